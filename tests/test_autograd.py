"""Gradients of every op: float64 gradcheck on each device and backend, half-type gradients against
float64 references, the transpose cache, and that each backward computes only what is needed."""
import numpy as np
import pytest
import scipy.sparse
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sparsetorch as st
import sparsetorch._autograd as st_autograd
from _helpers import assert_matches, random_csr, randn, rounded
from conftest import CUDA_READY, FLOAT_DTYPES, INDEX_DTYPES

ops = torch.ops.sparsetorch

TARGETS = [("cpu", "auto")] + ([("cuda", be) for be in ("native", "balanced", "split", "tiled", "cusparse", "densify")] if CUDA_READY
                               else [])
LAYOUTS = ["single", "per_batch", "shared", "broadcast_b", "batched_b"]


@pytest.fixture(autouse=True)
def _rules_routes_only():
    """gradcheck runs the backward twice and wants the same bits: with autotuning on, the second call
    may take a measured route that rounds differently (seen on the H100 with the densify forward).
    These tests check the formulas; measuring is tested in test_routing.py."""
    previous = st.set_autotune(False)
    yield
    st.set_autotune(previous)


def make_a(rng, layout, device, dtype=torch.float64, index_dtype=torch.int64, m=6, k=5):
    """A in one of the batch layouts; unsorted, repeated columns and empty rows included."""
    kw = dict(unsorted=True, duplicates=True, empty_rows=0.3)
    if layout in ("single", "batched_b"):
        return st.from_scipy(random_csr(rng, m, k, 0.5, **kw), device=device, dtype=dtype, index_dtype=index_dtype)
    if layout in ("per_batch", "broadcast_b"):
        mats = [random_csr(rng, m, k, d, **kw) for d in (0.6, 0.0, 0.3)]  # batch 1 has nnz = 0
        return st.from_list(mats, device=device, dtype=dtype, index_dtype=index_dtype)
    base = st.from_scipy(random_csr(rng, m, k, 0.5, **kw), device=device, dtype=dtype, index_dtype=index_dtype)
    values = randn(rng, 3, base.values.numel(), dtype=dtype, device=device)
    return st.CSR(base.crow_indices, base.col_indices, values, (3, m, k))


def dense_b(rng, layout, device, dtype=torch.float64, k=5, n=4):
    shape = (3, k, n) if layout in ("per_batch", "shared", "batched_b") else (k, n)
    return randn(rng, *shape, dtype=dtype, device=device)


def _gradcheck_spmm(rng, target, layout, product):
    """gradcheck of product(a, values, b, c, bias, backend) in every input: values, b, c and bias."""
    device, backend = target
    a = make_a(rng, layout, device)
    b = dense_b(rng, layout, device).requires_grad_()
    values = a.values.clone().requires_grad_()
    out_shape = (3, 6, 4) if layout != "single" else (6, 4)
    c = randn(rng, *out_shape, device=device, dtype=torch.float64).requires_grad_()
    bias = randn(rng, 4, device=device, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda v, b, c, bias: product(a, v, b, c, bias, backend), (values, b, c, bias))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(t))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("activation", ["none", "gelu", "leaky_relu"])
