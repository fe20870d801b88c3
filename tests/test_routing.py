"""The per-matrix analysis (validity + row-length statistics, cached per pattern) and the routing
module that decides the SpMM route from it (csrc/common/csr_analysis.h, spmm_routing.cpp).

The routing decision is device-independent C++: ``spmm_route(..., as_cuda=True)`` asks what the CUDA
op would take, so the rules are tested here on the CPU too; which route is *fast* is measured by the
skew suite of the main job (python -m benchmarks --suites skew), not here.
"""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch._ops import ops
from conftest import CUDA_READY


def _cuda_route(A, n, dtype=torch.float32, validate=True, batched_b=False):
    a = st.as_csr(A)
    k = a.shape[-1]
    shape = (a.shape[0] if a.batched else 3, k, n) if batched_b else (k, n)
    b = torch.empty((), dtype=dtype, device=a.device).expand(shape)
    return ops.spmm_route(a.crow_indices, a.col_indices, a.values.to(dtype), b, "auto", validate, True)


def _from_lengths(lengths, k, seed=0, dtype=torch.float32, index_dtype=torch.int32, device="cpu"):
    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), k)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.concatenate([rng.choice(k, size=n, replace=False) for n in lengths]) if rows.size else rows
    a = sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(len(lengths), k))
    return st.from_scipy(a, device=device, dtype=dtype, index_dtype=index_dtype)


# --- the analysis ------------------------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_analysis_statistics(device, index_dtype):
    rng = np.random.default_rng(1)
    lengths = np.concatenate([rng.integers(0, 5, 300), [0, 0, 700, 1, 33]])
    A = _from_lengths(lengths, 1000, index_dtype=index_dtype, device=device)
    info = st.analyze(A)
    assert info.valid
    assert info.entries == lengths.sum() and info.max_row == 700 and info.empty_rows == (lengths == 0).sum()
    assert info.mean_row == pytest.approx(lengths.mean())
    assert info.row_cv == pytest.approx(lengths.std() / lengths.mean(), rel=1e-9)
    # Histogram bins of rows with length in [2^i, 2^(i+1)): rows and entries per bin.
    for start, (rows, entries) in info.row_histogram.items():
        sel = lengths[(lengths >= start) & (lengths < 2 * start)]
        assert rows == sel.size and entries == sel.sum()
    assert info.share_in_rows_of_at_least(512) == pytest.approx(700 / lengths.sum())


def test_analysis_statistics_over_many_blocks(device):
    # Enough rows and entries for many blocks and a grid-stride loop on CUDA (per-thread sums, warp
    # shuffles, per-block histograms): every statistic against NumPy's.
    rng = np.random.default_rng(2)
    m, k = 300_000, 5000
    lengths = np.minimum(rng.zipf(1.6, m) - 1, k)
    lengths[rng.integers(0, m, 10)] = k  # a few full rows
    crow = np.concatenate([[0], np.cumsum(lengths)])
    col = rng.integers(0, k, int(crow[-1]))
    A = st.CSR(torch.from_numpy(crow).to(device), torch.from_numpy(col).to(device),
               torch.ones(col.size, device=device), (m, k))
    info = st.analyze(A)
    assert info.valid
    assert info.entries == lengths.sum() and info.max_row == lengths.max()
    assert info.empty_rows == (lengths == 0).sum()
    assert info.row_cv == pytest.approx(lengths.std() / lengths.mean(), rel=1e-9)
    for start, (rows, entries) in info.row_histogram.items():
        sel = lengths[(lengths >= start) & (lengths < 2 * start)]
        assert rows == sel.size and entries == sel.sum()
    assert sum(rows for rows, _ in info.row_histogram.values()) == (lengths > 0).sum()


def _defect_message(crow, col, shape, device):
    a = st.CSR(torch.as_tensor(crow).to(device), torch.as_tensor(col).to(device),
               torch.ones(col.shape, device=device), shape)
    with pytest.raises(ValueError) as err:
        st.validate_csr(a)
    return str(err.value)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
