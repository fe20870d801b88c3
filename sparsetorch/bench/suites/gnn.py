"""GNN training: a 2-layer GCN and GraphSAGE, one training step (forward + backward + Adam) with
sparsetorch's layers against torch_geometric's, same run, same initial weights.

Graphs: Cora, CiteSeer, PubMed (../shared/data/planetoid; PubMed has no features there, so random
ones of its real width) and undirected power-law graphs from a deterministic generator
(:func:`power_law_edge_index`): ~170k nodes / 2.1M entries with 128 -> 256 -> 40 channels (the
shape of ogbn-arxiv), and with ``--full`` ~1M nodes / 25M entries with 100 -> 256 -> 47 (of
ogbn-products); on the CPU 20k nodes (and 170k with ``--full``).

Per case, three implementations of the same model (``x -> conv1 -> relu -> conv2``, cross-entropy
over all nodes, Adam): ``sparsetorch`` (st.nn.GCNConv / SAGEConv given the ``edge_index``, as a
PyG script with its import swapped), ``torch_geometric edge_index`` and ``torch_geometric sparse
adj`` (the same PyG layer given a torch sparse CSR ``adj_t``, its fastest variant). GCN layers
use ``cached=True`` (PyG's SAGEConv has no cache). Outputs are checked against each other before
timing. ``peak_GiB``: the most memory allocated at once during the timed steps, counting the
model, optimiser state, features, labels, the graph input the variant is given and whatever it
caches (cuBLAS's workspaces too: they are released between variants), and nothing the other
variants hold.

Floor of a step: the sum over its kernels of max(bytes / copy bandwidth, flops / fp32 GEMM rate),
for the least work the math needs: each layer's SpMM at the narrower of its two widths (forward;
backward for layer 2 only, layer 1's input needing no gradient), its GEMMs forward and backward
(and SAGE's root GEMMs); SpMM bytes as in common.spmm_model, GEMM bytes every operand once.

``dense_part_ms`` (every row of a case): the same step with the layers' aggregation removed
(``DENSE_PART``: their GEMMs, then ReLU, the loss and Adam). Both libraries run that work; on the small
graphs and mini-batches, where steps are bound by the host, it is most of the step and bounds the ratio
any aggregation can reach.

Accuracy: Kipf & Welling's recipe on Cora (16 hidden, dropout 0.5, Adam lr 0.01, weight decay 5e-4
on layer 1, 200 epochs; test accuracy at the best validation epoch) with both libraries, same seeds
(3 on CUDA, 10 with ``--full``; on the CPU one seed, with ``--full`` only).

``python -m sparsetorch.bench.suites.gnn --steps --profile GCNConv,SAGEConv`` times the synthetic
cases alone and prints where the time of our step goes (torch.profiler, device time per op);
``--memory GCNConv --profile-impls sparsetorch,pyg-sparse`` lists what is allocated at each one's peak.
"""
from __future__ import annotations

import functools
import gc
import os
import statistics
import time
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

import sparsetorch as st
from sparsetorch.bench.suites.common import Context, Job, gemm_model, spmm_model
from sparsetorch.bench.suites.minibatch import minibatch_jobs
from sparsetorch.bench.timing import check

GIB = 2.0**30