def test_spmm_gradcheck(rng, target, layout, activation):
    _gradcheck_spmm(rng, target, layout, lambda a, v, b, c, bias, backend: ops.spmm(
        a.crow_indices, a.col_indices, v, b, 1.5, c, 0.5, bias, activation, 0.1, backend))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(t))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_st_spmm_gradcheck(rng, target, layout, activation):
    """st.spmm records through its own autograd.Function (SpmmFunction), not the op's registered
    autograd: the same gradients, every input and batch layout."""
    _gradcheck_spmm(rng, target, layout, lambda a, v, b, c, bias, backend: st.spmm(
        a.with_values(v), b, alpha=1.5, c=c, beta=0.5, bias=bias, activation=activation, backend=backend))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(t))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_spmm_function_and_registered_autograd_agree(rng, target, layout):
    """The two autograds of the product -- SpmmFunction (st.spmm in eager) and the op's registered one (what
    torch.compile and direct op calls record) -- give the same output and gradients, bit for bit."""
    device, backend = target
    a = make_a(rng, layout, device)
    out_shape = (3, 6, 4) if layout != "single" else (6, 4)
    inputs = [a.values, dense_b(rng, layout, device), randn(rng, *out_shape, device=device, dtype=torch.float64),
              randn(rng, 4, device=device, dtype=torch.float64)]
    w = randn(rng, *out_shape, device=device, dtype=torch.float64)

    def run(product):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        y = product(*leaves)
        (y * w).sum().backward()
        return [y.detach()] + [t.grad for t in leaves]

    via_function = run(lambda v, b, c, bias: st_autograd.SpmmFunction.apply(v, b, c, bias, a.crow_indices,
                                                                              a.col_indices, 1.5, 0.5, backend, True))
    via_op = run(lambda v, b, c, bias: ops.spmm(a.crow_indices, a.col_indices, v, b, 1.5, c, 0.5, bias, "none", 0.01,
                                                backend))
    for got, want in zip(via_function, via_op):
        assert torch.equal(got, want)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(t))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sddmm_gradcheck(rng, target, layout):
    device, backend = target
    a = make_a(rng, layout, device)
    batched = layout in ("per_batch", "shared", "batched_b")
    x = randn(rng, *((3, 6, 4) if batched else (6, 4)), device=device, dtype=torch.float64).requires_grad_()
    y = dense_b(rng, layout, device).requires_grad_()

    def f(x, y):
        return ops.sddmm(a.crow_indices, a.col_indices, x, y, 0.75, backend)

    assert torch.autograd.gradcheck(f, (x, y))


def test_spmm_wrapper_gradients_match_dense(device, rng):
    """st.spmm with an activation records the activation as its own op; gradients equal dense torch's."""
    a_sp = random_csr(rng, 8, 6, 0.5, unsorted=True, duplicates=True)
    a = st.from_scipy(a_sp, device=device)
    values = a.values.clone().requires_grad_()
    dense_a = torch.from_numpy(a_sp.toarray()).to(device)
    b = randn(rng, 6, 5, device=device, dtype=torch.float64).requires_grad_()
    bias = randn(rng, 5, device=device, dtype=torch.float64).requires_grad_()
    y = st.spmm(a.with_values(values), b, bias=bias, activation="silu")
    g = randn(rng, 8, 5, device=device, dtype=torch.float64)
    gv, gb, gbias = torch.autograd.grad(y, (values, b, bias), g)

    b_ref, bias_ref = b.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    a_ref = dense_a.clone().requires_grad_()
    y_ref = torch.nn.functional.silu(a_ref @ b_ref + bias_ref)
    ga_ref, gb_ref, gbias_ref = torch.autograd.grad(y_ref, (a_ref, b_ref, bias_ref), g)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gb, gb_ref)
    torch.testing.assert_close(gbias, gbias_ref)
    rows = np.repeat(np.arange(8), np.diff(a_sp.indptr))
    torch.testing.assert_close(gv, ga_ref[torch.from_numpy(rows).to(device), a.col_indices.long()])


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(t))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_spmm_gradients_every_dtype(rng, target, dtype, index_dtype):
    """grad_values = (G @ B^T) at A's entries and grad_B = A^T @ G, against float64."""
    device, backend = target
    a_sp = rounded(random_csr(rng, 40, 30, 0.2, unsorted=True, duplicates=True, empty_rows=0.2), dtype)
    a = st.from_scipy(a_sp, device=device, dtype=dtype, index_dtype=index_dtype)
    values = a.values.clone().requires_grad_()
    b = randn(rng, 30, 24, dtype=dtype, device=device).requires_grad_()
    g = randn(rng, 40, 24, dtype=dtype, device=device)
    y = ops.spmm(a.crow_indices, a.col_indices, values, b, 1.0, None, 0.0, None, "none", 0.01, backend)
    gv, gb = torch.autograd.grad(y, (values, b), g)
    g64, b64 = g.double().cpu().numpy(), b.detach().double().cpu().numpy()
    full = g64 @ b64.T
    rows = np.repeat(np.arange(40), np.diff(a_sp.indptr))
    assert_matches(gv, full[rows, a_sp.indices], dtype)
    assert_matches(gb, a_sp.toarray().T @ g64, dtype)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "-".join(t))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_sddmm_matches_reference(rng, target, dtype):
    device, backend = target
    a_sp = random_csr(rng, 33, 17, 0.3, unsorted=True, duplicates=True, empty_rows=0.2)
    a = st.from_scipy(a_sp, device=device, dtype=dtype)
    for n in (1, 8, 37):  # vectorised and scalar paths
        x, y = randn(rng, 33, n, dtype=dtype, device=device), randn(rng, 17, n, dtype=dtype, device=device)
        out = st.sddmm(a, x, y, alpha=2.0, backend=backend)
        full = 2.0 * x.double().cpu().numpy() @ y.double().cpu().numpy().T
        rows = np.repeat(np.arange(33), np.diff(a_sp.indptr))
        assert_matches(out.values, full[rows, a_sp.indices], dtype)


