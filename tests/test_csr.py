"""Conversions between what users hold and sparsetorch.CSR, both ways."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from _helpers import random_csr
from conftest import INDEX_DTYPES


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "csr_array", "lil"])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES + [None])
def test_scipy_round_trip(device, rng, fmt, index_dtype):
    a = random_csr(rng, 23, 17, 0.25)
    src = sp.csr_array(a) if fmt == "csr_array" else a.asformat(fmt)
    A = st.from_scipy(src, device=device, index_dtype=index_dtype)
    assert A.shape == (23, 17) and A.device.type == device
    if index_dtype is not None:
        assert A.index_dtype == index_dtype
    back = st.to_scipy(A)
    assert isinstance(back, sp.csr_matrix)
    np.testing.assert_array_equal(back.toarray(), a.toarray())
    np.testing.assert_array_equal(A.to_dense().cpu().numpy(), a.toarray())


def test_scipy_dtypes(rng):
    a = random_csr(rng, 5, 4, 0.5)
    assert st.from_scipy(a.astype(np.float32)).dtype == torch.float32
    assert st.from_scipy(a.astype(np.int64)).dtype == torch.float32  # integers become float32
    assert st.from_scipy(a, dtype=torch.bfloat16).dtype == torch.bfloat16
    back = st.to_scipy(st.from_scipy(a, dtype=torch.bfloat16))
    assert back.dtype == np.float32


def test_torch_round_trip(device, rng):
    a = random_csr(rng, 12, 10, 0.3)
    t = torch.from_numpy(a.toarray()).to(device).to_sparse_csr()
    A = st.from_torch(t)
    assert A.crow_indices.data_ptr() == t.crow_indices().data_ptr(), "wrapping must not copy"
    assert torch.equal(st.to_torch(A).to_dense(), t.to_dense())


def test_batched_torch_round_trip_with_ragged_nnz(device, rng):
    mats = [random_csr(rng, 6, 5, d) for d in (0.0, 0.3, 1.0)]
    A = st.from_list(mats, device=device)
    assert A.col_indices.shape == (3, 30)
    assert A.nnz.tolist() == [m.nnz for m in mats]
    t = st.to_torch(A)
    assert t.layout == torch.sparse_csr and t.shape == (3, 6, 5)
    expected = torch.stack([torch.from_numpy(m.toarray()) for m in mats]).to(device)
    assert torch.equal(t.to_dense(), expected)
    assert torch.equal(A.to_dense(), expected)
    assert [x.nnz for x in st.to_scipy(A)] == [m.nnz for m in mats]


def test_from_dense(device, rng):
    d = torch.from_numpy(random_csr(rng, 9, 7, 0.3).toarray()).to(device)
    assert torch.equal(st.from_dense(d).to_dense(), d)
    d3 = torch.stack([d, torch.zeros_like(d), d * 2])
    A3 = st.from_dense(d3)
    assert A3.batched and torch.equal(A3.to_dense(), d3)


def test_shared_pattern_to_dense_and_torch(device, rng):
    a = random_csr(rng, 5, 4, 0.5)
    values = torch.randn(3, a.nnz, dtype=torch.float64, device=device)
    A = st.CSR(torch.from_numpy(a.indptr).to(device), torch.from_numpy(a.indices).to(device), values, (3, 5, 4))
    dense = A.to_dense()
    for i in range(3):
        x = a.copy()
        x.data = values[i].cpu().numpy()
        np.testing.assert_allclose(dense[i].cpu().numpy(), x.toarray())
    assert torch.equal(st.to_torch(A).to_dense(), dense)


@pytest.mark.parametrize("deterministic", [False, True])
def test_to_dense_sums_duplicates_and_is_differentiable(device, deterministic):
    """Repeated (row, column) slots add up, in every dtype, with deterministic algorithms on or off, and the
    gradient of every slot's value is the output gradient at its position."""
    crow = torch.tensor([0, 3, 3, 6], device=device)
    col = torch.tensor([2, 0, 2, 1, 1, 3], device=device)
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        values = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5, 6.0], device=device, dtype=dtype, requires_grad=True)
        expected = torch.tensor([[2.0, 0, 4, 0], [0, 0, 0, 0], [0, 4.5, 0, 6]], device=device, dtype=dtype)
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(deterministic)
        try:
            dense = st.CSR(crow, col, values, (3, 4)).to_dense()
        finally:
            torch.use_deterministic_algorithms(previous)
        assert torch.equal(dense, expected)
        weights = torch.arange(12, device=device, dtype=dtype).view(3, 4)
        (dense * weights).sum().backward()
        assert torch.equal(values.grad, weights[torch.tensor([0, 0, 0, 2, 2, 2]), col])


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_to_dense_drops_columns_outside_the_matrix_in_either_index_width(device, index_dtype):
    """A column outside [0, k) is dropped, also an int64 one that an int32 position would wrap into range
    (2**32 + 1 -> 1); padding slots past crow[-1] are dropped; batched patterns stay apart."""
    wild = 2**32 + 1 if index_dtype == torch.int64 else -3
    crow = torch.tensor([0, 2, 4], dtype=index_dtype, device=device)
    col = torch.tensor([1, wild, 0, 5, 2], dtype=index_dtype, device=device)  # 5 == k; slot 4 is padding
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 9.0], device=device)
    dense = st.CSR(crow, col, values, (2, 5)).to_dense()
    expected = torch.tensor([[0, 1.0, 0, 0, 0], [3.0, 0, 0, 0, 0]], device=device)
    assert torch.equal(dense, expected), dense
    batched = st.CSR(torch.stack([crow, crow]), torch.stack([col, col.flip(0)]), torch.stack([values, values]),
                     (2, 2, 5)).to_dense()
    assert torch.equal(batched[0], expected)
    assert torch.equal(batched[1], torch.tensor([[0, 0, 1.0, 0, 0], [3.0, 0, 0, 0, 0]], device=device)), batched[1]


