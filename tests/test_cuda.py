"""CUDA-only cases: streams, devices, both routes agreeing, huge batch counts, a 1M-row graph."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from _helpers import assert_matches, randn, random_csr
from conftest import CUDA_READY, FLOAT_DTYPES

pytestmark = pytest.mark.skipif(not CUDA_READY, reason="needs a CUDA device and a CUDA build of sparsetorch")


def test_non_default_stream(rng):
    a = random_csr(rng, 300, 200, 0.05)
    b = randn(rng, 200, 64, dtype=torch.float32, device="cuda")
    ref = torch.from_numpy(a @ b.double().cpu().numpy())
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = {be: st.spmm(A, b, backend=be, bias=torch.zeros(64, device="cuda"), activation="none")
                for be in ("cusparse", "native", "balanced", "tiled", "densify")}
        batched = st.spmm(st.from_list([a, a], device="cuda", dtype=torch.float32), b, backend="cusparse")
    side.synchronize()
    for out in outs.values():
        assert_matches(out, ref, torch.float32)
    assert_matches(batched, torch.stack([ref, ref]), torch.float32)


def test_non_current_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs to place the operands off the current device")
    a = sp.random(50, 40, density=0.2, format="csr", random_state=0)
    A = st.from_scipy(a, device="cuda:1", dtype=torch.float32)
    b = torch.randn(40, 8, device="cuda:1")
    with torch.cuda.device(0):
        for be in ("cusparse", "native", "balanced", "tiled", "densify"):
            out = st.spmm(A, b, backend=be)
            assert out.device == torch.device("cuda:1")
            assert_matches(out, a @ b.double().cpu().numpy(), torch.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["single", "per_batch", "shared_A", "shared_B", "shared_pattern"])
def test_backends_agree(rng, layout, dtype):
    m, k, n, batch = 70, 50, 40, 5
    mats = [random_csr(rng, m, k, d) for d in (0.05, 0.3, 0.0, 0.6, 0.1)]
    if layout == "single":
        A, b = st.from_scipy(mats[0], device="cuda", dtype=dtype), randn(rng, k, n, dtype=dtype, device="cuda")
    elif layout == "per_batch":
        A, b = st.from_list(mats, device="cuda", dtype=dtype), randn(rng, batch, k, n, dtype=dtype, device="cuda")
    elif layout == "shared_A":
        A, b = st.from_scipy(mats[1], device="cuda", dtype=dtype), randn(rng, batch, k, n, dtype=dtype, device="cuda")
    elif layout == "shared_B":
        A, b = st.from_list(mats, device="cuda", dtype=dtype), randn(rng, k, n, dtype=dtype, device="cuda")
    else:
        a = st.from_scipy(mats[1], device="cuda", dtype=dtype)
        values = randn(rng, batch, a.values.numel(), dtype=dtype, device="cuda")
        A = st.CSR(a.crow_indices, a.col_indices, values, (batch, m, k))
        b = randn(rng, batch, k, n, dtype=dtype, device="cuda")
    ref = st.spmm(A.to(device="cpu", dtype=torch.float64), b.double().cpu())
    for be in ("cusparse", "native", "balanced", "tiled", "densify", "auto"):
        assert_matches(st.spmm(A, b, backend=be), ref, dtype)


@pytest.mark.parametrize("backend", ["cusparse", "native", "balanced", "tiled", "densify"])
def test_batch_count_above_65535(rng, backend):
    batch, m, k, n = 70_000, 3, 4, 4
    crow = torch.tensor([0, 1, 3, 4]).repeat(batch, 1)
    col = torch.from_numpy(rng.integers(0, k, size=(batch, 4)))
    values = torch.from_numpy(rng.standard_normal((batch, 4)))
    b = torch.from_numpy(rng.standard_normal((batch, k, n)))
    A = st.CSR(crow, col, values, (batch, m, k))
    ref = st.spmm(A, b)  # CPU float64, itself checked against SciPy in test_spmm
    out = st.spmm(A.to(device="cuda"), b.cuda(), backend=backend)
    assert_matches(out, ref, torch.float64)


def test_graph_with_a_million_rows(rng):
    n_nodes, per_row, n = 1_000_000, 8, 16
    rows = np.repeat(np.arange(n_nodes), per_row)
    cols = rng.integers(0, n_nodes, size=rows.size)
    a = sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(n_nodes, n_nodes))
    b = randn(rng, n_nodes, n, dtype=torch.float32, device="cuda")
    ref = a @ b.double().cpu().numpy()
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    for be in ("cusparse", "native", "balanced"):
        assert_matches(st.spmm(A, b, backend=be), ref, torch.float32)


@pytest.mark.parametrize("backend", ["native", "balanced", "tiled", "densify"])
def test_native_kernel_survives_malformed_indices(backend):
    """With validate=False (the caller vouches for A) the native kernels skip out-of-range entries
    instead of faulting; the CUDA context stays usable. By default the matrix is refused."""
    crow = torch.tensor([0, 2, 9], device="cuda")          # last row claims entries past nnz
    col = torch.tensor([0, 1 << 40, -5], device="cuda")    # far out of range both ways
    values = torch.ones(3, device="cuda")
    with pytest.raises(ValueError, match="crow_indices\\[2\\] = 9"):
        st.spmm((crow, col, values, (2, 3)), torch.ones(3, 2, device="cuda"), backend=backend)
    out = st.spmm((crow, col, values, (2, 3)), torch.ones(3, 2, device="cuda"), backend=backend, validate=False)
    torch.cuda.synchronize()
    assert out.shape == (2, 2)
    assert out[0].tolist() == [1.0, 1.0]  # the one valid entry, (0, 0)
    with pytest.raises(ValueError, match="col_indices\\[1\\] = 1099511627776 is out of range"):
        st.spmm((torch.tensor([0, 2, 3], device="cuda"), col, values, (2, 3)), torch.ones(3, 2, device="cuda"),
                validate=True)
    good = st.spmm(st.from_scipy(sp.eye(3, format="csr"), device="cuda", dtype=torch.float32),
                   torch.ones(3, 2, device="cuda"))
    assert good.cpu().tolist() == [[1.0, 1.0]] * 3


def _coo_to_csr(rows, cols, vals, shape):
    """CSR components that keep the given per-row entry order (unsorted, repeated columns)."""
    order = np.argsort(rows, kind="stable")
    crow = np.zeros(shape[0] + 1, dtype=np.int64)
    np.add.at(crow, rows + 1, 1)
    return np.cumsum(crow), cols[order], vals[order]


@pytest.mark.parametrize("backend", ["tiled", "balanced"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("order", ["sorted", "reversed", "shuffled", "repeats"])
def test_own_kernel_entry_orders(rng, dtype, order, backend):
    """The tiled kernel consumes entries in storage order across its 32-column tiles: rows longer
    than a warp within one tile, columns going backwards across tiles (taken from global memory),
    repeated columns within and across passes, and invalid rows/columns next to valid ones. The
    balanced kernel walks the same entries across row and slice boundaries (rows of 0..299 entries
    in blocks of 32 rows)."""
    m, k, n = 45, 300, 72  # 10 tiles of B rows, a partial row block and column tile
    lengths = rng.integers(0, 200, size=m)
    lengths[:3] = [0, 299, 150]
    rows = np.repeat(np.arange(m), lengths)
    cols = np.concatenate([rng.choice(k, size=ln, replace=order == "repeats") for ln in lengths])
    if order == "repeats":  # also a row with one column 100 times, more than a warp in one tile
        rows, cols = np.concatenate([rows, np.full(100, 5)]), np.concatenate([cols, np.full(100, 37)])
    vals = rng.standard_normal(rows.size)
    crow, col, val = _coo_to_csr(rows, cols, vals, (m, k))
    for r in range(m):  # the entry order inside each row
        s = slice(crow[r], crow[r + 1])
        idx = np.arange(s.start, s.stop)
        if order in ("sorted", "repeats"):
            idx = idx[np.argsort(col[s], kind="stable")] if order == "sorted" else idx
        elif order == "reversed":
            idx = idx[np.argsort(-col[s], kind="stable")]
        else:
            idx = rng.permutation(idx)
        col[s], val[s] = col[idx], val[idx]
    a = sp.csr_matrix((val, col, crow), shape=(m, k))  # SciPy sums repeated columns in the product
    b = randn(rng, k, n, dtype=dtype, device="cuda")
    ref = a @ b.double().cpu().numpy()
    A = st.CSR(torch.from_numpy(crow), torch.from_numpy(col), torch.from_numpy(val).to(dtype), (m, k)).to(device="cuda")
    col_before = A.col_indices.clone()
    for n_cols in (n, 64):  # n = 72: scalar path (not a multiple of the vector width for fp32)
        out = st.spmm(A, b[:, :n_cols].contiguous(), backend=backend,
                      bias=torch.ones(n_cols, device="cuda", dtype=dtype))
        assert_matches(out, ref[:, :n_cols] + 1.0, dtype)
    assert torch.equal(A.col_indices, col_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_kernel_pruned_weight_matches_native(rng, dtype):
    """A pruned-weight shape (many tiles, full column tiles, 8 rows per warp above 256 entries/row):
    the tiled kernel agrees with the row-group kernel and with float64."""
    m = k = 512
    for density in (0.1, 0.6):
        w = torch.from_numpy(rng.standard_normal((m, k)) * (rng.random((m, k)) < density))
        A = st.from_dense(w.to(dtype).cuda())
        b = randn(rng, k, 256, dtype=dtype, device="cuda")
        ref = w @ b.double().cpu()
        tiled, native = st.spmm(A, b, backend="tiled"), st.spmm(A, b, backend="native")
        assert_matches(tiled, ref, dtype)
        assert_matches(native, ref, dtype)


def _skewed_csr(rng, m, k, longest, index_dtype, dtype):
    """Power-law-like rows: mostly 0-6 entries, a few of hundreds, one of `longest` (cut by many
    slice boundaries), runs of empty rows, unsorted and repeated columns."""
    lengths = rng.integers(0, 7, size=m)
    lengths[rng.choice(m, size=m // 20, replace=False)] = rng.integers(50, 400, size=m // 20)
    lengths[m // 3] = longest
    lengths[m // 2: m // 2 + 40] = 0
    rows = np.repeat(np.arange(m), lengths)
    cols = rng.integers(0, k, size=rows.size)
    vals = rng.standard_normal(rows.size)
    crow, col, val = _coo_to_csr(rows, cols, vals, (m, k))
    a = sp.csr_matrix((val, col, crow), shape=(m, k))
    A = st.CSR(torch.from_numpy(crow), torch.from_numpy(col), torch.from_numpy(val), (m, k))
    return a, A.to(device="cuda", dtype=dtype, index_dtype=index_dtype)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_balanced_kernel_skewed_rows(rng, dtype, index_dtype):
    """The load-balanced kernel on skewed rows: a 20,000-entry row shared by every group of its
    block, rows cut by slice boundaries, empty rows between them, widths covering groups of 8, 16
    and 32 lanes, several column passes and the scalar path; the fused epilogue (bias, activation,
    beta * c) on the rows summed from partials; inputs unchanged."""
    m, k = 1000, 700
    a, A = _skewed_csr(rng, m, k, 20_000, index_dtype, dtype)
    before = [t.clone() for t in (A.crow_indices, A.col_indices, A.values)]
    for n in (8, 32, 64, 128, 300, 520):
        b = randn(rng, k, n, dtype=dtype, device="cuda")
        c = randn(rng, m, n, dtype=dtype, device="cuda")
        bias = randn(rng, n, dtype=dtype, device="cuda")
        prod = a @ b.double().cpu().numpy()
        ref = np.maximum(0.5 * prod + 2.0 * c.double().cpu().numpy() + bias.double().cpu().numpy(), 0.0)
        out = st.spmm(A, b, alpha=0.5, beta=2.0, c=c, bias=bias, activation="relu", backend="balanced")
        assert_matches(out, ref, dtype)
        assert_matches(st.spmm(A, b, backend="balanced"), prod, dtype)
    for t, t0 in zip((A.crow_indices, A.col_indices, A.values), before):
        assert torch.equal(t, t0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_balanced_kernel_deterministic_and_matches_native(rng, dtype):
    """Rows cut between groups are summed in a fixed order: repeated calls are bitwise equal, and a
    batch of different skewed patterns (blocks never straddle a batch) matches float64."""
    a, A = _skewed_csr(rng, 2000, 500, 5_000, torch.int32, dtype)
    b = randn(rng, 500, 96, dtype=dtype, device="cuda")
    first = st.spmm(A, b, backend="balanced")
    for _ in range(5):
        assert torch.equal(st.spmm(A, b, backend="balanced"), first)
    assert_matches(first, a @ b.double().cpu().numpy(), dtype)
    mats = [_skewed_csr(rng, 300, 500, longest, torch.int64, dtype)[0] for longest in (0, 900, 3000)]
    batch = st.from_list(mats, device="cuda", dtype=dtype)
    bb = randn(rng, 3, 500, 40, dtype=dtype, device="cuda")
    ref = np.stack([x @ bb[i].double().cpu().numpy() for i, x in enumerate(mats)])
    assert_matches(st.spmm(batch, bb, backend="balanced"), ref, dtype)


def test_balanced_kernel_survives_decreasing_row_pointers():
    """A crow that goes down (malformed, not validated) is clamped to a non-decreasing sequence in
    the kernel: no fault, no read outside the stored entries, the context stays usable."""
    crow = torch.tensor([0, 4, 1, 3, 2, 6], device="cuda")
    col = torch.tensor([0, 1, 2, 0, 1, 2], device="cuda")
    values = torch.ones(6, device="cuda")
    out = st.spmm((crow, col, values, (5, 3)), torch.ones(3, 4, device="cuda"), backend="balanced", validate=False)
    torch.cuda.synchronize()
    assert out.shape == (5, 4)
    assert out[0].tolist() == [4.0] * 4  # row 0 = entries [0, 4), all valid
    assert out.sum().item() == 6 * 4.0  # every entry counted once, in some row


def test_cusparse_takes_b_with_odd_strides_on_size_one_dims(rng):
    """A k x 1 B whose unit dimension carries a stride other than 1 (b.t() of a 1 x k row, a reshape
    of a batched B) counts as contiguous to torch; the cuSPARSE route copies it to fresh strides
    (it used to hand cuSPARSE ld = k' < k and fail with 'invalid value')."""
    a = random_csr(rng, 5, 6, 0.5)
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    row = randn(rng, 1, 6, device="cuda")
    b = row.t()  # (6, 1), strides (1, 6)
    assert b.is_contiguous() and b.stride(-1) != 1
    for be in ("cusparse", "native", "balanced", "auto"):
        assert_matches(st.spmm(A, b, backend=be), a @ b.double().cpu().numpy(), torch.float32)
    mats = [random_csr(rng, 1, 2, 0.5) for _ in range(3)]
    batch = st.from_list(mats, device="cuda", dtype=torch.float32)
    bb = randn(rng, 3, 1, 2, device="cuda").transpose(1, 2)  # (3, 2, 1), unit dim stride 2
    ref = np.stack([x @ bb[i].double().cpu().numpy() for i, x in enumerate(mats)])
    assert_matches(st.spmm(batch, bb, backend="cusparse"), ref, torch.float32)
