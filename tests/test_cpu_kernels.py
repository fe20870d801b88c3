"""The vectorised CPU kernels (csrc/cpu/*_kernels.h) at the sizes where their code paths change:
vector-width tails, row groups of short rows, parallel chunks, column blocks of the SpMM, rows shared
by several threads (one huge row), batches; every dtype against float64 references, and the portable
(non-AVX2) build in a subprocess. CPU only: the CUDA kernels have their own tests."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

import sparsetorch as st
from _helpers import activation_refs, assert_matches, randn, random_csr, rounded, to_st
from conftest import FLOAT_DTYPES, INDEX_DTYPES, python_env

ops = torch.ops.sparsetorch
ACTS = activation_refs(negative_slope=0.1)
# Around the vector width (8 floats / 4 doubles), the step (2 vectors), and one parallel chunk
# (32768 elements: 70001 is three chunks, two threads).
SIZES = [0, 1, 3, 7, 8, 9, 15, 16, 17, 33, 70001]


@pytest.fixture
def threads():
    """Runs the test with more threads than cores, so that work is split into many parts."""
    before = torch.get_num_threads()
    torch.set_num_threads(5)
    yield 5
    torch.set_num_threads(before)


def test_the_vector_build_is_the_one_running():
    isa = ops._cpu_isa()
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert isa == "avx2"
    else:
        assert isa == "default"


# --- elementwise ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_sizes(rng, op, size, dtype):
    x = randn(rng, size, dtype=dtype)
    y = randn(rng, size, dtype=dtype)
    if op == "div":
        y = y.sign() * (y.abs() + 0.5)
    fn = {"add": lambda a, b: st.add(a, b, alpha=-0.75), "sub": lambda a, b: st.sub(a, b, alpha=1.5),
          "mul": st.mul, "div": st.div}[op]
    ref = {"add": lambda a, b: a - 0.75 * b, "sub": lambda a, b: a - 1.5 * b, "mul": torch.mul,
           "div": torch.div}[op](x.double(), y.double())
    assert_matches(fn(x, y), ref, dtype)
    assert_matches(fn(x, 2.5), {"add": lambda a: a - 0.75 * 2.5, "sub": lambda a: a - 1.5 * 2.5,
                                "mul": lambda a: a * 2.5, "div": lambda a: a / 2.5}[op](x.double()), dtype)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_elementwise_pieces_cover_every_element_once(rng, threads):
    """The elementwise kernels hand out pieces of 32768 elements (bias_act: of rows) to the threads as
    they finish: every element computed once whatever the thread count, the result bit for bit the
    same (5 pieces and a partial one; 2 and 3 threads, and 1)."""
    before = torch.get_num_threads()
    try:
        x = randn(rng, 165000, dtype=torch.float32) * 3  # 5 pieces of 32768 and 1160 elements; 165 rows of 1000
        y = randn(rng, x.numel(), dtype=torch.float32)
        rows = x.view(-1, 1000)
        bias = randn(rng, 1000, dtype=torch.float32)
        torch.set_num_threads(1)
        single = (st.gelu(x), st.add(x, y, alpha=0.5), st.mul(x, 2.0), st.bias_act(rows, bias=bias, activation="gelu"))
        torch.set_num_threads(threads)
        many = (st.gelu(x), st.add(x, y, alpha=0.5), st.mul(x, 2.0), st.bias_act(rows, bias=bias, activation="gelu"))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(single, many):
        assert torch.equal(a, b)
    assert_matches(many[0], F.gelu(x.double()), torch.float32, input_scale=x.double())
    assert_matches(many[1], x.double() + 0.5 * y.double(), torch.float32)
    assert_matches(many[2], x.double() * 2.0, torch.float32)
    assert_matches(many[3], F.gelu(rows.double() + bias.double()), torch.float32, input_scale=rows.double())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("x_shape,y_shape", [((300, 257), (257,)),      # a bias: read in place, period 257
                                             ((40, 3, 300), (3, 300)),  # period 900
                                             ((500, 5), (5,)),           # short period: expanded first
                                             ((4, 5, 300), (4, 1, 300)),  # not a leading broadcast: copied
                                             ((7, 300), (7, 1))])
def test_binary_broadcast(rng, x_shape, y_shape, dtype):
    x = randn(rng, *x_shape, dtype=dtype)
    y = randn(rng, *y_shape, dtype=dtype)
    before = y.clone()
    assert_matches(st.add(x, y, alpha=2.0), x.double() + 2.0 * y.double(), dtype)
    assert_matches(st.mul(x, y), x.double() * y.double(), dtype)
    assert torch.equal(y, before)


def test_binary_non_contiguous_and_offset_views(rng):
    base = randn(rng, 64, 300, dtype=torch.float32)
    x = base[3:, 1:]            # offset, strided rows
    y = base.t()[:299, :61].t()  # transposed, offset
    assert_matches(st.sub(x, y), x.double() - y.double(), torch.float32)
    bias = randn(rng, 600, dtype=torch.float32)[::2][:299]  # strided bias, broadcast
    assert_matches(st.add(x, bias), x.double() + bias.double(), torch.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
def test_activation_sizes(rng, act, dtype):
    for size in (1, 7, 17, 70001):
        x = randn(rng, size, dtype=dtype) * 4
        assert_matches(st.activation(x, act, negative_slope=0.1), ACTS[act](x.double()), dtype, input_scale=x.double())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
def test_activation_special_values(act, dtype):
    """NaN propagates, infinities and large inputs saturate as in torch, in every dtype and in the
    vector body and the tail (19 elements: one step of 16 plus 3)."""
    vals = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 30.0, -30.0, 1e-3, -1e-3, 3.0, -3.0, 88.0, -88.0,
            0.5, -0.5, 2.0, float("nan"), -2.0, float("inf")]
    x = torch.tensor(vals, dtype=dtype)
    assert_matches(st.activation(x, act, negative_slope=0.1), ACTS[act](x.double()), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 3, 17, 255, 256, 300])
@pytest.mark.parametrize("rows", [0, 1, 5, 700])
def test_bias_act_row_groups(rng, rows, n, dtype):
    x = randn(rng, rows, n, dtype=dtype) * 2
    scale = randn(rng, n, dtype=dtype)
    bias = randn(rng, n, dtype=dtype)
    for act in ("gelu", "leaky_relu", "silu"):
        for s, b in ((scale, bias), (None, bias), (scale, None), (None, None)):
            pre = x.double()
            if s is not None:
                pre = pre * s.double()
            if b is not None:
                pre = pre + b.double()
            out = st.bias_act(x, bias=b, scale=s, activation=act, negative_slope=0.1)
            assert_matches(out, ACTS[act](pre), dtype, input_scale=pre)


def test_float_gelu_relative_accuracy_over_its_range():
    """The float GELU (vec_math.h's normal_cdf) keeps its relative accuracy everywhere its result is a
    normal float, for negative x too (where x Phi(x) is tiny), against 0.5 x erfc(-x / sqrt 2) in float64
    (torch's float64 form, 0.5 x (1 + erf), cancels below x = -8); the derivative to an absolute error.
    The AVX2 build runs pairs of vectors with every |x| <= 5 through a near path of its own (the grid
    has pairs of both kinds and mixed ones). Measured (AVX2 build): 3.7e-7 over |x| <= 13 (4.9e-7 over
    every 8th float there), 7.8e-7 below; the portable build, without a fused multiply-add, loses x^2's
    low part: 4.0e-6 near x = -11.5."""
    import scipy.special as sc
    x = torch.cat([torch.arange(-13.2, 13.2, 1e-3), torch.logspace(-30, 0, 301), -torch.logspace(-30, 0, 301),
                   torch.tensor([16.0, -16.0, 40.0, -40.0, 1e4, -1e4])]).float()
    xd = x.double().numpy()
    ref = torch.from_numpy(0.5 * xd * sc.erfc(-xd / np.sqrt(2)))
    normal = ref.abs() >= torch.finfo(torch.float32).tiny
    inner = normal & (x.abs() <= 13)
    avx2 = ops._cpu_isa() == "avx2"
    for out in (st.gelu(x).double(), st.bias_act(x.view(1, -1), activation="gelu").view(-1).double()):
        rel = (out - ref).abs() / ref.abs()
        assert rel[inner].max().item() <= (5e-7 if avx2 else 1e-5), rel[inner].max().item()
        assert rel[normal].max().item() <= (1e-6 if avx2 else 1e-5), rel[normal].max().item()
        assert (out[~normal].abs() <= 1e-37).all()
    xg = x.clone().requires_grad_()
    st.bias_act(xg, activation="gelu").backward(torch.ones_like(x))
    dref = 0.5 * sc.erfc(-xd / np.sqrt(2)) + xd * np.exp(-xd * xd / 2) / np.sqrt(2 * np.pi)
    assert (xg.grad.double() - torch.from_numpy(dref)).abs().max().item() <= 1e-6


def test_float_tanh_ulps_over_its_range():
    """The float tanh (vec_math.h's tanh_float: x + x^3 P(x^2) below |x| = 0.625, 1 - 2 / (e^2|x| + 1)
    above, |x| clamped to 9.5) against float64: within 1.5 float ulps of tanh(x) everywhere (measured
    1.17), both sides of the 0.625 switch and of the clamp in every lane, and exactly: +-1 from 9.02 on and
    at +-Inf, NaN kept, -0 kept, tiny x returned as x. Elementwise, bias_act and the SpMM epilogue share
    it; the derivative 1 - tanh^2 to an absolute error of 2.5e-7."""
    x = torch.cat([torch.arange(-12, 12, 1e-4), torch.logspace(-30, 0, 301), -torch.logspace(-30, 0, 301),
                   torch.randn(100_000) * 3]).float()
    edges = torch.tensor([0.625, float(np.nextafter(np.float32(0.625), np.float32(0))), 9.5, 9.02, 9.0, 9.01,
                          float(np.nextafter(np.float32(9.5), np.float32(10))), 20.0, 88.0, 1e4])
    x = torch.cat([x, edges, -edges])
    ref = torch.tanh(x.double())
    ulp = ref.float().abs().double() * 2.0 ** -23
    for out in (st.tanh(x), st.bias_act(x.view(1, -1), activation="tanh").view(-1)):
        err = (out.double() - ref).abs() / ulp.clamp_min(1e-45)
        assert err.max().item() <= 1.5, (err.max().item(), x[err.argmax()].item())
    big = x.abs() >= 9.02
    assert (st.tanh(x[big]) == torch.sign(x[big])).all()
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30, -1e-45])
    got = st.tanh(special)
    assert got[:4].tolist() == [0.0, -0.0, 1.0, -1.0] and torch.signbit(got[1]) and torch.isnan(got[4])
    assert got[5].item() == special[5].item() and got[6].item() == special[6].item()
    xg = x[:5000].clone().requires_grad_()
    st.bias_act(xg, activation="tanh").backward(torch.ones_like(xg))
    assert (xg.grad.double() - (1 - torch.tanh(xg.detach().double()) ** 2)).abs().max().item() <= 2.5e-7


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gelu_near_path_boundary(dtype):
    """GELU and its derivative where the AVX2 build's near path (pairs of 8-float vectors with every
    |x| <= 5) meets the full path: 5 and the next float above it, NaN and infinities, in each lane of a
    pair, in every dtype (float16/bfloat16 run in float32 vectors)."""
    import scipy.special as sc
    edge = [5.0, float(np.nextafter(np.float32(5), np.float32(6))), -5.0, float(np.nextafter(np.float32(-5), np.float32(-6))),
            float("nan"), float("inf"), float("-inf"), 4.999, -4.999, 0.0, -0.0, 1e-30, -1e-30, -9.0, -13.0, 13.0]
    base = np.linspace(-4.9, 4.9, 48)
    for lane in range(0, 48, 5):
        vals = base.copy()
        vals[lane:lane + len(edge)] = edge[: 48 - lane]
        x = torch.tensor(vals, dtype=dtype)
        xd = x.double()
        assert_matches(st.gelu(x), F.gelu(xd), dtype)
        xg = x.clone().requires_grad_()
        st.bias_act(xg, activation="gelu").backward(torch.ones_like(x))
        xdn = xd.numpy()
        with np.errstate(invalid="ignore"):  # inf * 0 at the infinities: NaN, as torch gives
            dref = torch.from_numpy(0.5 * sc.erfc(-xdn / np.sqrt(2)) + xdn * np.exp(-xdn * xdn / 2) / np.sqrt(2 * np.pi))
            ref = 0.5 * xdn * sc.erfc(-xdn / np.sqrt(2))
        assert_matches(xg.grad, dref, dtype)
        if dtype == torch.float32:
            got = st.gelu(x).double().numpy()
            nz = np.isfinite(xdn) & (ref != 0)
            assert np.max(np.abs(got[nz] - ref[nz]) / np.abs(ref[nz])) <= 1e-6


def test_bias_act_fused_linear_in_place(rng):
    """st.linear on the CPU runs the bias + activation in place on its own product."""
    x = randn(rng, 33, 40, dtype=torch.float32)
    w = randn(rng, 70, 40, dtype=torch.float32)
    b = randn(rng, 70, dtype=torch.float32)
    before = (x.clone(), w.clone(), b.clone())
    out = st.linear(x, w, b, activation="gelu")
    ref = F.gelu(x.double() @ w.double().t() + b.double())
    assert_matches(out, ref, torch.float32, input_scale=ref)
    assert all(torch.equal(u, v) for u, v in zip((x, w, b), before))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("shape", [(3, 1), (700, 5), (6, 300), (2, 3, 17)], ids=str)
def test_bias_act_backward(rng, act, shape, dtype):
    n = shape[-1]
    x = randn(rng, *shape, dtype=dtype)
    scale = randn(rng, n, dtype=dtype)
    bias = randn(rng, n, dtype=dtype)
    grad = randn(rng, *shape, dtype=dtype)
    gx, gs, gb = ops.bias_act_backward(grad, x, scale, bias, act, 0.1, [True, True, True])
    x64, s64, b64 = (t.detach().double().clone().requires_grad_() for t in (x, scale, bias))
    ACTS[act](x64 * s64 + b64).backward(grad.double())
    rows = x.numel() // n
    # The column sums add `rows` products: held to the tolerance of one output times sqrt(rows).
    assert_matches(gx, x64.grad, dtype)
    assert_matches(gs, s64.grad, dtype, input_scale=(grad.double().abs() * x.double().abs()).reshape(-1, n).sum(0)
                   / max(1, rows) ** 0.5)
    assert_matches(gb, b64.grad, dtype, input_scale=grad.double().abs().reshape(-1, n).sum(0) / max(1, rows) ** 0.5)
    only_x, none_s, none_b = ops.bias_act_backward(grad, x, None, None, act, 0.1, [True, False, False])
    x64 = x.detach().double().clone().requires_grad_()
    ACTS[act](x64).backward(grad.double())
    assert_matches(only_x, x64.grad, dtype)
    assert none_s.numel() == 0 and none_b.numel() == 0


def test_bias_act_backward_many_rows_is_deterministic(rng, threads):
    x = randn(rng, 20000, 7, dtype=torch.float32)
    grad = randn(rng, 20000, 7, dtype=torch.float32)
    bias = randn(rng, 7, dtype=torch.float32)
    first = ops.bias_act_backward(grad, x, None, bias, "tanh", 0.01, [False, False, True])[2]
    again = ops.bias_act_backward(grad, x, None, bias, "tanh", 0.01, [False, False, True])[2]
    assert torch.equal(first, again)
    ref = (grad.double() * (1 - torch.tanh(x.double() + bias.double()) ** 2)).sum(0)
    assert_matches(first, ref, torch.float32)


def test_bias_act_backward_empty(rng):
    for shape in ((0, 4), (3, 0)):
        x = torch.zeros(shape)
        gx, gs, gb = ops.bias_act_backward(x, x, torch.ones(shape[-1]), torch.ones(shape[-1]), "gelu", 0.01,
                                           [True, True, True])
        assert gx.shape == shape and torch.equal(gs, torch.zeros(shape[-1])) and torch.equal(gb, torch.zeros(shape[-1]))


# --- SpMM ---------------------------------------------------------------------------------------

def spmm_ref(a, b):
    return torch.from_numpy(np.asarray(a @ b.double().numpy()))


# Every column block shape: narrow only (n < 8: 16-byte vectors, a partly loaded one of 2-3 floats,
# single columns), one vector, vector blocks + a narrow tail, several blocks of up to 8 vectors.
WIDTHS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 23, 64, 65, 100, 136]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", WIDTHS)
def test_spmm_widths(rng, n, dtype, index_dtype):
    a = rounded(random_csr(rng, 45, 38, 0.2, unsorted=True, duplicates=True, empty_rows=0.2), dtype)
    b = randn(rng, 38, n, dtype=dtype)
    assert_matches(st.spmm(to_st(a, dtype, index_dtype, "cpu"), b), spmm_ref(a, b), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [2, 3, 4, 6, 7, 8, 11])
def test_spmm_narrow_b_rows_apart(rng, n, dtype):
    """B a column slice of a wider matrix (rows further apart than n), its last row in use, rows of
    1..9 entries (every remainder of the kernels' steps of 4 entries): the narrow loads read each
    row's n values and no more."""
    k = 30
    rows = np.repeat(np.arange(100), np.arange(100) % 10)  # row r has r % 10 entries
    cols = rng.integers(0, k, rows.size)  # unsorted, some repeated
    cols[-1] = k - 1
    a = rounded(unsummed_csr(rng, 100, k, rows, cols), dtype)
    wide = randn(rng, k, n + 5, dtype=dtype)
    b = wide[:, 2:2 + n]
    assert b.stride(-1) == 1 and b.stride(0) == n + 5
    assert_matches(st.spmm(to_st(a, dtype, torch.int32, "cpu"), b), spmm_ref(a, b), dtype)


def unsummed_csr(rng, m, k, rows, cols):
    """A CSR with the given entries in that order: duplicates kept, columns unsorted."""
    order = np.argsort(rows, kind="stable")
    indptr = np.searchsorted(rows[order], np.arange(m + 1))
    return sp.csr_matrix((rng.standard_normal(rows.size), cols[order], indptr), shape=(m, k))


def huge_row_matrix(rng, m=300, k=500, long_row=150, long_len=6000):
    """Rows of 0..3 entries, and one row holding most of the entries (with repeated columns)."""
    rows, cols = [], []
    for r in range(m):
        cnt = long_len if r == long_row else int(rng.integers(0, 4))
        rows.append(np.full(cnt, r))
        cols.append(rng.integers(0, k, cnt))
    return unsummed_csr(rng, m, k, np.concatenate(rows), np.concatenate(cols))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 7, 16, 100])
