"""Mini-batch GNN training as PyG users run it: every step a NEW sampled subgraph (neighbour
sampling around 1024 seed nodes, PyG NeighborLoader-style), 3 layers (128 -> 256 -> 256 -> 47), the
loss on the seeds, Adam. sparsetorch's GCNConv / SAGEConv against torch_geometric's, same weights,
same batches, same run.

The sampler (``sample_subgraph``) runs on the graph's device with torch ops and is not timed: both
libraries get the same list of pre-sampled batches, each with its own ``edge_index`` tensor, so no
cache can recognise a graph. (torch_geometric's NeighborLoader needs pyg-lib or torch-sparse, which are
not always installed; the sampler follows its conventions: seeds first in the node list, edges
``[source, target]`` in local ids, targets being the nodes sampled from, at most ``fanout`` distinct
neighbours per node and hop.)

Two ways of feeding the batches, both as PyG users do: ``on the device`` (the batches were sampled on
the GPU before the loop) and ``moved each step`` (the batches sit in host memory, as a CPU
NeighborLoader yields them, and each step starts with ``.to(device)`` of x, edge_index and y, inside
the timed step for both libraries). The second is what a loader-fed loop costs; it also removes the
advantage of a library that never waits for the GPU, since the copy of pageable host memory waits
for the work queued before it.

Per case: the wall time per step over a loop of steps (a synchronize before and after the loop, none
inside), and the host synchronisations per step counted by torch.profiler (the CUDA runtime's
``cudaStreamSynchronize`` / ``cudaEventSynchronize`` / ``cudaDeviceSynchronize`` calls) over 5 steps.
Floor: ``dense_part_ms``, the same step with every layer's aggregation removed (gnn.DENSE_PART: the
layers' GEMMs, ReLU, the loss and Adam on the same batches). Both libraries run that work, so
torch_geometric's time / the dense part's about bounds the ratio any aggregation can reach (separate
timings: with batches moved each step the copies' waits overlap differently).
"""
from __future__ import annotations

import statistics
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F

import sparsetorch as st
from benchmarks.harness import check
from benchmarks.suites.common import Context, Job
from benchmarks.suites.gnn_common import DENSE_PART, dense_part_ms, power_law_edge_index, pyg_layers, release_memory
from sparsetorch import timing

CHANNELS = (128, 256, 256, 47)
SEEDS = 1024
FANOUTS = ((15, 10), (25, 10, 5))
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


