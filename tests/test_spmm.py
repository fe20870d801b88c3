"""spmm against SciPy / dense float64 references: single, batched, broadcast, epilogue, real matrices."""
import os

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch.datasets import matrix_files
from _helpers import DATA_DIR, activation_refs, assert_matches, randn, random_csr, rounded, to_st
from conftest import CUDA_READY, FLOAT_DTYPES, INDEX_DTYPES

# Every SpMM test runs on the CPU and on every CUDA route.
TARGETS = [("cpu", "auto")] + ([("cuda", be) for be in ("cusparse", "native", "balanced", "split", "tiled", "densify")] if CUDA_READY else [])


@pytest.fixture(params=TARGETS, ids=lambda t: f"{t[0]}-{t[1]}")
def target(request):
    return request.param


@pytest.fixture
def device(target):
    return target[0]


@pytest.fixture
def backend(target):
    return target[1]

SHAPES = [(1, 1, 1), (7, 5, 3), (64, 48, 17), (130, 300, 64), (0, 5, 3), (5, 0, 3), (5, 4, 0), (33, 1, 8)]


def run(backend, *args, **kwargs):
    return st.spmm(*args, backend=backend, **kwargs)


def reference(a, b64):
    """A (scipy float64) @ B (float64 tensor) in float64."""
    return torch.from_numpy(np.asarray(a @ b64.cpu().numpy()))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("density", [0.0, 0.05, 0.3])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_spmm_matches_scipy(device, backend, rng, m, k, n, density, dtype, index_dtype):
    a = rounded(random_csr(rng, m, k, density, empty_rows=0.2), dtype)
    b = randn(rng, k, n, dtype=dtype, device=device)
    out = run(backend, to_st(a, dtype, index_dtype, device), b)
    assert out.device.type == device
    assert_matches(out, reference(a, b.double()), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["unsorted", "duplicates", "both"])
def test_unsorted_and_duplicate_columns_are_summed(device, backend, rng, layout, dtype):
    a = rounded(random_csr(rng, 90, 70, 0.15, unsorted=layout != "duplicates", duplicates=layout != "unsorted"), dtype)
    b = randn(rng, 70, 24, dtype=dtype, device=device)
    out = run(backend, to_st(a, dtype, torch.int64, device), b)
    assert_matches(out, reference(a, b.double()), dtype)
    if layout != "unsorted":  # the matrix really holds repeated columns
        dedup = a.copy()
        dedup.sum_duplicates()
        assert dedup.nnz < a.nnz


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["transposed", "sliced", "expanded"])
def test_non_contiguous_dense(device, backend, rng, kind, dtype):
    a = random_csr(rng, 40, 30, 0.2)
    if kind == "transposed":
        b = randn(rng, 12, 30, dtype=dtype, device=device).t()
    elif kind == "sliced":
        b = randn(rng, 30, 25, dtype=dtype, device=device)[:, ::2]
    else:
        b = randn(rng, 1, 9, dtype=dtype, device=device).expand(30, 9)
    assert not b.is_contiguous()
    before = b.clone()
    out = run(backend, to_st(a, dtype, torch.int32, device), b)
    assert_matches(out, reference(a, b.double()), dtype)
    assert torch.equal(b, before)


def test_input_kinds_agree(device, backend, rng):
    a = random_csr(rng, 25, 20, 0.3)
    b = randn(rng, 20, 6, dtype=torch.float64, device=device)
    ref = reference(a, b)
    t = torch.sparse_csr_tensor(torch.from_numpy(a.indptr), torch.from_numpy(a.indices), torch.from_numpy(a.data),
                                a.shape, check_invariants=True).to(device)
    comps = (t.crow_indices(), t.col_indices(), t.values(), a.shape)
    for A in (a, sp.csr_array(a), a.tocoo(), a.tocsc(), t, comps, st.from_scipy(a, device=device)):
        assert_matches(run(backend, A, b), ref, torch.float64)


# --- batched -----------------------------------------------------------------------------------

def batched_reference(mats, b64):
    """mats: list of scipy float64; b64: (k, n) or (b, k, n) float64 tensor."""
    bs = [b64[i] if b64.dim() == 3 else b64 for i in range(len(mats))]
    return torch.stack([reference(a, bi) for a, bi in zip(mats, bs)]) if mats else None


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_batched_per_batch_patterns(device, backend, rng, batch, dtype, index_dtype):
    m, k, n = 31, 23, 10
    # Very different nnz per batch: empty, sparse and nearly dense matrices side by side.
    densities = [[0.0, 0.02, 0.9][i % 3] for i in range(batch)]
    mats = [rounded(random_csr(rng, m, k, d), dtype) for d in densities]
    A = st.from_list(mats, index_dtype=index_dtype, device=device, dtype=dtype)
    assert A.batched and A.shape == (batch, m, k)
    b = randn(rng, batch, k, n, dtype=dtype, device=device)
    out = run(backend, A, b)
    assert out.shape == (batch, m, n)
    assert_matches(out, batched_reference(mats, b.double()), dtype)