def test_spmm_one_huge_row_is_shared_by_threads(rng, threads, n, dtype):
    a = rounded(huge_row_matrix(rng), dtype)
    assert a.indptr[151] - a.indptr[150] > 0.9 * a.nnz
    b = randn(rng, 500, n, dtype=dtype)
    bias = randn(rng, n, dtype=dtype)
    c = randn(rng, 300, n, dtype=dtype)
    A = to_st(a, dtype, torch.int64, "cpu")
    out = st.spmm(A, b, alpha=0.5, beta=2.0, c=c, bias=bias, activation="tanh")
    pre = 0.5 * spmm_ref(a, b) + 2.0 * c.double() + bias.double()
    assert_matches(out, torch.tanh(pre), dtype, input_scale=pre)
    # The same with out= aliasing the accumulate operand, and results equal run to run.
    o1, o2 = c.clone(), c.clone()
    st.spmm(A, b, beta=1.0, out=o1)
    st.spmm(A, b, beta=1.0, out=o2)
    assert torch.equal(o1, o2)
    assert_matches(o1, spmm_ref(a, b) + c.double(), dtype)


# validate=False skips the O(nnz) check before the kernel (which raises ValueError by default, see
# test_safety.py), so these reach the kernels' own checks as they read: IndexError, never an OOB read.
@pytest.mark.parametrize("n", [3, 40])
def test_spmm_huge_row_bad_column_raises(rng, threads, n):
    a = huge_row_matrix(rng)
    col = torch.from_numpy(a.indices.astype(np.int64))
    bad = int(a.indptr[150]) + 4321  # inside the huge row, in a part some thread other than the first runs
    col[bad] = 500
    with pytest.raises(IndexError, match=f"entry {bad} of batch 0 is column 500"):
        ops.spmm(torch.from_numpy(a.indptr.astype(np.int64)), col, torch.from_numpy(a.data), torch.randn(500, n,
                 dtype=torch.float64), validate=False)