def test_to_changes_dtype_device_index(device, rng):
    A = st.from_scipy(random_csr(rng, 4, 4, 0.5))
    B = A.to(device=device, dtype=torch.float16, index_dtype=torch.int32)
    assert B.device.type == device and B.dtype == torch.float16 and B.index_dtype == torch.int32


def test_as_csr_rejects_other_things():
    with pytest.raises(TypeError, match="expected a sparse matrix"):
        st.as_csr("not a matrix")
    with pytest.raises(TypeError, match="to_sparse_csr"):
        st.as_csr(torch.eye(3).to_sparse())
    with pytest.raises(TypeError, match="to_sparse_csr"):
        st.from_torch(torch.eye(3))
    with pytest.raises(TypeError, match="sparse_csr"):
        st.from_torch(torch.eye(3).to_sparse_csc())


@pytest.mark.parametrize(
    "crow,col,values,shape,exc,match",
    [
        ([0, 1, 2], [0, 1], [1.0, 2.0], (3, 2), ValueError, "last dimension m \\+ 1 = 4"),
        ([0, 1, 2], [0, 1, 1], [1.0, 2.0], (2, 2), ValueError, "values: expected shape"),
        ([0, 1, 2], [0, 1], [1, 2], (2, 2), TypeError, "values: expected float16"),
        ([0.0, 1.0, 2.0], [0, 1], [1.0, 2.0], (2, 2), TypeError, "int32 or int64"),
        ([0, 1, 2], [0, 1], [1.0, 2.0], (2, 2, 2), ValueError, "values: expected shape \\(2, nnz\\)"),
        ([0, 1, 2], [0, 1], [1.0, 2.0], (-2, 2), ValueError, "non-negative"),
    ],
)
def test_csr_component_checks(crow, col, values, shape, exc, match):
    with pytest.raises(exc, match=match):
        st.CSR(torch.tensor(crow), torch.tensor(col), torch.tensor(values), shape)


def test_csr_index_dtype_mismatch():
    with pytest.raises(TypeError, match="same dtype"):
        st.CSR(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0]), torch.tensor([1.0]), (1, 1))


def test_from_list_errors(rng):
    with pytest.raises(ValueError, match="same \\(m, k\\)"):
        st.from_list([random_csr(rng, 3, 3, 0.5), random_csr(rng, 3, 4, 0.5)])
    with pytest.raises(ValueError, match="needs shape"):
        st.from_list([])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernel")
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_cuda_to_dense_kernel_matches_the_scatter(index_dtype, dtype):
    """csr.to_dense on CUDA (one kernel) against its torch-op scatter (deterministic algorithms on): unsorted
    and repeated columns, empty rows, rows wider than one shared-memory chunk (k = 5003, odd), one pattern
    shared by a batch and one pattern per batch."""
    g = torch.Generator().manual_seed(11)
    m, k, nnz = 37, 5003, 4000
    rows = torch.randint(0, m - 3, (nnz,), generator=g).sort().values  # the last 3 rows empty
    cols = torch.randint(0, k, (nnz,), generator=g)
    cols[1::7] = cols[0::7][: cols[1::7].numel()]  # repeats
    crow = torch.zeros(m + 1, dtype=torch.int64)
    crow[1:] = torch.bincount(rows, minlength=m).cumsum(0)
    crow, cols = crow.to(index_dtype).cuda(), cols.to(index_dtype).cuda()
    values = torch.randn(3, nnz, generator=g).to(dtype).cuda()
    for A in (st.CSR(crow, cols, values[0], (m, k)), st.CSR(crow, cols, values, (3, m, k)),
              st.CSR(torch.stack([crow] * 3), torch.stack([cols, cols.flip(0), cols]), values, (3, m, k))):
        fast = A.to_dense()
        torch.use_deterministic_algorithms(True)
        try:
            scatter = A.to_dense()
        finally:
            torch.use_deterministic_algorithms(False)
        tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)  # repeats summed in float32 by the kernel
        torch.testing.assert_close(fast, scatter, rtol=tol, atol=tol)


