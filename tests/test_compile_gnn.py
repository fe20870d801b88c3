"""GCNConv and SAGEConv under torch.compile: one graph and no breaks for every graph input a PyG user
holds, a bounded number of graphs for a stream of mini-batches (dynamic=True), training steps equal
to eager's whose backward sorts nothing, the bad-input contract inside a compiled graph, and (on a GPU)
a full-graph training step without host syncs under CUDA graphs (mode="reduce-overhead")."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import sparsetorch as st
from conftest import CUDA_READY

cuda = pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _edge_index(n, edges, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, edges), generator=g)
    return torch.cat([ei, ei.flip(0)], 1).to(device)  # undirected, with some self loops


class _FakeSparseTensor:
    """torch_sparse's SparseTensor as the layers read it (csr(), sparse_sizes()); torch_sparse itself
    is not installed where the tests run."""

    def __init__(self, edge_index, value, n):
        a = st.from_edge_index(edge_index, n, value, transpose=True)
        self._parts = (a.crow_indices.long(), a.col_indices.long(), a.values if value is not None else None)
        self._size = (n, n)

    def csr(self):
        return self._parts

    def sparse_sizes(self):
        return self._size


_FakeSparseTensor.__name__ = "SparseTensor"


def _graph_inputs(kind, ei, n):
    """The layer's graph arguments for each kind of input (a Data only where torch_geometric is there)."""
    w = torch.rand(ei.shape[1], generator=torch.Generator().manual_seed(1)).to(ei.device) + 0.5
    if kind == "edge_index":
        return (ei,)
    if kind == "weighted":
        return (ei, w)
    if kind == "csr":
        return (st.from_edge_index(ei, n, w, transpose=True),)
    if kind == "sparse_tensor":
        return (_FakeSparseTensor(ei, w, n),)
    if kind == "data":
        data = pytest.importorskip("torch_geometric.data")
        return (data.Data(edge_index=ei, num_nodes=n),)
    raise AssertionError(kind)


GCN_KINDS = ["edge_index", "weighted", "csr", "sparse_tensor", "data"]
SAGE_KINDS = ["edge_index", "csr", "sparse_tensor", "data"]  # SAGEConv takes no edge weights (as PyG)
CASES = [("GCNConv", k) for k in GCN_KINDS] + [("SAGEConv", k) for k in SAGE_KINDS]


class _Net(torch.nn.Module):
    def __init__(self, conv, channels=(12, 24, 5), **kwargs):
        super().__init__()
        self.conv1 = getattr(st.nn, conv)(channels[0], channels[1], **kwargs)
        self.conv2 = getattr(st.nn, conv)(channels[1], channels[2], **kwargs)

    def forward(self, x, *graph):
        return self.conv2(torch.relu(self.conv1(x, *graph)), *graph)


