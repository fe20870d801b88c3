"""Bad input gets a clear Python exception (type and message checked); inputs are never modified."""
import numpy as np
import pytest
import torch

import sparsetorch as st
from _helpers import random_csr
from conftest import CUDA_READY

ops = torch.ops.sparsetorch


def small(device, index_dtype=torch.int64, dtype=torch.float32):
    crow = torch.tensor([0, 2, 3], dtype=index_dtype, device=device)
    col = torch.tensor([0, 2, 1], dtype=index_dtype, device=device)
    values = torch.tensor([1.0, 2.0, 3.0], dtype=dtype, device=device)
    return crow, col, values


def test_shape_mismatch(device):
    crow, col, values = small(device)
    with pytest.raises(ValueError, match="A's columns 3 != B's rows 4"):
        st.spmm((crow, col, values, (2, 3)), torch.randn(4, 2, device=device))


def test_batch_mismatch(device, rng):
    A = st.from_list([random_csr(rng, 3, 3, 0.5)] * 2, device=device, dtype=torch.float32)
    with pytest.raises(ValueError, match="batch size mismatch"):
        st.spmm(A, torch.randn(3, 3, 2, device=device))
    with pytest.raises(ValueError, match="batch sizes disagree"):
        ops.spmm(A.crow_indices, A.col_indices, A.values, torch.randn(3, 3, 2, device=device))


def test_dtype_errors(device):
    crow, col, values = small(device)
    with pytest.raises(TypeError, match=r"A and B of the same dtype, got A torch.float32 and B torch.float64: "
                                        r"convert one of them, e.g. B.to\(torch.float32\) or A.to\(torch.float64\)"):
        ops.spmm(crow, col, values, torch.randn(3, 2, dtype=torch.float64, device=device))
    with pytest.raises(TypeError, match="B: expected float16, bfloat16, float32 or float64"):
        ops.spmm(crow, col, values, torch.ones(3, 2, dtype=torch.long, device=device))
    with pytest.raises(TypeError, match="crow_indices: expected int32 or int64"):
        ops.spmm(crow.float(), col, values, torch.randn(3, 2, device=device))
    with pytest.raises(TypeError, match="crow_indices and col_indices of the same dtype"):
        ops.spmm(crow.int(), col, values, torch.randn(3, 2, device=device))
    with pytest.raises(TypeError, match="bias"):
        ops.spmm(crow, col, values, torch.randn(3, 2, device=device), bias=torch.zeros(2, dtype=torch.float64,
                                                                                       device=device))


def test_rank_errors(device):
    crow, col, values = small(device)
    with pytest.raises(ValueError, match="B: expected a 2-D"):
        ops.spmm(crow, col, values, torch.randn(3, device=device))
    with pytest.raises(ValueError, match="crow_indices: expected a 1-D"):
        ops.spmm(crow.view(1, 1, 3), col, values, torch.randn(3, 2, device=device))
    with pytest.raises(ValueError, match="col_indices: expected 1-D"):
        ops.spmm(crow, col.view(1, 3), values, torch.randn(3, 2, device=device))
    with pytest.raises(ValueError, match="values: expected last dimension 3"):
        ops.spmm(crow, col, values[:2], torch.randn(3, 2, device=device))
    with pytest.raises(ValueError, match="bias: expected shape \\(2,\\)"):
        ops.spmm(crow, col, values, torch.randn(3, 2, device=device), bias=torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="c \\(accumulate\\): expected shape \\[2, 2\\]"):
        ops.spmm(crow, col, values, torch.randn(3, 2, device=device), accumulate=torch.zeros(2, 3, device=device),
                 beta=1.0)
    with pytest.raises(ValueError, match="out: expected shape \\[2, 2\\]"):
        ops.spmm_out(crow, col, values, torch.randn(3, 2, device=device), torch.zeros(2, 3, device=device))


def test_device_mismatch_named():
    if not torch.cuda.is_available() or not st.build_info()["cuda"]:
        pytest.skip("needs CUDA")
    crow, col, values = small("cpu")
    with pytest.raises(ValueError, match=r"A and B on the same device, got A on cpu and B on cuda:0: move one of them, "
                                         r'e.g. B.to\("cpu"\) or A.to\("cuda:0"\)'):
        ops.spmm(crow, col, values, torch.randn(3, 2, device="cuda"))
    with pytest.raises(ValueError, match="A and B on the same device"):
        st.spmm(st.CSR(crow, col, values, (2, 3)), torch.randn(3, 2, device="cuda"))


def test_int32_cannot_address_huge_k(device):
    crow, col, values = small(device, index_dtype=torch.int32)
    huge = torch.zeros(1, 1, device=device).expand(2**31 + 5, 1)  # a view: no memory behind it
    with pytest.raises(ValueError, match="int32 indices cannot address k"):
        ops.spmm(crow, col, values, huge)