# --- graphs --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)  # the GCN and SAGE cases of one graph share it
def power_law_edge_index(nodes: int, entries: int, seed: int, exponent: float = 1.5,
                         device: str = "cpu") -> torch.Tensor:
    """An undirected graph with power-law degrees (Chung-Lu: both ends of each edge drawn with
    probability proportional to a Pareto(``exponent``) node weight), no self loops, no repeated
    edges, both directions stored: an int64 (2, ~entries) edge_index. Deterministic: the weights
    and uniforms come from NumPy's generator, the draws are an exact search in their float64 CDF,
    so every device gives the same graph."""
    rng = np.random.default_rng(seed)
    w = rng.pareto(exponent, nodes) + 1.0
    cdf = torch.from_numpy(np.cumsum(w / w.sum())).to(device)
    u = torch.from_numpy(rng.random((2, entries // 2))).to(device)
    ends = torch.searchsorted(cdf, u).clamp_(max=nodes - 1)
    lo, hi = ends.min(0).values, ends.max(0).values
    keep = lo != hi
    key = torch.unique(lo[keep] * nodes + hi[keep])
    lo, hi = key // nodes, key % nodes
    return torch.cat([torch.stack([lo, hi]), torch.stack([hi, lo])], 1)


def planetoid_case(root: str, name: str):
    """(edge_index, features, labels, train/val/test index or None) of a Planetoid graph; PubMed has
    only its graph in ../shared/data: random features and labels of its real widths (500, 3)."""
    from sparsetorch.datasets import load_planetoid, planetoid_adjacency

    if name == "pubmed":
        adj = planetoid_adjacency(name, root)
        adj = ((adj + adj.T) > 0).tocsr()
        adj.setdiag(0)
        adj.eliminate_zeros()
        coo = adj.tocoo()
        g = torch.Generator().manual_seed(0)
        n = adj.shape[0]
        return (torch.from_numpy(np.stack([coo.row, coo.col])).long(), torch.randn(n, 500, generator=g),
                torch.randint(0, 3, (n,), generator=g), None)
    ds = load_planetoid(name, root)
    coo = ds.adjacency.tocoo()
    return (torch.from_numpy(np.stack([coo.row, coo.col])).long(), ds.features, ds.labels,
            (ds.train_index, ds.val_index, ds.test_index))


# --- models --------------------------------------------------------------------------------------

class Net(torch.nn.Module):
    """conv1 -> relu -> (dropout) -> conv2, with the layers of ``lib`` (torch_geometric.nn or sparsetorch.nn)."""

    def __init__(self, lib, layer: str, channels: Tuple[int, int, int], dropout: float = 0.0):
        super().__init__()
        kwargs = {"cached": True} if layer == "GCNConv" else {}
        self.conv1 = getattr(lib, layer)(channels[0], channels[1], **kwargs)
        self.conv2 = getattr(lib, layer)(channels[1], channels[2], **kwargs)
        self.dropout = dropout

    def forward(self, x, graph):
        x = F.dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(x, graph))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, graph)


class _GCNDensePart(torch.nn.Module):
    """GCNConv without its aggregation: ``lin(x)`` (PyG's GCNConv computes it before propagating)."""

    def __init__(self, in_channels: int, out_channels: int, **_):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, graph):
        return self.lin(x)


class _SAGEDensePart(torch.nn.Module):
    """SAGEConv without its aggregation: ``lin_l(x) + lin_r(x)``, PyG's two GEMMs."""

    def __init__(self, in_channels: int, out_channels: int, **_):
        super().__init__()
        self.lin_l = torch.nn.Linear(in_channels, out_channels)
        self.lin_r = torch.nn.Linear(in_channels, out_channels, bias=False)

    def forward(self, x, graph):
        return torch.addmm(self.lin_l(x), x, self.lin_r.weight.t())


class DENSE_PART:
    """The layers with the aggregation removed, for the step's dense part: the same model, loss and
    optimiser as the libraries' steps with every layer's sparse work taken out. Both libraries run this
    work too, so torch_geometric's time / this one's about bounds the ratio a step can reach, whatever
    the aggregation costs (separate timings; fusing SAGE's two GEMMs aside)."""
    GCNConv = _GCNDensePart
    SAGEConv = _SAGEDensePart


