"""The fresh-graph builder (sparsetorch/_graph_build.py): a new graph's propagation matrix, its
transpose and both analyses in one pass, checked against float64 references, its torch-op values for
learnable edge weights, and on bad input."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch import _transpose
from sparsetorch._graph_build import build_graph
from sparsetorch._ops import ops


def _edges(rng, n_src, n_dst, e, loops=True, device="cpu", index_dtype=torch.int64):
    src = rng.integers(0, n_src, e)
    dst = rng.integers(0, n_dst, e)
    if loops and n_src == n_dst and e:
        pick = rng.random(e) < 0.1
        dst[pick] = src[pick]
    return torch.from_numpy(np.stack([src, dst])).to(device=device, dtype=index_dtype)


def _reference(src, dst, w, n_src, n_dst, loops, fill, norm):
    """float64 adj_t (n_dst x n_src) by the definitions, with SciPy."""
    src, dst = src.cpu().long().numpy(), dst.cpu().long().numpy()
    w = np.ones(len(src)) if w is None else w.detach().cpu().double().numpy()
    if loops in ("remaining", "fill"):
        loop = src == dst
        loop_w = np.full(n_dst, fill)
        if loops == "remaining":
            for e in np.flatnonzero(loop):  # the last loop of a node wins
                loop_w[src[e]] = w[e]
        src, dst, w = src[~loop], dst[~loop], w[~loop]
        node = np.arange(n_dst)
        src, dst, w = np.concatenate([src, node]), np.concatenate([dst, node]), np.concatenate([w, loop_w])
    elif loops == "add":
        node = np.arange(n_dst)
        src, dst, w = np.concatenate([src, node]), np.concatenate([dst, node]), np.concatenate([w, np.full(n_dst, fill)])
    a = sp.coo_matrix((w, (dst, src)), shape=(n_dst, n_src)).tocsr()  # repeated edges sum
    if norm == "gcn":
        deg = np.asarray(a.sum(1)).ravel()
        d = np.where(deg > 0, deg ** -0.5, 0.0)
        a = sp.diags(d) @ a @ sp.diags(d)
    elif norm == "mean":
        count = np.bincount(dst, minlength=n_dst)
        a = sp.diags(np.where(count > 0, 1.0 / np.maximum(count, 1), 0.0)) @ a
    return a.toarray()


CASES = [  # (n_src, n_dst, edges, loops, fill, norm, weighted)
    (40, 40, 300, "remaining", 1.0, "gcn", False),
    (40, 40, 300, "remaining", 2.0, "gcn", True),
    (40, 40, 300, "fill", 2.0, "gcn", False),
    (40, 40, 300, "add", 1.0, "gcn", True),
    (40, 40, 300, None, 1.0, "gcn", True),
    (40, 40, 300, None, 1.0, None, True),
    (40, 30, 300, None, 1.0, None, False),
    (50, 20, 300, None, 1.0, "mean", False),
    (20, 50, 100, None, 1.0, "mean", True),
    (40, 40, 300, "remaining", 1.0, "mean", False),
    (400, 400, 3000, "fill", 2.0, "mean", True),
    (30, 30, 0, "remaining", 1.0, "gcn", False),
    (7, 9, 0, None, 1.0, "mean", False),
    (0, 0, 0, None, 1.0, None, False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[3]}-{c[5]}-{c[0]}x{c[1]}-{c[2]}" for c in CASES])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matrix_transpose_and_analysis_match_references(device, rng, case, index_dtype):
    n_src, n_dst, e, loops, fill, norm, weighted = case
    ei = _edges(rng, max(n_src, 1), max(n_dst, 1), e, device=device, index_dtype=index_dtype)
    w = torch.rand(e, dtype=torch.float64, device=device) if weighted else None
    built = build_graph(ei[0], ei[1], w, n_src, n_dst, loops=loops, fill=fill, norm=norm, dtype=torch.float64)
    a = built.matrix
    ref = _reference(ei[0], ei[1], w, n_src, n_dst, loops, fill, norm)
    assert a.shape == (n_dst, n_src) and built.transpose.shape == (n_src, n_dst)
    np.testing.assert_allclose(st.to_dense(a).cpu().numpy(), ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(st.to_dense(built.transpose).cpu().numpy(), ref.T, rtol=1e-12, atol=1e-14)
    # The transpose kept for the backward is the one returned, for A's values and for any other values.
    crow_t, col_t, perm = _transpose.transpose_pattern(a.crow_indices, a.col_indices, n_src)
    assert crow_t is built.transpose.crow_indices and col_t is built.transpose.col_indices
    assert _transpose.transpose_values(a.values, perm) is built.transpose.values
    at = st.CSR(crow_t, col_t, _transpose.transpose_values(a.values, perm), (n_src, n_dst))
    np.testing.assert_allclose(st.to_dense(at).cpu().numpy(), ref.T, rtol=1e-12, atol=1e-14)
    other = torch.randn_like(a.values)
    at2 = st.CSR(crow_t, col_t, _transpose.transpose_values(other, perm), (n_src, n_dst))
    np.testing.assert_allclose(st.to_dense(at2).cpu().numpy(), st.to_dense(a.with_values(other)).cpu().numpy().T)
    # The stored analyses equal a fresh analysis of both patterns, and both are valid CSRs.
    for crow, col, k in ((a.crow_indices, a.col_indices, n_src), (crow_t, col_t, n_dst)):
        stored = ops.csr_analysis(crow, col, k)
        fresh = ops.csr_analysis(crow, col, k, True)
        assert torch.equal(stored, fresh)
        assert fresh[0].item() == 0
    assert a.index_dtype == torch.int32


def test_backward_uses_the_kept_transpose_and_matches_reference(device, rng, monkeypatch):
    n = 60
    ei = _edges(rng, n, n, 400, device=device)
    x = torch.randn(n, 8, dtype=torch.float64, device=device, requires_grad=True)

    def no_sort(*args):
        raise AssertionError("the backward built a transpose")

    a = st.nn.gcn_norm(ei, num_nodes=n, dtype=torch.float64)
    monkeypatch.setattr(_transpose, "_compute", no_sort)
    y = st.spmm(a, x)
    g = torch.randn_like(y)
    y.backward(g)
    dense = torch.from_numpy(_reference(ei[0], ei[1], None, n, n, "remaining", 1.0, "gcn")).to(device)
    torch.testing.assert_close(x.grad, dense.T @ g, rtol=1e-10, atol=1e-12)


def test_edge_weight_gradient(device, rng):
    n = 12
    ei = _edges(rng, n, n, 50, device=device)
    w = torch.rand(50, dtype=torch.float64, device=device, requires_grad=True)
    x = torch.randn(n, 3, dtype=torch.float64, device=device)

    def f(w):
        a = build_graph(ei[0], ei[1], w, n, n, loops="remaining", fill=2.0, norm="gcn", dtype=torch.float64).matrix
        return st.spmm(a, x)

    assert torch.autograd.gradcheck(f, (w,))


@pytest.mark.parametrize("bad", ["negative", "source", "target"])
def test_out_of_range_indices_raise_before_use(device, bad):
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]], device=device)
    if bad == "negative":
        ei[0, 1] = -1
    elif bad == "source":
        ei[0, 2] = 3
    else:
        ei[1, 0] = 7
    before = ei.clone()

    def use(run):  # on CUDA the check lands after the build: the graph's next use raises
        y = run()
        if device == "cuda":
            assert torch.isnan(y).all()  # never a wrong number meanwhile
            torch.cuda.synchronize()
            y.sum().backward()  # raises where the backward uses the graph (GCN's A^T product)
            st.nn.gcn_norm(torch.tensor([[0], [1]], device=device), num_nodes=2)  # else the next graph built

    with pytest.raises(IndexError, match="edge_index"):
        use(lambda: st.spmm(build_graph(ei[0], ei[1], None, 3, 3, loops="remaining", norm="gcn").matrix,
                            torch.randn(3, 2, device=device, requires_grad=True)))
    with pytest.raises(IndexError, match="edge_index"):
        use(lambda: st.nn.GCNConv(4, 2).to(device)(torch.randn(3, 4, device=device), ei))
    with pytest.raises(IndexError, match="edge_index"):
        use(lambda: st.nn.SAGEConv(4, 2).to(device)(torch.randn(3, 4, device=device), ei))
    assert torch.equal(ei, before)  # the caller's tensor is left alone


def test_a_graph_in_flight_does_not_hold_the_callers_edge_index(device):
    """On CUDA the builder's index check lands after the call and keeps the edges until then: it holds
    aliases of their storage, never views of the caller's edge_index, so the edge_index (the key of the
    layers' graph cache) dies when the caller drops it, even before the check lands."""
    import weakref

    from sparsetorch._graph_build import storage_alias

    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]], device=device)
    alias = storage_alias(ei[1])
    assert alias._base is None and alias.data_ptr() == ei[1].data_ptr() and torch.equal(alias, ei[1])
    ref = weakref.ref(ei)
    build_graph(ei[0], ei[1], None, 3, 3, loops="add", norm="gcn")
    del ei
    assert ref() is None


