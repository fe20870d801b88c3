"""The public ops under torch.compile: fullgraph traces (no graph break) of st.spmm (an st.CSR A, with bias,
activation, c/beta and alpha), st.sddmm, st.bias_act, st.linear, the elementwise ops and st.transpose,
forward and backward, against eager; with dynamic=True one graph serves every shape; and the input
contract holds in a compiled call (a malformed A or mismatched operands raise, never a wrong result).

torch sparse tensors cannot enter a dynamo graph (torch raises "Attempted to wrap sparse Tensor"): compiled
code takes an st.CSR (st.from_torch(A) outside the compiled function).

The CPU runs aot_eager (the traced graph, run by eager kernels: fast to compile) and one inductor case."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

import sparsetorch as st
from _helpers import random_csr, randn

ACTIVATIONS = [None, "relu", "gelu", "leaky_relu"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _csr(rng, m, k, device, dtype=torch.float64, density=0.4, index_dtype=torch.int64):
    return st.from_scipy(random_csr(rng, m, k, density, unsorted=True, duplicates=True, empty_rows=0.3),
                         device=device, dtype=dtype, index_dtype=index_dtype)


def _compiled(fn, dynamic=None):
    """fn compiled with fullgraph=True (a graph break raises), and a counter of the graphs it traced."""
    counter = CompileCounterWithBackend("aot_eager")
    return torch.compile(fn, backend=counter, fullgraph=True, dynamic=dynamic), counter


def _no_breaks(fn, *args):
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def _grads(fn, inputs):
    """fn's output and the gradients of (output * w).sum() for a fixed random weight w."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    y = fn(*inputs)
    w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).reshape(y.shape)
    (y * w).sum().backward()
    return y.detach(), [t.grad for t in inputs]


def _assert_same_grads(fn, inputs, dynamic=None):
    compiled, counter = _compiled(fn, dynamic)
    want_y, want_g = _grads(fn, inputs)
    got_y, got_g = _grads(compiled, inputs)
    torch.testing.assert_close(got_y, want_y)
    for got, want in zip(got_g, want_g):
        torch.testing.assert_close(got, want)
    assert counter.frame_count == 1
    return counter


# --- spmm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_spmm_traces_whole_with_every_epilogue_and_its_backward(device, rng, activation, index_dtype):
    a = _csr(rng, 9, 7, device, index_dtype=index_dtype)
    b = randn(rng, 7, 5, device=device, dtype=torch.float64)
    c = randn(rng, 9, 5, device=device, dtype=torch.float64)
    bias = randn(rng, 5, device=device, dtype=torch.float64)

    def f(values, b, c, bias):
        A = st.CSR(a.crow_indices, a.col_indices, values, a.shape)  # built inside the compiled function
        return st.spmm(A, b, alpha=1.5, c=c, beta=0.5, bias=bias, activation=activation, negative_slope=0.2)

    _no_breaks(f, a.values, b, c, bias)
    _assert_same_grads(f, [a.values, b, c, bias])
    # the eager result is the float64 reference's
    z = 1.5 * (a.to_dense() @ b) + 0.5 * c + bias
    ref = {None: z, "relu": torch.relu(z), "gelu": torch.nn.functional.gelu(z),
           "leaky_relu": torch.nn.functional.leaky_relu(z, 0.2)}[activation]
    torch.testing.assert_close(torch.compile(f, backend="aot_eager", fullgraph=True)(a.values, b, c, bias), ref)


def test_spmm_of_a_csr_argument_and_a_batched_b(device, rng):
    a = _csr(rng, 6, 4, device, dtype=torch.float32)
    b = randn(rng, 3, 4, 2, device=device)
    f = lambda A, b: st.spmm(A, b)  # noqa: E731
    compiled, counter = _compiled(f)
    torch.testing.assert_close(compiled(a, b), a.to_dense() @ b)
    _no_breaks(f, a, b)


def test_spmm_dynamic_shapes_compile_once(device, rng):
    """dynamic=True: matrices of other sizes and entry counts, and B of other widths, reuse the graph."""
    def f(values, crow, col, b, bias):
        A = st.CSR(crow, col, values, (crow.shape[0] - 1, b.shape[0]))
        return st.spmm(A, b, bias=bias, activation="relu")

    compiled, counter = _compiled(f, dynamic=True)
    compiles = []
    for m, k, n in ((5, 4, 3), (9, 7, 2), (17, 6, 8), (3, 11, 5), (30, 20, 4), (12, 9, 6), (40, 3, 7), (7, 25, 9)):
        a = _csr(rng, m, k, device, dtype=torch.float32)
        b, bias = randn(rng, k, n, device=device), randn(rng, n, device=device)
        got = compiled(a.values, a.crow_indices, a.col_indices, b, bias)
        torch.testing.assert_close(got, torch.relu(a.to_dense() @ b + bias))
        compiles.append(counter.frame_count)
    # At most one recompile: dynamo's duck sizing may turn a coincidence of the first call's sizes (nnz = m + 1)
    # into a guard; the second graph has none left to break.
    assert compiles[-1] <= compiles[0] + 1 and compiles[-1] == compiles[2], compiles


def test_registered_autograd_and_spmm_function_give_the_same_gradients(rng):
    """Compiled calls record through the op's registered autograd, eager ones through SpmmFunction: the same
    gradients, to the bit, for every input."""
    a = _csr(rng, 8, 6, "cpu")
    inputs = [a.values, randn(rng, 6, 4, dtype=torch.float64), randn(rng, 8, 4, dtype=torch.float64),
              randn(rng, 4, dtype=torch.float64)]

    def f(values, b, c, bias):
        return st.spmm(st.CSR(a.crow_indices, a.col_indices, values, a.shape), b, alpha=2.0, c=c, beta=0.25,
                       bias=bias)

    want_y, want_g = _grads(f, inputs)
    got_y, got_g = _grads(torch.compile(f, backend="aot_eager", fullgraph=True), inputs)
    assert torch.equal(got_y, want_y)
    for got, want in zip(got_g, want_g):
        assert torch.equal(got, want)


