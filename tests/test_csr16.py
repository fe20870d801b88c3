"""csr16_linear (CSR16: value and 16-bit column in one word; CUDA-core kernel for few tokens, CPU reference)
against float64 products, its argument checks and corrupt layouts, and SparseLinear's "csr16" form."""
import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch.pruned.csr16 import MAX_COLUMNS, Csr16Weight, applies, csr16_linear
from sparsetorch._ops import ops
from _helpers import assert_matches, linear_reference, packed_weight, random_csr, randn

HALF_DTYPES = [torch.bfloat16, torch.float16]


def weight(rng, m, k, density, dtype, device, **kw):
    return packed_weight(Csr16Weight, rng, m, k, density, dtype, device, **kw)


reference = linear_reference


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 16, 17, 40])
def test_matches_float64(device, rng, dtype, n):
    """Token counts across the kernel's tiles (1, 2, 4, 8, 16 per block; 17 and 40: several tiles), a k
    that is not a multiple of 8, empty rows, a long row."""
    a, w = weight(rng, 70, 333, 0.1, dtype, device, empty_rows=0.2)
    x = randn(rng, n, 333, dtype=dtype, device=device)
    assert_matches(csr16_linear(x, w), reference(a, x), dtype)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
def test_bias_activation_and_batch_dims(device, rng, dtype, act):
    a, w = weight(rng, 45, 96, 0.3, dtype, device, unsorted=True, duplicates=True)
    x = randn(rng, 2, 3, 96, dtype=dtype, device=device)
    bias = randn(rng, 45, dtype=dtype, device=device)
    z = reference(a, x, bias)
    out = csr16_linear(x, w, bias, act or "none")
    assert out.shape == (2, 3, 45) and out.dtype == dtype
    assert_matches(out, reference(a, x, bias, act), dtype, input_scale=z)


def test_empty_shapes(device):
    crow = torch.zeros(5, dtype=torch.int32, device=device)
    entries = torch.zeros(0, dtype=torch.int32, device=device)
    bias = torch.arange(4, dtype=torch.bfloat16, device=device) - 1
    # no entries: act(bias) for every token
    out = ops.csr16_linear(torch.randn(3, 10, dtype=torch.bfloat16, device=device), crow, entries, bias, "relu")
    torch.testing.assert_close(out, torch.relu(bias).expand(3, 4))
    # k == 0, n == 0, m == 0
    torch.testing.assert_close(ops.csr16_linear(torch.empty(2, 0, dtype=torch.bfloat16, device=device), crow, entries,
                                                bias), bias.expand(2, 4))
    assert ops.csr16_linear(torch.empty(0, 10, dtype=torch.bfloat16, device=device), crow, entries).shape == (0, 4)
    one = torch.zeros(1, dtype=torch.int32, device=device)
    assert ops.csr16_linear(torch.randn(3, 10, dtype=torch.bfloat16, device=device), one, entries).shape == (3, 0)


