"""Host time per call (no sync; GPU kept ahead of the host) of sparsetorch's ops against torch's, Cora-sized."""
import os, time, statistics
import torch
import sparsetorch as st
from sparsetorch._ops import ops
from sparsetorch.bench.suites.gnn import planetoid_case, power_law_edge_index
from sparsetorch.bench.suites import minibatch as mb
from sparsetorch.bench.suites.common import Context
from sparsetorch.bench.timing import make_timer

dev = torch.device("cuda")
root = os.environ.get("SPARSETORCH_DATA")
ei, x, y, _ = planetoid_case(root, "cora")
n = x.shape[0]; ei = ei.to(dev)
A = st.nn.gcn_norm(ei, num_nodes=n)
from sparsetorch._graph_build import build_graph
g = build_graph(ei[0], ei[1], None, n, n, loops="remaining", norm="gcn", dtype=torch.float32) if A is None else A
torch.cuda.synchronize()
crow, col, val = g.crow_indices, g.col_indices, g.values
B = torch.randn(n, 16, device=dev)
tcsr = torch.sparse_csr_tensor(crow, col, val, (n, n))
_k = getattr(ops.spmm.default, "_op", ops.spmm.default)

def host(tag, fn, reps=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps // 5): fn()
        ts.append((time.perf_counter() - t0) / (reps // 5) * 1e6)
    torch.cuda.synchronize()
    print(f"{tag:60s} {min(ts):7.1f} us/call host", flush=True)

with torch.no_grad():
    host("torch.sparse.mm (CSR)", lambda: torch.sparse.mm(tcsr, B))
    host("torch.add (dispatcher floor)", lambda: torch.add(B, B))
    host("torch mm [n,16]x[16,16]", lambda: B @ B[:16])
    host("ops.spmm auto validate", lambda: _k(crow, col, val, B, 1.0, None, 0.0, None, "none", 0.01, "auto", True))
    host("ops.spmm auto no-validate", lambda: _k(crow, col, val, B, 1.0, None, 0.0, None, "none", 0.01, "auto", False))
    host("ops.spmm native no-validate", lambda: _k(crow, col, val, B, 1.0, None, 0.0, None, "none", 0.01, "native", False))
    host("ops.spmm balanced no-validate", lambda: _k(crow, col, val, B, 1.0, None, 0.0, None, "none", 0.01, "balanced", False))
    host("ops.spmm cusparse validate", lambda: _k(crow, col, val, B, 1.0, None, 0.0, None, "none", 0.01, "cusparse", True))
    st.set_autotune(False)
    host("ops.spmm auto validate, autotune off", lambda: _k(crow, col, val, B, 1.0, None, 0.0, None, "none", 0.01, "auto", True))
    st.set_autotune(True)
    host("ops.spmm (OpOverloadPacket path) auto", lambda: ops.spmm(crow, col, val, B, 1.0, None, 0.0, None, "none", 0.01, "auto"))
    host("st.spmm(g, B) no grad", lambda: st.spmm(g, B))
    print("route:", st.spmm_route(g, B))
Bg = B.clone().requires_grad_()
host("st.spmm(g, Bg) recording grad (forward only)", lambda: st.spmm(g, Bg), reps=1000)
def fb():
    st.spmm(g, Bg).sum().backward()
def fb_t():
    torch.sparse.mm(tcsr, Bg).sum().backward()
host("st.spmm forward+backward (+sum)", fb, reps=500)
host("torch.sparse.mm forward+backward (+sum)", fb_t, reps=500)
# the builder, on a mini-batch-sized graph
ctx = Context(dev, make_timer(dev, True), None, True, None)
nodes = 300_000
graph = power_law_edge_index(nodes, 3_000_000, seed=7, device="cuda")
batches = mb.make_batches(ctx, graph, nodes, (15, 10), 3, seed=2)
e = batches[0][1]; nn_ = batches[0][0].shape[0]
host("_build_graph mean (mini-batch graph)", lambda: build_graph(e[0], e[1], None, nn_, nn_, norm="mean", dtype=torch.float32), reps=300)
host("_build_graph gcn+loops (mini-batch graph)", lambda: build_graph(e[0], e[1], None, nn_, nn_, loops="remaining", norm="gcn", dtype=torch.float32), reps=300)
W = torch.randn(256, 128, device=dev)
xs = [torch.randn(nn_ + i, 128, device=dev) for i in range(64)]
it = iter(range(10**9))
host("F.linear fixed M", lambda: torch.nn.functional.linear(xs[0], W))
host("F.linear new M each call (64 shapes cycled)", lambda: torch.nn.functional.linear(xs[next(it) % 64], W))