def test_sddmm_batched_layouts_and_padding(device, rng):
    mats = [random_csr(rng, 7, 9, d) for d in (0.5, 0.0, 0.2)]
    a = st.from_list(mats, device=device)
    x, y = randn(rng, 3, 7, 4, device=device), randn(rng, 9, 4, device=device)
    out = st.sddmm(a, x, y)
    assert out.values.shape == a.values.shape
    for i, mat in enumerate(mats):
        full = x[i].double().cpu().numpy() @ y.double().cpu().numpy().T
        rows = np.repeat(np.arange(7), np.diff(mat.indptr))
        nnz = mat.nnz
        assert_matches(out.values[i, :nnz], full[rows, mat.indices], torch.float32)
        assert torch.all(out.values[i, nnz:] == 0)  # padding slots read 0


def test_sddmm_empty_and_zero_sized(device):
    crow = torch.zeros(5, dtype=torch.int64, device=device)
    col = torch.zeros(0, dtype=torch.int64, device=device)
    out = ops.sddmm(crow, col, torch.randn(4, 3, device=device), torch.randn(6, 3, device=device))
    assert out.shape == (0,)
    a = st.from_scipy(random_csr(np.random.default_rng(0), 4, 6, 0.5), device=device)
    out = ops.sddmm(a.crow_indices, a.col_indices, torch.randn(4, 0, device=device), torch.randn(6, 0, device=device))
    assert torch.all(out == 0) and out.shape == a.values.shape


def test_sddmm_bad_arguments(device):
    a = st.from_scipy(random_csr(np.random.default_rng(1), 4, 6, 0.5), device=device)
    with pytest.raises(ValueError, match="a: expected 4 rows"):
        ops.sddmm(a.crow_indices, a.col_indices, torch.randn(5, 3, device=device), torch.randn(6, 3, device=device))
    with pytest.raises(ValueError, match="last dimensions must agree"):
        ops.sddmm(a.crow_indices, a.col_indices, torch.randn(4, 3, device=device), torch.randn(6, 2, device=device))
    with pytest.raises(TypeError, match="same dtype"):
        ops.sddmm(a.crow_indices, a.col_indices, torch.randn(4, 3, device=device),
                  torch.randn(6, 3, device=device, dtype=torch.float64))
    with pytest.raises(ValueError, match="batch sizes disagree"):
        ops.sddmm(a.crow_indices, a.col_indices, torch.randn(2, 4, 3, device=device), torch.randn(3, 6, 3, device=device))


# --- transpose -----------------------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_transpose_matches_scipy(device, rng, index_dtype):
    a_sp = random_csr(rng, 13, 8, 0.3, unsorted=True, duplicates=True, empty_rows=0.3)
    t = st.transpose(st.from_scipy(a_sp, device=device, index_dtype=index_dtype))
    assert t.shape == (8, 13) and t.index_dtype == index_dtype
    np.testing.assert_allclose(st.to_scipy(t).toarray(), a_sp.T.toarray(), rtol=1e-6)
    mats = [random_csr(rng, 5, 7, d) for d in (0.4, 0.0, 0.9)]
    tb = st.transpose(st.from_list(mats, device=device, index_dtype=index_dtype))
    assert tb.shape == (3, 7, 5)
    for got, mat in zip(st.to_scipy(tb), mats):
        np.testing.assert_allclose(got.toarray(), mat.T.toarray(), rtol=1e-6)