def test_unknown_activation_and_op(device):
    crow, col, values = small(device)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        st.spmm((crow, col, values, (2, 3)), torch.randn(3, 2, device=device), activation="swish")
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        ops.activation(values, "swish")
    with pytest.raises(ValueError, match="unknown elementwise operator 'pow'"):
        ops.binary(values, values, "pow")
    with pytest.raises(ValueError, match="expected 'none' or 'tanh'"):
        st.gelu(values, approximate="fast")


def test_c_and_out_together(device):
    crow, col, values = small(device)
    with pytest.raises(ValueError, match="either c= or out="):
        st.spmm((crow, col, values, (2, 3)), torch.randn(3, 2, device=device), c=torch.zeros(2, 2, device=device),
                out=torch.zeros(2, 2, device=device))


def test_out_must_not_alias_inputs(device):
    crow, col, values = small(device)
    dense = torch.randn(3, 3, device=device)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        ops.spmm_out(crow, col, values, dense, dense[:2])


def test_b_must_be_dense(device):
    crow, col, values = small(device)
    with pytest.raises(TypeError, match="B: expected a dense torch.Tensor"):
        st.spmm((crow, col, values, (2, 3)), torch.eye(3, device=device).to_sparse_csr())
    with pytest.raises(TypeError, match="B: expected a dense torch.Tensor"):
        st.spmm((crow, col, values, (2, 3)), [[1.0]])


# --- O(nnz) validation -----------------------------------------------------------------------

@pytest.mark.parametrize(
    "crow,col,shape,match",
    [
        ([1, 2, 3], [0, 2, 1], (2, 3), "crow_indices\\[0\\] = 1, expected 0"),
        ([0, 3, 2], [0, 2, 1], (2, 3), "not non-decreasing: crow_indices\\[2\\] = 2"),
        ([0, 1, 2], [0, 2, 1], (2, 3), "crow_indices\\[2\\] = 2, expected nnz = 3"),
        ([0, 2, 3], [0, 3, 1], (2, 3), "col_indices\\[1\\] = 3 is out of range for a matrix with 3 columns"),
        ([0, 2, 3], [0, -1, 1], (2, 3), "col_indices\\[1\\] = -1 is out of range"),
    ],
)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_validate_reports_the_defect(device, crow, col, shape, match, index_dtype):
    crow_t = torch.tensor(crow, dtype=index_dtype, device=device)
    col_t = torch.tensor(col, dtype=index_dtype, device=device)
    values = torch.ones(len(col), device=device)
    A = (crow_t, col_t, values, shape)
    with pytest.raises(ValueError, match=match):
        st.validate_csr(st.as_csr(A))
    with pytest.raises(ValueError, match=match):
        st.spmm(A, torch.randn(shape[1], 2, device=device), validate=True)
    # The CSR check never touched the inputs, and a correct product still runs afterwards.
    assert crow_t.tolist() == crow and col_t.tolist() == col
    crow_ok, col_ok, values_ok = small(device)
    out = st.spmm((crow_ok, col_ok, values_ok, (2, 3)), torch.ones(3, 2, device=device))
    assert out.tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_validate_batched(device):
    crow = torch.tensor([[0, 1, 2], [0, 2, 5]], device=device)  # batch 1 ends past the 4 stored entries
    col = torch.zeros(2, 4, dtype=torch.int64, device=device)
    values = torch.ones(2, 4, device=device)
    with pytest.raises(ValueError, match="crow_indices\\[1, 2\\] = 5 exceeds the 4 entries per batch"):
        st.validate_csr(st.CSR(crow, col, values, (2, 2, 3)))
    col[1, 1] = 7
    crow[1, 2] = 4
    with pytest.raises(ValueError, match="col_indices\\[1, 1\\] = 7 is out of range"):
        st.validate_csr(st.CSR(crow, col, values, (2, 2, 3)))
    col[1, 1] = 2
    st.validate_csr(st.CSR(crow, col, values, (2, 2, 3)))  # padding after crow[i, -1] is not checked


def test_cpu_kernel_bounds_checks_without_validate():
    """With validate=False (the caller vouches for A) the CPU kernel still checks every index it reads."""
    crow = torch.tensor([0, 2, 3])
    col = torch.tensor([0, 9, 1])
    with pytest.raises(IndexError, match="is column 9, out of range for k = 3"):
        ops.spmm(crow, col, torch.ones(3), torch.randn(3, 2), validate=False)
    with pytest.raises(IndexError, match="spans entries"):
        ops.spmm(torch.tensor([0, 2, 7]), torch.tensor([0, 1, 1]), torch.ones(3), torch.randn(3, 2), validate=False)
    # By default the op validates first: a ValueError naming the defect.
    with pytest.raises(ValueError, match=r"col_indices\[1\] = 9 is out of range"):
        ops.spmm(crow, col, torch.ones(3), torch.randn(3, 2))
    with pytest.raises(IndexError, match="out of range for col_scale"):
        ops.csr_scale(crow, col, torch.ones(3), None, torch.ones(3))