def dense_part_ms(ctx: Context, model: torch.nn.Module, time_step) -> float:
    """Milliseconds per step of ``model`` (a DENSE_PART network) under ``time_step(model, opt)``."""
    model = model.to(ctx.device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    try:
        return time_step(model, opt) * 1e3
    finally:
        model = opt = None
        _release(ctx.device)


def step_model(layer: str, n: int, entries: int, channels, ceilings) -> Tuple[float, float, float]:
    """(bytes, flops, floor seconds) of the least work of one training step (see the docstring)."""
    c0, c1, c2 = channels
    e = entries + (n if layer == "GCNConv" else 0)  # GCN's self loops
    kernels = []
    w1, w2 = min(c0, c1), min(c1, c2)
    kernels += [spmm_model(e, n, n, w1, 4, 4), spmm_model(e, n, n, w2, 4, 4), spmm_model(e, n, n, w2, 4, 4)]
    gemms = [(c0, c1), (c1, c2), (c0, c1), (c1, c2), (c2, c1)]  # forward 2, grad W 2, grad of layer 2's input
    if layer == "SAGEConv":
        gemms += gemms  # the root weight: the same GEMMs again
    kernels += [gemm_model(n, k, m, 4) for k, m in gemms]
    nbytes = sum(b for b, _ in kernels)
    flops = sum(f for _, f in kernels)
    floor = sum(ceilings.floor(b, f, "float32") for b, f in kernels)
    return nbytes, flops, floor


def _pyg():
    try:
        import torch_geometric.nn as pyg_nn
        from torch_geometric.utils import to_torch_csr_tensor

        return pyg_nn, to_torch_csr_tensor
    except ImportError:
        return None, None


def _variants(ctx: Context, layer: str, edge_index: torch.Tensor, n: int):
    """name -> (library, graph input maker) for the three implementations."""
    pyg_nn, to_csr = _pyg()
    out = {"sparsetorch": (st.nn, lambda: edge_index)}
    if pyg_nn is not None:
        out["torch_geometric edge_index"] = (pyg_nn, lambda: edge_index)
        out["torch_geometric sparse adj"] = (pyg_nn, lambda: to_csr(edge_index.flip(0), size=(n, n)))
    return out


def _nbytes(t) -> int:
    if t is None:
        return 0
    if isinstance(t, torch.Tensor) and t.layout == torch.sparse_csr:
        return sum(_nbytes(p) for p in (t.crow_indices(), t.col_indices(), t.values()))
    return t.numel() * t.element_size()


def _release(device: torch.device) -> None:
    """Frees what the previous variant left behind, cuBLAS's workspaces included: torch keeps one per
    (handle, stream), and the autograd engine's thread has its own handle, so the variant timed first
    would otherwise pay 32 MiB per workspace (H100) that the later ones find already allocated."""
    gc.collect()
    st.graph.graph_cache_clear()
    st._transpose.transpose_cache_clear()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()


def training_step_rows(ctx: Context, name: str, layer: str, edge_index: torch.Tensor, n: int, channels,
                       x: Optional[torch.Tensor] = None, y: Optional[torch.Tensor] = None,
                       steps_for_peak: int = 2) -> List[dict]:
    """Times one training step of each implementation on one graph; rows for the report."""
    device = ctx.device
    c0, c1, c2 = channels
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(n, c0, generator=g) if x is None else x).to(device)
    y = (torch.randint(0, c2, (n,), generator=g) if y is None else y.clamp(min=0)).to(device)
    edge_index = edge_index.to(device)
    entries = edge_index.shape[1]
    nbytes, flops, floor = step_model(layer, n, entries, channels, ctx.ceilings)
    case = f"{layer} {name}, {c0}-{c1}-{c2}"
    base = {"suite": "gnn", "case": case, "graph": name, "layer": layer, "nodes": n, "entries": entries,
            "channels": f"{c0}-{c1}-{c2}", "dtype": "float32"}
    torch.manual_seed(0)
    initial = Net(st.nn, layer, channels).state_dict()
    rows, reference = [], None
    for impl, (lib, make_graph) in _variants(ctx, layer, edge_index, n).items():
        _release(device)
        graph = make_graph()
        resident = torch.cuda.memory_allocated(device) if ctx.cuda else 0
        own = _nbytes(x) + _nbytes(y) + _nbytes(graph)
        try:
            model = Net(lib, layer, channels).to(device)
            model.load_state_dict(initial)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)

            def step():
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x, graph), y)
                loss.backward()
                opt.step()

            with torch.no_grad():
                out = model(x, graph)
            if reference is None:
                reference = out.double().cpu()
                err = 0.0
            else:
                err = check(out, reference, f"gnn {case}: {impl}", 1e-4)
            del out
            step()  # builds what the layers cache
            peak = None
            if ctx.cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                for _ in range(steps_for_peak):
                    step()
                torch.cuda.synchronize(device)
                # What this variant holds: the peak less what was resident before its model existed
                # (the shared inputs, whatever this variant does not use), plus its own inputs.
                peak = (torch.cuda.max_memory_allocated(device) - resident + own) / GIB
            seconds = ctx.timer(step)
        except torch.cuda.OutOfMemoryError as e:  # a baseline that cannot run this case is reported, not fatal
            if impl == "sparsetorch":
                raise
            print(f"\ngnn {case}: {impl} ran out of memory ({str(e)[:100]}); left out")
            continue
        finally:
            model = opt = graph = None
        rows.append({**base, "impl": impl, "time_ms": seconds * 1e3, "GBps": nbytes / seconds / 1e9,
                     "GFLOPs": flops / seconds / 1e9, "floor_ms": floor * 1e3, "of_floor": floor / seconds,
                     "rel_err": err, "peak_GiB": peak})
    _release(device)

    def time_dense(model, opt):
        def step():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x, None), y).backward()
            opt.step()

        step()
        return ctx.timer(step)

    dense = dense_part_ms(ctx, Net(DENSE_PART, layer, channels), time_dense)
    for r in rows:
        r["dense_part_ms"] = dense
    return rows


