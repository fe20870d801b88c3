"""GNN training: a 2-layer GCN and GraphSAGE, one training step (forward + backward + Adam) with
sparsetorch's layers against torch_geometric's, same run, same initial weights.

Graphs: Cora, CiteSeer, PubMed (from the data folder; PubMed with random features of its real width,
so that its graph file alone suffices) and undirected power-law graphs from a deterministic generator
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

Times: a training step by the wall clock with a synchronize (harness.make_step_timer: the host's time
is part of a step); the accuracy runs' epochs likewise, one by one. ``python -m benchmarks.gnn_profile``
shows where a step's time and memory go.
"""
from __future__ import annotations

import statistics
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

import sparsetorch as st
from benchmarks.harness import check, once
from benchmarks.suites.common import Context, Job, gemm_model, spmm_model
from benchmarks.suites.gnn_common import DENSE_PART, dense_part_ms, pyg_layers, power_law_edge_index, release_memory
from benchmarks.suites.minibatch import minibatch_jobs

GIB = 2.0**30


# --- graphs --------------------------------------------------------------------------------------

def planetoid_case(root: str, name: str):
    """(edge_index, features, labels, train/val/test index or None) of a Planetoid graph; for PubMed its
    graph alone, with random features and labels of its real widths (500, 3)."""
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


def _variants(ctx: Context, layer: str, edge_index: torch.Tensor, n: int):
    """name -> (library, graph input maker) for the three implementations."""
    pyg_nn, to_csr = pyg_layers()
    out = {"sparsetorch": (st.nn, lambda: edge_index)}
    if pyg_nn is not None:
        out["torch_geometric edge_index"] = (pyg_nn, lambda: edge_index)
        out["torch_geometric sparse adj"] = (pyg_nn, lambda: to_csr(edge_index.flip(0), size=(n, n)))
    return out


def held_bytes(t) -> int:
    """Bytes of a tensor (a torch sparse CSR tensor's three parts), 0 for None."""
    if t is None:
        return 0
    if isinstance(t, torch.Tensor) and t.layout == torch.sparse_csr:
        return sum(held_bytes(p) for p in (t.crow_indices(), t.col_indices(), t.values()))
    return t.numel() * t.element_size()


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
        release_memory(device)
        graph = make_graph()
        resident = torch.cuda.memory_allocated(device) if ctx.cuda else 0
        own = held_bytes(x) + held_bytes(y) + held_bytes(graph)
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
            seconds = ctx.step_timer(step)
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
    release_memory(device)

    def time_dense(model, opt):
        def step():
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x, None), y).backward()
            opt.step()

        step()
        return ctx.step_timer(step)

    dense = dense_part_ms(ctx.device, Net(DENSE_PART, layer, channels), time_dense)
    for r in rows:
        r["dense_part_ms"] = dense
    return rows


def accuracy_rows(ctx: Context, layer: str, seeds: int, epochs: int = 200) -> List[dict]:
    """Kipf & Welling's Cora recipe with both libraries: test accuracy at the best validation epoch
    (mean over seeds), and the median training epoch time."""
    pyg_nn, _ = pyg_layers()
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
            def epoch():
                model.train()
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x, edge_index)[train], y[train]).backward()
                opt.step()

            for _ in range(epochs):
                times.append(once(epoch, device)[1])
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
    release_memory(device)
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