def test_spmm_bad_row_span_raises(rng):
    a = random_csr(rng, 50, 20, 0.3)
    crow = torch.from_numpy(a.indptr.astype(np.int64))
    crow[30] = crow[31] + 1  # row 29 ends after row 30 begins... row 30 spans backwards
    with pytest.raises(IndexError, match="crow_indices: row 30 of batch 0"):
        ops.spmm(crow, torch.from_numpy(a.indices.astype(np.int64)), torch.from_numpy(a.data), torch.randn(20, 4,
                 dtype=torch.float64), validate=False)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_spmm_nnz_zero_and_empty_dims(rng, dtype):
    for m, k, n in ((5, 4, 9), (0, 4, 9), (5, 0, 9), (5, 4, 0)):
        a = random_csr(rng, m, k, 0.0)
        b = randn(rng, k, n, dtype=dtype)
        bias = randn(rng, n, dtype=dtype)
        out = st.spmm(to_st(a, dtype, torch.int32, "cpu"), b, bias=bias, activation="gelu")
        assert_matches(out, F.gelu(bias.double()).expand(m, n), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 9, 64])
def test_spmm_batched_patterns_with_padding(rng, threads, n, dtype):
    """Batches of different nnz (some empty, one with a huge row) in one padded 2-D crow/col, whose
    slots after crow[b, m] hold garbage that must never be read."""
    mats = [rounded(random_csr(rng, 40, 30, d, unsorted=True, duplicates=True), dtype) for d in (0.0, 0.3, 0.05)]
    mats.append(rounded(huge_row_matrix(rng, m=40, k=30, long_row=7, long_len=800), dtype))
    L = max(x.nnz for x in mats) + 5
    crow = torch.stack([torch.from_numpy(x.indptr.astype(np.int64)) for x in mats])
    col = torch.full((len(mats), L), 10**6, dtype=torch.int64)   # padding: out of range on purpose
    val = torch.full((len(mats), L), float("nan"), dtype=dtype)
    for i, x in enumerate(mats):
        col[i, :x.nnz] = torch.from_numpy(x.indices.astype(np.int64))
        val[i, :x.nnz] = torch.from_numpy(x.data).to(dtype)
    b = randn(rng, len(mats), 30, n, dtype=dtype)
    out = ops.spmm(crow, col, val, b)
    ref = torch.stack([spmm_ref(x, b[i]) for i, x in enumerate(mats)])
    assert_matches(out, ref, dtype)
    # One B for every batch, and one pattern with per-batch values.
    out = ops.spmm(crow, col, val, b[1])
    assert_matches(out, torch.stack([spmm_ref(x, b[1]) for x in mats]), dtype)
    shared = torch.stack([torch.from_numpy(mats[1].data).to(dtype) * (i + 1) for i in range(3)])
    out = ops.spmm(crow[1], col[1, :mats[1].nnz], shared, b[:3])
    assert_matches(out, torch.stack([(i + 1) * spmm_ref(mats[1], b[i]) for i in range(3)]), dtype)


