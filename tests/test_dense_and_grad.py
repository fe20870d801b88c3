"""The dense path (linear on cuBLASLt, strided-batched GEMM, the spmm policy), gradients of the fused
bias + activation, and elementwise kernels at odd sizes and misaligned storage."""
import pytest
import torch
import torch.nn.functional as F

import sparsetorch as st
from _helpers import activation_refs, assert_matches, randn, random_csr
from conftest import FLOAT_DTYPES

ACTS = activation_refs(negative_slope=0.1)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear(device, rng, act, dtype, with_bias):
    x = randn(rng, 2, 37, 48, dtype=dtype, device=device)
    w = randn(rng, 24, 48, dtype=dtype, device=device) * 0.2
    b = randn(rng, 24, dtype=dtype, device=device) if with_bias else None
    out = st.linear(x, w, b, activation=act, negative_slope=0.1)
    ref = x.double().cpu() @ w.double().cpu().t()
    if with_bias:
        ref = ref + b.double().cpu()
    assert out.shape == (2, 37, 24)
    assert_matches(out, ACTS[act](ref), dtype)


@pytest.mark.parametrize("shape", [(0, 8), (5, 0), (1, 1)], ids=str)
def test_linear_empty_dims(device, shape):
    rows, inner = shape
    x = torch.randn(rows, inner, device=device)
    w = torch.randn(3, inner, device=device)
    b = torch.randn(3, device=device)
    out = st.linear(x, w, b, activation="sigmoid")
    assert_matches(out, torch.sigmoid(x.double().cpu() @ w.double().cpu().t() + b.double().cpu()), torch.float32)


def test_linear_errors(device):
    with pytest.raises(ValueError, match="weight: expected shape \\(out, 4\\)"):
        st.linear(torch.randn(2, 4, device=device), torch.randn(3, 5, device=device))
    with pytest.raises(ValueError, match="bias: expected shape \\(3,\\)"):
        st.linear(torch.randn(2, 4, device=device), torch.randn(3, 4, device=device), torch.randn(4, device=device))
    with pytest.raises(TypeError, match="x and weight of the same dtype"):
        st.linear(torch.randn(2, 4, device=device), torch.randn(3, 4, device=device, dtype=torch.float64))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["both", "a_shared", "b_shared"])
def test_dense_bmm(device, rng, layout, dtype):
    a = randn(rng, *((4, 9, 7) if layout != "a_shared" else (9, 7)), dtype=dtype, device=device)
    b = randn(rng, *((4, 7, 5) if layout != "b_shared" else (7, 5)), dtype=dtype, device=device)
    out = st.dense_bmm(a, b)
    assert out.shape == (4, 9, 5)
    assert_matches(out, torch.matmul(a.double().cpu(), b.double().cpu()), dtype)
    with pytest.raises(ValueError, match="at least one batched"):
        st.dense_bmm(a[0] if a.dim() == 3 else a, b[0] if b.dim() == 3 else b)


@pytest.mark.parametrize("policy", ["dense", "auto"])
def test_spmm_policies_agree(device, rng, policy):
    mats = [random_csr(rng, 30, 20, d) for d in (0.5, 0.02, 0.3)]
    A = st.from_list(mats, device=device)
    b = randn(rng, 3, 20, 6, dtype=torch.float64, device=device)
    bias = randn(rng, 6, dtype=torch.float64, device=device)
    c = randn(rng, 3, 30, 6, dtype=torch.float64, device=device)
    sparse = st.spmm(A, b, alpha=0.5, beta=2.0, c=c, bias=bias, activation="tanh", policy="sparse")
    other = st.spmm(A, b, alpha=0.5, beta=2.0, c=c, bias=bias, activation="tanh", policy=policy)
    assert_matches(other, sparse, torch.float64)
    a1 = st.from_scipy(mats[0], device=device)
    out = torch.zeros(30, 6, dtype=torch.float64, device=device)
    st.spmm(a1, b[0], out=out, policy=policy)
    assert_matches(out, torch.from_numpy(mats[0] @ b[0].cpu().numpy()), torch.float64)
    plan = st.SpmmPlan(a1, policy=policy, activation="relu")
    assert_matches(plan(b[0]), torch.relu(torch.from_numpy(mats[0] @ b[0].cpu().numpy())), torch.float64)


def test_auto_policy_uses_crossover(device, rng):
    dense_a = st.from_scipy(random_csr(rng, 40, 40, 0.9), device=device)
    sparse_a = st.from_scipy(random_csr(rng, 40, 40, 0.005), device=device)
    assert st.functional._prefers_dense(dense_a) and not st.functional._prefers_dense(sparse_a)
    with pytest.raises(ValueError, match="policy"):
        st.spmm(dense_a, torch.randn(40, 2, dtype=torch.float64, device=device), policy="fastest")


# --- gradients ------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", list(ACTS))
def test_bias_act_gradcheck(device, rng, act):
    x = (randn(rng, 6, 5, dtype=torch.float64, device=device) * 2).requires_grad_()
    scale = randn(rng, 5, dtype=torch.float64, device=device).requires_grad_()
    bias = randn(rng, 5, dtype=torch.float64, device=device).requires_grad_()
    if act == "relu" or act == "leaky_relu":  # keep pre-activations away from the kink at 0
        with torch.no_grad():
            z = x * scale + bias
            x += torch.where(z.abs() < 0.05, torch.full_like(x, 0.2), torch.zeros_like(x))
    fn = lambda x, s, b: st.bias_act(x, bias=b, scale=s, activation=act, negative_slope=0.1)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, scale, bias))


@pytest.mark.parametrize("act", ["gelu", "silu", "tanh", "sigmoid", "gelu_tanh"])
def test_activation_gradcheck(device, rng, act):
    x = randn(rng, 3, 7, dtype=torch.float64, device=device).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: st.activation(t, act), (x,))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bias_act_backward_matches_torch(device, rng, dtype):
    x = randn(rng, 333, 40, dtype=dtype, device=device).requires_grad_()
    scale = randn(rng, 40, dtype=dtype, device=device).requires_grad_()
    bias = randn(rng, 40, dtype=dtype, device=device).requires_grad_()
    g = randn(rng, 333, 40, dtype=dtype, device=device)
    st.bias_act(x, bias=bias, scale=scale, activation="gelu").backward(g)
    x64, s64, b64 = (t.detach().double().cpu().requires_grad_() for t in (x, scale, bias))
    F.gelu(x64 * s64 + b64).backward(g.double().cpu())
    assert_matches(x.grad, x64.grad, dtype)
    # Column sums over 333 rows, accumulated in float32 for half types and rounded once.
    assert_matches(scale.grad, s64.grad, dtype)
    assert_matches(bias.grad, b64.grad, dtype)


def test_only_needed_gradients(device, rng):
    x = randn(rng, 4, 3, dtype=torch.float64, device=device).requires_grad_()
    bias = randn(rng, 3, dtype=torch.float64, device=device)  # no grad wanted
    st.bias_act(x, bias=bias, activation="silu").sum().backward()
    assert x.grad is not None and bias.grad is None


# --- odd sizes and misaligned storage ------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 3, 1023, 2**20 + 7])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_odd_sizes_and_offsets(device, rng, size, offset, dtype):
    base = randn(rng, size + offset, dtype=dtype, device=device)
    x = base[offset:]  # storage offset 1: not 16-byte aligned, takes the scalar path
    y = randn(rng, size + offset, dtype=dtype, device=device)[offset:]
    assert_matches(st.add(x, y, alpha=2.0), x.double().cpu() + 2 * y.double().cpu(), dtype)
    assert_matches(st.silu(x), F.silu(x.double().cpu()), dtype)
    n = 1 if size in (1, 3) else (size if size < 2000 else 8)
    rows = x[: (size // n) * n].view(-1, n)
    bias = randn(rng, n, dtype=dtype, device=device)
    assert_matches(st.bias_act(rows, bias=bias, activation="relu"), F.relu(rows.double().cpu() + bias.double().cpu()),
                   dtype)


@pytest.mark.parametrize("n", [2048, 4104])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_act_wide_rows(device, rng, n, dtype):
    """Rows wider than one block's column tile (several tiles per row), forward and backward."""
    x = randn(rng, 37, n, dtype=dtype, device=device).requires_grad_()
    scale = randn(rng, n, dtype=dtype, device=device).requires_grad_()
    bias = randn(rng, n, dtype=dtype, device=device).requires_grad_()
    g = randn(rng, 37, n, dtype=dtype, device=device)
    y = st.bias_act(x, bias=bias, scale=scale, activation="silu")
    x64, s64, b64 = (t.detach().double().cpu().requires_grad_() for t in (x, scale, bias))
    y64 = F.silu(x64 * s64 + b64)
    assert_matches(y, y64, dtype)
    y.backward(g)
    y64.backward(g.double().cpu())
    for got, ref in ((x.grad, x64.grad), (scale.grad, s64.grad), (bias.grad, b64.grad)):
        assert_matches(got, ref, dtype)