def test_transpose_cache(device, rng):
    from sparsetorch._transpose import transpose_pattern

    a = st.from_scipy(random_csr(rng, 9, 6, 0.4), device=device)
    first = transpose_pattern(a.crow_indices, a.col_indices, 6)
    assert transpose_pattern(a.crow_indices, a.col_indices, 6) is first  # made once
    col = a.col_indices.clone()
    assert transpose_pattern(a.crow_indices, col, 6) is not first  # other tensor: other entry
    col2 = a.col_indices
    col2.add_(0)  # an in-place write bumps the version counter: recomputed
    again = transpose_pattern(a.crow_indices, col2, 6)
    assert again is not first
    torch.testing.assert_close(again[0], first[0])


def test_transpose_skips_out_of_range_columns(device):
    crow = torch.tensor([0, 2, 3], device=device)
    col = torch.tensor([1, 7, 0], device=device)  # 7 is out of range for k = 3
    crow_t, col_t, perm = st._transpose.transpose_pattern(crow, col, 3)
    assert crow_t.tolist() == [0, 1, 2, 2]
    assert col_t[:2].tolist() == [1, 0] and perm[:2].tolist() == [2, 0]


# --- the other ops -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_gradcheck(device, rng, op):
    x = (randn(rng, 4, 5, device=device, dtype=torch.float64).abs() + 0.5).requires_grad_()
    y = (randn(rng, 4, 5, device=device, dtype=torch.float64).abs() + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y: ops.binary(x, y, op, 1.5), (x, y))


@pytest.mark.parametrize("op", ["add", "sub", "rsub", "mul", "div"])
def test_binary_scalar_gradcheck(device, rng, op):
    x = randn(rng, 4, 5, device=device, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: ops.binary_scalar(x, 2.5, op), (x,))


def test_broadcast_binary_gradient(device, rng):
    x = randn(rng, 4, 5, device=device, dtype=torch.float64).requires_grad_()
    y = randn(rng, 5, device=device, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y: st.mul(x, y), (x, y))


@pytest.mark.parametrize("activation", st.ACTIVATIONS)
def test_linear_gradcheck(device, rng, activation):
    x = randn(rng, 2, 3, 6, device=device, dtype=torch.float64).requires_grad_()
    w = randn(rng, 4, 6, device=device, dtype=torch.float64).requires_grad_()
    b = randn(rng, 4, device=device, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear(x, w, b, activation, 0.2), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b: st.linear(x, w, b, activation, 0.2), (x, w, b))


def test_dense_bmm_gradcheck(device, rng):
    a = randn(rng, 3, 4, 5, device=device, dtype=torch.float64).requires_grad_()
    b = randn(rng, 5, 2, device=device, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: ops.dense_bmm(a, b), (a, b))
    assert torch.autograd.gradcheck(lambda a, b: ops.dense_bmm(b.transpose(0, 1), a.transpose(1, 2)), (a, b))


@pytest.mark.parametrize("batched", [False, True])
def test_csr_scale_gradcheck(device, rng, batched):
    if batched:
        a = st.from_list([random_csr(rng, 6, 5, d, duplicates=True) for d in (0.5, 0.2)], device=device,
                         dtype=torch.float64)
        row = (torch.rand(2, 6, device=device, dtype=torch.float64) + 0.5).requires_grad_()
        col = (torch.rand(5, device=device, dtype=torch.float64) + 0.5).requires_grad_()
    else:
        a = st.from_scipy(random_csr(rng, 6, 5, 0.5, duplicates=True, unsorted=True), device=device)
        row = (torch.rand(6, device=device, dtype=torch.float64) + 0.5).requires_grad_()
        col = (torch.rand(5, device=device, dtype=torch.float64) + 0.5).requires_grad_()
    values = a.values.clone().requires_grad_()
    f = lambda v, r, c: ops.csr_scale(a.crow_indices, a.col_indices, v, r, c)  # noqa: E731
    assert torch.autograd.gradcheck(f, (values, row, col))
    assert torch.autograd.gradcheck(lambda v, r: ops.csr_scale(a.crow_indices, a.col_indices, v, r, None),
                                    (values, row))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_csr_scale_factor_gradients_sum_half_types_in_float(device, rng, dtype):
    """A row and a column of 600 like-signed terms: their factors' gradients, summed in bf16, would
    stop growing past 256 terms; in float32 each is the float64 sum rounded once."""
    n = 700
    rows = np.concatenate([np.full(600, 2), rng.integers(0, n, 1000), np.arange(600)])
    cols = np.concatenate([np.arange(600), rng.integers(0, n, 1000), np.full(600, 5)])
    a = st.from_scipy(scipy.sparse.coo_matrix((rng.random(rows.size) + 0.5, (rows, cols)), shape=(n, n)).tocsr(),
                      device=device, dtype=dtype)
    row = (torch.rand(n, device=device) + 0.5).to(dtype).requires_grad_()
    col = (torch.rand(n, device=device) + 0.5).to(dtype).requires_grad_()
    grad = (torch.rand(a.values.shape, device=device) + 0.5).to(dtype)
    ops.csr_scale(a.crow_indices, a.col_indices, a.values, row, col).backward(grad)
    gv = st.to_scipy(st.CSR(a.crow_indices, a.col_indices, grad.double() * a.values.double(), a.shape)).tocoo()
    want_row = np.bincount(gv.row, gv.data * col.detach().double().cpu().numpy()[gv.col], minlength=n)
    want_col = np.bincount(gv.col, gv.data * row.detach().double().cpu().numpy()[gv.row], minlength=n)
    eps = torch.finfo(dtype).eps
    np.testing.assert_allclose(row.grad.double().cpu().numpy(), want_row, rtol=eps, atol=0)
    np.testing.assert_allclose(col.grad.double().cpu().numpy(), want_col, rtol=eps, atol=0)


