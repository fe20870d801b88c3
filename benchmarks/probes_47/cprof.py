"""cProfile of the host path: sparsetorch SAGE / GCN mini-batch steps and a full-graph Cora GCN step."""
import os, sys, time, cProfile, pstats, io
import torch, torch.nn.functional as F
import sparsetorch as st
from sparsetorch.bench.suites.common import Context
from sparsetorch.bench.timing import make_timer
from sparsetorch.bench.suites import minibatch as mb
from sparsetorch.bench.suites.gnn import Net, planetoid_case, power_law_edge_index

dev = torch.device("cuda")
ctx = Context(dev, make_timer(dev, True), None, True, os.environ.get("SPARSETORCH_DATA"))
nodes = 300_000
graph = power_law_edge_index(nodes, 3_000_000, seed=7, device="cuda")
batches = mb.make_batches(ctx, graph, nodes, (15, 10), 25, seed=2)

def prof(tag, step, items):
    for it in items[:5]: step(it)
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for it in items[5:]: step(it)
    torch.cuda.synchronize()
    pr.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats(key).print_stats(45)
        print(f"==== {tag} by {key} ({len(items) - 5} steps)\n" + s.getvalue()[-9000:], flush=True)

for layer in ("SAGEConv", "GCNConv"):
    torch.manual_seed(0)
    model = mb.Net3(st.nn, layer).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    def step(b):
        x, ei, y, size = b
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x, ei)[:size], y).backward()
        opt.step()
    prof(f"minibatch {layer}", step, batches)
ei, x, y, _ = planetoid_case(ctx.data_root, "cora")
n = x.shape[0]; ei = ei.to(dev); x = x.to(dev); y = y.clamp(min=0).to(dev)
model = Net(st.nn, "GCNConv", (x.shape[1], 16, int(y.max()) + 1)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
def step(_):
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x, ei), y).backward()
    opt.step()
prof("full cora GCNConv", step, [None] * 25)