@pytest.mark.parametrize("n", [1, 5, 8, 24])
def test_spmm_nan_in_b_under_structural_zero_does_not_leak(rng, n):
    a = random_csr(rng, 20, 200, 0.05)
    unused = sorted(set(range(200)) - set(a.indices.tolist()))
    assert unused
    b = randn(rng, 200, n, dtype=torch.float32)
    b[unused] = float("nan")
    out = st.spmm(to_st(a, torch.float32, torch.int32, "cpu"), b)
    assert not torch.isnan(out).any()
    b64 = b.double()
    b64[unused] = 0.0
    assert_matches(out, spmm_ref(a, b64), torch.float32)


def test_spmm_large_graph_many_parts(rng, threads):
    """A power-law-like matrix big enough for every thread to get a part, against SciPy."""
    m = 3000
    deg = np.minimum((rng.pareto(1.2, m) + 1) * 3, 2000).astype(np.int64)
    rows = np.repeat(np.arange(m), deg)
    cols = rng.integers(0, m, rows.size)
    a = unsummed_csr(rng, m, m, rows, cols)
    for n in (1, 32):
        b = randn(rng, m, n, dtype=torch.float32)
        assert_matches(st.spmm(to_st(a, torch.float32, torch.int32, "cpu"), b), spmm_ref(a, b), torch.float32)


