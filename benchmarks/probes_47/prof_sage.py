"""Where the host time of sparsetorch's SAGE mini-batch step goes: phases (forward / backward / optimizer, synced),
allocator activity, CUDA runtime calls, ops grouped by input shape."""
import os, sys, time, statistics
import torch, torch.nn.functional as F
import sparsetorch as st
from torch.profiler import profile, ProfilerActivity
from sparsetorch.bench.suites.common import Context
from sparsetorch.bench.timing import make_timer
from sparsetorch.bench.suites import minibatch as mb
from sparsetorch.bench.suites.gnn import Net, planetoid_case, power_law_edge_index, _pyg

dev = torch.device("cuda")
ctx = Context(dev, make_timer(dev, True), None, True, os.environ.get("SPARSETORCH_DATA"))
pyg_nn, to_csr = _pyg()

def phases(tag, model, opt, batches):
    fwd, bwd, stp, tot = [], [], [], []
    a0 = torch.cuda.memory_stats().get("num_device_alloc", 0)
    for i, (x, ei, y, size) in enumerate(batches):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, ei)[:size], y)
        t1 = time.perf_counter(); torch.cuda.synchronize(); t1s = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter(); torch.cuda.synchronize(); t2s = time.perf_counter()
        opt.step()
        t3 = time.perf_counter(); torch.cuda.synchronize(); t3s = time.perf_counter()
        if i >= 3:
            fwd.append(((t1 - t0) * 1e3, (t1s - t0) * 1e3)); bwd.append(((t2 - t1s) * 1e3, (t2s - t1s) * 1e3))
            stp.append(((t3 - t2s) * 1e3, (t3s - t2s) * 1e3))
    a1 = torch.cuda.memory_stats().get("num_device_alloc", 0)
    med = lambda v: "host %.3f / synced %.3f" % (statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
    print(f"-- {tag}: forward {med(fwd)}; backward {med(bwd)}; optimizer {med(stp)} ms; cudaMallocs {a1 - a0}", flush=True)

nodes = 300_000
graph = power_law_edge_index(nodes, 3_000_000, seed=7, device="cuda")
batches = mb.make_batches(ctx, graph, nodes, (15, 10), 13, seed=2)
for layer in ("SAGEConv", "GCNConv"):
    for impl, lib in (("st", st.nn), ("pyg", pyg_nn)):
        torch.manual_seed(0)
        model = mb.Net3(lib, layer).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        phases(f"minibatch {layer} {impl}", model, opt, batches)
        phases(f"minibatch {layer} {impl} again", model, opt, batches)
        if layer == "SAGEConv" and impl == "st":
            def step(batch):
                x, edge_index, y, size = batch
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x, edge_index)[:size], y).backward()
                opt.step()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
                for b in batches[3:8]: step(b)
                torch.cuda.synchronize()
            av = prof.key_averages()
            print("runtime calls:", {e.key: (e.count, round(e.self_cpu_time_total / 1e3, 2)) for e in av if e.key.startswith("cu")})
            print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=40, max_shapes_column_width=80))
            prof.export_chrome_trace(os.environ.get("OUT", "/tmp") + "/sage_st.json")
for name in ("cora", "pubmed"):
    ei, x, y, _ = planetoid_case(ctx.data_root, name)
    n = x.shape[0]; ei = ei.to(dev); x = x.to(dev); y = y.clamp(min=0).to(dev)
    channels = (x.shape[1], 16, int(y.max()) + 1)
    for layer in ("GCNConv", "SAGEConv"):
        for impl, lib in (("st", st.nn), ("pyg", pyg_nn)):
            torch.manual_seed(0)
            model = Net(lib, layer, channels).to(dev)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            phases(f"full {name} {layer} {impl}", model, opt, [(x, ei, y, n)] * 23)