def accuracy_rows(ctx: Context, layer: str, seeds: int, epochs: int = 200) -> List[dict]:
    """Kipf & Welling's Cora recipe with both libraries: test accuracy at the best validation epoch
    (mean over seeds), and the median training epoch time."""
    pyg_nn, _ = _pyg()
    edge_index, features, labels, split = planetoid_case(ctx.data_root, "cora")
    device = ctx.device
    x, y, edge_index = features.to(device), labels.to(device), edge_index.to(device)
    train, val, test = (s.to(device) for s in split)
    channels = (x.shape[1], 16, int(labels.max()) + 1)
    libs = {"sparsetorch": st.nn}
    if pyg_nn is not None:
        libs["torch_geometric edge_index"] = pyg_nn
    rows = []
    for impl, lib in libs.items():
        accs, times = [], []
        for seed in range(seeds):
            torch.manual_seed(seed)
            model = Net(lib, layer, channels, dropout=0.5).to(device)
            opt = torch.optim.Adam([{"params": model.conv1.parameters(), "weight_decay": 5e-4},
                                    {"params": model.conv2.parameters(), "weight_decay": 0.0}], lr=0.01)
            best_val = test_at_best = 0.0
            for _ in range(epochs):
                if ctx.cuda:
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                model.train()
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x, edge_index)[train], y[train]).backward()
                opt.step()
                if ctx.cuda:
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
                model.eval()
                with torch.no_grad():
                    pred = model(x, edge_index).argmax(1)
                v = (pred[val] == y[val]).float().mean().item()
                if v > best_val:
                    best_val, test_at_best = v, (pred[test] == y[test]).float().mean().item()
            accs.append(test_at_best)
        ms = statistics.median(times[10:]) * 1e3
        rows.append({"suite": "gnn", "case": f"{layer} cora accuracy, {seeds} seeds x {epochs} epochs",
                     "graph": "cora", "layer": layer, "impl": impl, "dtype": "float32", "time_ms": ms, "GBps": 0.0,
                     "GFLOPs": 0.0, "floor_ms": 0.0, "of_floor": 0.0, "test_acc": statistics.mean(accs),
                     "test_acc_std": statistics.pstdev(accs), "seeds": seeds})
    _release(device)
    return rows


def synthetic_graphs(ctx: Context):
    """(name, nodes, entries, channels) of the power-law cases for this device and mode."""
    if ctx.cuda:
        cases = [("power-law 170k", 169_343, 2_100_000, (128, 256, 40))]
        if not ctx.quick:
            cases.append(("power-law 1M", 1_000_000, 25_000_000, (100, 256, 47)))
    else:
        cases = [("power-law 20k", 20_000, 250_000, (128, 256, 40))]
        if not ctx.quick:
            cases.append(("power-law 170k", 169_343, 2_100_000, (128, 256, 40)))
    return cases