def test_arguments_are_checked():
    ei = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="square"):
        build_graph(ei[0], ei[1], None, 2, 3, loops="remaining")
    with pytest.raises(ValueError, match="loops"):
        build_graph(ei[0], ei[1], None, 2, 2, loops="bogus")
    with pytest.raises(ValueError, match="norm"):
        build_graph(ei[0], ei[1], None, 2, 2, norm="max")
    with pytest.raises(IndexError, match="edge_index"):
        build_graph(ei[0], ei[1], None, 0, 0)


def test_analysis_store_refuses_a_malformed_vector(device):
    a = st.nn.gcn_norm(torch.tensor([[0, 1], [1, 0]], device=device), num_nodes=2)
    good = ops.csr_analysis(a.crow_indices, a.col_indices, 2)
    for bad in (good[:-1], good.float(), good.reshape(2, -1)):
        with pytest.raises(RuntimeError, match="raw must be a CPU int64 vector"):
            ops._csr_analysis_store(a.crow_indices, a.col_indices, 2, bad)
    if device == "cuda":
        with pytest.raises(RuntimeError, match="raw must be a CPU int64 vector"):
            ops._csr_analysis_store(a.crow_indices, a.col_indices, 2, good.cuda())


def _parts(built):
    a, t = built
    return a.crow_indices, a.col_indices, a.values, t.crow_indices, t.col_indices, t.values


