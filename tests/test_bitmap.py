"""BitmapWeight and bitmap_linear (sparsetorch/pruned/bitmap.py, csrc/*/bitmap_*): the bitmap-tile layout of
pruned weights and its product, on the CPU (reference kernel, every float dtype) and CUDA (tensor
cores, bfloat16/float16). Checked against float64 dense products: N = 1 and odd token counts, shapes
that are not multiples of the 16 x 64 groups, empty rows and tiles, fully dense tiles, an all-zero
weight, sparse groups (the CUDA kernel's scatter path) and dense ones (its gather path), groups beyond
the CUDA kernel's shared-memory stage (decoded from global memory), non-contiguous
and 3-D x, bias and activations, split-K (fixed-order: bitwise repeatable), NaN/Inf in x, gradients
(gradcheck in float64 on the CPU, against dense autograd on CUDA), opcheck, torch.compile, building
from CSR (duplicates, explicit zeros) and refreshing values, errors, and corrupted layouts (IndexError
on the CPU, no fault on CUDA)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sparsetorch as st
from _helpers import activation_refs, random_csr, randn
from conftest import CUDA_READY
from sparsetorch.pruned.bitmap import _position, _slot

ops = torch.ops.sparsetorch

# Relative Frobenius error against float64 (issue 19: <= 1e-2 for bf16; fp32 accumulation leaves
# about the output's rounding).
FROB_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
HALF = [torch.bfloat16, torch.float16]


def _dtypes(device):
    return HALF if device == "cuda" else [torch.float64, torch.float32] + HALF


def _pruned(rng, m, k, sparsity, dtype, device, empty_rows=0.0):
    w = randn(rng, m, k, dtype=torch.float64)
    if sparsity >= 1.0:
        w.zero_()
    elif sparsity > 0:
        w[w.abs() < w.abs().flatten().kthvalue(max(1, int(sparsity * w.numel()))).values] = 0.0  # magnitude
    if empty_rows:
        w[torch.from_numpy(rng.random(m) < empty_rows)] = 0.0
    return w.to(dtype=dtype, device=device)


def _ref(x, w, bias=None, act="none"):
    z = x.double().cpu() @ w.double().cpu().t()
    if bias is not None:
        z = z + bias.double().cpu()
    return activation_refs(0.01)[act](z)


def _check(out, ref, dtype):
    got = out.detach().double().cpu()
    assert got.shape == ref.shape
    assert torch.isfinite(got).all(), "non-finite output (unwritten or overflow)"
    denom = ref.norm().item()
    err = (got - ref).norm().item() / denom if denom > 0 else got.abs().max().item()
    assert err <= FROB_TOL[dtype], f"relative Frobenius error {err:.3g} > {FROB_TOL[dtype]:g} for {dtype}"


def test_layout_position_slot_inverse():
    rr, cc = torch.meshgrid(torch.arange(16), torch.arange(64), indexing="ij")
    q, b = _slot(rr.flatten(), cc.flatten())
    assert q.min() == 0 and q.max() == 15 and b.min() == 0 and b.max() == 63
    assert torch.unique(q * 64 + b).numel() == 1024  # a bijection of the group's positions
    r2, c2 = _position(q, b)
    assert torch.equal(r2, rr.flatten()) and torch.equal(c2, cc.flatten())


@pytest.mark.parametrize("shape", [(1, 1), (16, 64), (37, 150), (130, 1000), (5, 3)])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.95, 1.0])
def test_roundtrip_and_bytes(device, rng, shape, sparsity):
    w = _pruned(rng, *shape, sparsity, torch.bfloat16, device)
    W = st.BitmapWeight.from_dense(w)
    assert torch.equal(W.to_dense(), w)
    m, k = shape
    groups = -(-m // 16) * -(-k // 64)
    nnz = int((w != 0).sum())
    assert W.nnz == nnz and W.shape == shape and W.dtype == torch.bfloat16
    assert W.bitmaps.shape == (-(-m // 16), -(-k // 64), 16) and W.offsets.shape == (groups + 1,)
    assert W.nbytes == 2 * nnz + 8 * 16 * groups + 4 * (groups + 1)
    assert int(W.offsets[-1]) == nnz


@pytest.mark.parametrize("m,k,n", [(37, 150, 1), (37, 150, 3), (16, 64, 8), (130, 1000, 17), (33, 200, 40),
                                   (200, 320, 70), (7, 9, 5)])
@pytest.mark.parametrize("sparsity", [0.0, 0.7, 0.93])
def test_matches_float64(device, rng, m, k, n, sparsity):
    for dtype in _dtypes(device):
        w = _pruned(rng, m, k, sparsity, dtype, device, empty_rows=0.2)
        W = st.BitmapWeight.from_dense(w)
        x = randn(rng, n, k, dtype=dtype, device=device)
        _check(st.bitmap_linear(x, W), _ref(x, w), dtype)


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu", "leaky_relu", "tanh"])
def test_bias_activation(device, rng, act):
    m, k, n = 70, 130, 12
    for dtype in _dtypes(device):
        w = _pruned(rng, m, k, 0.8, dtype, device)
        x, bias = randn(rng, n, k, dtype=dtype, device=device), randn(rng, m, dtype=dtype, device=device)
        W = st.BitmapWeight.from_dense(w)
        z = _ref(x, w, bias)
        out = st.bitmap_linear(x, W, bias=bias, activation=act)
        got, ref = out.double().cpu(), activation_refs(0.01)[act](z)
        # An activation is evaluated to an absolute error proportional to its input.
        err = (got - ref).norm().item() / max(z.norm().item(), 1e-30)
        assert err <= FROB_TOL[dtype], f"{act} {dtype}: {err:.3g}"


def test_all_zero_empty_tiles_and_dense_tiles(device, rng):
    for dtype in _dtypes(device):
        m, k = 50, 300
        w = torch.zeros(m, k, dtype=torch.float64)
        w[:16, :64] = torch.from_numpy(rng.standard_normal((16, 64)))  # one fully dense group
        w[40, 250] = 1.5  # one value in an otherwise empty group
        w = w.to(dtype=dtype, device=device)
        x = randn(rng, 9, k, dtype=dtype, device=device)
        _check(st.bitmap_linear(x, st.BitmapWeight.from_dense(w)), _ref(x, w), dtype)
        zero = st.BitmapWeight.from_dense(torch.zeros(m, k, dtype=dtype, device=device))
        assert zero.nnz == 0
        bias = randn(rng, m, dtype=dtype, device=device)
        out = st.bitmap_linear(x, zero, bias=bias)
        assert torch.equal(out.cpu(), bias.cpu().expand(9, m))


def test_shapes_of_x(device, rng):
    m, k = 40, 136
    for dtype in _dtypes(device):
        w = _pruned(rng, m, k, 0.6, dtype, device)
        W = st.BitmapWeight.from_dense(w)
        x3 = randn(rng, 2, 5, k, dtype=dtype, device=device)
        out = st.bitmap_linear(x3, W)
        assert out.shape == (2, 5, m)
        _check(out.reshape(10, m), _ref(x3.reshape(10, k), w), dtype)
        xt = randn(rng, k, 7, dtype=dtype, device=device).t()  # (7, k), column-major
        xs = randn(rng, 6, 2 * k, dtype=dtype, device=device)[::2, 1::2]  # strided rows and columns
        for x in (xt, xs):
            saved = x.clone()
            _check(st.bitmap_linear(x, W), _ref(x, w), dtype)
            assert torch.equal(x, saved)
        xodd = randn(rng, 3, k + 1, dtype=dtype, device=device)[:, 1:]  # rows not 16-byte aligned
        _check(st.bitmap_linear(xodd, W), _ref(xodd, w), dtype)
        empty = st.bitmap_linear(torch.zeros(0, k, dtype=dtype, device=device), W)
        assert empty.shape == (0, m)


def test_zero_sized(device, rng):
    for dtype in _dtypes(device):
        for m, k in [(0, 10), (10, 0)]:
            W = st.BitmapWeight.from_dense(torch.zeros(m, k, dtype=dtype, device=device))
            x = torch.ones(4, k, dtype=dtype, device=device)
            out = st.bitmap_linear(x, W)
            assert out.shape == (4, m) and (out == 0).all()


@pytest.mark.skipif(not CUDA_READY, reason="CUDA not available")
def test_cuda_split_k_and_both_paths_repeatable(rng):
    # 32 rows x 8192 columns: too few blocks for the GPU, so the chunks are split among thread blocks
    # and summed by a second kernel in split order. Rows of 95% and 40% density: sparse groups take the
    # scatter path, dense ones the gather path.
    m, k = 32, 8192
    w = _pruned(rng, m, k, 0.0, torch.float64, "cpu")
    keep = torch.from_numpy(rng.random((m, k)) < np.where(np.arange(m) < 16, 0.05, 0.6)[:, None])
    w = (w * keep).to(torch.bfloat16).cuda()
    W = st.BitmapWeight.from_dense(w)
    for n in (1, 5, 16, 33):
        x = randn(rng, n, k, dtype=torch.bfloat16, device="cuda")
        out = st.bitmap_linear(x, W, bias=torch.ones(m, dtype=torch.bfloat16, device="cuda"), activation="relu")
        _check(out, F.relu(_ref(x, w) + 1), torch.bfloat16)
        assert torch.equal(out, st.bitmap_linear(x, W, bias=torch.ones(m, dtype=torch.bfloat16, device="cuda"),
                                                 activation="relu"))


@pytest.mark.skipif(not CUDA_READY, reason="CUDA not available")
@pytest.mark.parametrize("sparsity", [0.5, 0.9])
def test_cuda_llama_shape_launches(rng, sparsity):
    # A Llama-3-8B MLP weight, 14336 x 4096: at 50% the dense configuration (two groups per stage, the
    # one-wave grid), at 90% the sparse one, whose first grid exceeds a wave on an H100 and takes the
    # one-wave split (three chunk splits summed by the second kernel) instead.
    m, k = 14336, 4096
    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**31)))
    w = torch.randn(m, k, generator=gen, device="cuda")
    w = (w * (torch.rand(m, k, generator=gen, device="cuda") >= sparsity)).to(torch.bfloat16)
    W = st.BitmapWeight.from_dense(w)
    for n in (1, 16):
        x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
        _check(st.bitmap_linear(x, W), (x.double() @ w.double().t()).cpu(), torch.bfloat16)


@pytest.mark.parametrize("n", [1, 16, 40])
def test_skewed_groups_beyond_the_stage(device, rng, n):
    # The CUDA kernel sizes its shared-memory stages by the weight's mean group and batches several
    # sparse groups per stage; groups or batches with more values than a stage holds are decoded from
    # global memory. Here strip 0 is dense, one chunk of strip 2 is dense among 98%-sparse ones, and the
    # rest is 98% sparse: the mean is small, so the dense parts overflow their stages.
    m, k = 64, 4096
    for dtype in _dtypes(device):
        w = _pruned(rng, m, k, 0.98, torch.float64, "cpu")
        w[:16] = torch.from_numpy(rng.standard_normal((16, k)))
        w[32:48, 640:704] = torch.from_numpy(rng.standard_normal((16, 64)))
        w = w.to(dtype=dtype, device=device)
        x = randn(rng, n, k, dtype=dtype, device=device)
        _check(st.bitmap_linear(x, st.BitmapWeight.from_dense(w)), _ref(x, w), dtype)


def test_nonfinite_x_like_dense(device, rng):
    # The tensor cores multiply the weight's zeros too: like F.linear on the dense weight, an Inf meeting
    # a zero gives NaN, meeting an entry +-Inf; a NaN spreads to the whole token.
    m, k = 20, 100
    for dtype in _dtypes(device):
        w = _pruned(rng, m, k, 0.9, dtype, device)
        w[:, 7] = 0.0
        w[::3, 7] = 1.0  # some rows have an entry where token 1 is Inf
        x = randn(rng, 4, k, dtype=dtype, device=device)
        x[1, 7] = float("inf")
        x[2, 99] = float("nan")
        out = st.bitmap_linear(x, st.BitmapWeight.from_dense(w)).double().cpu()
        ref = (x.double().cpu()[:, None, :] * w.double().cpu()[None, :, :]).sum(-1)  # every product, IEEE
        assert torch.equal(torch.isnan(out), torch.isnan(ref))
        assert torch.equal(torch.isinf(out), torch.isinf(ref)) and torch.isinf(out[1]).sum() == 7
        assert torch.equal(out[torch.isinf(ref)], ref[torch.isinf(ref)])
        _check(out[[0, 3]], ref[[0, 3]], dtype)


def test_from_csr_duplicates_explicit_zeros_and_refresh(device, rng):
    a = random_csr(rng, 45, 200, 0.2, unsorted=True, duplicates=True, empty_rows=0.2)
    a.data[::7] = 0.0  # explicit zeros stay in the pattern
    for dtype in _dtypes(device):
        for index_dtype in (torch.int32, torch.int64):
            A = st.from_scipy(a, device=device, dtype=dtype, index_dtype=index_dtype)
            W = st.BitmapWeight.from_csr(A)
            # repeated positions summed exactly (float64), rounded once
            dense = st.to_dense(A.to(dtype=torch.float64)).to(dtype)
            assert torch.equal(W.to_dense().cpu(), dense.cpu())
            a_nodup = a.copy()
            a_nodup.sum_duplicates()
            assert W.nnz == a_nodup.nnz
            x = randn(rng, 3, 200, dtype=dtype, device=device)
            _check(st.bitmap_linear(x, W), _ref(x, dense), dtype)
            new = randn(rng, A.values.numel(), dtype=dtype, device=device)
            W.values_from_csr(new)
            assert torch.equal(W.to_dense().cpu(), st.to_dense(A.with_values(new).to(dtype=torch.float64)).to(dtype).cpu())
    # a scipy matrix and a torch sparse CSR tensor are accepted too; from_dense's CSR order refreshes
    W2 = st.BitmapWeight.from_csr(a, dtype=torch.float32)
    assert W2.shape == (45, 200) and W2.dtype == torch.float32
    w = _pruned(rng, 30, 70, 0.5, torch.float32, device)
    W3 = st.BitmapWeight.from_dense(w)
    W3.values_from_csr(w[w != 0] * 2)
    assert torch.equal(W3.to_dense(), w * 2)
    W4 = st.BitmapWeight.from_csr(w.to_sparse_csr())
    assert torch.equal(W4.to_dense(), w)


def test_mask_and_to(device, rng):
    w = _pruned(rng, 20, 80, 0.0, torch.bfloat16, device)
    mask = torch.from_numpy(rng.random((20, 80)) < 0.3).to(device)
    mask[0, 0] = True
    w[0, 0] = 0.0
    W = st.BitmapWeight.from_dense(w, mask=mask)
    assert W.nnz == int(mask.sum())  # the zero under the mask is part of the pattern
    assert torch.equal(W.to_dense(), w * mask)
    Wc = W.to("cpu")
    assert Wc.device.type == "cpu" and torch.equal(Wc.to_dense(), (w * mask).cpu())
    assert "BitmapWeight" in repr(W)


def test_gradcheck_cpu_float64(rng):
    m, k, n = 17, 66, 2  # two strips and two chunks, both ragged
    w = _pruned(rng, m, k, 0.85, torch.float64, "cpu")
    W = st.BitmapWeight.from_dense(w)
    W.values.requires_grad_()
    x = randn(rng, n, k, dtype=torch.float64).requires_grad_()
    bias = randn(rng, m, dtype=torch.float64).requires_grad_()
    for act in ("none", "silu"):
        def f(x, values, bias):
            V = st.BitmapWeight(W.bitmaps, W.offsets, values, W.shape, _backward=W.prepare_backward())
            return st.bitmap_linear(x, V, bias=bias, activation=act)
        assert torch.autograd.gradcheck(f, (x, W.values, bias))


def test_grads_match_dense_autograd(device, rng):
    m, k, n = 48, 200, 10
    for dtype in _dtypes(device):
        w = _pruned(rng, m, k, 0.8, dtype, device)
        W = st.BitmapWeight.from_dense(w)
        W.values.requires_grad_()
        x = randn(rng, 2, n // 2, k, dtype=dtype, device=device).requires_grad_()
        bias = randn(rng, m, dtype=dtype, device=device).requires_grad_()
        g = randn(rng, 2, n // 2, m, dtype=dtype, device=device)
        st.bitmap_linear(x, W, bias=bias, activation="gelu").backward(g)
        # float64 dense reference on the same pattern
        mask = (w != 0).double().cpu()
        w64 = w.double().cpu().requires_grad_()
        x64 = x.detach().double().cpu().requires_grad_()
        b64 = bias.detach().double().cpu().requires_grad_()
        F.gelu(x64 @ w64.t() + b64).backward(g.double().cpu())
        _check(x.grad, x64.grad, dtype)
        _check(bias.grad, b64.grad, dtype)
        # values' gradient is in packed order: compare it through the dense layout
        rows, cols = (w != 0).cpu().nonzero(as_tuple=True)
        got = st.BitmapWeight(W.bitmaps, W.offsets, W.values.grad, W.shape).to_dense().double().cpu()
        _check(got[rows, cols], (w64.grad * mask)[rows, cols], dtype)


def test_opcheck(device, rng):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = _pruned(rng, 24, 100, 0.6, dtype, device)
    W = st.BitmapWeight.from_dense(w)
    x = randn(rng, 5, 100, dtype=dtype, device=device)
    bias = randn(rng, 24, dtype=dtype, device=device)
    extra = W.prepare_backward()
    values = W.values.detach().clone().requires_grad_()
    torch.library.opcheck(ops.bitmap_linear, (x, W.bitmaps, W.offsets, W.values, 24, bias, "relu"))
    torch.library.opcheck(ops.bitmap_linear, (x.requires_grad_(), W.bitmaps, W.offsets, values, 24, bias, "none",
                                              0.01, *extra))


def test_compile(device, rng):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = _pruned(rng, 24, 100, 0.6, dtype, device)
    W = st.BitmapWeight.from_dense(w)
    W.values.requires_grad_()
    W.prepare_backward()
    x = randn(rng, 5, 100, dtype=dtype, device=device).requires_grad_()

    def f(x):
        return st.bitmap_linear(x, W, activation="silu").sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    compiled(x).backward()
    gx, gv = x.grad.clone(), W.values.grad.clone()
    x.grad = W.values.grad = None
    f(x).backward()
    assert torch.allclose(gx, x.grad) and torch.allclose(gv, W.values.grad)


def test_errors(device, rng):
    w = _pruned(rng, 20, 70, 0.5, torch.bfloat16, device)
    W = st.BitmapWeight.from_dense(w)
    with pytest.raises(ValueError, match="x: expected shape"):
        st.bitmap_linear(randn(rng, 3, 71, dtype=torch.bfloat16, device=device), W)
    with pytest.raises(ValueError, match="bitmaps"):  # the op itself sees the chunk count
        ops.bitmap_linear(randn(rng, 3, 130, dtype=torch.bfloat16, device=device), W.bitmaps, W.offsets, W.values, 20)
    with pytest.raises(TypeError, match="values"):
        st.bitmap_linear(randn(rng, 3, 70, dtype=torch.float16, device=device), W)
    with pytest.raises(ValueError, match="bias"):
        st.bitmap_linear(randn(rng, 3, 70, dtype=torch.bfloat16, device=device), W,
                         bias=torch.zeros(21, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="activation"):
        st.bitmap_linear(randn(rng, 3, 70, dtype=torch.bfloat16, device=device), W, activation="swish")
    with pytest.raises(TypeError, match="BitmapWeight"):
        st.bitmap_linear(randn(rng, 3, 70, dtype=torch.bfloat16, device=device), w)
    with pytest.raises(ValueError, match="mask"):
        st.BitmapWeight.from_dense(w, mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="weight"):
        st.BitmapWeight.from_dense(w[0])
    with pytest.raises(ValueError, match="csr_values"):
        W.values_from_csr(torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="out_features"):
        ops.bitmap_linear(randn(rng, 3, 70, dtype=torch.bfloat16, device=device), W.bitmaps, W.offsets, W.values, -1)
    if device == "cuda":
        W32 = st.BitmapWeight.from_dense(w.float())
        with pytest.raises(TypeError, match="bfloat16 or float16"):
            st.bitmap_linear(randn(rng, 3, 70, device=device), W32)


def _corrupt(W, rng):
    bitmaps = torch.from_numpy(rng.integers(-2**63, 2**63 - 1, size=tuple(W.bitmaps.shape), dtype=np.int64))
    offsets = torch.from_numpy(rng.integers(-5000, 5000, size=tuple(W.offsets.shape)).astype(np.int32))
    return bitmaps.to(W.bitmaps.device), offsets.to(W.offsets.device)


def test_corrupt_layout(device, rng):
    dtype = torch.bfloat16
    w = _pruned(rng, 40, 300, 0.8, dtype, device)
    W = st.BitmapWeight.from_dense(w)
    x = randn(rng, 6, 300, dtype=dtype, device=device)
    bitmaps, offsets = _corrupt(W, rng)
    few = W.values[:10].clone()
    cases = [(bitmaps, W.offsets, W.values), (W.bitmaps, offsets, W.values), (bitmaps, offsets, few),
             (W.bitmaps, W.offsets, few)]
    for bm, off, val in cases:
        if device == "cpu":
            with pytest.raises(IndexError):
                ops.bitmap_linear(x, bm, off, val, 40)
        else:
            ops.bitmap_linear(x, bm, off, val, 40)  # a wrong product, never a fault
            ops.bitmap_linear(x[:1], bm, off, val, 40)
    if device == "cuda":
        torch.cuda.synchronize()
        _check(st.bitmap_linear(x, W), _ref(x, w), dtype)  # the context is still healthy
    # a bit marking a position outside the weight (rows past out_features)
    bm = W.bitmaps.clone()
    bm[-1, -1, 15] = -1  # quadrant 15 has rows 8..15 of the last strip: rows 40.. do not exist
    if device == "cpu":
        with pytest.raises(IndexError):
            ops.bitmap_linear(x, bm, W.offsets, W.values, 40)