def gnn_suite(ctx: Context) -> List[Job]:
    jobs: List[Job] = []
    from sparsetorch.datasets import planetoid_available

    # Every layout the loader reads (torch_geometric's download folder too), not only planetoid/.
    has_planetoid = bool(ctx.data_root) and planetoid_available("cora", ctx.data_root)
    for layer in ("GCNConv", "SAGEConv"):
        if has_planetoid:
            for name in ("cora", "citeseer", "pubmed"):
                def run(layer=layer, name=name):
                    edge_index, x, y, _ = planetoid_case(ctx.data_root, name)
                    channels = (x.shape[1], 16, int(y.max()) + 1)
                    return training_step_rows(ctx, name, layer, edge_index, x.shape[0], channels, x, y)

                jobs.append(run)
        for name, nodes, entries, channels in synthetic_graphs(ctx):
            def run(layer=layer, name=name, nodes=nodes, entries=entries, channels=channels):
                edge_index = power_law_edge_index(nodes, entries, seed=nodes % 1000, device=str(ctx.device))
                return training_step_rows(ctx, name, layer, edge_index, nodes, channels)

            jobs.append(run)
        jobs += minibatch_jobs(ctx, layer)
        if has_planetoid and (ctx.cuda or not ctx.quick):  # 200 epochs per seed: minutes on a small CPU
            seeds = (3 if ctx.quick else 10) if ctx.cuda else 1
            jobs.append(lambda layer=layer, seeds=seeds: accuracy_rows(ctx, layer, seeds))
    return jobs


# --- where the time goes -------------------------------------------------------------------------

def _probe_inputs(dev: torch.device, nodes: int, entries: int, channels, lib_name: str):
    """(x, y, graph) of the synthetic power-law case for one implementation ("sparsetorch": the
    edge_index; "pyg": the same; "pyg-sparse": a torch sparse CSR adj_t)."""
    edge_index = power_law_edge_index(nodes, entries, seed=nodes % 1000, device=str(dev)).to(dev)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(nodes, channels[0], generator=g).to(dev)
    y = torch.randint(0, channels[2], (nodes,), generator=g).to(dev)
    _, to_csr = _pyg()
    graph = to_csr(edge_index.flip(0), size=(nodes, nodes)) if lib_name == "pyg-sparse" else edge_index
    return x, y, graph


def _probe_step(dev: torch.device, layer: str, channels, lib_name: str, x, y, graph):
    """One training step (forward, backward, Adam) of a fresh model of ``lib_name``'s layers."""
    pyg_nn, _ = _pyg()
    torch.manual_seed(0)
    model = Net(st.nn if lib_name == "sparsetorch" else pyg_nn, layer, channels).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x, graph), y).backward()
        opt.step()

    return step

def profile_step(device: str = "cuda", layer: str = "GCNConv", nodes: int = 169_343, entries: int = 2_100_000,
                 channels=(128, 256, 40), lib_name: str = "sparsetorch", rows: int = 25) -> str:
    """torch.profiler over 5 training steps of one implementation; the table sorted by device time."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device)
    x, y, graph = _probe_inputs(dev, nodes, entries, channels, lib_name)
    step = _probe_step(dev, layer, channels, lib_name, x, y, graph)
    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(5):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def memory_at_peak(device: str = "cuda", layer: str = "GCNConv", nodes: int = 169_343, entries: int = 2_100_000,
                   channels=(128, 256, 40), lib_name: str = "sparsetorch", rows: int = 25) -> str:
    """What is allocated at the peak of one training step of one implementation (after a first step
    has built the caches): the blocks live at that moment, largest first, each with the innermost
    frames of the code that allocated it (torch.cuda.memory's history of allocations)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError("device: the memory history needs CUDA")
    _release(dev)
    x, y, graph = _probe_inputs(dev, nodes, entries, channels, lib_name)
    torch.cuda.synchronize(dev)
    # C++ frames too: blocks the autograd engine allocates have no Python frames.
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="all")
    try:
        step = _probe_step(dev, layer, channels, lib_name, x, y, graph)
        step()
        torch.cuda.synchronize(dev)
        mark = len(torch.cuda.memory._snapshot()["device_traces"][dev.index or 0])
        step()
        torch.cuda.synchronize(dev)
        trace = torch.cuda.memory._snapshot()["device_traces"][dev.index or 0]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    # The allocator's allocated-bytes count falls when a block is freed (free_requested), also when
    # its reuse waits on another stream's work (free_completed comes later).
    live, now, peak, at_peak, cause = {}, 0, -1, {}, (0, {})
    for i, ev in enumerate(trace):
        if ev["action"] == "alloc":
            live[ev["addr"]] = (i, ev)
            now += ev["size"]
        elif ev["action"] == "free_requested" and ev["addr"] in live:
            now -= live.pop(ev["addr"])[1]["size"]
        if i >= mark and now > peak:
            peak, at_peak, cause = now, dict(live), (i, ev)

    def where(ev):
        keep = []
        for f in ev.get("frames", []):
            name, fname = f.get("name", ""), f.get("filename", "")
            if fname.endswith(".py"):
                if "/torch/" not in fname or "torch_geometric" in fname:
                    keep.append(f"{os.path.basename(fname)}:{f['line']} {name}")
            elif any(k in name for k in ("at::native::", "sparsetorch::", "torch::autograd::generated::")):
                keep.append(name.split("(")[0][-70:])
        return " < ".join(keep[:4])

    own = _nbytes(x) + _nbytes(y) + _nbytes(graph)
    lines = [f"{lib_name} {layer}: peak of the second step {peak / GIB:.4f} GiB above what was resident "
             f"before the model; with x, y and the graph input ({own / GIB:.4f} GiB) {(peak + own) / GIB:.4f} GiB "
             f"(the suite's peak_GiB); reached at event {cause[0] - mark} of the step ({cause[1].get('action')} "
             f"{where(cause[1])}); live then (MiB, the event that allocated it, negative = before the step):"]
    blocks = sorted(at_peak.values(), key=lambda ie: -ie[1]["size"])
    for i, ev in blocks[:rows]:
        lines.append(f"  {ev['size'] / 2**20:9.2f} MiB  {i - mark:6d}  {where(ev)}")
    rest = sum(ev["size"] for _, ev in blocks[rows:])
    lines.append(f"  {rest / 2**20:9.2f} MiB  in {max(len(blocks) - rows, 0)} smaller blocks")
    return "\n".join(lines)


