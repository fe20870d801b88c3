"""Layers (SparseLinear, GCNConv, graph batching), torch.compile of a model using them, and GCN on Cora."""
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from _helpers import DATA_DIR, HAS_PLANETOID, assert_matches, random_csr, randn

# --- SparseLinear --------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["global", "row"])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 1.0])
def test_sparse_linear_from_dense_prunes_by_magnitude(device, scheme, sparsity):
    torch.manual_seed(0)
    dense = torch.nn.Linear(40, 24, device=device, dtype=torch.float64)
    layer = st.nn.SparseLinear.from_dense(dense, sparsity=sparsity, scheme=scheme)
    w = dense.weight.detach()
    kept = layer.to_dense().detach() != 0
    if scheme == "global":
        assert layer.nnz == round((1 - sparsity) * w.numel())
        if 0 < layer.nnz < w.numel():  # every kept |w| >= every removed |w|
            assert w.abs()[kept].min() >= w.abs()[~kept].max()
    else:
        per_row = round((1 - sparsity) * 40)
        assert torch.all(kept.sum(1) == per_row)
        for r in range(24):
            if 0 < per_row < 40:
                assert w[r].abs()[kept[r]].min() >= w[r].abs()[~kept[r]].max()
    torch.testing.assert_close(layer.to_dense().detach(), torch.where(kept, w, torch.zeros_like(w)))
    assert layer.crow_indices.dtype == torch.int32


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_sparse_linear_matches_dense_forward_and_backward(device, rng, activation):
    torch.manual_seed(1)
    dense = torch.nn.Linear(30, 20, device=device, dtype=torch.float64)
    layer = st.nn.SparseLinear.from_dense(dense, sparsity=0.7, activation=activation)
    w_masked = layer.to_dense().detach().clone().requires_grad_()
    b_ref = dense.bias.detach().clone().requires_grad_()
    x = randn(rng, 2, 7, 30, device=device, dtype=torch.float64).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y = layer(x)
    y_ref = torch.nn.functional.linear(x_ref, w_masked, b_ref)
    if activation:
        y_ref = getattr(torch.nn.functional, activation)(y_ref)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(layer.bias.grad, b_ref.grad)
    rows = torch.repeat_interleave(torch.arange(20, device=device), torch.diff(layer.crow_indices.long()))
    torch.testing.assert_close(layer.values.grad, w_masked.grad[rows, layer.col_indices.long()])