@pytest.mark.parametrize("defects", ["two columns", "crow before a column", "batch 0 before batch 1"])
def test_cuda_reports_the_cpus_first_defect_across_blocks(defects):
    # Defects far apart (different blocks of the CUDA check): the report is the first in the CPU's scan
    # order (per batch: crow_indices, then columns), decoded by the kernel's last block.
    rng = np.random.default_rng(3)
    m, k = 200_000, 1000
    lengths = rng.integers(0, 8, m)
    crow = np.concatenate([[0], np.cumsum(lengths)])
    col = rng.integers(0, k, int(crow[-1]))
    shape = (m, k)
    if defects == "two columns":
        col[[len(col) - 5, 900]] = [k + 3, -1]
    elif defects == "crow before a column":
        col[10] = k
        crow[190_000] = crow[190_001] + 1
    else:
        crow = np.stack([crow, crow])
        col = np.stack([col, col])
        col[1, 5] = k
        col[0, len(col[0]) - 1] = k + 1
        shape = (2, m, k)
    assert _defect_message(crow, col, shape, "cuda") == _defect_message(crow, col, shape, "cpu")


def test_analysis_of_batched_patterns_ignores_padding(device):
    mats = [sp.random(20, 30, density=d, format="csr", random_state=i, dtype=np.float32)
            for i, d in enumerate((0.05, 0.3, 0.0))]
    A = st.from_list(mats, device=device)
    info = st.analyze(A)
    assert info.valid and info.entries == sum(m.nnz for m in mats)
    assert info.max_row == max(int(np.diff(m.indptr).max()) for m in mats)
    assert info.empty_rows == sum(int((np.diff(m.indptr) == 0).sum()) for m in mats)


def test_analysis_is_cached_and_invalidated_by_in_place_changes(device):
    A = _from_lengths([3, 1, 0, 2], 8, device=device)
    B = torch.randn(8, 4, device=device)
    st.spmm(A, B)
    size = ops.csr_analysis_cache()
    for _ in range(5):
        st.spmm(A, B)  # same tensors, unmodified: the cached verdict, no new entry
    assert ops.csr_analysis_cache() == size
    A.col_indices[2] = 8  # out of range, written in place: the version counter moves
    with pytest.raises(ValueError, match=r"col_indices\[2\] = 8 is out of range"):
        st.spmm(A, B)
    A.col_indices[2] = 7
    torch.testing.assert_close(st.spmm(A, B), A.to_dense() @ B)


def test_cache_forgets_freed_matrices():
    for seed in range(10):
        A = _from_lengths([2, 3, 1], 6, seed=seed)
        st.spmm(A, torch.randn(6, 2))
    del A
    assert ops.csr_analysis_cache() <= 10
    ops.csr_analysis_cache(True)
    assert ops.csr_analysis_cache() == 0


def test_a_full_cache_stays_bounded_and_sheds_dropped_matrices():
    """1024 entries at most, live matrices or not; when it is full, the entries of dropped matrices go
    (a sweep at most every 128 inserts), else the least recently used one."""
    B = torch.randn(6, 2)
    live = [_from_lengths([2, 3, 1], 6, seed=seed) for seed in range(1100)]
    for A in live:
        st.spmm(A, B)
    assert ops.csr_analysis_cache() == 1024
    A = live[-1]
    st.spmm(A, B)  # the most recent entry is still there: no new one
    assert ops.csr_analysis_cache() == 1024
    del live, A
    for seed in range(140):  # the dropped matrices' entries are swept once a full cache needs room
        st.spmm(_from_lengths([2, 3, 1], 6, seed=seed), B)
    assert ops.csr_analysis_cache() < 200