def test_batched_from_3d_torch_csr(device, backend, rng):
    """torch's batched CSR needs one nnz per batch; patterns still differ between batches."""
    batch, m, k, n, nnz = 5, 12, 9, 7, 20
    mats = []
    for _ in range(batch):
        dense = np.zeros((m, k))
        flat = rng.choice(m * k, size=nnz, replace=False)
        dense.flat[flat] = rng.standard_normal(nnz)
        mats.append(sp.csr_matrix(dense))
    t = torch.stack([torch.from_numpy(x.toarray()) for x in mats]).to(device).to_sparse_csr()
    assert t.dim() == 3 and t.values().shape == (batch, nnz)
    b = randn(rng, batch, k, n, dtype=torch.float64, device=device)
    assert_matches(run(backend, t, b), batched_reference(mats, b), torch.float64)


def test_batched_list_input(device, backend, rng):
    mats = [random_csr(rng, 8, 6, d) for d in (0.0, 0.5, 1.0, 0.1)]
    b = randn(rng, 4, 6, 3, dtype=torch.float64, device=device)
    out = run(backend, [st.from_scipy(x, device=device) for x in mats], b)
    assert_matches(out, batched_reference(mats, b), torch.float64)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_broadcast_one_A_many_B(device, backend, rng, dtype):
    a = rounded(random_csr(rng, 20, 15, 0.2), dtype)
    b = randn(rng, 6, 15, 9, dtype=dtype, device=device)
    out = run(backend, to_st(a, dtype, torch.int32, device), b)
    assert_matches(out, batched_reference([a] * 6, b.double()), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_broadcast_many_A_one_B(device, backend, rng, dtype):
    mats = [rounded(random_csr(rng, 20, 15, d), dtype) for d in (0.1, 0.4, 0.0)]
    b = randn(rng, 15, 9, dtype=dtype, device=device)
    out = run(backend, st.from_list(mats, device=device, dtype=dtype), b)
    assert_matches(out, batched_reference(mats, b.double()), dtype)


def test_shared_pattern_batched_values(device, backend, rng):
    """1-D crow/col with (b, nnz) values: one pattern, different values per batch."""
    a = random_csr(rng, 16, 12, 0.3)
    batch = 4
    values = randn(rng, batch, a.nnz, dtype=torch.float64, device=device)
    crow = torch.from_numpy(a.indptr).to(device)
    col = torch.from_numpy(a.indices).to(device)
    b = randn(rng, batch, 12, 5, dtype=torch.float64, device=device)
    out = run(backend, (crow, col, values, (batch, 16, 12)), b)
    mats = []
    for i in range(batch):
        x = a.copy()
        x.data = values[i].cpu().numpy()
        mats.append(x)
    assert_matches(out, batched_reference(mats, b), torch.float64)


def test_batched_zero_batches_and_empty_dims(device, backend, rng):
    empty = st.from_list([], shape=(4, 3), device=device, dtype=torch.float32)
    out = run(backend, empty, torch.zeros(0, 3, 2, device=device))
    assert out.shape == (0, 4, 2)
    mats = [random_csr(rng, 0, 3, 0.5)] * 2
    out = run(backend, st.from_list(mats, device=device, dtype=torch.float32), randn(rng, 2, 3, 4, device=device))
    assert out.shape == (2, 0, 4)


def test_batched_transposed_dense(device, backend, rng):
    mats = [random_csr(rng, 10, 8, d) for d in (0.3, 0.6)]
    b = randn(rng, 2, 5, 8, dtype=torch.float64, device=device).transpose(1, 2)
    assert not b.is_contiguous()
    assert_matches(run(backend, st.from_list(mats, device=device), b), batched_reference(mats, b), torch.float64)


# --- epilogue: alpha, beta, c, out, bias, activation ---------------------------------------------

ACTS = activation_refs(negative_slope=0.2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
def test_epilogue_alpha_beta_bias_activation(device, backend, rng, act, dtype):
    m, k, n = 37, 29, 21
    a = rounded(random_csr(rng, m, k, 0.2, empty_rows=0.2), dtype)
    b = randn(rng, k, n, dtype=dtype, device=device)
    c = randn(rng, m, n, dtype=dtype, device=device)
    bias = randn(rng, n, dtype=dtype, device=device)
    c_before = c.clone()
    out = run(backend, to_st(a, dtype, torch.int32, device), b, alpha=0.7, beta=-1.3, c=c, bias=bias, activation=act,
                  negative_slope=0.2)
    pre = 0.7 * reference(a, b.double()) - 1.3 * c.double().cpu() + bias.double().cpu()
    assert_matches(out, ACTS[act](pre), dtype)
    assert torch.equal(c, c_before), "c must not be written"


def test_beta_zero_ignores_nan_accumulate(device, backend, rng):
    a = random_csr(rng, 6, 5, 0.5)
    b = randn(rng, 5, 4, dtype=torch.float64, device=device)
    c = torch.full((6, 4), float("nan"), dtype=torch.float64, device=device)
    assert_matches(run(backend, a, b, c=c, beta=0.0), reference(a, b), torch.float64)
    out = torch.full((6, 4), float("nan"), dtype=torch.float64, device=device)
    run(backend, a, b, out=out)  # beta = 0: whatever out held is overwritten
    assert_matches(out, reference(a, b), torch.float64)


@pytest.mark.parametrize("contiguous_out", [True, False])
def test_out_accumulates(device, backend, rng, contiguous_out):
    a = random_csr(rng, 12, 10, 0.3)
    b = randn(rng, 10, 6, dtype=torch.float64, device=device)
    base = randn(rng, 6, 12, dtype=torch.float64, device=device)
    out = base.t().contiguous() if contiguous_out else base.t()
    start = out.clone()
    res = run(backend, a, b, alpha=2.0, beta=0.5, out=out)
    assert res is out
    assert_matches(out, 2.0 * reference(a, b) + 0.5 * start.cpu(), torch.float64)


def test_out_batched(device, backend, rng):
    mats = [random_csr(rng, 9, 7, d) for d in (0.2, 0.0, 0.7)]
    b = randn(rng, 3, 7, 5, dtype=torch.float32, device=device)
    out = torch.full((3, 9, 5), float("nan"), device=device)
    run(backend, st.from_list(mats, device=device, dtype=torch.float32), b, out=out, bias=torch.ones(5, device=device),
            activation="relu")
    assert_matches(out, torch.relu(batched_reference(mats, b.double()) + 1), torch.float32)


def test_nnz_zero_still_applies_epilogue(device, backend):
    a = st.CSR(torch.zeros(5, dtype=torch.int64, device=device), torch.zeros(0, dtype=torch.int64, device=device),
               torch.zeros(0, device=device), (4, 3))
    bias = torch.tensor([1.0, -2.0], device=device)
    out = run(backend, a, torch.randn(3, 2, device=device), bias=bias, activation="sigmoid")
    assert_matches(out, torch.sigmoid(bias.double().cpu()).expand(4, 2), torch.float32)


# --- NaN / Inf propagate as in SciPy ------------------------------------------------------------

def test_nan_inf_propagate_like_scipy(device, backend, rng):
    a = random_csr(rng, 10, 8, 0.4)
    a.data[0] = np.nan
    a.data[-1] = np.inf
    b = randn(rng, 8, 3, dtype=torch.float64, device=device)
    # A NaN in a row of B that no stored entry of A references must not reach the output.
    unused = sorted(set(range(8)) - set(a.indices.tolist()))
    if unused:
        b[unused[0], 0] = float("nan")
    ref = reference(a, b)
    assert torch.isnan(ref).any()
    assert_matches(run(backend, a, b), ref, torch.float64)


# --- the real matrices in the data folder (../shared/data/matrices or $SPARSETORCH_DATA/matrices) ------------

MATRIX_FILES = matrix_files(DATA_DIR)


@pytest.mark.parametrize("path", MATRIX_FILES or [None], ids=lambda p: os.path.basename(p) if p else "missing")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_real_matrices(device, backend, rng, path, dtype):
    if path is None:
        pytest.skip(f"no Matrix Market files under {os.path.join(DATA_DIR, 'matrices')} (shared data absent)")
    a = sp.csr_matrix(scipy.io.mmread(path))
    a.data = rng.standard_normal(a.nnz)
    a = rounded(a, dtype)
    b = randn(rng, a.shape[1], 32, dtype=dtype, device=device)
    out = run(backend, to_st(a, dtype, torch.int32, device), b)
    assert_matches(out, reference(a, b.double()), dtype)


# --- the plain call st.spmm(CSR, B): its own short path in functional.spmm --------------------------

def test_plain_call_path_checks_and_autograd(device, rng):
    """st.spmm(A, B) with an st.CSR and a plain 2-D tensor and nothing else takes a short path that
    checks only A's column count itself: the product, the shape check, A's validation (in the op), a
    tensor subclass and a B that requires grad (both through the general path) must all hold there."""
    a = random_csr(rng, 37, 29, 0.2)
    A = to_st(a, torch.float32, torch.int32, device)
    b = randn(rng, 29, 5, dtype=torch.float32, device=device)
    ref = reference(a, b.double())
    assert_matches(st.spmm(A, b), ref, torch.float32)
    assert_matches(st.spmm(A, torch.nn.Parameter(b.clone())).detach(), ref, torch.float32)
    with pytest.raises(ValueError, match="A's columns 29 != B's rows 30"):
        st.spmm(A, torch.randn(30, 5, device=device))
    bad = st.CSR(A.crow_indices, A.col_indices.clone(), A.values, A.shape)
    bad.col_indices[0] = 29  # out of range for 29 columns
    with pytest.raises(ValueError, match="col_indices"):
        st.spmm(bad, b)
    bg = b.clone().requires_grad_()
    out = st.spmm(A, bg)
    assert out.requires_grad
    out.sum().backward()
    assert_matches(bg.grad, torch.from_numpy(np.asarray(a.sum(axis=0)).reshape(-1, 1)).expand(29, 5), torch.float32)
