"""The entry-split SpMM route (backend="split", csrc/cuda/spmm_split.cu) against float64 references.

Long rows are cut among units of E entries and their pieces summed by a second kernel; the
SPARSETORCH_SPLIT_UNIT / SPARSETORCH_SPLIT_LANES knobs force tiny units (E = 1: every row longer than
one entry is cut into one-entry pieces, hundreds of pieces summed by a whole block) and each column
tile width, so the cut / snap / fix-up paths run on small matrices. The general op cases (every
shape, density, epilogue, layout) run on this route through tests/test_spmm.py's targets too.
"""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from _helpers import activation_refs, assert_matches, randn, random_csr, rounded
from conftest import CUDA_READY, FLOAT_DTYPES, INDEX_DTYPES

pytestmark = pytest.mark.skipif(not CUDA_READY, reason="needs a CUDA device and a CUDA build of sparsetorch")

LAYOUTS = ["single", "per_batch", "shared_A", "shared_B", "shared_pattern"]


def skewed(rng, m, k, longest, *, empty_run=0):
    """A float64 SciPy CSR with power-law-like rows: mostly 0-6 entries, a few of 50-300 (cut at the
    default unit size), one of `longest` entries, a run of empty rows; columns unsorted and repeated,
    kept in storage order (SciPy sums repeats in the product, as the kernels must)."""
    lengths = rng.integers(0, 7, size=m)
    if m >= 20:
        lengths[rng.choice(m, size=m // 20, replace=False)] = rng.integers(50, 300, size=m // 20)
    if m:
        lengths[m // 3] = longest
    lengths[m // 2: m // 2 + empty_run] = 0
    crow = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cols = rng.integers(0, k, size=int(crow[-1])) if k else np.zeros(0, dtype=np.int64)
    return sp.csr_matrix((rng.standard_normal(cols.size), cols, crow), shape=(m, k))


def to_cuda(a, dtype, index_dtype=torch.int64):
    """st.CSR of a SciPy matrix keeping its storage order (from_scipy may sort)."""
    A = st.CSR(torch.from_numpy(a.indptr.astype(np.int64)), torch.from_numpy(a.indices.astype(np.int64)),
               torch.from_numpy(a.data), a.shape)
    return A.to(device="cuda", dtype=dtype, index_dtype=index_dtype)


@pytest.fixture
def knobs(monkeypatch):
    """set(unit=, lanes=, offsets=): force the unit size / lanes per group / offset width (64: the
    64-bit offsets only a problem of more than 2^31 elements takes otherwise) of the split route."""
    def set_(unit=None, lanes=None, offsets=None):
        for name, v in (("SPARSETORCH_SPLIT_UNIT", unit), ("SPARSETORCH_SPLIT_LANES", lanes),
                        ("SPARSETORCH_SPLIT_OFFSETS", offsets)):
            if v is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(v))
    yield set_
    set_()


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("unit,lanes,offsets", [(None, None, None), (1, 4, None), (1, 8, None), (3, 16, None),
                                                (7, 32, None), (64, 8, None), (None, None, 64), (2, 4, 64)])
def test_split_skewed_rows_every_dtype(rng, knobs, dtype, index_dtype, unit, lanes, offsets):
    """Rows cut into many pieces (one of 1,500 entries: more than 16 pieces at every unit size, so
    the whole-block sum runs), rows of 50-300, short rows never cut, empty rows; widths that give
    one or several column tiles and the one-element path (n = 70 is no multiple of 16 bytes / 8 B);
    the fused epilogue on whole, cut and empty rows; 32- and 64-bit offsets; inputs unchanged."""
    knobs(unit=unit, lanes=lanes, offsets=offsets)
    m, k = 400, 300
    a = rounded(skewed(rng, m, k, 1500, empty_run=30), dtype)
    A = to_cuda(a, dtype, index_dtype)
    before = [t.clone() for t in (A.crow_indices, A.col_indices, A.values)]
    for n in (8, 40, 70, 136):
        b = randn(rng, k, n, dtype=dtype, device="cuda")
        c = randn(rng, m, n, dtype=dtype, device="cuda")
        bias = randn(rng, n, dtype=dtype, device="cuda")
        prod = a @ b.double().cpu().numpy()
        z = 0.5 * prod + 2.0 * c.double().cpu().numpy() + bias.double().cpu().numpy()
        out = st.spmm(A, b, alpha=0.5, beta=2.0, c=c, bias=bias, activation="relu", backend="split")
        assert_matches(out, np.maximum(z, 0.0), dtype, input_scale=torch.from_numpy(z))
        assert_matches(st.spmm(A, b, backend="split"), prod, dtype)
    for t, t0 in zip((A.crow_indices, A.col_indices, A.values), before):
        assert torch.equal(t, t0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("unit", [None, 2])
def test_split_batch_layouts(rng, knobs, dtype, layout, unit):
    """Per-batch patterns (different nnz, one all empty), one A for a batch of B, one B for a batch
    of A, a shared pattern with batched values: each batch's units and pieces stay its own."""
    knobs(unit=unit)
    m, k, n, batch = 90, 60, 48, 4
    mats = [rounded(skewed(rng, m, k, longest), dtype) for longest in (400, 0, 120, 700)]
    mats[1] = sp.csr_matrix((m, k))
    if layout == "single":
        A, b = to_cuda(mats[0], dtype), randn(rng, k, n, dtype=dtype, device="cuda")
        ref = mats[0] @ b.double().cpu().numpy()
    elif layout == "per_batch":
        A, b = st.from_list(mats, device="cuda", dtype=dtype), randn(rng, batch, k, n, dtype=dtype, device="cuda")
        ref = np.stack([x @ b[i].double().cpu().numpy() for i, x in enumerate(mats)])
    elif layout == "shared_A":
        A, b = to_cuda(mats[3], dtype), randn(rng, batch, k, n, dtype=dtype, device="cuda")
        ref = np.stack([mats[3] @ b[i].double().cpu().numpy() for i in range(batch)])
    elif layout == "shared_B":
        A, b = st.from_list(mats, device="cuda", dtype=dtype), randn(rng, k, n, dtype=dtype, device="cuda")
        ref = np.stack([x @ b.double().cpu().numpy() for x in mats])
    else:
        a0 = to_cuda(mats[0], dtype)
        values = randn(rng, batch, a0.values.numel(), dtype=dtype, device="cuda")
        A = st.CSR(a0.crow_indices, a0.col_indices, values, (batch, m, k))
        b = randn(rng, batch, k, n, dtype=dtype, device="cuda")
        ref = np.stack([sp.csr_matrix((values[i].double().cpu().numpy(), mats[0].indices, mats[0].indptr),
                                      shape=(m, k)) @ b[i].double().cpu().numpy() for i in range(batch)])
    assert_matches(st.spmm(A, b, backend="split"), ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_split_one_row_holds_most_entries(rng, dtype):
    """A 60,000-entry row among 3,000 short ones at the default unit size: hundreds of pieces
    summed by a block; every row else whole."""
    m, k, n = 3000, 2000, 64
    a = rounded(skewed(rng, m, k, 60_000), dtype)
    assert a.indptr[m // 3 + 1] - a.indptr[m // 3] > 0.5 * a.nnz
    b = randn(rng, k, n, dtype=dtype, device="cuda")
    assert_matches(st.spmm(to_cuda(a, dtype, torch.int32), b, backend="split"), a @ b.double().cpu().numpy(), dtype)


@pytest.mark.parametrize("unit", [None, 1])
def test_split_deterministic(rng, knobs, unit):
    """Pieces are added in a fixed order: repeated calls give the same bits (single and batched)."""
    knobs(unit=unit)
    a = skewed(rng, 2000, 500, 9000)
    A = to_cuda(a, torch.float32)
    b = randn(rng, 500, 96, device="cuda")
    first = st.spmm(A, b, backend="split")
    for _ in range(3):
        assert torch.equal(st.spmm(A, b, backend="split"), first)
    assert_matches(first, a @ b.double().cpu().numpy(), torch.float32)
    batch = st.from_list([a, skewed(rng, 2000, 500, 3000)], device="cuda", dtype=torch.float32)
    bb = randn(rng, 2, 500, 32, device="cuda")
    first = st.spmm(batch, bb, backend="split")
    for _ in range(3):
        assert torch.equal(st.spmm(batch, bb, backend="split"), first)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("m,k,n", [(0, 5, 3), (5, 0, 3), (5, 4, 0), (1, 1, 1), (6, 9, 4)])
def test_split_empty_and_zero_sized(rng, index_dtype, m, k, n):
    """Zero-sized dimensions and nnz = 0: every row empty still gets the epilogue (bias, activation,
    beta * c); k = 0 has no entries at all."""
    a = sp.csr_matrix((m, k))
    b = randn(rng, k, n, device="cuda")
    bias = randn(rng, n, device="cuda")
    c = randn(rng, m, n, device="cuda")
    out = st.spmm(to_cuda(a, torch.float32, index_dtype), b, beta=0.5, c=c, bias=bias, activation="tanh",
                  backend="split")
    assert_matches(out, torch.tanh(0.5 * c.double().cpu() + bias.double().cpu()), torch.float32)
    if m and k:
        one = sp.csr_matrix(([2.0], ([m - 1], [k - 1])), shape=(m, k))
        assert_matches(st.spmm(to_cuda(one, torch.float32, index_dtype), b, backend="split"),
                       one @ b.double().cpu().numpy(), torch.float32)


@pytest.mark.parametrize("kind", ["transposed", "sliced", "row_stride", "expanded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_any_b_strides_and_out(rng, kind, dtype):
    """B in any strides (column-major, every other column, rows further apart than n, a broadcast
    row), and out= with beta: out is the accumulate operand and the destination."""
    a = rounded(skewed(rng, 200, 120, 900), dtype)
    if kind == "transposed":
        b = randn(rng, 24, 120, dtype=dtype, device="cuda").t()
    elif kind == "sliced":
        b = randn(rng, 120, 48, dtype=dtype, device="cuda")[:, ::2]
    elif kind == "row_stride":
        b = randn(rng, 120, 40, dtype=dtype, device="cuda")[:, :32]
    else:
        b = randn(rng, 1, 16, dtype=dtype, device="cuda").expand(120, 16)
    A = to_cuda(a, dtype)
    prod = a @ b.double().cpu().numpy()
    assert_matches(st.spmm(A, b, backend="split"), prod, dtype)
    out = randn(rng, 200, b.shape[1], dtype=dtype, device="cuda")
    start = out.double().cpu().numpy()
    res = st.spmm(A, b, beta=-1.0, out=out, backend="split")
    assert res is out
    assert_matches(out, prod - start, dtype)


@pytest.mark.parametrize("activation", ["leaky_relu", "gelu", "silu", "sigmoid"])
def test_split_activations(rng, activation):
    """Each activation on whole rows, cut rows and empty rows."""
    a = skewed(rng, 300, 200, 2000, empty_run=10)
    b = randn(rng, 200, 32, device="cuda")
    bias = randn(rng, 32, device="cuda")
    z = torch.from_numpy(a @ b.double().cpu().numpy()) + bias.double().cpu()
    out = st.spmm(to_cuda(a, torch.float32), b, bias=bias, activation=activation, negative_slope=0.2,
                  backend="split")
    assert_matches(out, activation_refs(0.2)[activation](z), torch.float32, input_scale=z)


@pytest.mark.parametrize("unit", [None, 1, 2])
def test_split_survives_malformed_indices(knobs, unit):
    """validate=False (the caller vouches for A): row pointers that go down, past nnz or below 0, columns far out of range.
    No fault (compute-sanitizer runs this file on the device), the valid entries of well-formed rows
    counted, and the CUDA context stays usable."""
    knobs(unit=unit)
    b = torch.ones(3, 4, device="cuda")
    cases = [
        (torch.tensor([0, 4, 1, 3, 2, 6]), torch.tensor([0, 1, 2, 0, 1, 2])),      # decreasing
        (torch.tensor([0, 2, 90, 3]), torch.tensor([0, 1, 2])),                     # past nnz
        (torch.tensor([-7, 1, 2, -1]), torch.tensor([0, 1, 2])),                    # negative
        (torch.tensor([5, 1, 0, 3]), torch.tensor([0, 1, 2])),                      # starts past its end
        (torch.tensor([0, 2, 3]), torch.tensor([0, 1 << 40, -5])),                  # columns out of range
    ]
    for crow, col in cases:
        m = crow.numel() - 1
        for idx in (torch.int32, torch.int64):
            vals = torch.ones(col.numel(), device="cuda")
            out = st.spmm((crow.to("cuda", idx), col.to("cuda", idx), vals, (m, 3)), b, backend="split",
                          validate=False)
            torch.cuda.synchronize()
            assert out.shape == (m, 4)
    out = st.spmm((torch.tensor([0, 2, 3], device="cuda"), torch.tensor([0, 1 << 40, -5], device="cuda"),
                   torch.ones(3, device="cuda"), (2, 3)), b, backend="split", validate=False)
    assert out[0].tolist() == [1.0] * 4  # row 0: the one valid entry
    good = st.spmm(st.from_scipy(sp.eye(3, format="csr"), device="cuda", dtype=torch.float32), b, backend="split")
    assert good.cpu().tolist() == [[1.0] * 4] * 3


@pytest.mark.parametrize("unit", [None, 3])
def test_split_unit_plan_follows_the_pattern(rng, knobs, unit):
    """The unit plan is kept with the matrix's analysis: rewriting the indices in place (a new
    pattern, same sizes) must drop it; unit sizes and streams get plans of their own; a matrix used
    without an analysis (validate=False, never checked) and one used under inference mode (no
    version counter, never cached) get a plan per call."""
    knobs(unit=unit)
    m, k, n = 500, 400, 32
    first, second = skewed(rng, m, k, 2000), skewed(rng, m, k, 300)
    second = sp.csr_matrix((np.resize(second.data, first.nnz), np.resize(second.indices, first.nnz),
                            np.minimum(second.indptr * first.nnz // max(second.nnz, 1), first.nnz)), shape=(m, k))
    assert second.nnz == first.nnz and not np.array_equal(second.indptr, first.indptr)
    A = to_cuda(first, torch.float32, torch.int32)
    b = randn(rng, k, n, device="cuda")
    assert_matches(st.spmm(A, b, backend="split"), first @ b.double().cpu().numpy(), torch.float32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = st.spmm(A, b, backend="split")
    torch.cuda.current_stream().wait_stream(side)
    assert_matches(on_side, first @ b.double().cpu().numpy(), torch.float32)
    B = to_cuda(second, torch.float32, torch.int32)
    A.crow_indices.copy_(B.crow_indices)
    A.col_indices.copy_(B.col_indices)
    A.values.copy_(B.values)
    assert_matches(st.spmm(A, b, backend="split"), second @ b.double().cpu().numpy(), torch.float32)
    fresh = to_cuda(first, torch.float32, torch.int32)
    assert_matches(st.spmm(fresh, b, backend="split", validate=False), first @ b.double().cpu().numpy(),
                   torch.float32)
    with torch.inference_mode():
        frozen = to_cuda(first, torch.float32, torch.int32)
        for _ in range(2):
            assert_matches(st.spmm(frozen, b, backend="split"), first @ b.double().cpu().numpy(), torch.float32)


def test_split_under_cuda_graph_capture(rng):
    """Captured before the matrix's plan exists (made inside the capture, from its pool) and replayed
    with new B values; then the same matrix outside the capture."""
    a = skewed(rng, 300, 200, 1200)
    A = to_cuda(a, torch.float32, torch.int32)
    st.spmm(A, randn(rng, 200, 16, device="cuda"), backend="native")  # analysed: a capture cannot sync
    b = randn(rng, 200, 16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = st.spmm(A, b, backend="split")
    torch.cuda.current_stream().wait_stream(stream)
    b.copy_(randn(rng, 200, 16, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(out, a @ b.double().cpu().numpy(), torch.float32)
    assert_matches(st.spmm(A, b, backend="split"), a @ b.double().cpu().numpy(), torch.float32)


def test_split_plan_and_autograd(rng):
    """SpmmPlan(backend="split") and the gradients through it (the backward's own routes)."""
    a = skewed(rng, 150, 100, 800)
    A = to_cuda(a, torch.float64)
    plan = st.SpmmPlan(A, backend="split", validate=True)
    b = randn(rng, 100, 16, dtype=torch.float64, device="cuda").requires_grad_()
    out = plan(b)
    assert_matches(out, a @ b.detach().cpu().numpy(), torch.float64)
    out.sum().backward()
    assert_matches(b.grad, a.T @ np.ones((150, 16)), torch.float64)


def test_split_random_graph_unchanged_by_knobs(rng, knobs):
    """A uniform random graph (rows of ~20, the route's non-skewed case) at every lane count: same
    values within rounding, each within tolerance of float64."""
    a = random_csr(rng, 3000, 3000, 20 / 3000, duplicates=True, unsorted=True)
    b = randn(rng, 3000, 128, device="cuda")
    ref = a @ b.double().cpu().numpy()
    for lanes in (4, 8, 16, 32):
        knobs(lanes=lanes)
        assert_matches(st.spmm(to_cuda(a, torch.float32, torch.int32), b, backend="split"), ref, torch.float32)