def test_inference_tensors_are_checked_every_time():
    with torch.inference_mode():
        A = _from_lengths([2, 3, 1], 6)
        B = torch.randn(6, 2)
        torch.testing.assert_close(st.spmm(A, B), A.to_dense() @ B)
        bad = st.CSR(A.crow_indices, A.col_indices.clone().fill_(9), A.values, A.shape)
        with pytest.raises(ValueError, match="out of range"):
            st.spmm(bad, B)


def test_validate_true_rechecks_a_cached_verdict():
    """A write that bypasses the version counter (through another tensor sharing the storage) is
    caught by validate=True, which re-checks whatever the cache holds."""
    A = _from_lengths([3, 1, 2], 8)
    B = torch.randn(8, 2)
    st.spmm(A, B)
    alias = torch.empty(0, dtype=A.col_indices.dtype).set_(A.col_indices.untyped_storage(),
                                                           A.col_indices.storage_offset(), A.col_indices.shape)
    alias.data[0] = 99  # .data: no version bump on A.col_indices
    with pytest.raises(ValueError, match="out of range"):
        st.spmm(A, B, validate=True)


# --- the routing decision ----------------------------------------------------------------------------

def test_uniform_short_rows_take_the_row_group_kernel():
    A = _from_lengths(np.full(5000, 16), 5000)
    assert _cuda_route(A, 32) == "native"
    assert _cuda_route(A, 128, torch.bfloat16) == "native"


def test_skewed_rows_never_take_the_row_group_kernel():
    rng = np.random.default_rng(3)
    lengths = np.minimum(np.round((rng.pareto(1.2, 20000) + 1) * 5), 20000)
    lengths[7] = 15000  # one row with most columns
    A = _from_lengths(lengths, 20000)
    for n in (1, 8, 32, 128, 512):
        for dtype in (torch.float32, torch.bfloat16):
            assert _cuda_route(A, n, dtype) not in ("native", "tiled"), (n, dtype)


def test_unchecked_matrices_never_reach_cusparse():
    rng = np.random.default_rng(4)
    lengths = np.minimum(np.round((rng.pareto(1.5, 60000) + 1) * 4), 3000)  # skewed, 60k rows: not "small"
    A = _from_lengths(lengths, 60000)
    assert _cuda_route(A, 512, validate=False) != "cusparse"
    assert _cuda_route(A, 512) == "cusparse"  # analysed now: a validated skewed fp32 matrix, wide B
    # Once analysed, validate=False may use the cached verdict.
    assert _cuda_route(A, 512, validate=False) == "cusparse"


def test_unchecked_matrices_take_a_route_that_does_not_hang_on_the_longest_row():
    A = _from_lengths([5000] + [1] * 20000, 6000)  # one long row: the row-per-group kernel serialises it
    assert _cuda_route(A, 32, validate=False) == "balanced"


def test_repeated_columns_never_reach_cusparse():
    crow = torch.tensor([0, 3, 3])
    col = torch.tensor([0, 0, 0])  # three entries in one position: cuSPARSE refuses more entries than positions
    A = st.CSR(crow, col, torch.ones(3), (2, 1))
    assert _cuda_route(A, 512) != "cusparse"


def test_dense_ish_half_matrices_take_densify():
    A = _from_lengths(np.full(2048, 205), 2048)  # 10% dense, 4M positions
    assert _cuda_route(A, 256, torch.bfloat16) == "densify"
    assert _cuda_route(A, 256, torch.float32) != "densify"


def test_candidates_leave_out_pathological_routes():
    rng = np.random.default_rng(5)
    lengths = np.minimum(np.round((rng.pareto(1.2, 20000) + 1) * 5), 20000)
    lengths[0] = 12000
    skewed = _from_lengths(lengths, 20000)
    routes = st.plan._autotune_candidates(skewed, 256)
    assert "native" not in routes and "tiled" not in routes and "balanced" in routes and "cusparse" in routes
    uniform_long = _from_lengths(np.full(512, 300), 2048)
    assert "tiled" in st.plan._autotune_candidates(uniform_long, 256)


