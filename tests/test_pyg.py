"""The PyTorch Geometric drop-in: st.from_edge_index / st.to_edge_index, GCNConv and SAGEConv against
torch_geometric's layers (same weights: outputs and gradients, forward and backward, every input kind
PyG users hold), state dicts both ways, the per-graph cache, the transpose the builder makes with a
propagation matrix (the backward builds none), and the protocol of distributed adjacencies."""
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
import sparsetorch._transpose as st_transpose
from _helpers import DATA_DIR, HAS_PLANETOID

pyg = pytest.importorskip("torch_geometric")
pyg_nn = pytest.importorskip("torch_geometric.nn")
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.utils import to_torch_csr_tensor, to_undirected  # noqa: E402



def _graph(n=60, edges=240, seed=0, undirected=True, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, edges), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    if undirected:
        ei = to_undirected(ei, num_nodes=n)
    return ei.to(device)


class _Net(torch.nn.Module):
    """PyG's 2-layer recipe; ``lib`` is torch_geometric.nn or sparsetorch.nn."""

    def __init__(self, lib, conv, channels, **kwargs):
        super().__init__()
        self.conv1 = getattr(lib, conv)(channels[0], channels[1], **kwargs)
        self.conv2 = getattr(lib, conv)(channels[1], channels[2], **kwargs)

    def forward(self, x, *graph):
        return self.conv2(torch.relu(self.conv1(x, *graph)), *graph)


def _pair(conv, channels, device, **kwargs):
    torch.manual_seed(0)
    ref = _Net(pyg_nn, conv, channels, **kwargs).to(device)
    ours = _Net(st.nn, conv, channels, **kwargs).to(device)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _compare(ref, ours, x, ref_graph, our_graph=None, rtol=1e-4, atol=1e-5):
    """Forward, then backward of the same random cotangent: outputs, x's gradient and every
    parameter's gradient (by name) agree to float32 tolerance."""
    our_graph = ref_graph if our_graph is None else our_graph
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yo = ref(xr, *ref_graph), ours(xo, *our_graph)
    torch.testing.assert_close(yo, yr, rtol=rtol, atol=atol)
    g = torch.randn_like(yr)
    yr.backward(g)
    yo.backward(g)
    torch.testing.assert_close(xo.grad, xr.grad, rtol=rtol, atol=atol)
    grads = {k: p.grad for k, p in ours.named_parameters()}
    for k, p in ref.named_parameters():
        torch.testing.assert_close(grads[k], p.grad, rtol=rtol, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


# --- conversions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_from_edge_index_matches_scipy_and_round_trips(device, index_dtype):
    ei = torch.tensor([[0, 2, 2, 1, 0, 2], [1, 0, 0, 3, 1, 2]], dtype=index_dtype, device=device)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], device=device)
    a = st.from_edge_index(ei, num_nodes=5, edge_weight=w)
    ref = sp.coo_matrix((w.cpu().numpy(), (ei[0].cpu().numpy(), ei[1].cpu().numpy())), shape=(5, 5)).toarray()
    np.testing.assert_allclose(st.to_dense(a).cpu().numpy(), ref)  # repeated edges sum
    assert a.shape == (5, 5) and a.nnz == 6 and a.index_dtype == torch.int32
    np.testing.assert_allclose(st.to_dense(st.from_edge_index(ei, 5, w, transpose=True)).cpu().numpy(), ref.T)
    back, bw = st.to_edge_index(a)
    assert back.dtype == torch.int64
    again = st.from_edge_index(back, 5, bw)
    torch.testing.assert_close(st.to_dense(again), st.to_dense(a))
    # PyG's own conversions agree with ours.
    from torch_geometric.utils import to_edge_index as pyg_to_edge_index
    pyg_ei, pyg_w = pyg_to_edge_index(to_torch_csr_tensor(ei.long(), w, size=(5, 5)))
    torch.testing.assert_close(st.to_dense(st.from_edge_index(pyg_ei, 5, pyg_w)), st.to_dense(a))