def short_rows_batch(rng, m, k, long_row, long_len, empty_rows):
    """Rows of 0..5 entries (a share forced empty), one long row, columns unsorted and repeated."""
    rows, cols = [], []
    for r in range(m):
        cnt = long_len if r == long_row else (0 if rng.random() < empty_rows else int(rng.integers(1, 6)))
        rows.append(np.full(cnt, r))
        cols.append(rng.integers(0, k, cnt))
    return unsummed_csr(rng, m, k, np.concatenate(rows), np.concatenate(cols))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 3, 8, 20])
def test_spmm_part_boundaries_at_every_thread_count(rng, dtype, n):
    """The SpMM walk (csr_rows.h walk_path_runs) runs the rows a part holds whole in a loop of their own
    and only the rows it shares with its neighbours as pieces. The cut points move with the number of
    threads: onto empty rows, inside long rows, onto batch boundaries (one batch empty, one ending in
    its long row). Every count gives the float64 product, with the identity epilogue and with
    alpha/bias/activation, for int32 and int64 indices and a column-major B."""
    m, k = 1500, 70
    mats = [rounded(x, dtype) for x in (short_rows_batch(rng, m, k, 7, 3000, 0.2), random_csr(rng, m, k, 0.0),
                                        short_rows_batch(rng, m, k, m - 1, 2500, 0.5),
                                        short_rows_batch(rng, m, k, 600, 40, 0.0))]
    L = max(x.nnz for x in mats) + 3
    b = randn(rng, len(mats), n, k, dtype=dtype).transpose(1, 2)  # (batch, k, n), column-major
    bias = randn(rng, n, dtype=dtype)
    ref = torch.stack([spmm_ref(x, b[i]) for i, x in enumerate(mats)])
    pre = 0.5 * ref + bias.double()
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3, 5, 7):
            torch.set_num_threads(threads)
            for index_dtype in INDEX_DTYPES:
                crow = torch.stack([torch.from_numpy(x.indptr).to(index_dtype) for x in mats])
                col = torch.full((len(mats), L), 10**6, dtype=index_dtype)  # padding: out of range on purpose
                val = torch.full((len(mats), L), float("nan"), dtype=dtype)
                for i, x in enumerate(mats):
                    col[i, :x.nnz] = torch.from_numpy(x.indices).to(index_dtype)
                    val[i, :x.nnz] = torch.from_numpy(x.data).to(dtype)
                assert_matches(ops.spmm(crow, col, val, b), ref, dtype)
                out = ops.spmm(crow, col, val, b, 0.5, None, 0.0, bias, "relu")
                assert_matches(out, torch.relu(pre), dtype, input_scale=pre)
                A0 = to_st(mats[0], dtype, index_dtype, "cpu")
                assert_matches(st.spmm(A0, b[0]), ref[0], dtype)
    finally:
        torch.set_num_threads(before)


