"""The densify route (A expanded on the GPU + one cuBLAS GEMM): sparse-product semantics for NaN/Inf
in B (the device-side guard and the row-group fallback), fp32 accuracy whatever torch's TF32 and
reduced-precision flags say, the caller's accumulate kept for the fallback, and the plan's
candidate rule. Every other SpMM test runs it too (test_spmm / test_autograd TARGETS)."""
import numpy as np
import pytest
import torch

import sparsetorch as st
from _helpers import assert_matches, randn, random_csr, rounded
from conftest import CUDA_READY, FLOAT_DTYPES

pytestmark = pytest.mark.skipif(not CUDA_READY, reason="needs a CUDA device and a CUDA build of sparsetorch")


def _unused_columns(a):
    return sorted(set(range(a.shape[1])) - set(a.indices.tolist()))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["single", "batched_b", "per_batch"])
def test_nonfinite_b_does_not_leak_through_structural_zeros(rng, dtype, layout):
    """NaN, +Inf and -Inf in rows of B that only some rows of A reference: a dense product would turn
    every output row NaN (0 * inf); the densify route must give the sparse result, bit for bit the
    row-group kernel's (its fallback)."""
    m, k, n, batch = 40, 30, 24, 3
    mats = [rounded(random_csr(rng, m, k, 0.1, empty_rows=0.2), dtype) for _ in range(batch)]
    if layout == "per_batch":
        A = st.from_list(mats, device="cuda", dtype=dtype)
        b = randn(rng, batch, k, n, dtype=dtype, device="cuda")
        bad = b[1]
    else:
        A = st.from_scipy(mats[0], device="cuda", dtype=dtype)
        b = randn(rng, *((batch, k, n) if layout == "batched_b" else (k, n)), dtype=dtype, device="cuda")
        bad = b[-1] if layout == "batched_b" else b
    bad[3, 5] = float("nan")
    bad[7, :] = float("inf")
    bad[11, 2] = -float("inf")
    unused = _unused_columns(mats[0])
    if unused:
        bad[unused[0], :] = float("nan")  # referenced by no entry: must not appear anywhere
    ref = st.spmm(A.to(device="cpu", dtype=torch.float64), b.double().cpu())
    out = st.spmm(A, b, backend="densify")
    assert_matches(out, ref, dtype)
    torch.testing.assert_close(out, st.spmm(A, b, backend="native"), rtol=0, atol=0, equal_nan=True)
    assert not torch.isnan(ref).all(), "the case must keep finite outputs to be a test"


def test_finite_b_takes_the_gemm_and_stays_fp32_exact(rng):
    """With TF32 and reduced-precision reductions allowed in torch, the route still multiplies in full
    fp32 (k = 4096: TF32's 10-bit mantissa would miss the 1e-5 tolerance by ~100x); torch's own
    matmul keeps its TF32 setting afterwards."""
    a = random_csr(rng, 256, 4096, 0.3)
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    b = randn(rng, 4096, 128, device="cuda")
    x = torch.randn(512, 512, device="cuda")
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
        before = x @ x
        assert_matches(st.spmm(A, b, backend="densify"), a @ b.double().cpu().numpy(), torch.float32)
        assert torch.equal(x @ x, before)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flags


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_out_accumulate_survives_the_fallback(rng, dtype):
    """spmm_out with beta != 0: out is both the accumulate operand and the destination. When B holds a
    NaN the fallback recomputes from the caller's out (kept aside), not from the GEMM's result."""
    a = rounded(random_csr(rng, 50, 40, 0.1), dtype)
    A = st.from_scipy(a, device="cuda", dtype=dtype)
    b = randn(rng, 40, 16, dtype=dtype, device="cuda")
    b[_unused_columns(a)[0] if _unused_columns(a) else 0, 3] = float("nan")
    start = randn(rng, 50, 16, dtype=dtype, device="cuda")
    bias = randn(rng, 16, dtype=dtype, device="cuda")
    got, want = start.clone(), start.clone()
    st.spmm(A, b, out=got, alpha=0.5, beta=2.0, bias=bias, activation="relu", backend="densify")
    st.spmm(A, b, out=want, alpha=0.5, beta=2.0, bias=bias, activation="relu", backend="native")
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    finite_b = torch.nan_to_num(b)
    got = start.clone()
    st.spmm(A, finite_b, out=got, alpha=0.5, beta=2.0, bias=bias, activation="relu", backend="densify")
    ref = torch.relu(0.5 * torch.from_numpy(a @ finite_b.double().cpu().numpy()) + 2.0 * start.double().cpu()
                     + bias.double().cpu())
    assert_matches(got, ref, dtype)


