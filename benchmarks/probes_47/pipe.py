"""Pipelined (no sync) mini-batch steps: per-phase host time, to find where a step blocks."""
import os, sys, time, statistics
import torch, torch.nn.functional as F
import sparsetorch as st
from sparsetorch.bench.suites.common import Context
from sparsetorch.bench.timing import make_timer
from sparsetorch.bench.suites import minibatch as mb
from sparsetorch.bench.suites.gnn import power_law_edge_index, _pyg

dev = torch.device("cuda")
ctx = Context(dev, make_timer(dev, True), None, True, None)
pyg_nn, _ = _pyg()
nodes = 300_000
graph = power_law_edge_index(nodes, 3_000_000, seed=7, device="cuda")
batches = mb.make_batches(ctx, graph, nodes, (15, 10), 25, seed=2)

def run(tag, model, opt, batches, sync_each=False):
    ph = []
    for rep in range(3):
        torch.cuda.synchronize(); T0 = time.perf_counter(); rows = []
        for x, ei, y, size in batches:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            out = model(x, ei)
            t1 = time.perf_counter()
            loss = F.cross_entropy(out[:size], y)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            t4 = time.perf_counter()
            if sync_each: torch.cuda.synchronize()
            rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
        torch.cuda.synchronize(); wall = (time.perf_counter() - T0) / len(batches)
        ph.append((wall, [statistics.median(r[i] for r in rows) for i in range(4)], [max(r[i] for r in rows) for i in range(4)]))
    wall, med, mx = sorted(ph)[1]
    f = lambda v: "/".join(f"{t * 1e3:.2f}" for t in v)
    print(f"{tag}: wall {wall * 1e3:.2f} ms/step; host median fwd/loss/bwd/opt {f(med)}; max {f(mx)}", flush=True)

for layer in ("SAGEConv", "GCNConv"):
    for impl, lib in (("st", st.nn), ("pyg", pyg_nn)):
        torch.manual_seed(0)
        model = mb.Net3(lib, layer).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        run(f"{layer} {impl}", model, opt, batches)
        run(f"{layer} {impl} synced steps", model, opt, batches, sync_each=True)
        if impl == "st":
            st.set_autotune(False) if hasattr(st, "set_autotune") else None
            run(f"{layer} {impl} autotune off", model, opt, batches)
            st.set_autotune(True) if hasattr(st, "set_autotune") else None