# Outputs of 8 MiB and more are stored past the caches (elementwise_kernels.h, kStreamBytes), from each
# thread's first 32-byte boundary on: thread chunks and broadcast periods that start misaligned, odd
# lengths, every dtype.
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_binary_streamed_output(rng, dtype, threads):
    numel = (8 << 20) // torch.tensor([], dtype=dtype).element_size() + 13
    x = randn(rng, numel, dtype=dtype)
    y = randn(rng, numel, dtype=dtype)
    x_before, y_before = x.clone(), y.clone()
    assert_matches(st.add(x, y, alpha=-0.75), x.double() - 0.75 * y.double(), dtype)
    assert_matches(st.mul(x[1:], y[:-1]), x[1:].double() * y[:-1].double(), dtype)
    # y broadcast over x's rows: pieces of one period (1003 elements) each begin at another alignment.
    rows = numel // 1003 + 1
    x2 = randn(rng, rows, 1003, dtype=dtype)
    y2 = randn(rng, 1003, dtype=dtype)
    assert_matches(st.sub(x2, y2, alpha=2.0), x2.double() - 2.0 * y2.double(), dtype)
    assert torch.equal(x, x_before) and torch.equal(y, y_before)


# --- SDDMM and csr_scale ------------------------------------------------------------------------