def test_from_edge_index_defaults_data_and_empty(device):
    ei = torch.tensor([[0, 3], [3, 1]], device=device)
    a = st.from_edge_index(ei)  # num_nodes = max + 1, weights ones
    assert a.shape == (4, 4) and a.dtype == torch.float32
    torch.testing.assert_close(st.to_dense(a)[0, 3], torch.tensor(1.0, device=device))
    data = Data(edge_index=ei, edge_weight=torch.tensor([2.0, 5.0], device=device), num_nodes=6)
    b = st.from_edge_index(data)
    assert b.shape == (6, 6) and st.to_dense(b)[3, 1].item() == 5.0
    empty = st.from_edge_index(torch.zeros(2, 0, dtype=torch.long, device=device), num_nodes=3)
    assert empty.shape == (3, 3) and empty.nnz == 0
    bip_ei = torch.tensor([[0, 3], [1, 0]], device=device)
    bip = st.from_edge_index(bip_ei, num_nodes=(4, 2), transpose=True)  # (sources, targets): adj_t is (2, 4)
    assert bip.shape == (2, 4) and st.to_dense(bip)[0, 3].item() == 1.0
    with pytest.raises(IndexError, match="row 1 holds node index 3"):
        st.from_edge_index(ei, num_nodes=(4, 2))


def test_from_edge_index_is_differentiable_in_the_weights():
    ei = torch.tensor([[0, 1, 1], [1, 0, 2]])
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 2, dtype=torch.float64)
    st.spmm(st.from_edge_index(ei, 3, w), x).sum().backward()
    torch.testing.assert_close(w.grad, x.sum(1)[ei[1]])


def test_from_edge_index_errors():
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match="edge_index"):
        st.from_edge_index(ei.float())
    with pytest.raises(TypeError, match="edge_index"):
        st.from_edge_index(torch.tensor([0, 1, 2]))
    with pytest.raises(IndexError, match="edge_index.*out of range"):
        st.from_edge_index(ei, num_nodes=2)
    with pytest.raises(IndexError, match=">= 0"):
        st.from_edge_index(torch.tensor([[0, -1], [1, 0]]))
    with pytest.raises(ValueError, match="edge_weight"):
        st.from_edge_index(ei, 3, torch.ones(3))
    with pytest.raises(TypeError, match="edge_weight"):
        st.from_edge_index(ei, 3, torch.ones(2, dtype=torch.long))
    with pytest.raises(ValueError, match="num_nodes"):
        st.from_edge_index(ei, -1)


# --- equivalence with torch_geometric ------------------------------------------------------------

# (layer keywords, input kind, undirected graph)
GCN_CASES = [({}, "edge_index", True), ({}, "edge_index", False), ({}, "weighted", True), ({}, "weighted", False),
             ({}, "csr", True), ({}, "csr", False), ({}, "data", True), ({"improved": True}, "weighted", True),
             ({"improved": True}, "csr", False), ({"add_self_loops": False}, "edge_index", True),
             ({"normalize": False}, "weighted", False), ({"bias": False, "cached": True}, "edge_index", True)]
SAGE_CASES = [({}, "edge_index", True), ({}, "edge_index", False), ({}, "csr", True), ({}, "csr", False),
              ({}, "data", True), ({"normalize": True}, "edge_index", True),
              ({"root_weight": False}, "edge_index", False), ({"project": True}, "edge_index", True),
              ({"aggr": "sum"}, "edge_index", False), ({"bias": False}, "csr", True)]


def _inputs(kind, ei, n, device, weight=None):
    if kind == "edge_index":
        return (ei,), (ei,)
    if kind == "weighted":
        return (ei, weight), (ei, weight)
    if kind == "csr":
        adj_t = to_torch_csr_tensor(ei.flip(0), weight, size=(n, n))
        return (adj_t,), (adj_t,)
    if kind == "data":
        return (ei,), (Data(edge_index=ei, num_nodes=n),)
    raise AssertionError(kind)