def test_sparse_linear_trains(device):
    """SGD on a pruned layer fits a teacher with the same pattern; the pattern never changes."""
    torch.manual_seed(2)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(16, 8, device=device), sparsity=0.5, scheme="row")
    teacher = st.nn.SparseLinear(16, 8, layer.crow_indices, layer.col_indices, torch.randn_like(layer.values),
                                 torch.randn_like(layer.bias))
    pattern = layer.col_indices.clone()
    x = torch.randn(256, 16, device=device)
    with torch.no_grad():
        target = teacher(x)
    opt = torch.optim.SGD(layer.parameters(), lr=0.2)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(layer(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], losses
    assert torch.equal(layer.col_indices, pattern)


def test_sparse_linear_state_dict_round_trip(device):
    torch.manual_seed(3)
    src = st.nn.SparseLinear.from_dense(torch.nn.Linear(12, 10, device=device), sparsity=0.8)
    dst = st.nn.SparseLinear.from_dense(torch.nn.Linear(12, 10, device=device), sparsity=0.3)  # other nnz
    dst.load_state_dict(src.state_dict())
    assert dst.nnz == src.nnz
    x = torch.randn(5, 12, device=device)
    torch.testing.assert_close(dst(x), src(x))
    assert isinstance(dst.values, torch.nn.Parameter)
    assert "nnz=" in repr(dst)


def test_sparse_linear_from_sparse_and_errors(device, rng):
    w = random_csr(rng, 6, 9, 0.4)
    layer = st.nn.SparseLinear.from_sparse(w, bias=torch.zeros(6), dtype=torch.float32).to(device)
    assert layer.values.dtype == torch.float32 and layer.bias.dtype == torch.float32
    x = randn(rng, 4, 9, device=device)
    assert_matches(layer(x), (w @ x.double().cpu().numpy().T).T, torch.float32)
    with pytest.raises(ValueError, match="in_features"):
        layer(randn(rng, 4, 8, device=device))
    with pytest.raises(ValueError, match="sparsity"):
        st.nn.SparseLinear.from_dense(torch.nn.Linear(3, 3), sparsity=1.5)
    with pytest.raises(ValueError, match="scheme"):
        st.nn.SparseLinear.from_dense(torch.nn.Linear(3, 3), scheme="column")
    with pytest.raises(ValueError, match="bias: expected shape"):
        st.nn.SparseLinear(9, 6, layer.crow_indices.cpu(), layer.col_indices.cpu(), layer.values.detach().cpu(),
                           bias=torch.zeros(5))
    with pytest.raises(TypeError, match="nn.Linear"):
        st.nn.SparseLinear.from_dense("weights")


# --- GCN -----------------------------------------------------------------------------------------

def _symmetric_graph(rng, n, density, weighted=False):
    a = sp.random(n, n, density=density, format="csr", random_state=int(rng.integers(1 << 31)))
    a = a + a.T
    if not weighted:
        a.data[:] = 1.0
    return a.tocsr()


def _reference_propagation(a):
    a_hat = a.toarray() + np.eye(a.shape[0])
    d = a_hat.sum(1) ** -0.5
    return d[:, None] * a_hat * d[None, :]


@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_normalize_matches_definition(device, rng, weighted):
    a = _symmetric_graph(rng, 30, 0.1, weighted)
    a.setdiag(1.0)  # an existing diagonal entry stays, and the self loop adds to it
    norm = st.nn.gcn_normalize(st.from_scipy(a, device=device, dtype=torch.float64))
    np.testing.assert_allclose(st.to_scipy(norm).toarray(), _reference_propagation(a), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gcn_normalize_sums_half_types_in_float(device, rng, dtype):
    """A hub of 601 neighbours: its degree summed in bf16 would stop growing exactly past 256. Each
    value is the float product rounded once, within half an ulp of float64."""
    n = 700
    rows = np.concatenate([np.full(601, 3), rng.integers(0, n, 2000)])
    cols = np.concatenate([np.arange(601) + 50, rng.integers(0, n, 2000)])
    a = sp.coo_matrix((rng.random(rows.size) + 0.5, (rows, cols)), shape=(n, n)).tocsr()
    a = a + a.T
    a.data = torch.tensor(a.data).to(dtype).double().numpy()  # the input's own rounding is not the test's
    norm = st.nn.gcn_normalize(st.from_scipy(a, device=device, dtype=dtype))
    assert norm.dtype == dtype
    got = st.to_dense(norm.to(dtype=torch.float64)).cpu().numpy()
    np.testing.assert_allclose(got, _reference_propagation(a), rtol=torch.finfo(dtype).eps / 2 * 1.01, atol=0)


def test_add_self_loops_batched_keeps_padding_out(device, rng):
    mats = [_symmetric_graph(rng, 8, d) for d in (0.3, 0.0)]
    loops = st.nn.add_self_loops(st.from_list(mats, device=device))
    for got, mat in zip(st.to_scipy(loops), mats):
        np.testing.assert_allclose(got.toarray(), mat.toarray() + np.eye(8))


@pytest.mark.parametrize("channels", [(6, 5), (3, 7)])  # x @ W first, and the SpMM first (in < out)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_gcn_conv_matches_dense(device, rng, activation, channels):
    torch.manual_seed(4)
    a = _symmetric_graph(rng, 25, 0.15)
    conv = st.nn.GCNConv(*channels, activation=activation).to(device=device, dtype=torch.float64)
    x = randn(rng, 25, channels[0], device=device, dtype=torch.float64).requires_grad_()
    y = conv(x, st.from_scipy(a, device=device))
    a_hat = torch.from_numpy(_reference_propagation(a)).to(device)
    w = conv.lin.weight  # (out, in), as torch_geometric's
    y_ref = a_hat @ (x @ w.T) + conv.bias
    if activation:
        y_ref = torch.relu(y_ref)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    gx, gw, gb = torch.autograd.grad(y, (x, w, conv.bias), g)
    gx_ref, gw_ref, gb_ref = torch.autograd.grad(y_ref, (x, w, conv.bias), g)
    torch.testing.assert_close(gx, gx_ref)
    torch.testing.assert_close(gw, gw_ref)
    torch.testing.assert_close(gb, gb_ref)


def test_gcn_conv_loads_the_earlier_state_dict_layout(device):
    """State dicts of the earlier layout (``weight`` as (in, out)) still load; ``weight`` reads as before."""
    conv = st.nn.GCNConv(4, 3).to(device)
    old = {"weight": torch.randn(4, 3, device=device), "bias": torch.randn(3, device=device)}
    conv.load_state_dict(old)
    torch.testing.assert_close(conv.lin.weight, old["weight"].T)
    torch.testing.assert_close(conv.weight, old["weight"])
    assert set(conv.state_dict()) == {"lin.weight", "bias"}


def test_gcn_conv_batch_of_graphs_of_different_sizes(device, rng):
    torch.manual_seed(5)
    sizes = [9, 4, 13, 1]
    graphs = [_symmetric_graph(rng, n, 0.3) for n in sizes]
    feats = [randn(rng, n, 3, device=device, dtype=torch.float64) for n in sizes]
    conv = st.nn.GCNConv(3, 4, activation="tanh").to(device=device, dtype=torch.float64)
    adj, x, got_sizes = st.nn.batch_graphs([st.from_scipy(g, device=device) for g in graphs], feats)
    assert got_sizes == sizes and adj.shape == (4, 13, 13) and x.shape == (4, 13, 3)
    x.requires_grad_()
    outs = st.nn.unbatch(conv(x, adj), sizes)
    for out, g, f in zip(outs, graphs, feats):
        torch.testing.assert_close(out, conv(f, st.from_scipy(g, device=device)))
    sum(o.sum() for o in outs).backward()
    assert conv.lin.weight.grad is not None and torch.all(x.grad[1, 4:] == 0)  # padded rows get no gradient


def test_gcn_conv_cached_and_unnormalized(device, rng):
    a = st.from_scipy(_symmetric_graph(rng, 10, 0.3), device=device)
    conv = st.nn.GCNConv(2, 2, cached=True).to(device)
    x = torch.randn(10, 2, device=device)
    y1 = conv(x, a)
    assert conv._cached_adjacency is not None
    torch.testing.assert_close(conv(x, None), y1)  # cached: the graph argument is not read again
    plain = st.nn.GCNConv(2, 2, normalize=False).to(device)
    plain.load_state_dict(conv.state_dict())
    torch.testing.assert_close(plain(x, st.nn.gcn_normalize(a)), y1)


# --- torch.compile -------------------------------------------------------------------------------

class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = st.nn.GCNConv(8, 16, activation="relu")
        self.conv2 = st.nn.GCNConv(16, 6)
        self.head = st.nn.SparseLinear.from_dense(torch.nn.Linear(6, 5), sparsity=0.5, activation="gelu")

    def forward(self, x, adjacency):
        return self.head(self.conv2(self.conv1(x, adjacency), adjacency))


def test_model_compiles_fullgraph_and_matches_eager(device, rng):
    """Inductor, fullgraph: forward and gradients equal eager's."""
    torch.manual_seed(6)
    model = _Model().to(device)
    adjacency = st.from_scipy(_symmetric_graph(rng, 40, 0.1), device=device)
    x = torch.randn(40, 8, device=device, requires_grad=True)
    ref = model(x, adjacency)
    ref_grads = torch.autograd.grad(ref.sum(), (x, *model.parameters()))
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, adjacency)
    grads = torch.autograd.grad(out.sum(), (x, *model.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


# --- a real workload -----------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_PLANETOID, reason=f"Planetoid data not found under {DATA_DIR} (set SPARSETORCH_DATA)")
def test_gcn_on_cora_reaches_published_accuracy(device):
    """The paper's recipe, one seed: test accuracy at the best validation epoch >= 79%."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gcn_cora", os.path.join(os.path.dirname(__file__), "..", "examples", "gcn_cora.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from sparsetorch.datasets import load_planetoid

    ds = load_planetoid("cora", DATA_DIR)
    data = {"x": ds.features.to(device), "y": ds.labels.to(device), "train": ds.train_index.to(device),
            "val": ds.val_index.to(device), "test": ds.test_index.to(device)}
    torch.manual_seed(0)
    model = example.SparseGCN(ds.features.shape[1], 16, ds.num_classes).to(device)
    result = example.train(model, st.from_scipy(ds.adjacency, device=device), data, torch.device(device), 200)
    assert result["test_at_best_val"] >= 0.79, result