def sddmm_ref(a, x, y):
    coo = a.tocoo()
    dots = (x.double()[coo.row] * y.double()[coo.col]).sum(-1)
    return dots


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 5, 16, 17, 40])
def test_sddmm_widths(rng, n, dtype, index_dtype):
    a = random_csr(rng, 35, 28, 0.2, unsorted=True, duplicates=True, empty_rows=0.2)
    x = randn(rng, 35, n, dtype=dtype)
    y = randn(rng, 28, n, dtype=dtype)
    out = st.sddmm(to_st(a, dtype, index_dtype, "cpu"), x, y, alpha=1.5)
    assert_matches(out.values, 1.5 * sddmm_ref(a, x, y), dtype)


def test_sddmm_huge_row_and_bad_column(rng, threads):
    a = huge_row_matrix(rng)
    x = randn(rng, 300, 12, dtype=torch.float32)
    y = randn(rng, 500, 12, dtype=torch.float32)
    crow = torch.from_numpy(a.indptr.astype(np.int64))
    col = torch.from_numpy(a.indices.astype(np.int64))
    assert_matches(ops.sddmm(crow, col, x, y), sddmm_ref(a, x, y), torch.float32)
    col[int(a.indptr[150]) + 5000] = -1
    with pytest.raises(IndexError, match="is column -1"):
        ops.sddmm(crow, col, x, y, validate=False)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_csr_scale_huge_row_batched_and_padding(rng, threads, dtype):
    a = rounded(huge_row_matrix(rng), dtype)
    r = randn(rng, 300, dtype=dtype)
    c = randn(rng, 500, dtype=dtype)
    out = st.scale(to_st(a, dtype, torch.int32, "cpu"), row=r, col=c)
    ref = sp.diags(r.double().numpy()) @ a @ sp.diags(c.double().numpy())
    assert_matches(out.to_dense(), ref.toarray(), dtype)
    # Batched values over one pattern, with slots before crow[0] and after crow[m] kept as they are.
    crow = torch.from_numpy(a.indptr.astype(np.int64)) + 2
    col = torch.cat([torch.tensor([0, 0]), torch.from_numpy(a.indices.astype(np.int64)), torch.tensor([7])])
    vals = randn(rng, 2, a.nnz + 3, dtype=dtype)
    rb = randn(rng, 2, 300, dtype=dtype)
    got = ops.csr_scale(crow, col, vals, rb, c)
    assert torch.equal(got[:, :2], vals[:, :2]) and torch.equal(got[:, -1], vals[:, -1])
    coo_rows = np.repeat(np.arange(300), np.diff(a.indptr))
    ref = vals[:, 2:-1].double() * rb.double()[:, coo_rows] * c.double()[a.indices]
    assert_matches(got[:, 2:-1], ref, dtype)
    col[2 + 4000] = 500
    with pytest.raises(IndexError, match="out of range for col_scale of length 500"):
        ops.csr_scale(crow, col, vals, rb, c)