@pytest.mark.parametrize("channels", [(8, 32, 4), (16, 6, 3)])  # in < out: SpMM first in layer 1
@pytest.mark.parametrize("kwargs,kind,undirected", GCN_CASES)
def test_gcn_matches_torch_geometric(device, kwargs, kind, channels, undirected):
    n = 60
    ei = _graph(n, undirected=undirected, device=device)
    weight = torch.rand(ei.shape[1], device=device) + 0.5
    ref, ours = _pair("GCNConv", channels, device, **kwargs)
    ref_graph, our_graph = _inputs(kind, ei, n, device, weight)
    x = torch.randn(n, channels[0], device=device)
    _compare(ref, ours, x, ref_graph, our_graph)
    if kwargs.get("cached"):  # the cached matrix is used, whatever graph comes next
        assert ours.conv1._cached_adjacency is not None


@pytest.mark.parametrize("channels", [(8, 32, 4), (16, 6, 3)])
@pytest.mark.parametrize("kwargs,kind,undirected", SAGE_CASES)
def test_sage_matches_torch_geometric(device, kwargs, kind, channels, undirected):
    n = 60
    ei = _graph(n, seed=1, undirected=undirected, device=device)
    ref, ours = _pair("SAGEConv", channels, device, **kwargs)
    ref_graph, our_graph = _inputs(kind, ei, n, device)
    _compare(ref, ours, torch.randn(n, channels[0], device=device), ref_graph, our_graph)


def test_sage_bipartite_with_size(device):
    torch.manual_seed(1)
    n_src, n_dst = 30, 12
    ei = torch.stack([torch.randint(0, n_src, (90,)), torch.randint(0, n_dst, (90,))]).to(device)
    for cin in [(5, 7), (9, 3)]:
        ref = pyg_nn.SAGEConv(cin, 6).to(device)
        ours = st.nn.SAGEConv(cin, 6).to(device)
        ours.load_state_dict(ref.state_dict())
        xs, xd = torch.randn(n_src, cin[0], device=device), torch.randn(n_dst, cin[1], device=device)
        torch.testing.assert_close(ours((xs, xd), ei), ref((xs, xd), ei), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours((xs, None), ei, size=(n_src, n_dst)),
                                   ref((xs, None), ei, size=(n_src, n_dst)), rtol=1e-4, atol=1e-5)


def test_edge_weight_gradient_matches_torch_geometric(device):
    n = 40
    ei = _graph(n, 160, seed=2, device=device)
    w = (torch.rand(ei.shape[1], device=device) + 0.5)
    ref, ours = _pair("GCNConv", (6, 5, 3), device)
    wr, wo = w.clone().requires_grad_(), w.clone().requires_grad_()
    x = torch.randn(n, 6, device=device)
    yr, yo = ref(x, ei, wr), ours(x, ei, wo)
    torch.testing.assert_close(yo, yr, rtol=1e-4, atol=1e-5)
    g = torch.randn_like(yr)
    yr.backward(g)
    yo.backward(g)
    torch.testing.assert_close(wo.grad, wr.grad, rtol=1e-4, atol=1e-5)


class _FakeSparseTensor:
    """torch_sparse's SparseTensor as the layers read it (csr(), sparse_sizes()); torch_sparse
    itself is not installed where the tests run."""

    def __init__(self, row, col, value, size):
        a = st.from_edge_index(torch.stack([row, col]), num_nodes=size[0],
                               edge_weight=value if value is not None else None)
        self._rowptr, self._col = a.crow_indices.long(), a.col_indices.long()
        self._value = a.values if value is not None else None
        self._size = size

    def csr(self):
        return self._rowptr, self._col, self._value

    def sparse_sizes(self):
        return self._size


_FakeSparseTensor.__name__ = "SparseTensor"