@pytest.mark.parametrize("case", CASES, ids=[f"{c[3]}-{c[5]}-{c[0]}x{c[1]}-{c[2]}" for c in CASES])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_op_matches_the_differentiable_path(device, rng, case, index_dtype):
    """Weights that require a gradient get the op's pattern and values computed by torch ops
    (_differentiable_values): the same values slot by slot as the op's, in A and in A^T."""
    n_src, n_dst, e, loops, fill, norm, weighted = case
    ei = _edges(rng, max(n_src, 1), max(n_dst, 1), e, device=device, index_dtype=index_dtype)
    w = torch.rand(e, dtype=torch.float64, device=device)
    if not weighted and (loops != "remaining" or fill == 1.0):  # unweighted: the op's ones, the path's ones
        native = build_graph(ei[0], ei[1], None, n_src, n_dst, loops=loops, fill=fill, norm=norm, dtype=torch.float64)
        w = torch.ones(e, dtype=torch.float64, device=device)
    else:
        native = build_graph(ei[0], ei[1], w, n_src, n_dst, loops=loops, fill=fill, norm=norm, dtype=torch.float64)
    steps = build_graph(ei[0], ei[1], w.clone().requires_grad_(), n_src, n_dst, loops=loops, fill=fill, norm=norm,
                        dtype=torch.float64)
    for x, y in zip(_parts(native), _parts(steps)):
        if x.is_floating_point():
            torch.testing.assert_close(x, y.detach(), rtol=1e-13, atol=1e-15)
        else:
            assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("norm", ["gcn", "mean"])
def test_differentiable_path_sums_half_types_in_float(device, rng, dtype, norm):
    """Weights that require a gradient take the torch-op path; in half types its degrees and entry
    counts are summed in float32 as the op's (a target of 601 entries: a bf16 running sum stops
    growing at 256 + ...), so both give the same values, each rounded once."""
    n, e = 700, 3000
    src = torch.from_numpy(rng.integers(0, n, e))
    dst = torch.where(torch.arange(e) < 601, 3, torch.from_numpy(rng.integers(0, n, e)))
    ei = torch.stack([src, dst]).to(device)
    w = torch.from_numpy(rng.random(e) + 0.5).to(device=device, dtype=dtype)
    loops = "remaining" if norm == "gcn" else None
    native = build_graph(ei[0], ei[1], w, n, n, loops=loops, norm=norm, dtype=dtype)
    steps = build_graph(ei[0], ei[1], w.clone().requires_grad_(), n, n, loops=loops, norm=norm, dtype=dtype)
    ref = _reference(ei[0], ei[1], w.double(), n, n, loops, 1.0, norm)
    eps = torch.finfo(dtype).eps
    for a in (native.matrix, steps.matrix):
        np.testing.assert_allclose(st.to_dense(a.to(dtype=torch.float64)).detach().cpu().numpy(), ref, rtol=eps, atol=0)
    torch.testing.assert_close(steps.matrix.values.detach(), native.matrix.values, rtol=eps, atol=0)
    steps.matrix.values.float().sum().backward()  # the gradient reaches the weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("norm", ["gcn", "mean"])