# --- the portable build ------------------------------------------------------------------------

def test_portable_build_matches_in_a_subprocess():
    """ATEN_CPU_CAPABILITY=default selects the kernels built without AVX2: the same checks, shortly."""
    script = textwrap.dedent("""
        import numpy as np, scipy.sparse as sp, torch, torch.nn.functional as F
        import sparsetorch as st
        assert torch.ops.sparsetorch._cpu_isa() == "default", torch.ops.sparsetorch._cpu_isa()
        g = torch.Generator().manual_seed(0)
        for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12), (torch.bfloat16, 2e-2), (torch.float16, 3e-3)):
            x = torch.randn(37, 45, generator=g).to(dtype)
            b = torch.randn(45, generator=g).to(dtype)
            def close(out, ref):
                err = (out.double() - ref).norm() / ref.norm()
                assert err <= tol, (dtype, float(err))
            close(st.add(x, x, alpha=2.0), 3 * x.double())
            close(st.bias_act(x, bias=b, activation="gelu"), F.gelu(x.double() + b.double()))
            y = 3 * x
            close(st.tanh(y), torch.tanh(y.double()))
            a = sp.random(60, 37, density=0.2, format="csr", random_state=1)
            a.data = torch.from_numpy(a.data).to(dtype).double().numpy()
            for n in (1, 2, 3, 6, 7, 11, 45):
                close(st.spmm(st.from_scipy(a, dtype=dtype), x[:, :n]), torch.from_numpy(a @ x[:, :n].double().numpy()))
        print("ok")
    """)
    env = python_env(ATEN_CPU_CAPABILITY="default")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr
