"""Elementwise ops, activations, the fused bias + activation and CSR scaling against float64 torch/SciPy."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

import sparsetorch as st
from _helpers import activation_refs, assert_matches, randn, random_csr, rounded, to_st
from conftest import FLOAT_DTYPES

SIZES = [(0,), (1,), (3,), (1023,), (5, 7), (2, 3, 129)]

BINARY_REF = {
    "add": lambda x, y, a: x + a * y,
    "sub": lambda x, y, a: x - a * y,
    "mul": lambda x, y, a: x * y,
    "div": lambda x, y, a: x / y,
}
BINARY_FN = {"add": st.add, "sub": st.sub, "mul": st.mul, "div": st.div}

ACT_REF = activation_refs(negative_slope=0.1)


def ref64(fn, *tensors):
    return fn(*[t.double().cpu() if isinstance(t, torch.Tensor) else t for t in tensors])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("op", list(BINARY_REF))
def test_binary_tensor(device, rng, op, shape, dtype):
    x = randn(rng, *shape, dtype=dtype, device=device)
    y = randn(rng, *shape, dtype=dtype, device=device)
    if op == "div":
        y = y.sign() * (y.abs() + 0.5)  # keep the quotient well conditioned
    kwargs = {"alpha": -0.75} if op in ("add", "sub") else {}
    out = BINARY_FN[op](x, y, **kwargs)
    assert_matches(out, ref64(lambda a, b: BINARY_REF[op](a, b, kwargs.get("alpha", 1.0)), x, y), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op", list(BINARY_REF))
def test_binary_scalar(device, rng, op, dtype):
    x = randn(rng, 4, 33, dtype=dtype, device=device)
    out = BINARY_FN[op](x, 1.5)
    assert_matches(out, ref64(lambda a: BINARY_REF[op](a, 1.5, 1.0), x), dtype)


def test_rsub_scalar_op(device, rng):
    x = randn(rng, 17, dtype=torch.float64, device=device)
    assert_matches(st._ops.ops.binary_scalar(x, 2.0, "rsub"), 2.0 - x.cpu(), torch.float64)


@pytest.mark.parametrize("kind", ["transposed", "sliced", "broadcast"])
def test_binary_non_contiguous(device, rng, kind):
    x = randn(rng, 8, 6, dtype=torch.float32, device=device)
    if kind == "transposed":
        x = x.t()
        y = randn(rng, 6, 8, dtype=torch.float32, device=device)
    elif kind == "sliced":
        x = x[:, ::2]
        y = randn(rng, 8, 6, dtype=torch.float32, device=device)[:, 1::2]
    else:
        y = randn(rng, 6, dtype=torch.float32, device=device)
    before = (x.clone(), y.clone())
    assert_matches(st.mul(x, y), ref64(torch.mul, x, y), torch.float32)
    assert torch.equal(x, before[0]) and torch.equal(y, before[1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("act", list(ACT_REF))
def test_activations(device, rng, act, dtype):
    x = randn(rng, 3, 257, dtype=dtype, device=device) * 3
    out = st.activation(x, act, negative_slope=0.1)
    assert_matches(out, ref64(ACT_REF[act], x), dtype)


def test_named_activation_helpers(device, rng):
    x = randn(rng, 50, dtype=torch.float64, device=device)
    xc = x.cpu()
    assert_matches(st.relu(x), F.relu(xc), torch.float64)
    assert_matches(st.leaky_relu(x, 0.3), F.leaky_relu(xc, 0.3), torch.float64)
    assert_matches(st.gelu(x), F.gelu(xc), torch.float64)
    assert_matches(st.gelu(x, approximate="tanh"), F.gelu(xc, approximate="tanh"), torch.float64)
    assert_matches(st.silu(x), F.silu(xc), torch.float64)
    assert_matches(st.sigmoid(x), torch.sigmoid(xc), torch.float64)
    assert_matches(st.tanh(x), torch.tanh(xc), torch.float64)


def test_activation_propagates_nan(device):
    x = torch.tensor([float("nan"), -1.0, float("inf"), float("-inf")], dtype=torch.float64, device=device)
    for act, fn in ACT_REF.items():
        assert_matches(st.activation(x, act, 0.1), fn(x.cpu()), torch.float64)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("act", list(ACT_REF))
@pytest.mark.parametrize("with_scale,with_bias", [(True, True), (False, True), (True, False), (False, False)])
def test_bias_act(device, rng, act, dtype, with_scale, with_bias):
    x = randn(rng, 5, 7, 131, dtype=dtype, device=device)
    scale = randn(rng, 131, dtype=dtype, device=device) if with_scale else None
    bias = randn(rng, 131, dtype=dtype, device=device) if with_bias else None
    out = st.bias_act(x, bias=bias, scale=scale, activation=act, negative_slope=0.1)
    pre = x.double().cpu()
    if with_scale:
        pre = pre * scale.double().cpu()
    if with_bias:
        pre = pre + bias.double().cpu()
    assert_matches(out, ACT_REF[act](pre), dtype)


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (1,), (3, 1), (1000, 3)], ids=str)
def test_bias_act_odd_shapes(device, rng, shape):
    x = randn(rng, *shape, dtype=torch.float32, device=device)
    bias = randn(rng, shape[-1], dtype=torch.float32, device=device)
    out = st.bias_act(x, bias=bias, scale=2.0, activation="gelu")
    assert_matches(out, F.gelu(2.0 * x.double().cpu() + bias.double().cpu()), torch.float32)


def test_bias_act_non_contiguous(device, rng):
    x = randn(rng, 64, 48, dtype=torch.float32, device=device).t()  # features last, strided
    bias = randn(rng, 64, dtype=torch.float32, device=device)
    out = st.bias_act(x, bias=bias, activation="silu")
    assert_matches(out, F.silu(x.double().cpu() + bias.double().cpu()), torch.float32)


# --- CSR values -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", list(BINARY_REF))
def test_csr_values_ops(device, rng, op):
    a = random_csr(rng, 20, 15, 0.3)
    A = st.from_scipy(a, device=device)
    B = A.with_values(A.values.abs() + 1)
    out = BINARY_FN[op](A, B)
    assert isinstance(out, st.CSR) and out.crow_indices is A.crow_indices
    expected = BINARY_REF[op](A.values.double().cpu(), B.values.double().cpu(), 1.0)
    assert_matches(out.values, expected, torch.float64)
    scaled = st.mul(A, 3.0)
    assert_matches(scaled.to_dense(), torch.from_numpy(3.0 * a.toarray()), torch.float64)


def test_csr_activation_and_torch_tensor_in_out(device, rng):
    a = random_csr(rng, 12, 9, 0.4)
    t = st.to_torch(st.from_scipy(a, device=device))
    out = st.relu(t)
    assert isinstance(out, torch.Tensor) and out.layout == torch.sparse_csr
    assert_matches(out.to_dense(), np.maximum(a.toarray(), 0), torch.float64)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("which", ["rows", "cols", "both"])
def test_scale_matches_diagonal_products(device, rng, which, dtype):
    m, k = 40, 30
    a = rounded(random_csr(rng, m, k, 0.2, unsorted=True, duplicates=True, empty_rows=0.2), dtype)
    r = randn(rng, m, dtype=dtype, device=device) if which != "cols" else None
    c = randn(rng, k, dtype=dtype, device=device) if which != "rows" else None
    out = st.scale(to_st(a, dtype, torch.int32, device), row=r, col=c)
    ref = a.toarray()
    if r is not None:
        ref = np.diag(r.double().cpu().numpy()) @ ref
    if c is not None:
        ref = ref @ np.diag(c.double().cpu().numpy())
    assert_matches(out.to_dense(), ref, dtype)


def test_gcn_normalisation(device, rng):
    """D^-1/2 (A + I) D^-1/2 built with scale, checked against SciPy."""
    n = 50
    a = random_csr(rng, n, n, 0.1)
    a.data[:] = 1.0
    a = (a + a.T + sp.eye(n)).tocsr()
    deg = np.asarray(a.sum(axis=1)).ravel()
    d = torch.from_numpy(deg ** -0.5).to(device)
    out = st.scale(st.from_scipy(a, device=device), row=d, col=d)
    dm = sp.diags(deg ** -0.5)
    assert_matches(out.to_dense(), (dm @ a @ dm).toarray(), torch.float64)


def test_scale_batched(device, rng):
    mats = [random_csr(rng, 10, 8, d) for d in (0.2, 0.6, 0.0)]
    A = st.from_list(mats, device=device)
    r = randn(rng, 3, 10, dtype=torch.float64, device=device)
    c = randn(rng, 8, dtype=torch.float64, device=device)
    out = st.scale(A, row=r, col=c)
    ref = np.stack([np.diag(r[i].cpu().numpy()) @ x.toarray() @ np.diag(c.cpu().numpy()) for i, x in enumerate(mats)])
    assert_matches(out.to_dense(), ref, torch.float64)