def _ops_run(call):
    """The ops ``call()`` dispatched (sparsetorch's and ATen's), in order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    return [e.name for e in prof.events() if e.name.startswith(("sparsetorch::", "aten::"))]


# --- one graph, no breaks -------------------------------------------------------------------------

@pytest.mark.parametrize("conv,kind", CASES)
def test_no_graph_breaks_and_fullgraph_matches_eager(conv, kind):
    n = 40
    ei = _edge_index(n, 120, seed=2)
    graph = _graph_inputs(kind, ei, n)
    torch.manual_seed(0)
    layer = getattr(st.nn, conv)(12, 6)
    x = torch.randn(n, 12)
    explained = torch._dynamo.explain(lambda x, *g: layer(x, *g))(x, *graph)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, *g: layer(x, *g), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, *graph), layer(x, *graph), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("conv,kind", [("GCNConv", "edge_index"), ("GCNConv", "weighted"), ("GCNConv", "csr"),
                                       ("SAGEConv", "edge_index"), ("SAGEConv", "sparse_tensor")])
def test_compiled_model_trains_as_eager_and_its_backward_sorts_nothing(conv, kind):
    """The usual pattern (compiled model, backward outside): loss and every gradient equal eager's. The
    compiled step runs one builder call per graph and no sort: the backward multiplies by the A^T the
    builder made (aot_eager, so that every ATen op of the step shows in the profile)."""
    n = 50
    ei = _edge_index(n, 160, seed=3)
    graph = _graph_inputs(kind, ei, n)
    x, y = torch.randn(n, 12), torch.randint(0, 5, (n,))
    torch.manual_seed(0)
    model = _Net(conv)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)

    def grads(m):
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(m(x, *graph), y)
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters()]

    for got, want in zip(grads(compiled), grads(model)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    ops = _ops_run(lambda: grads(compiled))
    assert not [op for op in ops if "sort" in op], ops
    assert ops.count("sparsetorch::_build_graph") == 1, ops  # one graph, two layers
    # Two products forward, one A^T product backward: layer 1 (12 -> 24) multiplies x itself, which needs
    # no gradient.
    assert ops.count("sparsetorch::spmm") == 3, ops


def test_inductor_training_step_with_backward_inside_matches_eager():
    """Inductor, the whole step compiled (forward, loss.backward(), the loss returned detached). torch
    itself breaks the graph at Tensor.backward() unless torch._dynamo.config.trace_autograd_ops is set;
    with it the step is one graph."""
    n = 60
    ei = _edge_index(n, 200, seed=4)
    x, y = torch.randn(n, 12), torch.randint(0, 5, (n,))
    for conv in ("GCNConv", "SAGEConv"):
        torch.manual_seed(0)
        model = _Net(conv)

        def step(x, ei, y):
            loss = torch.nn.functional.cross_entropy(model(x, ei), y)
            loss.backward()
            return loss.detach()

        want = step(x, ei, y)
        want_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        traced = hasattr(torch._dynamo.config, "trace_autograd_ops")
        with torch._dynamo.config.patch(trace_autograd_ops=True) if traced else torch.enable_grad():
            got = torch.compile(step, fullgraph=traced)(x, ei, y)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for p, g in zip(model.parameters(), want_grads):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
        torch._dynamo.reset()


def test_learnable_edge_weights_compile_and_get_their_gradient():
    n = 30
    ei = _edge_index(n, 80, seed=5)
    w = torch.rand(ei.shape[1]) + 0.5
    x = torch.randn(n, 12)
    torch.manual_seed(0)
    layer = st.nn.GCNConv(12, 4)
    explained = torch._dynamo.explain(lambda x, ei, w: layer(x, ei, w))(x, ei, w.requires_grad_())
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, ei, w: layer(x, ei, w), backend="aot_eager", fullgraph=True)
    (g_compiled,) = torch.autograd.grad(compiled(x, ei, w).square().sum(), (w,))
    (g_eager,) = torch.autograd.grad(layer(x, ei, w).square().sum(), (w,))
    torch.testing.assert_close(g_compiled, g_eager, rtol=1e-5, atol=1e-6)
    assert g_eager.abs().sum() > 0


# --- mini-batches of different sizes ---------------------------------------------------------------

@pytest.mark.parametrize("conv", ["GCNConv", "SAGEConv"])
def test_minibatch_stream_compiles_a_bounded_number_of_graphs(conv):
    """dynamic=True: ten batches of different node and edge counts (sizes 0 and 1 left out: torch
    specialises them) compile on the first batch only, and each output equals eager's."""
    torch.manual_seed(0)
    model = _Net(conv)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    g = torch.Generator().manual_seed(6)
    frames = None
    for step in range(10):
        n = int(torch.randint(20, 300, (), generator=g))
        e = int(torch.randint(2 * n, 8 * n, (), generator=g))
        ei, x = torch.randint(0, n, (2, e), generator=g), torch.randn(n, 12, generator=g)
        out = compiled(x, ei)
        out.sum().backward()
        torch.testing.assert_close(out, model(x, ei), rtol=1e-5, atol=1e-6)
        frames = counter.frame_count if frames is None else frames
        assert counter.frame_count == frames, f"batch {step} ({n} nodes, {e} edges) recompiled"
    assert frames <= 2


def test_cached_layer_builds_once_under_compile():
    """cached=True: the first compiled call builds the graph inside the compiled graph and keeps it on the
    layer; the next call recompiles once to read it, and from then on a step runs no builder."""
    n = 40
    ei = _edge_index(n, 120, seed=7)
    x = torch.randn(n, 12)
    for conv in ("GCNConv", "SAGEConv"):
        torch.manual_seed(0)
        model = _Net(conv, cached=True)
        eager = _Net(conv)
        eager.load_state_dict(model.state_dict())
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        for _ in range(3):
            torch.testing.assert_close(compiled(x, ei), eager(x, ei), rtol=1e-5, atol=1e-6)
        assert counter.frame_count <= 2
        ops = _ops_run(lambda: compiled(x, ei).sum().backward())
        assert "sparsetorch::_build_graph" not in ops and "sparsetorch::spmm" in ops, ops
        torch._dynamo.reset()


# --- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("conv", ["GCNConv", "SAGEConv"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_out_of_range_edge_index_raises_index_error_compiled(conv, backend):
    n = 30
    ei = _edge_index(n, 60, seed=8)
    x = torch.randn(n, 12)
    layer = getattr(st.nn, conv)(12, 4)
    compiled = torch.compile(lambda x, ei: layer(x, ei), backend=backend, fullgraph=True, dynamic=True)
    compiled(x, ei)
    for position, value in (((1, 17), n + 3), ((0, 5), -1), ((0, 0), n)):
        bad = ei.clone()
        bad[position] = value
        for run in (lambda: layer(x, bad), lambda: compiled(x, bad)):
            with pytest.raises(IndexError, match=r"edge_index: edge \d+ \(source -?\d+, target \d+\) is out of range"):
                run()
    if conv == "GCNConv":  # learnable weights: the same check (the op gives their pattern)
        w = torch.rand(ei.shape[1], requires_grad=True)
        weighted = torch.compile(lambda x, ei, w: layer(x, ei, w), backend=backend, fullgraph=True)
        weighted(x, ei, w)
        with pytest.raises(IndexError, match="edge_index"):
            weighted(x, bad, w)


@pytest.mark.parametrize("conv", ["GCNConv", "SAGEConv"])
def test_malformed_csr_raises_value_error_compiled(conv):
    """A malformed st.CSR adjacency is refused inside the compiled graph too (the op that reads its
    rows checks it first), never normalised into a wrong matrix."""
    n = 30
    a = st.from_edge_index(_edge_index(n, 60, seed=9), n, transpose=True)
    x = torch.randn(n, 12)
    layer = getattr(st.nn, conv)(12, 4)
    compiled = torch.compile(lambda x, a: layer(x, a), backend="aot_eager", fullgraph=True)
    compiled(x, a)
    crow = a.crow_indices.clone()
    crow[5], crow[6] = crow[6], crow[5] - 1  # not non-decreasing
    col = a.col_indices.clone()
    col[3] = n + 100  # out of range
    for bad, message in ((st.CSR(crow, a.col_indices, a.values, a.shape), "crow_indices is not non-decreasing"),
                         (st.CSR(a.crow_indices, col, a.values, a.shape), "out of range")):
        for run in (lambda: layer(x, bad), lambda: compiled(x, bad)):
            with pytest.raises(ValueError, match=message):
                run()


def test_torch_sparse_tensors_stay_outside_the_compiled_function():
    """torch cannot wrap a sparse tensor in a compiled graph; st.from_torch(A) outside it can (docs/api.md)."""
    n = 30
    ei = _edge_index(n, 60, seed=10)
    adj_t = st.from_edge_index(ei, n, transpose=True).to_torch()
    layer = st.nn.GCNConv(12, 4)
    x = torch.randn(n, 12)
    compiled = torch.compile(lambda x, a: layer(x, a), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="(?i)sparse"):
        compiled(x, adj_t)
    torch.testing.assert_close(compiled(x, st.from_torch(adj_t)), layer(x, adj_t), rtol=1e-5, atol=1e-6)


# --- on a GPU: the full-graph step under CUDA graphs ---------------------------------------------------

def _planetoid_sized(device, n=2708, edges=5278, features=1433, classes=7):
    g = torch.Generator().manual_seed(11)
    ei = torch.randint(0, n, (2, edges), generator=g)
    ei = torch.cat([ei, ei.flip(0)], 1).to(device)
    x = torch.randn(n, features, generator=g).to(device)
    return ei, x, torch.randint(0, classes, (n,), generator=g).to(device)


@cuda
@pytest.mark.parametrize("conv", ["GCNConv", "SAGEConv"])
def test_full_graph_training_step_has_no_host_sync(conv):
    """A warm full-graph step (cached=True: the graph built once) reads nothing back from the GPU:
    no .item(), no analysis read, no check, no allocation that waits."""
    ei, x, y = _planetoid_sized("cuda")
    torch.manual_seed(0)
    model = _Net(conv, (x.shape[1], 16, 7), cached=True).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x, ei), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):  # the graph built and its check landed, the products routed and tuned
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


@cuda
@pytest.mark.parametrize("conv", ["GCNConv", "SAGEConv"])
def test_reduce_overhead_full_graph_step_matches_eager(conv):
    """torch.compile(mode="reduce-overhead") (CUDA graphs) of a full-graph training step: the losses and
    the trained weights follow eager's over ten steps."""
    ei, x, y = _planetoid_sized("cuda")

    def train(compiled):
        torch.manual_seed(0)
        model = _Net(conv, (x.shape[1], 16, 7), cached=True).cuda()
        if compiled:  # the graph built outside the CUDA graphs (docs/api.md: a matrix built inside is their output)
            with torch.no_grad():
                model(x, ei)
        forward = torch.compile(model, mode="reduce-overhead", fullgraph=True) if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(10):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(forward(x, ei), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        return torch.stack(losses), [p.detach().clone() for p in model.parameters()]

    (l_eager, p_eager), (l_compiled, p_compiled) = train(False), train(True)
    torch.testing.assert_close(l_compiled, l_eager, rtol=1e-4, atol=1e-5)
    for a, b in zip(p_compiled, p_eager):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


@cuda
def test_out_of_range_edge_index_raises_compiled_on_cuda():
    """On CUDA the builder's check lands after the build: the compiled call returns NaN (never a wrong
    number) and the graph's next use raises IndexError naming edge_index (docs/safety.md)."""
    n = 30
    ei = _edge_index(n, 60, seed=12, device="cuda")
    x = torch.randn(n, 12, device="cuda")
    layer = st.nn.GCNConv(12, 4).cuda()
    compiled = torch.compile(lambda x, ei: layer(x, ei), fullgraph=True)
    compiled(x, ei)
    bad = ei.clone()
    bad[1, 17] = n + 3
    with pytest.raises(IndexError, match="edge_index"):
        y = compiled(x, bad)
        assert torch.isnan(y).all()
        torch.cuda.synchronize()
        compiled(x, ei)  # the next graph built reports it at the latest