def test_inductor_spmm_step(rng):
    """The default backend (inductor: generated C++ around the opaque op) on a training step."""
    a = _csr(rng, 12, 10, "cpu", dtype=torch.float32)
    w = torch.nn.Linear(10, 6)

    def step(x):
        h = st.spmm(a, w(x), activation="relu")
        return st.bias_act(h, scale=2.0, activation="tanh").sum()

    x = randn(rng, 10, 10)
    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(x)
    loss.backward()
    got = [p.grad.clone() for p in w.parameters()]
    w.zero_grad()
    step(x).backward()
    for g, p in zip(got, w.parameters()):
        torch.testing.assert_close(g, p.grad)


# --- the input contract under compile ----------------------------------------------------------------

def test_a_malformed_matrix_raises_in_a_compiled_call(device, rng):
    a = _csr(rng, 6, 5, device, dtype=torch.float32)
    col = a.col_indices.clone()
    col[0] = 5  # out of range for 5 columns
    compiled = torch.compile(lambda A, b: st.spmm(A, b), backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError, match=r"col_indices\[0\] = 5 is out of range"):
        compiled(st.CSR(a.crow_indices, col, a.values, a.shape), randn(rng, 5, 3, device=device))


@pytest.mark.parametrize("what", ["dtype", "columns", "activation"])
def test_mismatched_operands_raise_in_a_compiled_call(device, rng, what):
    a = _csr(rng, 6, 5, device, dtype=torch.float64)
    b = randn(rng, 5, 3, device=device, dtype=torch.float32 if what == "dtype" else torch.float64)
    if what == "columns":
        b = randn(rng, 4, 3, device=device, dtype=torch.float64)
    act = "nope" if what == "activation" else None
    compiled = torch.compile(lambda A, b: st.spmm(A, b, activation=act), backend="aot_eager", fullgraph=True)
    expected = {"dtype": (Exception, "A and B of the same dtype"), "columns": (Exception, "A's columns 5 != B's rows 4"),
                "activation": (Exception, "unknown activation 'nope'")}[what]
    with pytest.raises(expected[0], match=expected[1]):
        compiled(a, b)


# --- the other ops -----------------------------------------------------------------------------------

def test_sddmm_traces_whole_with_its_backward(device, rng):
    a = _csr(rng, 7, 6, device)
    x, y = randn(rng, 7, 4, device=device, dtype=torch.float64), randn(rng, 6, 4, device=device, dtype=torch.float64)

    def f(x, y):
        return st.sddmm(a, x, y, alpha=0.5).values

    _no_breaks(f, x, y)
    _assert_same_grads(f, [x, y])
    dense = 0.5 * (x @ y.T)
    ref = st.to_dense(a.with_values(torch.ones_like(a.values)))  # counts repeated entries
    got = st.to_dense(st.sddmm(a, x, y, alpha=0.5))
    torch.testing.assert_close(got, dense * ref)


@pytest.mark.parametrize("scale", [None, 2.0, "tensor"])
def test_bias_act_traces_whole_with_its_backward(device, rng, scale):
    x = randn(rng, 4, 3, 5, device=device, dtype=torch.float64)
    bias = randn(rng, 5, device=device, dtype=torch.float64)
    s = randn(rng, 5, device=device, dtype=torch.float64)

    def f(x, bias, s):
        return st.bias_act(x, bias=bias, scale=s if scale == "tensor" else scale, activation="silu")

    _no_breaks(f, x, bias, s)
    _assert_same_grads(f, [x, bias, s])


@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh"])
def test_linear_traces_whole_with_its_backward(device, rng, activation):
    x, w = randn(rng, 3, 4, 6, device=device, dtype=torch.float64), randn(rng, 5, 6, device=device, dtype=torch.float64)
    bias = randn(rng, 5, device=device, dtype=torch.float64)
    f = lambda x, w, bias: st.linear(x, w, bias, activation=activation)  # noqa: E731
    _no_breaks(f, x, w, bias)
    _assert_same_grads(f, [x, w, bias])


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "relu", "gelu", "sigmoid", "tanh", "leaky_relu", "silu"])
def test_elementwise_ops_trace_whole_on_dense_and_csr_operands(device, rng, op):
    a = _csr(rng, 6, 5, device)
    x = randn(rng, 6, 5, device=device, dtype=torch.float64)
    y = randn(rng, 6, 5, device=device, dtype=torch.float64).abs() + 0.5
    binary = op in ("add", "sub", "mul", "div")
    fn = getattr(st, op)

    def dense(x, y):
        return fn(x, y) if binary else fn(x)

    def sparse(values, other):
        A = a.with_values(values)
        out = fn(A, a.with_values(other)) if binary else fn(A)
        return fn(out, 3.0).values if binary else out.values

    other = a.values.abs() + 0.5
    for f, args in ((dense, (x, y)), (sparse, (a.values, other))):
        _no_breaks(f, *args)
        _assert_same_grads(f, list(args))


def test_transpose_and_scale_trace_whole(device, rng):
    a = _csr(rng, 6, 5, device)
    d = randn(rng, 6, device=device, dtype=torch.float64).abs() + 0.5

    def f(values, d):
        At = st.transpose(a.with_values(values))
        return st.scale(At, col=d).values

    _no_breaks(f, a.values, d)
    _assert_same_grads(f, [a.values, d])
    torch.testing.assert_close(st.to_dense(st.transpose(a)), a.to_dense().T)