def test_op_on_a_skewed_graph_and_low_precision(device, rng, dtype, norm):
    """Rows of very different lengths (one target receives a third of all edges, half the nodes
    none), many blocks of every kernel, the values in half types against float64 SciPy."""
    n, e = 3000, 60000
    src = rng.integers(0, n, e)
    dst = np.where(rng.random(e) < 0.33, 7, rng.integers(0, n // 2, e))
    ei = torch.from_numpy(np.stack([src, dst])).to(device)
    loops = "remaining" if norm == "gcn" else None
    a = build_graph(ei[0], ei[1], None, n, n, loops=loops, norm=norm, dtype=dtype).matrix
    ref = _reference(ei[0], ei[1], None, n, n, loops, 1.0, norm)
    # each value rounded once; repeated edges are separate entries, summed in `dtype` by to_dense
    tol = {torch.float32: 1e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    np.testing.assert_allclose(st.to_dense(a).double().cpu().numpy(), ref, rtol=tol, atol=tol * 1e-2)
    crow_t, col_t, perm = _transpose.transpose_pattern(a.crow_indices, a.col_indices, n)
    at = st.CSR(crow_t, col_t, _transpose.transpose_values(a.values, perm), (n, n))
    np.testing.assert_allclose(st.to_dense(at).double().cpu().numpy(), ref.T, rtol=tol, atol=tol * 1e-2)
    stored = ops.csr_analysis(a.crow_indices, a.col_indices, n)
    assert torch.equal(stored, ops.csr_analysis(a.crow_indices, a.col_indices, n, True))


def test_op_checks_its_arguments(device):
    src = torch.tensor([0, 1, 2], device=device)
    with pytest.raises(ValueError, match="1-D of one length"):
        ops._build_graph(src, src[:2], None, 3, 3, 0, 1.0, 0, torch.float32, "edge_index")
    with pytest.raises(TypeError, match="int32 or int64"):
        ops._build_graph(src.float(), src.float(), None, 3, 3, 0, 1.0, 0, torch.float32, "edge_index")
    with pytest.raises(TypeError, match="int32 or int64"):
        ops._build_graph(src, src.int(), None, 3, 3, 0, 1.0, 0, torch.float32, "edge_index")
    with pytest.raises(ValueError, match="one value per edge"):
        ops._build_graph(src, src, torch.ones(2, device=device), 3, 3, 0, 1.0, 0, torch.float32, "edge_index")
    with pytest.raises(TypeError, match="weights must be of dtype"):
        ops._build_graph(src, src, torch.ones(3, device=device, dtype=torch.float64), 3, 3, 0, 1.0, 0, torch.float32, "edge_index")
    with pytest.raises(ValueError, match="square"):
        ops._build_graph(src, src, None, 3, 4, 1, 1.0, 0, torch.float32, "edge_index")
    with pytest.raises(ValueError, match="loops must be"):
        ops._build_graph(src, src, None, 3, 3, 7, 1.0, 0, torch.float32, "edge_index")
    with pytest.raises(TypeError, match="floating"):
        ops._build_graph(src, src, None, 3, 3, 0, 1.0, 0, torch.int32, "edge_index")
    with pytest.raises(ValueError, match=">= 0"):
        ops._build_graph(src, src, None, -1, 3, 0, 1.0, 0, torch.float32, "edge_index")
    # A bad index raises IndexError naming the first bad edge: on the CPU at once; on CUDA when the check
    # lands (at the next use of the graph), its values all NaN meanwhile.
    bad = torch.tensor([0, 5, 7], device=device), torch.tensor([1, 1, 9], device=device)
    if device == "cpu":
        with pytest.raises(IndexError, match=r"adj_t: edge 1 \(source 5, target 1\) is out of range"):
            ops._build_graph(*bad, None, 3, 3, 0, 1.0, 0, torch.float32, "adj_t")
    else:
        out = ops._build_graph(*bad, None, 3, 3, 0, 1.0, 0, torch.float32, "adj_t")
        assert torch.isnan(out[2]).all() and torch.isnan(out[5]).all()
        torch.cuda.synchronize()
        with pytest.raises(IndexError, match=r"adj_t: edge 1 \(source 5, target 1\) is out of range"):
            ops.csr_analysis(out[0], out[1], 3)