def test_to_dense_gradient(device):
    """csr_to_dense's registered gradient (a gather) against gradcheck and, on CUDA, the kernel's against the
    scatter route's: repeats each get the output's gradient whole; shared and per-batch patterns."""
    from sparsetorch._ops import ops

    g = torch.Generator().manual_seed(5)
    m, k, nnz = 6, 9, 20
    rows = torch.randint(0, m - 1, (nnz,), generator=g).sort().values  # the last row empty
    cols = torch.randint(0, k, (nnz,), generator=g)
    cols[1] = cols[0] if rows[1] == rows[0] else cols[1]
    crow = torch.zeros(m + 1, dtype=torch.int64)
    crow[1:] = torch.bincount(rows, minlength=m).cumsum(0)
    crow, cols = crow.to(device), cols.to(device)
    values = torch.randn(2, nnz, generator=g, dtype=torch.float64).to(device).requires_grad_()
    torch.autograd.gradcheck(lambda v: ops.csr_to_dense(crow, cols, v, m, k), (values,))
    torch.autograd.gradcheck(lambda v: ops.csr_to_dense(torch.stack([crow, crow]), torch.stack([cols, cols.flip(0)]),
                                                        v, m, k), (values,))
    weight = torch.randn(2, m, k, dtype=torch.float64, device=device)
    (grad_fast,) = torch.autograd.grad((st.CSR(crow, cols, values, (2, m, k)).to_dense() * weight).sum(), values)
    torch.use_deterministic_algorithms(True)
    try:
        (grad_scatter,) = torch.autograd.grad((st.CSR(crow, cols, values, (2, m, k)).to_dense() * weight).sum(), values)
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(grad_fast, grad_scatter, rtol=0, atol=0)


def test_to_dense_of_an_empty_batch_and_empty_shapes(device):
    crow = torch.tensor([0, 2, 5], device=device)
    col = torch.tensor([0, 1, 0, 1, 2], device=device)
    assert st.CSR(crow, col, torch.zeros(0, 5, device=device), (0, 2, 3)).to_dense().shape == (0, 2, 3)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    assert torch.equal(st.CSR(torch.zeros(4, dtype=torch.int64, device=device), empty, torch.zeros(0, device=device),
                              (3, 0)).to_dense(), torch.zeros(3, 0, device=device))


def test_csr_to_dense_op_checks_its_arguments(device):
    """The op's CPU version (Python) and CUDA kernel refuse the same bad arguments, naming the argument."""
    from sparsetorch._ops import ops
    crow = torch.tensor([0, 2, 3], device=device)
    col = torch.tensor([0, 2, 1], device=device)
    values = torch.ones(3, device=device)
    assert ops.csr_to_dense(crow, col, values, 2, 3).shape == (2, 3)
    cases = [
        (TypeError, "crow_indices: expected int32 or int64", (crow.short(), col.short(), values, 2, 3)),
        (TypeError, "col_indices: expected torch.int64|col_indices: expected Long", (crow, col.int(), values, 2, 3)),
        (TypeError, "values: expected float16, bfloat16, float32 or float64", (crow, col, values.int(), 2, 3)),
        (ValueError, "m, k: expected non-negative sizes", (crow, col, values, 2, -1)),
        (ValueError, "crow_indices: expected shape", (crow, col, values, 3, 3)),
        (ValueError, "col_indices: expected one row per pattern", (crow, col.unsqueeze(0), values, 2, 3)),
        (ValueError, "values: expected shape", (crow, col, values[:2], 2, 3)),
        (ValueError, "crow_indices: expected 1 pattern or one per batch",
         (torch.stack([crow] * 3), torch.stack([col] * 3), torch.ones(2, 3, device=device), 2, 3)),
    ]
    for error, message, args in cases:
        with pytest.raises(error, match=message):
            ops.csr_to_dense(*args)


def test_csr_to_dense_op_skips_what_lies_outside_the_matrix(device):
    """Called directly on an unchecked CSR: columns outside [0, k) are skipped and row pointers past the entries
    are clamped, on the CPU and in the CUDA kernel alike: no out-of-bounds access, no crash."""
    from sparsetorch._ops import ops
    crow = torch.tensor([0, 2, 4], device=device)
    col = torch.tensor([-5, 1, 3, 2], device=device)  # -5 and 3 lie outside a 2 x 3 matrix
    values = torch.tensor([1.0, 2.0, 3.0, 4.0], device=device)
    expected = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 4.0]])
    assert torch.equal(ops.csr_to_dense(crow, col, values, 2, 3).cpu(), expected)
    wild = torch.tensor([0, 2**40, -7], device=device)  # row pointers past the entries and decreasing
    out = ops.csr_to_dense(wild, col, values, 2, 3)
    if device == "cuda":
        torch.cuda.synchronize()
    assert out.shape == (2, 3) and bool(torch.isfinite(out).all())