def test_inputs_unchanged_and_repeated_columns_summed(rng):
    """Repeated columns are summed (shared-memory accumulation); nothing the caller passed changes."""
    a = random_csr(rng, 64, 48, 0.2, unsorted=True, duplicates=True)
    A = st.from_scipy(a, device="cuda", dtype=torch.bfloat16)
    b = randn(rng, 48, 32, dtype=torch.bfloat16, device="cuda")
    c = randn(rng, 64, 32, dtype=torch.bfloat16, device="cuda")
    copies = [t.clone() for t in (A.crow_indices, A.col_indices, A.values, b, c)]
    out = st.spmm(A, b, c=c, beta=-1.0, backend="densify")
    for before, after in zip(copies, (A.crow_indices, A.col_indices, A.values, b, c)):
        assert torch.equal(before, after)
    ref = rounded(a, torch.bfloat16) @ b.double().cpu().numpy() - c.double().cpu().numpy()
    assert_matches(out, ref, torch.bfloat16)


def test_wide_rows_span_several_shared_memory_chunks(rng):
    """k = 10,000 float32 columns is three 4096-column chunks (the last partial), k odd: the scalar
    store path; float64 chunks hold 2048 columns."""
    for dtype, k in ((torch.float32, 10_001), (torch.float64, 5_000)):
        a = random_csr(rng, 20, k, 0.01)
        b = randn(rng, k, 8, dtype=dtype, device="cuda")
        assert_matches(st.spmm(st.from_scipy(a, device="cuda", dtype=dtype), b, backend="densify"),
                       a @ b.double().cpu().numpy(), dtype)


def test_plan_candidate_rule():
    """Densify is timed only when A reaches a quarter of the rules' density threshold and its dense copy
    fits the byte budget (1 GiB: csrc/common/spmm_routing.cpp)."""
    import sparsetorch.plan as plan_mod

    dense_ish = st.from_dense(torch.ones(64, 64, device="cuda"))
    assert "densify" in plan_mod._autotune_candidates(dense_ish, 32)
    crow = torch.cat([torch.zeros(4096, dtype=torch.int64), torch.tensor([8])]).cuda()
    nearly_empty = st.CSR(crow, torch.arange(8, device="cuda"), torch.ones(8, device="cuda"), (4096, 4096))
    assert "densify" not in plan_mod._autotune_candidates(nearly_empty, 32)
    batch = st.from_list([random_csr(np.random.default_rng(0), 8, 8, 0.5)] * 2, device="cuda")
    assert "densify" in plan_mod._autotune_candidates(batch, 32)
    per_row = 328  # 4% of 8193: dense enough (fp32 at n >= 512 needs 3%) that only the byte budget keeps densify out
    nnz = per_row * 32768
    too_big = st.CSR(torch.arange(0, nnz + 1, per_row, device="cuda"), torch.arange(nnz, device="cuda") % 8193,
                     torch.ones(nnz, device="cuda"), (32768, 8193))  # 1 GiB + 128 KiB of float32 when dense
    assert "densify" not in plan_mod._autotune_candidates(too_big, 1024)
    fits = st.CSR(too_big.crow_indices[:16385], too_big.col_indices[:16384 * per_row],
                  too_big.values[:16384 * per_row], (16384, 8193))  # the same density at half the rows
    assert "densify" in plan_mod._autotune_candidates(fits, 1024)


def test_auto_takes_densify_on_dense_ish_a_and_keeps_sparse_semantics(rng):
    """"auto" sends a 1024 x 1024 bf16 A at 20% (above the measured crossover) to the densify route
    (its kernel shows in the profile) and still skips a NaN row of B that no entry references."""
    from torch.profiler import ProfilerActivity, profile

    a = random_csr(rng, 1024, 1024, 0.2)
    a[:, 17] = 0
    a.eliminate_zeros()
    a = rounded(a, torch.bfloat16)
    A = st.from_scipy(a, device="cuda", dtype=torch.bfloat16)
    b = randn(rng, 1024, 256, dtype=torch.bfloat16, device="cuda")
    b[17, :] = float("nan")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = st.spmm(A, b)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    if not any("kernel" in name for name in names):
        pytest.skip("no CUDA activity recorded (CUPTI unavailable, e.g. under compute-sanitizer)")
    assert any("densify_kernel" in name for name in names), "auto did not take the densify route"
    assert torch.isfinite(out).all()
    assert_matches(out, a @ torch.nan_to_num(b).double().cpu().numpy(), torch.bfloat16)


def test_b_row_stride_beyond_int32_is_copied(rng):
    """cuBLAS takes int leading dimensions: a k = 1 B whose (unused) row stride is 2^31 + 5 goes to a
    fresh copy instead of a truncated ld."""
    a = random_csr(rng, 30, 1, 0.5)
    flat = randn(rng, 12, device="cuda")
    b = flat.as_strided((1, 12), (2**31 + 5, 1))
    assert_matches(st.spmm(st.from_scipy(a, device="cuda", dtype=torch.float32), b, backend="densify"),
                   a @ flat.double().cpu().numpy()[None, :], torch.float32)