def test_sparse_tensor_input_fills_the_diagonal(device):
    """A SparseTensor adj_t: GCN sets its diagonal to the fill value (torch_sparse.fill_diag in PyG's
    gcn_norm), SAGE drops its values; both equal PyG on the same graph given as edge_index."""
    n = 30
    ei = _graph(n, 100, seed=3, device=device)
    loops = torch.arange(0, n, 3, device=device)
    ei = torch.cat([ei, torch.stack([loops, loops])], 1)  # some existing self loops
    value = torch.rand(ei.shape[1], device=device) + 0.5
    adj_t = _FakeSparseTensor(ei[1], ei[0], value, (n, n))
    ours = st.nn.GCNConv(4, 3, improved=True).to(device)
    x = torch.randn(n, 4, device=device)
    dense = torch.zeros(n, n, device=device).index_put_((ei[1], ei[0]), value, accumulate=True)
    dense.fill_diagonal_(2.0)
    d = dense.sum(1).pow(-0.5)
    a_hat = d[:, None] * dense * d[None, :]
    torch.testing.assert_close(ours(x, adj_t), a_hat @ ours.lin(x) + ours.bias, rtol=1e-4, atol=1e-5)
    sage_ref = pyg_nn.SAGEConv(4, 3).to(device)
    sage = st.nn.SAGEConv(4, 3).to(device)
    sage.load_state_dict(sage_ref.state_dict())
    torch.testing.assert_close(sage(x, adj_t), sage_ref(x, ei), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_PLANETOID, reason=f"Planetoid data not found under {DATA_DIR}")
@pytest.mark.parametrize("conv", ["GCNConv", "SAGEConv"])
def test_two_layer_model_on_cora_matches_torch_geometric(device, conv):
    from sparsetorch.datasets import load_planetoid

    ds = load_planetoid("cora", DATA_DIR)
    coo = ds.adjacency.tocoo()
    ei = torch.from_numpy(np.stack([coo.row, coo.col])).long().to(device)
    ref, ours = _pair(conv, (ds.features.shape[1], 16, ds.num_classes), device)
    _compare(ref, ours, ds.features.to(device), (ei,))


# --- the PyG API ---------------------------------------------------------------------------------

@pytest.mark.parametrize("conv,kwargs", [("GCNConv", {}), ("GCNConv", {"bias": False}), ("SAGEConv", {}),
                                         ("SAGEConv", {"project": True, "root_weight": False}),
                                         ("SAGEConv", {"bias": False})])
def test_state_dict_loads_both_ways(conv, kwargs):
    ref = getattr(pyg_nn, conv)(7, 5, **kwargs)
    ours = getattr(st.nn, conv)(7, 5, **kwargs)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    ours.load_state_dict(ref.state_dict())  # strict: same names, same shapes
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(1.0)
    ref.load_state_dict(ours.state_dict())
    for (k, a), (_, b) in zip(sorted(ref.state_dict().items()), sorted(ours.state_dict().items())):
        torch.testing.assert_close(a, b, msg=k)


def test_unsupported_pyg_arguments_raise_naming_them():
    with pytest.raises(ValueError, match="flow='target_to_source'"):
        st.nn.GCNConv(4, 4, flow="target_to_source")
    with pytest.raises(ValueError, match="aggr='mean'"):
        st.nn.GCNConv(4, 4, aggr="mean")
    with pytest.raises(TypeError, match="cheese=1"):
        st.nn.GCNConv(4, 4, cheese=1)
    with pytest.raises(ValueError, match="in_channels"):
        st.nn.GCNConv(-1, 4)
    with pytest.raises(ValueError, match="add_self_loops"):
        st.nn.GCNConv(4, 4, add_self_loops=True, normalize=False)
    with pytest.raises(ValueError, match="aggr='max'"):
        st.nn.SAGEConv(4, 4, aggr="max")
    with pytest.raises(ValueError, match="aggr="):
        st.nn.SAGEConv(4, 4, aggr=["mean", "max"])
    with pytest.raises(ValueError, match="in_channels"):
        st.nn.SAGEConv(-1, 4)
    st.nn.GCNConv(4, 4, aggr="add", flow="source_to_target", node_dim=-2)  # PyG's defaults are fine
    conv = st.nn.GCNConv(4, 4)
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="bipartite"):
        conv((torch.randn(2, 4), torch.randn(2, 4)), ei)
    with pytest.raises(ValueError, match="in_channels"):
        conv(torch.randn(2, 5), ei)
    with pytest.raises(ValueError, match="edge_weight"):
        conv(torch.randn(2, 4), st.from_edge_index(ei), torch.ones(2))
    with pytest.raises(IndexError, match="out of range"):
        conv(torch.randn(2, 4), torch.tensor([[0, 2], [1, 0]]))


