"""Where a GNN training step's time and memory go, without the whole harness (the gnn suite's cases):

    python -m benchmarks.gnn_profile --steps                   # time the synthetic cases of this device
    python -m benchmarks.gnn_profile --profile GCNConv,SAGEConv [--profile-impls sparsetorch,pyg,pyg-sparse]
                                                               # torch.profiler over 5 steps, device time per op
    python -m benchmarks.gnn_profile --memory GCNConv --profile-impls sparsetorch,pyg-sparse
                                                               # the blocks live at a step's peak (CUDA)
    python -m benchmarks.gnn_profile --minibatch GCNConv:sparsetorch,GCNConv:pyg [--compiled]
                                                               # host time per op of fresh-graph steps (CUDA)
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

import sparsetorch as st
from benchmarks.harness import make_timer, measure_ceilings
from benchmarks.suites.common import Context
from benchmarks.suites.gnn import GIB, Net, held_bytes, synthetic_graphs, training_step_rows
from benchmarks.suites.gnn_common import power_law_edge_index, pyg_layers, release_memory
from benchmarks.suites.minibatch import SYNC_CALLS, Net3, make_batches


def _probe_inputs(dev: torch.device, nodes: int, entries: int, channels, lib_name: str):
    """(x, y, graph) of the synthetic power-law case for one implementation ("sparsetorch": the
    edge_index; "pyg": the same; "pyg-sparse": a torch sparse CSR adj_t)."""
    edge_index = power_law_edge_index(nodes, entries, seed=nodes % 1000, device=str(dev)).to(dev)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(nodes, channels[0], generator=g).to(dev)
    y = torch.randint(0, channels[2], (nodes,), generator=g).to(dev)
    _, to_csr = pyg_layers()
    graph = to_csr(edge_index.flip(0), size=(nodes, nodes)) if lib_name == "pyg-sparse" else edge_index
    return x, y, graph


def _probe_step(dev: torch.device, layer: str, channels, lib_name: str, x, y, graph):
    """One training step (forward, backward, Adam) of a fresh model of ``lib_name``'s layers."""
    pyg_nn, _ = pyg_layers()
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
    release_memory(dev)
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

    own = held_bytes(x) + held_bytes(y) + held_bytes(graph)
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


def profile_minibatch(layer: str = "GCNConv", fanouts=(15, 10), impl: str = "sparsetorch", rows: int = 30,
                      compiled: bool = False) -> str:
    """torch.profiler over 5 fresh-graph training steps of one implementation on the CUDA power-law
    graph: the ops sorted by host (CPU) time, the host synchronisations per step, and the wall and GPU
    time per step. ``compiled``: the model under ``torch.compile(dynamic=True)``, as the compile suite runs
    it (backward and Adam outside)."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda")
    ctx = Context(dev, make_timer(dev, True), None, True, None)
    nodes = 300_000
    graph = power_law_edge_index(nodes, 3_000_000, seed=7, device="cuda")
    batches = make_batches(ctx, graph, nodes, fanouts, 15, seed=len(fanouts))  # warm-up, timed, profiled
    lib = st.nn if impl == "sparsetorch" else pyg_layers()[0]
    torch.manual_seed(0)
    model = Net3(lib, layer).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    run = torch.compile(model, dynamic=True) if compiled else model

    def step(batch):
        x, edge_index, y, size = batch
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(run(x, edge_index)[:size], y).backward()
        opt.step()

    for b in batches[:5]:
        step(b)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for b in batches[5:10]:
        step(b)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) / 5 * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches[10:]:
            step(b)
        torch.cuda.synchronize()
    averages = prof.key_averages()
    syncs = sum(e.count for e in averages if e.key in SYNC_CALLS) - 1
    launches = sum(e.count for e in averages if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    gpu_ms = sum(e.self_device_time_total for e in averages
                 if e.device_type == torch.autograd.DeviceType.CUDA) / 5 / 1e3
    head = (f"{impl} {layer} {'compiled' if compiled else 'eager'} fanout {list(fanouts)}: per step {wall_ms:.3f} ms "
            f"wall (unprofiled), {gpu_ms:.3f} ms of GPU kernels, {syncs / 5:.1f} host syncs, {launches / 5:.0f} kernel "
            f"launches")
    return head + "\n" + averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=55)



def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gnn_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", action="store_true", help="time the synthetic cases of this device (quick set)")
    ap.add_argument("--profile", default="", help="comma-separated layers to profile (our step)")
    ap.add_argument("--profile-impls", default="sparsetorch", help="sparsetorch,pyg,pyg-sparse")
    ap.add_argument("--memory", default="", help="comma-separated layers: the blocks live at the step's peak "
                    "(for each of --profile-impls)")
    ap.add_argument("--minibatch", default="", help="comma-separated LAYER:IMPL (IMPL sparsetorch or pyg): "
                    "torch.profiler over fresh-graph mini-batch steps")
    ap.add_argument("--compiled", action="store_true", help="--minibatch: the model under torch.compile(dynamic=True)")
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
    for spec in [x for x in args.minibatch.split(",") if x]:
        layer, impl = spec.split(":")
        print(profile_minibatch(layer, impl=impl, compiled=args.compiled))
    if not (args.steps or args.profile or args.memory or args.minibatch):
        ap.print_help()


if __name__ == "__main__":
    main()