# --- nothing the caller passed is modified -----------------------------------------------------

def test_inputs_never_modified(device, rng):
    A = st.from_scipy(random_csr(rng, 30, 20, 0.3), device=device, dtype=torch.float32)
    B = torch.randn(20, 8, device=device)
    c = torch.randn(30, 8, device=device)
    bias = torch.randn(8, device=device)
    r, s = torch.rand(30, device=device), torch.rand(20, device=device)
    tensors = [A.crow_indices, A.col_indices, A.values, B, c, bias, r, s]
    before = [t.clone() for t in tensors]
    st.spmm(A, B, alpha=2.0, beta=1.0, c=c, bias=bias, activation="gelu")
    st.scale(A, r, s)
    st.add(A, A)
    st.mul(B, 2.0)
    st.bias_act(c, bias=bias, scale=2.0, activation="tanh")
    st.relu(A)
    for t, b in zip(tensors, before):
        assert torch.equal(t, b)


# --- elementwise / bias_act argument errors ------------------------------------------------------

def test_elementwise_errors(device):
    x = torch.randn(4, 5, device=device)
    with pytest.raises(ValueError, match="does not broadcast"):
        st.add(x, torch.randn(3, device=device))
    with pytest.raises(TypeError, match="x and y of the same dtype"):
        st.add(x, torch.randn(4, 5, dtype=torch.float64, device=device))
    with pytest.raises(TypeError, match="x: expected float16"):
        st.relu(torch.ones(3, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="bias: expected shape \\(5,\\)"):
        st.bias_act(x, bias=torch.zeros(4, device=device))
    with pytest.raises(TypeError, match="scale"):
        st.bias_act(x, scale=torch.zeros(5, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="0-D"):
        st.bias_act(torch.tensor(1.0, device=device), scale=2.0)
    with pytest.raises(TypeError, match="dense op sparse"):
        st.add(x, torch.eye(4, 5, device=device).to_sparse_csr())


def test_sparse_pattern_mismatch(device, rng):
    A = st.from_scipy(random_csr(rng, 6, 6, 0.5), device=device)
    B = st.from_scipy(random_csr(rng, 6, 6, 0.5), device=device)
    with pytest.raises(ValueError, match="same shape and pattern|share one sparsity pattern"):
        st.add(A, B)


def test_scale_errors(device, rng):
    A = st.from_scipy(random_csr(rng, 6, 5, 0.5), device=device)
    with pytest.raises(ValueError, match="row_scale: expected 6 entries"):
        st.scale_rows(A, torch.ones(5, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="col: expected 5 entries"):
        st.scale_cols(A, torch.ones(6, dtype=torch.float64, device=device))
    with pytest.raises(TypeError, match="row_scale"):
        st.scale_rows(A, torch.ones(6, dtype=torch.float32, device=device))


def test_bias_act_backward_errors(device):
    x = torch.randn(4, 5, device=device)
    with pytest.raises(ValueError, match="grad: expected the shape of x"):
        ops.bias_act_backward(torch.randn(4, 4, device=device), x, None, None, "relu", 0.01, [True, False, False])
    with pytest.raises(TypeError, match="x and grad of the same dtype"):
        ops.bias_act_backward(x.double(), x, None, None, "relu", 0.01, [True, False, False])
    with pytest.raises(ValueError, match="bias: expected shape \\(5,\\)"):
        ops.bias_act_backward(x, x, None, torch.zeros(3, device=device), "relu", 0.01, [True, False, True])


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_cusparse_refuses_more_entries_than_positions_clearly():
    """A 2 x 2 matrix storing 5 entries (repeated columns): backend='cusparse' raises a ValueError that
    says why; 'auto' and the own kernels sum the repeats."""
    A = st.CSR(torch.tensor([0, 3, 5]), torch.tensor([0, 0, 1, 1, 1]), torch.ones(5), (2, 2)).to(device="cuda")
    b = torch.ones(2, 300, device="cuda")  # n > 256: "auto" would otherwise pick cuSPARSE
    # Twice with the same tensors: the refused call must leave nothing in the descriptor cache that the
    # second would find (it once did: a half-built entry, then "cusparseDnMatSetValues failed").
    for _ in range(2):
        with pytest.raises(ValueError, match="cuSPARSE refuses"):
            st.spmm(A, b, backend="cusparse")
    want = torch.tensor([[3.0], [2.0]], device="cuda").expand(2, 300)
    for be in ("auto", "native", "balanced", "tiled", "densify"):
        torch.testing.assert_close(st.spmm(A, b, backend=be), want)
    plan = st.SpmmPlan(A)
    torch.testing.assert_close(plan(b), want)


def test_int32_conversion_refused_when_it_would_wrap():
    """CSR.to(index_dtype=int32) with more than 2^31 - 1 columns raises instead of wrapping."""
    A = st.CSR(torch.tensor([0, 1]), torch.tensor([2**31 + 3]), torch.ones(1), (1, 2**31 + 5))
    with pytest.raises(ValueError, match="int32 cannot index"):
        A.to(index_dtype=torch.int32)
    assert A.col_indices.dtype == torch.int64


# --- operands in the user's terms ---------------------------------------------------------------------------

def test_scipy_and_list_inputs_take_b_dtype(device, rng):
    """A SciPy matrix (float64 by default) or a list of them is copied anyway: it takes B's dtype and device,
    in spmm, sddmm, scale and spmm_route alike."""
    a = random_csr(rng, 6, 5, 0.5)  # float64
    assert a.dtype == "float64"
    for dtype in (torch.float32, torch.bfloat16):
        b = torch.randn(5, 3, device=device, dtype=dtype)
        out = st.spmm(a, b)
        assert out.dtype == dtype and out.device.type == device
        ref = torch.from_numpy(a.toarray()).to(dtype).double() @ b.double().cpu()
        torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                                   atol=1e-2 if dtype == torch.bfloat16 else 1e-5)
        batched = st.spmm([a, a], b)
        assert batched.dtype == dtype and batched.shape == (2, 6, 3)
        x, y = torch.randn(6, 3, device=device, dtype=dtype), torch.randn(5, 3, device=device, dtype=dtype)
        assert st.sddmm(a, x, y).values.dtype == dtype
        assert st.scale(a, row=torch.ones(6, device=device, dtype=dtype)).values.dtype == dtype
        assert st.spmm_route(a, b) in ("cpu", "native", "balanced", "split", "tiled", "densify", "cusparse")
    numpy_tuple = (a.indptr, a.indices, a.data, a.shape)  # NumPy arrays: copied anyway too
    assert st.spmm(numpy_tuple, torch.randn(5, 3, device=device)).dtype == torch.float32


@pytest.mark.parametrize("kind", ["st.CSR", "torch"])
def test_a_tensor_of_another_dtype_names_a_and_b_and_the_fix(device, kind):
    """A torch tensor or an st.CSR is never cast behind the caller's back: the error names A, B and the fix."""
    crow, col, values = small(device, dtype=torch.float64)
    A = st.CSR(crow, col, values, (2, 3))
    if kind == "torch":
        A = A.to_torch()
    b = torch.randn(3, 2, device=device)
    with pytest.raises(TypeError, match=r"A and B of the same dtype, got A torch.float64 and B torch.float32: "
                                        r"convert one of them, e.g. B.to\(torch.float64\) or A.to\(torch.float32\)"):
        st.spmm(A, b)
    # the fix the message names works
    torch.testing.assert_close(st.spmm(A.to(torch.float32), b), st.spmm(A, b.to(torch.float64)).float())
    with pytest.raises(TypeError, match="expected a and b of the same dtype"):
        st.sddmm(A, torch.randn(2, 4, device=device, dtype=torch.float64), torch.randn(3, 4, device=device))
    with pytest.raises(TypeError, match=r"A and bias of the same dtype, got A torch.float64 and bias torch.float32"):
        st.spmm(A, b.double(), bias=torch.zeros(2, device=device))


def test_csr_to_takes_a_dtype_positionally(device):
    crow, col, values = small(device)
    A = st.CSR(crow, col, values, (2, 3))
    assert A.to(torch.float64).dtype == torch.float64 and A.to(torch.float64).device == A.device
    with pytest.raises(TypeError, match="dtype given twice"):
        A.to(torch.float64, dtype=torch.float16)


def test_b_that_is_not_a_dense_tensor(device):
    crow, col, values = small(device)
    A = st.CSR(crow, col, values, (2, 3))
    with pytest.raises(TypeError, match="B: expected a dense torch.Tensor, got list"):
        st.spmm(A, [[1.0, 2.0]] * 3)
    with pytest.raises(TypeError, match="B: expected a dense torch.Tensor, got torch.sparse_csr"):
        st.spmm(A, torch.eye(3, device=device).to_sparse_csr())
    with pytest.raises(TypeError, match="B: expected a dense torch.Tensor"):
        st.spmm(random_csr(np.random.default_rng(0), 2, 3, 0.5), "B")
    with pytest.raises(ValueError, match="B: expected a 2-D"):
        st.spmm(A, torch.randn(3, device=device))