@pytest.mark.parametrize("activation", st.ACTIVATIONS)
def test_activation_and_bias_act_gradcheck(device, rng, activation):
    x = randn(rng, 3, 5, device=device, dtype=torch.float64).requires_grad_()
    s = randn(rng, 5, device=device, dtype=torch.float64).requires_grad_()
    b = randn(rng, 5, device=device, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: ops.activation(x, activation, 0.3), (x,))
    assert torch.autograd.gradcheck(lambda x, s, b: ops.bias_act(x, s, b, activation, 0.3), (x, s, b))


# --- only what is needed -------------------------------------------------------------------------

class _SparsetorchOpLog(TorchDispatchMode):
    """The sparsetorch ops that run (below autograd too: the dispatch mode sees every call)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "sparsetorch":
            self.calls.append(func._opname)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("entry", ["op", "st.spmm"])
@pytest.mark.parametrize("wanted", ["values", "dense"])
def test_spmm_backward_computes_only_needed_gradients(device, rng, wanted, entry):
    """The registered autograd (the op) and SpmmFunction (st.spmm) alike run one kernel per wanted gradient."""
    a = st.from_scipy(random_csr(rng, 6, 5, 0.5), device=device, dtype=torch.float64)
    values = a.values.clone().requires_grad_(wanted == "values")
    b = randn(rng, 5, 3, device=device, dtype=torch.float64).requires_grad_(wanted == "dense")
    if entry == "op":
        y = ops.spmm(a.crow_indices, a.col_indices, values, b)
    else:
        y = st.spmm(a.with_values(values), b)
    log = _SparsetorchOpLog()
    with log:
        y.sum().backward()
    if wanted == "values":
        assert log.calls == ["sddmm"] and b.grad is None and values.grad is not None
    else:
        assert log.calls == ["spmm"] and values.grad is None and b.grad is not None


def test_spmm_out_refuses_autograd(device, rng):
    a = st.from_scipy(random_csr(rng, 6, 5, 0.5), device=device)
    b = randn(rng, 5, 3, device=device).requires_grad_()
    with pytest.raises(RuntimeError, match="out= does not support autograd"):
        st.spmm(a, b, out=torch.empty(6, 3, device=device))


def test_matrix_without_entries(device):
    """nnz = 0: transpose, the spmm backward (through the transpose) and csr_scale's backward."""
    for crow, col, shape in ((torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), (3, 5)),
                             (torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 0, dtype=torch.int64), (2, 3, 5))):
        values = torch.zeros(col.shape, device=device, requires_grad=True)
        A = st.CSR(crow.to(device), col.to(device), values, shape)
        assert st.transpose(A).shape == shape[:-2] + (shape[-1], shape[-2])
        B = torch.randn(shape[-1], 2, device=device, requires_grad=True)
        st.spmm(A, B).sum().backward()
        assert B.grad.abs().sum() == 0 and values.grad.shape == values.shape
        r = torch.rand(shape[-2], device=device, requires_grad=True)
        st.scale(A, row=r).values.sum().backward()
        assert r.grad.abs().sum() == 0