def test_densify_is_a_tuning_candidate_only_near_its_crossover():
    """Densify is timed only where A reaches a quarter of the rules' density threshold for the dtype and
    B's width: a 5000 x 5000 matrix at 0.4% is never expanded to 100 MB by a tuning sample."""
    def candidates(A, n, dtype):
        a = st.as_csr(A)
        b = torch.empty((), dtype=dtype).expand(a.shape[-1], n)
        return ops.spmm_route_candidates(a.crow_indices, a.col_indices, a.values.to(dtype), b)

    sparse_5k = _from_lengths(np.full(5000, 20), 5000)  # 0.4%
    for n in (32, 128, 1024):
        assert "densify" not in candidates(sparse_5k, n, torch.float32)
    four_percent = _from_lengths(np.full(512, 20), 512)  # 3.9%: fp32 at n < 128 needs 6.25%, bf16 1.25%
    assert "densify" not in candidates(four_percent, 64, torch.float32)
    assert "densify" in candidates(four_percent, 64, torch.bfloat16)
    assert "densify" in candidates(four_percent, 1024, torch.float32)  # 3% at n >= 512
    eight_percent = _from_lengths(np.full(512, 41), 512)
    assert "densify" in candidates(eight_percent, 64, torch.float32)


def test_spmm_route_names_the_route_taken(device):
    A = _from_lengths([3, 1, 2], 8, device=device)
    B = torch.randn(8, 2, device=device)
    route = st.spmm_route(A, B)
    assert route == ("cpu" if device == "cpu" else "native")
    assert st.spmm_route(A, B, backend="balanced") == ("cpu" if device == "cpu" else "balanced")


def test_backward_of_a_skewed_matrix(device):
    """The backward's A^T product is routed on A^T's own analysis (here: one long column)."""
    lengths = np.full(400, 2)
    A = _from_lengths(lengths, 300, device=device)
    col = A.col_indices.clone()
    col[::2] = 5  # column 5 in every row: A^T has a row of 400 entries
    A = st.CSR(A.crow_indices, col, A.values.clone().requires_grad_(), A.shape)
    B = torch.randn(300, 16, device=device, requires_grad=True)
    st.spmm(A, B).sum().backward()
    dense = A.to_dense().detach().double()
    ones = torch.ones(400, 16, dtype=torch.float64, device=device)
    torch.testing.assert_close(B.grad.double(), dense.t() @ ones, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not st.build_info()["cuda_available"], reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cusparse_sums_half_types_in_float(dtype):
    """Half A and B through cuSPARSE: a float32 C (its mixed precision), so long rows keep the own
    kernels' accuracy. With a half C it had summed in bf16: 5.9e-3 at a longest row of 1000, 1.1e-2 at
    21k (H100), against 1.6-1.7e-3 for the float sums; both routes must stay near the latter here."""
    lengths = np.concatenate([np.full(200, 8), [20000, 3000]])
    A = _from_lengths(lengths, 30000, seed=3, dtype=dtype, device="cuda")
    A = st.CSR(A.crow_indices, A.col_indices, A.values.abs(), A.shape)  # positive terms: no cancellation
    B = torch.rand(30000, 32, device="cuda").to(dtype)
    ref = A.to_dense().double() @ B.double()
    errors = {}
    for backend in ("cusparse", "split"):
        C = st.spmm(A, B, backend=backend)
        assert C.dtype == dtype
        errors[backend] = float((C.double() - ref).norm() / ref.norm())
    assert errors["cusparse"] <= 2.5 * errors["split"] + 1e-3, errors
    # accumulate (beta) and the epilogue run on the float sums too
    c = torch.rand(A.shape[0], 32, device="cuda").to(dtype)
    bias = torch.rand(32, device="cuda").to(dtype)
    got = st.spmm(A, B, beta=0.5, c=c, bias=bias, activation="relu", backend="cusparse")
    want = torch.relu(ref + 0.5 * c.double() + bias.double())
    assert float((got.double() - want).norm() / want.norm()) <= 8e-3