def _main(argv=None):
    """A short look without the whole harness: the synthetic training-step cases (``--steps``)
    and/or profiles of one step (``--profile GCNConv,SAGEConv``)."""
    import argparse

    from sparsetorch.bench.timing import make_timer, measure_ceilings

    ap = argparse.ArgumentParser(description=_main.__doc__)
    ap.add_argument("--steps", action="store_true", help="time the synthetic cases of this device (quick set)")
    ap.add_argument("--profile", default="", help="comma-separated layers to profile (our step)")
    ap.add_argument("--profile-impls", default="sparsetorch", help="sparsetorch,pyg,pyg-sparse")
    ap.add_argument("--memory", default="", help="comma-separated layers: the blocks live at the step's peak "
                    "(for each of --profile-impls)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--nodes", type=int, default=169_343)
    ap.add_argument("--entries", type=int, default=2_100_000)
    ap.add_argument("--channels", default="128,256,40")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device)
    channels = tuple(int(c) for c in args.channels.split(","))
    if args.steps:
        timer = make_timer(device, True)
        ctx = Context(device, timer, measure_ceilings(device, timer, True), True, None)
        for name, nodes, entries, chans in synthetic_graphs(ctx):
            edge_index = power_law_edge_index(nodes, entries, seed=nodes % 1000, device=str(device))
            deg = torch.bincount(edge_index[0], minlength=nodes)
            print(f"{name}: {nodes} nodes, {edge_index.shape[1]} entries, longest row {int(deg.max())}")
            for layer in ("GCNConv", "SAGEConv"):
                for r in training_step_rows(ctx, name, layer, edge_index, nodes, chans):
                    peak = "" if r["peak_GiB"] is None else f"{r['peak_GiB']:.3f} GiB"
                    print(f"  {layer:8s} {r['impl']:28s} {r['time_ms']:8.3f} ms  floor {r['floor_ms']:.3f} ms "
                          f"({100 * r['of_floor']:.0f}%)  peak {peak}  rel_err {r['rel_err']:.1e}", flush=True)
    for layer in [x for x in args.profile.split(",") if x]:
        for impl in args.profile_impls.split(","):
            print(f"\n{impl} {layer}, power-law {args.nodes} nodes / ~{args.entries} entries, {channels}, "
                  f"5 training steps on {device}")
            print(profile_step(str(device), layer, args.nodes, args.entries, channels, impl, rows=18))
    for layer in [x for x in args.memory.split(",") if x]:
        for impl in args.profile_impls.split(","):
            print()
            print(memory_at_peak(str(device), layer, args.nodes, args.entries, channels, impl))


if __name__ == "__main__":
    _main()