def test_improved_without_weights_follows_torch_geometric_and_warns():
    """torch_geometric 2.8's gcn_norm gives self loops weight 1 for improved=True when an edge_index
    comes without edge_weight; ours does the same (say so once), and A + 2I with weights."""
    ei = _graph(20, 60, seed=4)
    ref, ours = pyg_nn.GCNConv(3, 2, improved=True), st.nn.GCNConv(3, 2, improved=True)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(20, 3)
    st.nn.gcn._warned_improved = False
    with pytest.warns(UserWarning, match="improved=True"):
        torch.testing.assert_close(ours(x, ei), ref(x, ei))


def test_data_and_layer_call_forms(device):
    n = 25
    ei = _graph(n, 80, seed=5, device=device)
    x = torch.randn(n, 4, device=device)
    conv = st.nn.GCNConv(4, 3).to(device)
    data = Data(x=x, edge_index=ei)
    torch.testing.assert_close(conv(data), conv(x, ei))
    torch.testing.assert_close(conv(x, data), conv(x, ei))
    torch.testing.assert_close(conv(x, st.from_edge_index(ei, n, transpose=True)), conv(x, ei))
    coo = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], device=device), (n, n))
    torch.testing.assert_close(conv(x, coo), conv(x, ei))  # converted to CSR, as PyG does
    sage = st.nn.SAGEConv(4, 3).to(device)
    torch.testing.assert_close(sage(x, coo), sage(x, ei))


# --- no wasted work ------------------------------------------------------------------------------