def test_argument_errors(device):
    crow = torch.tensor([0, 1], dtype=torch.int32, device=device)
    entries = torch.tensor([2], dtype=torch.int32, device=device)
    x = torch.randn(2, 8, dtype=torch.bfloat16, device=device)
    with pytest.raises(TypeError, match="x: expected bfloat16 or float16"):
        ops.csr16_linear(x.float(), crow, entries)
    with pytest.raises(TypeError, match="crow: expected int32"):
        ops.csr16_linear(x, crow.long(), entries)
    with pytest.raises(TypeError, match="entries: expected int32"):
        ops.csr16_linear(x, crow, entries.long())
    with pytest.raises(ValueError, match="bias: expected shape"):
        ops.csr16_linear(x, crow, entries, torch.zeros(3, dtype=torch.bfloat16, device=device))
    with pytest.raises(TypeError, match="bias"):
        ops.csr16_linear(x, crow, entries, torch.zeros(1, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="at most 65535 in_features"):
        ops.csr16_linear(torch.zeros(1, MAX_COLUMNS + 1, dtype=torch.bfloat16, device=device), crow, entries)
    with pytest.raises(ValueError, match="crow: expected a 1-D"):
        ops.csr16_linear(x, crow.view(1, 2), entries)
    w = Csr16Weight(crow, entries, torch.ones(1, dtype=torch.bfloat16, device=device), (1, 8))
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 8\)"):
        csr16_linear(torch.randn(2, 9, dtype=torch.bfloat16, device=device), w)
    with pytest.raises(TypeError, match="x: expected torch.bfloat16"):  # fp16 x would read bf16 bits as fp16
        csr16_linear(torch.randn(2, 8, dtype=torch.float16, device=device), w)
    with pytest.raises(ValueError, match="values: expected"):
        w.set_values(torch.ones(1, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="values: expected"):
        w.set_values(torch.ones(2, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="row pointers"):
        Csr16Weight(crow, entries, torch.ones(1, dtype=torch.bfloat16, device=device), (3, 8))
    assert "in_features 70000" in applies((4, 70000), torch.bfloat16, 1)
    assert "in_features 65536" in applies((4, 65536), torch.bfloat16, 1)
    assert "nonzeros" in applies((4, 8), torch.bfloat16, 2**31 - 1000)
    assert "dtype torch.float32" in applies((4, 8), torch.float32, 1)
    assert applies((4, 8), torch.float16, 1) is None
    with pytest.raises(ValueError, match="weight: dtype"):
        Csr16Weight(crow, entries, torch.ones(1, device=device), (1, 8))


def test_corrupt_layout_cpu_raises():
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    good = torch.tensor([0, 1, 2], dtype=torch.int32)
    entries = torch.tensor([1, 3], dtype=torch.int32)
    with pytest.raises(IndexError, match="crow: expected to run from 0 to 2"):
        ops.csr16_linear(x, torch.tensor([0, 1, 3], dtype=torch.int32), entries)
    with pytest.raises(IndexError, match="non-decreasing"):
        ops.csr16_linear(x, torch.tensor([0, 2, 1, 2], dtype=torch.int32), entries)
    with pytest.raises(IndexError, match="column 9"):
        ops.csr16_linear(x, good, torch.tensor([1, 9], dtype=torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernel")
def test_corrupt_layout_cuda_stays_in_bounds():
    """The CUDA kernel does not read the layout on the host: out-of-range row pointers and columns are
    clamped on the device (a wrong product, never a fault); the process goes on."""
    x = torch.randn(3, 8, dtype=torch.bfloat16, device="cuda")
    bad_crow = torch.tensor([-5, 1 << 30, 2, -1], dtype=torch.int32, device="cuda")
    bad_entries = torch.tensor([0x3F80FFFF, 0x3F807FFF], dtype=torch.int32, device="cuda")  # 1.0 at column 65535
    out = ops.csr16_linear(x, bad_crow, bad_entries)
    torch.cuda.synchronize()
    assert out.shape == (3, 3)
    assert torch.equal(out, torch.zeros_like(out))  # column 65535 -> the zero column; the other rows are empty
    # the same GPU computes a correct product afterwards
    crow = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    ok = ops.csr16_linear(x, crow, torch.tensor([0x3F800002], dtype=torch.int32, device="cuda"))
    torch.testing.assert_close(ok, x[:, 2:3])


def test_from_csr_and_public_names(device, rng):
    a = random_csr(rng, 12, 30, 0.3)
    w = st.Csr16Weight.from_csr(st.from_scipy(a, device=device, dtype=torch.float16))
    x = randn(rng, 3, 30, dtype=torch.float16, device=device)
    a.data = torch.from_numpy(a.data).half().double().numpy()
    assert_matches(st.csr16_linear(x, w), reference(a, x), torch.float16)
    with pytest.raises(ValueError, match="2-D"):
        st.Csr16Weight.from_csr(st.from_list([a, a], device=device, dtype=torch.float16))


def test_set_values_repacks_in_place(device, rng):
    a, w = weight(rng, 20, 50, 0.3, torch.float16, device)
    entries = w.entries
    new = torch.from_numpy(rng.standard_normal(a.nnz)).to(dtype=torch.float16, device=device)
    w.set_values(new)
    assert w.entries is entries
    a.data = new.double().cpu().numpy()
    x = randn(rng, 4, 50, dtype=torch.float16, device=device)
    assert_matches(csr16_linear(x, w), reference(a, x), torch.float16)
    assert w.nbytes == 4 * (21 + a.nnz)


@pytest.mark.parametrize("n", [1, 16, 40])
def test_many_rows_per_warp_and_wide_inputs(device, rng, n):
    """Rows well beyond one per warp (9000 rows: each warp streams several, prefetching the next row's
    entries and pointers; empty rows among them), and in_features 11008 (at 16 tokens x's tile no longer
    fits shared memory whole: tiles of 8 tokens)."""
    a, w = weight(rng, 9000, 64, 0.05, torch.bfloat16, device, empty_rows=0.3)
    x = randn(rng, n, 64, dtype=torch.bfloat16, device=device)
    assert_matches(csr16_linear(x, w), reference(a, x), torch.bfloat16)
    a, w = weight(rng, 40, 11008, 0.01, torch.float16, device)
    x = randn(rng, n, 11008, dtype=torch.float16, device=device)
    assert_matches(csr16_linear(x, w), reference(a, x), torch.float16)


def test_inf_in_columns_without_entries_stays_out(device, rng):
    """CSR semantics: a column of x holding Inf/NaN reaches only the rows with an entry there; padding
    (k not a multiple of 8) and the filler entries read zeros, never a real column."""
    m, k = 50, 333
    a = random_csr(rng, m, k, 0.05)
    a = a.tolil()
    a[:, 300:] = 0  # no entry in columns 300 .. 332
    a = a.tocsr()
    a.eliminate_zeros()
    crow = torch.from_numpy(a.indptr.astype(np.int64)).to(device)
    col = torch.from_numpy(a.indices.astype(np.int64)).to(device)
    values = torch.from_numpy(a.data).to(dtype=torch.bfloat16, device=device)
    w = Csr16Weight(crow, col, values, (m, k))
    x = randn(rng, 3, k, dtype=torch.bfloat16, device=device)
    x[:, 300:] = float("inf")
    x[1, 310] = float("nan")
    out = csr16_linear(x, w)
    assert torch.isfinite(out).all()
    a.data = values.double().cpu().numpy()
    clean = x.clone()
    clean[:, 300:] = 0
    assert_matches(out, reference(a, clean), torch.bfloat16)