def in_neighbours(edge_index: torch.Tensor, nodes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(rowptr, sources) of each node's in-edges (the neighbours message passing aggregates from)."""
    order = torch.argsort(edge_index[1], stable=True)
    sources = edge_index[0][order]
    rowptr = torch.zeros(nodes + 1, dtype=torch.int64, device=edge_index.device)
    rowptr[1:] = torch.cumsum(torch.bincount(edge_index[1], minlength=nodes), 0)
    return rowptr, sources


def sample_subgraph(rowptr: torch.Tensor, sources: torch.Tensor, seeds: torch.Tensor, fanouts: Sequence[int],
                    generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """(global ids of the sampled nodes, seeds first; local edge_index (2, E)) of a neighbour sample."""
    device = seeds.device
    nodes_total = rowptr.shape[0] - 1
    local = torch.full((nodes_total,), -1, dtype=torch.int64, device=device)
    local[seeds] = torch.arange(seeds.shape[0], device=device)
    node_list, frontier = [seeds], seeds
    srcs, dsts = [], []
    count = seeds.shape[0]
    for fanout in fanouts:
        start = rowptr[frontier]
        degree = rowptr[frontier + 1] - start
        draw = torch.rand(frontier.shape[0], fanout, generator=generator, device=device)
        pick = start.unsqueeze(1) + (draw * degree.unsqueeze(1)).long()
        has = (degree > 0).unsqueeze(1).expand(-1, fanout)
        nbr = sources[pick.clamp(max=max(sources.shape[0] - 1, 0))][has]
        dst = frontier.unsqueeze(1).expand(-1, fanout)[has]
        pair = torch.unique(dst * nodes_total + nbr)  # distinct neighbours per node
        dst, nbr = pair // nodes_total, pair % nodes_total
        new = torch.unique(nbr[local[nbr] < 0])
        local[new] = torch.arange(count, count + new.shape[0], device=device)
        count += new.shape[0]
        node_list.append(new)
        srcs.append(nbr)
        dsts.append(dst)
        frontier = new
    edge_index = torch.stack([local[torch.cat(srcs)], local[torch.cat(dsts)]])
    return torch.cat(node_list), edge_index


class Net3(torch.nn.Module):
    """Three layers of ``lib``'s ``layer``, ReLU between (PyG's mini-batch recipe without dropout)."""

    def __init__(self, lib, layer: str, channels=CHANNELS):
        super().__init__()
        self.convs = torch.nn.ModuleList(getattr(lib, layer)(channels[i], channels[i + 1])
                                         for i in range(len(channels) - 1))

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


def make_batches(ctx: Context, graph: torch.Tensor, nodes: int, fanouts, count: int, seed: int):
    """``count`` pre-sampled batches (x, edge_index, y, seeds) of the graph, features of width CHANNELS[0]."""
    dev = ctx.device
    g = torch.Generator(device=dev).manual_seed(seed)
    features = torch.randn(nodes, CHANNELS[0], device=dev, generator=g)
    labels = torch.randint(0, CHANNELS[-1], (nodes,), device=dev, generator=g)
    rowptr, sources = in_neighbours(graph, nodes)
    batches = []
    for _ in range(count):
        seeds = torch.randperm(nodes, device=dev, generator=g)[:SEEDS]
        n_id, edge_index = sample_subgraph(rowptr, sources, seeds, fanouts, g)
        batches.append((features[n_id], edge_index, labels[seeds], SEEDS))
    return batches


def _syncs_per_step(step, batches) -> float:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches:
            step(b)
        torch.cuda.synchronize()
    calls = sum(e.count for e in prof.key_averages() if e.key in SYNC_CALLS)
    return (calls - 1) / len(batches)  # less the synchronize closing the window


def _time_loops(ctx: Context, step, timed) -> float:
    """Seconds per step: the median of 3 loops over ``timed`` (wall time, a synchronize before and after
    each loop, none inside)."""
    def loop():
        for b in timed:
            step(b)

    return 1e-3 * timing.wall_time(loop, device=ctx.device, reps=3, warmup=0) / len(timed)


def minibatch_rows(ctx: Context, graph_name: str, graph: torch.Tensor, nodes: int, layer: str,
                   fanouts, steps: int, feed: str = "on the device") -> List[dict]:
    pyg_nn, _ = pyg_layers()
    batches = make_batches(ctx, graph, nodes, fanouts, steps + 5, seed=len(fanouts))
    moved = feed != "on the device"
    if moved:  # what a CPU loader yields: host tensors, moved by the step itself
        batches = [(x.cpu(), ei.cpu(), y.cpu(), size) for x, ei, y, size in batches]
    sizes = [(b[0].shape[0], b[1].shape[1]) for b in batches]
    mean_nodes = statistics.mean(s[0] for s in sizes)
    mean_edges = statistics.mean(s[1] for s in sizes)
    fan = "[" + ", ".join(str(f) for f in fanouts) + "]"
    case = (f"{layer} mini-batch, {graph_name}, fanout {fan}, {SEEDS} seeds, " + "-".join(map(str, CHANNELS))
            + f", batches {feed}")
    base = {"suite": "gnn", "case": case, "graph": graph_name, "layer": layer, "dtype": "float32",
            "nodes_per_step": mean_nodes, "edges_per_step": mean_edges, "GBps": 0.0, "GFLOPs": 0.0,
            "floor_ms": 0.0, "of_floor": 0.0}
    torch.manual_seed(0)
    initial = Net3(st.nn, layer).state_dict()
    libs = {"sparsetorch": st.nn}
    if pyg_nn is not None:
        libs["torch_geometric edge_index"] = pyg_nn
    def make_step(model, opt):
        def step(batch):
            x, edge_index, y, size = batch
            if moved:
                x, edge_index, y = x.to(ctx.device), edge_index.to(ctx.device), y.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x, edge_index)[:size], y).backward()
            opt.step()

        return step

    rows, reference = [], None
    for impl, lib in libs.items():
        release_memory(ctx.device)
        model = Net3(lib, layer).to(ctx.device)
        model.load_state_dict(initial)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        step = make_step(model, opt)
        with torch.no_grad():
            out = model(batches[0][0].to(ctx.device), batches[0][1].to(ctx.device))
        if reference is None:
            reference, err = out.double().cpu(), 0.0
        else:
            err = check(out, reference, f"gnn {case}: {impl}", 1e-4)
        for b in batches[:5]:  # warm-up: code, workspaces, the tuning of the products' signatures
            step(b)
        timed = batches[5:]
        seconds = _time_loops(ctx, step, timed)
        syncs = _syncs_per_step(step, timed[:5]) if ctx.cuda else None
        rows.append({**base, "impl": impl, "time_ms": seconds * 1e3, "rel_err": err, "syncs_per_step": syncs})
        model = opt = step = None
    release_memory(ctx.device)

    def time_dense(model, opt):
        step = make_step(model, opt)
        for b in batches[:5]:
            step(b)
        return _time_loops(ctx, step, batches[5:])

    dense = dense_part_ms(ctx.device, Net3(DENSE_PART, layer), time_dense)
    for r in rows:
        r["dense_part_ms"] = dense
    return rows


def minibatch_jobs(ctx: Context, layer: str) -> List[Job]:
    """One job per fanout for ``layer`` on a power-law graph of 300k nodes (20k on the CPU)."""
    nodes, entries = (300_000, 3_000_000) if ctx.cuda else (20_000, 200_000)
    steps = 20 if ctx.cuda else 3
    name = f"power-law {nodes // 1000}k"

    def job(fan):
        def run():
            graph = power_law_edge_index(nodes, entries, seed=7, device=str(ctx.device))
            rows = minibatch_rows(ctx, name, graph, nodes, layer, fan, steps)
            if ctx.cuda:
                rows += minibatch_rows(ctx, name, graph, nodes, layer, fan, steps, feed="moved each step")
            return rows

        return run

    return [job(fan) for fan in (FANOUTS if ctx.cuda else FANOUTS[:1])]