def _sparsetorch_ops(run):
    """The sparsetorch ops ``run()`` dispatched, in order, however the Python layer calls them (the
    profiler records every dispatcher call)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    return [e.name.split("::")[1] for e in prof.events() if e.name.startswith("sparsetorch::")]


@pytest.mark.parametrize("undirected", [True, False])
def test_backward_builds_no_transpose_and_runs_no_sddmm(device, monkeypatch, undirected):
    """GCN's D^-1/2 (A+I) D^-1/2 and SAGE's D^-1 A, of any graph: the backward's A^T @ grad runs on
    the A^T the builder made with A (no transpose built, no values gathered); adjacency values that
    need no gradient get none (no SDDMM)."""
    n = 50
    ei = _graph(n, 200, seed=6, undirected=undirected, device=device)
    def no_transpose(*args):
        raise AssertionError("a transpose pattern was built")

    monkeypatch.setattr(st_transpose, "_compute", no_transpose)
    for conv in ("GCNConv", "SAGEConv"):
        ref, ours = _pair(conv, (16, 6, 3), device)
        names = _sparsetorch_ops(lambda: _compare(ref, ours, torch.randn(n, 16, device=device), (ei,)))
        assert "sddmm" not in names, names
        assert names.count("_build_graph") == 1, names  # one graph, both layers
        assert names.count("spmm") == 4, names  # 2 layers, 2 products each: the backward's A^T @ grad ran


def test_spmm_runs_on_the_narrower_side(device, monkeypatch):
    """in < out: (Â x) W^T, the SpMM at in_channels' width; else Â (x W^T) at out_channels'."""
    widths = []
    real = st.nn._pyg.F.spmm

    def spy(a, b, **kw):
        widths.append(b.shape[-1])
        return real(a, b, **kw)

    monkeypatch.setattr(st.nn._pyg.F, "spmm", spy)
    ei = _graph(30, 90, seed=8, device=device)
    x = torch.randn(30, 4, device=device)
    st.nn.GCNConv(4, 64).to(device)(x, ei)
    st.nn.GCNConv(4, 2).to(device)(x, ei)
    st.nn.SAGEConv(4, 64).to(device)(x, ei)
    st.nn.SAGEConv(4, 2).to(device)(x, ei)
    assert widths == [4, 2, 4, 2]


def test_graph_is_built_once_per_edge_index(device, monkeypatch):
    calls = []
    real = st.nn.gcn._gcn_graph

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(st.nn.gcn, "_gcn_graph", counting)
    ei = _graph(30, 90, seed=9, device=device)
    x = torch.randn(30, 4, device=device)
    model = _Net(st.nn, "GCNConv", (4, 8, 2)).to(device)
    for _ in range(3):
        model(x, ei).sum().backward()
    assert len(calls) == 1  # two layers, three steps: one build
    other = ei.clone()
    model(x, other)
    assert len(calls) == 2  # another tensor: built again
    other[0, 0] = (other[0, 0] + 1) % 30  # an in-place change invalidates the entry
    model(x, other)
    assert len(calls) == 3
    w = torch.rand(other.shape[1], device=device, requires_grad=True)
    model(x, other, w)
    model(x, other, w)
    assert len(calls) == 7  # learnable weights: the matrix depends on them, built by each layer each call
    with torch.inference_mode():
        model(x, ei)


def test_graph_caches_are_listed_die_with_their_tensors_and_are_bounded(device):
    """The per-graph cache and the transpose caches (sparsetorch/_cache.py) are in st.cache_info(): an
    entry lives as long as its key tensors, at most 16 graphs are kept, st.clear_caches() empties them."""
    names = ("graph.propagation", "transpose.patterns", "transpose.values")
    st.clear_caches()
    conv = st.nn.GCNConv(4, 2).to(device)
    x = torch.randn(30, 4, device=device, requires_grad=True)
    ei = _graph(30, 90, seed=12, device=device)
    conv(x, ei).sum().backward()
    assert [st.cache_info()[name] for name in names] == [1, 1, 1]
    del ei  # the graph's entry goes with its edge_index, and the transpose with the graph's matrix
    assert [st.cache_info()[name] for name in names] == [0, 0, 0]
    graphs = [_graph(30, 90, seed=s, device=device) for s in range(20)]
    for g in graphs:
        conv(x, g)
    assert st.cache_info()["graph.propagation"] == 16
    st.clear_caches()
    assert [st.cache_info()[name] for name in names] == [0, 0, 0]


# --- distributed adjacencies ---------------------------------------------------------------------

class _Distributed:
    """The protocol of sparsetorch.distributed's matrices: they run their own product and
    normalisation. This one wraps a CSR and records what the layers ask of it."""

    def __init__(self, csr, log):
        self.csr, self.log = csr, log

    def gcn_normalized(self, add_self_loops=True, improved=False):
        self.log.append(("gcn_normalized", add_self_loops, improved))
        return _Distributed(st.nn.gcn_normalize(self.csr, add_self_loops, fill_value=2.0 if improved else 1.0),
                            self.log)

    def mean_normalized(self):
        self.log.append(("mean_normalized",))
        return _Distributed(st.nn.mean_norm(self.csr), self.log)

    def __sparsetorch_spmm__(self, B, **kwargs):
        self.log.append(("spmm", kwargs["bias"] is not None, kwargs["activation"]))
        kwargs.pop("policy")
        return st.spmm(self.csr, B, **kwargs)


def test_distributed_adjacency_normalises_itself(device):
    n = 30
    ei = _graph(n, 90, seed=12, device=device)
    adj_t = st.from_edge_index(ei, n, transpose=True)
    x = torch.randn(n, 4, device=device)
    log = []
    conv = st.nn.GCNConv(4, 8, improved=True, activation="relu", cached=True).to(device)
    y = conv(x, _Distributed(adj_t, log))
    # in (4) < out (8): (Â x) W^T as for any graph, so bias and ReLU run in the dense product's epilogue
    assert log == [("gcn_normalized", True, True), ("spmm", False, "none")]
    torch.testing.assert_close(y, conv(x, adj_t), rtol=1e-5, atol=1e-6)
    conv(x, None)  # cached: the normalised distributed matrix is reused
    assert [e[0] for e in log].count("gcn_normalized") == 1
    log.clear()
    sage = st.nn.SAGEConv(4, 8).to(device)
    y = sage(x, _Distributed(adj_t, log))
    assert [e[0] for e in log] == ["mean_normalized", "spmm"]
    torch.testing.assert_close(y, sage(x, adj_t), rtol=1e-5, atol=1e-6)


# --- the drop-in example -------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_PLANETOID, reason=f"Planetoid data not found under {DATA_DIR}")
def test_pyg_dropin_example_runs(device):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "pyg_dropin", os.path.join(os.path.dirname(__file__), "..", "examples", "pyg_dropin.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--device", device, "--epochs", "12", "--seeds", "1", "--data", DATA_DIR])
    assert set(result) == {"torch_geometric", "sparsetorch"}
    # Same initial weights and dropout masks: the two trainings follow each other up to rounding.
    accs = [r["test_acc_mean"] for r in result.values()]
    assert abs(accs[0] - accs[1]) <= 0.01 and min(accs) > 0.2, result
    assert all(r["ms_per_epoch_median"] > 0 for r in result.values())


# --- the gnn suite of the main job ---------------------------------------------------------------

def test_gnn_suite_rows_and_report_on_cpu(tmp_path):
    """One small training-step case through the suite's code: three implementations, outputs
    checked against each other, floors and speedups filled in, the headline and the plot written."""
    from benchmarks import report
    from benchmarks.harness import Ceilings, make_timer
    from benchmarks.suites import gnn
    from benchmarks.suites.common import Context

    cpu = torch.device("cpu")
    ctx = Context(cpu, make_timer(cpu, True), Ceilings(2e10, {"float32": 1e11}), True, None)
    ei = gnn.power_law_edge_index(2000, 16000, seed=3)
    assert torch.equal(ei, gnn.power_law_edge_index.__wrapped__(2000, 16000, seed=3))  # deterministic
    assert torch.equal(torch.sort(ei[0] * 2000 + ei[1]).values, torch.sort(ei[1] * 2000 + ei[0]).values)
    rows = []
    for layer in ("GCNConv", "SAGEConv"):
        rows += gnn.training_step_rows(ctx, "power-law 2k", layer, ei, 2000, (8, 16, 3))
    assert {r["impl"] for r in rows} == {"sparsetorch", "torch_geometric edge_index", "torch_geometric sparse adj"}
    assert all(r["time_ms"] > 0 and 0 < r["floor_ms"] and r["rel_err"] < 1e-4 for r in rows)
    for r in rows:
        r["peak_GiB"] = 1.0  # measured on CUDA only; the report's arithmetic wants one
    report.add_speedups(rows)
    lines = report.gnn_headlines(rows)
    assert len(lines) == 2 and all("torch_geometric's fastest" in line for line in lines), lines
    pytest.importorskip("matplotlib")
    assert any(p.endswith("gnn_speedup.png") for p in report.make_plots(str(tmp_path), rows))


def test_spmm_keeps_no_dense_operand_for_an_adjacency_without_gradient(device):
    """The backward reads B only for A's values' gradient (or to recompute an activation): a graph
    layer's SpMM saves A and nothing of its (n, out) operand."""
    ei = _graph(30, 90, seed=13, device=device)
    a = st.nn.gcn_norm(ei, num_nodes=30)
    h = torch.randn(30, 5, device=device, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = st.spmm(a, h)
    assert (30, 5) not in saved, saved
    y.sum().backward()
    torch.testing.assert_close(h.grad, st.to_dense(a).T @ torch.ones(30, 5, device=device))
    c = torch.randn(30, 5, device=device, requires_grad=True)  # SAGE's root term: not kept either
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = st.spmm(a, h, c=c, beta=1.0)
    assert (30, 5) not in saved, saved
    gh, gc = torch.autograd.grad(y.sum(), (h, c))
    torch.testing.assert_close(gc, torch.ones_like(c))
    saved.clear()
    values = a.values.clone().requires_grad_()  # values with a gradient: B is kept for the SDDMM
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        st.spmm(st.CSR(a.crow_indices, a.col_indices, values, a.shape), h)
    assert (30, 5) in saved
