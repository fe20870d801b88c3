"""Hardening: every malformed input raises a Python exception and leaves the device usable, inputs are
never written, results stay right from several threads, under CUDA graph capture and over 10,000
calls (flat memory), and property-based checks of spmm / sddmm against dense float64 (hypothesis)."""
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import sparsetorch as st
from _helpers import activation_refs, assert_matches, random_csr, randn
from conftest import CUDA_READY, DEVICES

ops = torch.ops.sparsetorch


def _good(device):
    a = st.from_scipy(random_csr(np.random.default_rng(0), 5, 4, 0.5), device=device, dtype=torch.float32,
                      index_dtype=torch.int64)
    return a.crow_indices, a.col_indices, a.values, torch.randn(4, 3, device=device)


def _still_works(device):
    """A correct SpMM on the same device right after an error: the CUDA context is intact."""
    crow, col, values, b = _good(device)
    out = ops.spmm(crow, col, values, b)
    ref = st.to_dense(st.CSR(crow, col, values, (5, 4))).double() @ b.double()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def _bad_cases(device):
    crow, col, values, b = _good(device)
    other = "cpu" if device != "cpu" else ("cuda" if CUDA_READY else None)
    cases = {
        "crow length vs shape": (lambda: st.spmm(st.CSR(crow, col, values, (4, 4)), b), ValueError,
                                 "expected last dimension m \\+ 1"),
        "crow[-1] < nnz": (lambda: st.spmm((crow[:-1], col, values, (4, 4)), b, validate=True), ValueError, "nnz"),
        "crow not monotone": (lambda: st.spmm((torch.tensor([0, 3, 1, 4, 5, 6], device=device), col[:6],
                                               values[:6], (5, 4)), b, validate=True), ValueError, "non-decreasing"),
        "crow[-1] != nnz": (lambda: st.spmm((torch.tensor([0, 1, 2, 3, 4, 5], device=device),
                                              torch.zeros(6, dtype=torch.int64, device=device),
                                              torch.ones(6, device=device), (5, 4)), b, validate=True),
                            ValueError, "nnz"),
        "negative column": (lambda: st.spmm((crow, col.clone().fill_(-1), values, (5, 4)), b, validate=True),
                            ValueError, "column"),
        "column out of range": (lambda: st.spmm((crow, col.clone().fill_(4), values, (5, 4)), b, validate=True),
                                ValueError, "column"),
        "values dtype vs B": (lambda: st.spmm((crow, col, values.double(), (5, 4)), b), TypeError, "dtype"),
        "integer values": (lambda: ops.spmm(crow, col, values.long(), b), TypeError, "values"),
        "float indices": (lambda: ops.spmm(crow.float(), col, values, b), TypeError, "crow_indices"),
        "mixed index dtypes": (lambda: ops.spmm(crow.int(), col.long(), values, b), TypeError, "same dtype"),
        "B rank 1": (lambda: ops.spmm(crow, col, values, b[:, 0]), ValueError, "B: expected a 2-D"),
        "B rank 4": (lambda: ops.spmm(crow, col, values, b.reshape(1, 1, 4, 3)), ValueError, "B: expected a 2-D"),
        "A cols != B rows": (lambda: st.spmm((crow, col, values, (5, 4)), b[:3]), ValueError, "shape mismatch"),
        "batch sizes differ": (lambda: st.spmm(st.from_list([st.CSR(crow, col, values, (5, 4))] * 2),
                                               torch.randn(3, 4, 3, device=device)), ValueError, "batch"),
        "COO layout": (lambda: st.spmm(torch.eye(4, device=device).to_sparse_coo(), b), TypeError, "sparse_csr"),
        "sparse B": (lambda: st.spmm((crow, col, values, (5, 4)), b.to_sparse()), TypeError, "dense"),
        "bias wrong length": (lambda: ops.spmm(crow, col, values, b, bias=torch.zeros(2, device=device)), ValueError,
                              "bias"),
        "unknown activation": (lambda: ops.spmm(crow, col, values, b, activation="swish"), ValueError, "activation"),
        "unknown backend": (lambda: ops.spmm(crow, col, values, b, backend="mkl"), ValueError, "backend"),
        "sddmm a rows": (lambda: ops.sddmm(crow, col, torch.randn(6, 3, device=device), b), ValueError, "rows"),
    }
    if other is not None:
        cases["B on another device"] = (lambda: ops.spmm(crow, col, values, b.to(other)), ValueError, "device")
    return cases


BAD_NAMES = list(_bad_cases("cpu"))


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_input_raises_and_device_stays_usable(device, name, monkeypatch):
    originals = _good(device)
    snapshots = [t.clone() for t in originals]
    monkeypatch.setattr(__import__(__name__), "_good", lambda device: originals)
    fn, exc, match = _bad_cases(device)[name]
    with pytest.raises(exc, match=match):
        fn()
    for t, snap in zip(originals, snapshots):  # nothing the caller passed was written
        assert torch.equal(t, snap)
    if device == "cuda":
        torch.cuda.synchronize()  # an asynchronous device fault would surface here
    _still_works(device)


def test_threads_get_right_results(device, rng):
    """Eight threads, each with its own matrix, at once (ops release the GIL; CUDA uses one stream)."""
    mats = [random_csr(rng, 300, 200, 0.05, duplicates=True) for _ in range(8)]
    bs = [randn(rng, 200, 16, device=device) for _ in range(8)]
    results, errors = [None] * 8, []

    def work(i):
        try:
            a = st.from_scipy(mats[i], device=device, dtype=torch.float32)
            for _ in range(20):
                results[i] = st.spmm(a, bs[i], activation="relu")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for mat, b, out in zip(mats, bs, results):
        assert_matches(out, np.maximum(mat @ b.double().cpu().numpy(), 0), torch.float32)


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_cuda_graph_capture_of_the_sync_free_ops(rng):
    """Captured once, replayed on new data: native, balanced, tiled and densify SpMM (single and batched), native SDDMM,
    bias_act and the elementwise ops. (The cuSPARSE routes and validate=True are not claimed to be
    capturable.)"""
    a = st.from_scipy(random_csr(rng, 64, 48, 0.1, duplicates=True), device="cuda", dtype=torch.float32)
    batch = st.from_list([random_csr(rng, 64, 48, d) for d in (0.05, 0.2)], device="cuda", dtype=torch.float32)
    b = torch.randn(48, 32, device="cuda")
    g = torch.randn(64, 32, device="cuda")
    bias = torch.randn(32, device="cuda")

    def step():
        y = st.spmm(a, b, bias=bias, activation="gelu", backend="native")
        yb = st.spmm(batch, b, backend="native")
        yt = st.spmm(a, b, bias=bias, activation="relu", backend="tiled")
        ybt = st.spmm(batch, b, backend="tiled")
        yl = st.spmm(a, b, bias=bias, activation="tanh", backend="balanced")
        ybl = st.spmm(batch, b, backend="balanced")
        yd = st.spmm(a, b, bias=bias, activation="silu", backend="densify")
        ybd = st.spmm(batch, b, backend="densify")
        v = st.sddmm(a, g, b, backend="native").values
        return st.mul(st.bias_act(y, scale=2.0, activation="silu"), 3.0), yb, yt, ybt, yl, ybl, yd, ybd, v

    step()  # warm up (allocations, descriptors) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    b.copy_(torch.randn_like(b))
    g.copy_(torch.randn_like(g))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, step()):
        torch.testing.assert_close(got, want)


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
@pytest.mark.parametrize("route", ["native", "balanced", "tiled", "cusparse", "densify", "plan-native", "plan-balanced",
                                   "plan-tiled", "plan-cusparse", "plan-auto", "batched"])
def test_memory_flat_over_10000_calls(rng, route):
    a = st.from_scipy(random_csr(rng, 256, 256, 0.05), device="cuda", dtype=torch.float32)
    b = torch.randn(256, 32, device="cuda")
    if route.startswith("plan"):
        plan = st.SpmmPlan(a, backend=route.split("-")[1])
        call = lambda: plan(b)  # noqa: E731
    elif route == "batched":
        batch = st.from_list([random_csr(rng, 256, 256, d) for d in (0.01, 0.05, 0.1)], device="cuda",
                             dtype=torch.float32)
        call = lambda: st.spmm(batch, b, backend="cusparse")  # noqa: E731  (block-diagonal per call)
    else:
        call = lambda: st.spmm(a, b, backend=route)  # noqa: E731
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(10_000):
        call()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


# --- property-based -----------------------------------------------------------------------------------

@hs.composite
def _problems(draw):
    m, k, n = draw(hs.integers(0, 9)), draw(hs.integers(0, 9)), draw(hs.integers(0, 6))
    density = draw(hs.sampled_from([0.0, 0.2, 0.6, 1.0]))
    layout = draw(hs.sampled_from(["single", "per_batch", "shared", "batched_b"]))
    dtype = draw(hs.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    index_dtype = draw(hs.sampled_from([torch.int32, torch.int64]))
    seed = draw(hs.integers(0, 2**31 - 1))
    transposed_b = draw(hs.booleans())
    backend = draw(hs.sampled_from(["auto", "native", "balanced", "tiled", "cusparse", "densify"]))
    return m, k, n, density, layout, dtype, index_dtype, seed, transposed_b, backend


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=_problems())
def test_spmm_and_sddmm_properties(device, problem):
    """Random shapes (zeros included), densities, duplicates/unsorted columns, layouts, all four dtypes,
    index dtypes, a transposed B and every backend (one route on the CPU): spmm and sddmm equal dense
    float64 products."""
    m, k, n, density, layout, dtype, index_dtype, seed, transposed_b, backend = problem
    rng = np.random.default_rng(seed)
    kw = dict(unsorted=True, duplicates=True, empty_rows=0.2)
    if layout == "per_batch":
        mats = [random_csr(rng, m, k, density, **kw) for _ in range(3)]
        a = st.from_list(mats, shape=(m, k), device=device, dtype=dtype, index_dtype=index_dtype)
    else:
        a = st.from_scipy(random_csr(rng, m, k, density, **kw), device=device, dtype=dtype, index_dtype=index_dtype)
        if layout == "shared":
            vals = randn(rng, 3, a.values.numel(), dtype=dtype, device=device)
            a = st.CSR(a.crow_indices, a.col_indices, vals, (3, m, k))
    batched_b = layout in ("per_batch", "shared", "batched_b")
    b = randn(rng, *((3, n, k) if batched_b else (n, k)), dtype=dtype, device=device).transpose(-1, -2)
    if not transposed_b:
        b = b.contiguous()
    try:
        out = st.spmm(a, b, backend=backend)
    except ValueError as e:  # cuSPARSE refuses more stored entries than positions (repeated columns)
        assert backend == "cusparse" and "cuSPARSE refuses" in str(e) and a.col_indices.shape[-1] > m * k, e
        return
    dense_a = st.to_dense(a).double().cpu()
    ref = torch.matmul(dense_a, b.double().cpu())
    assert_matches(out, ref, dtype)
    g = randn(rng, *ref.shape, dtype=dtype, device=device)
    s = st.sddmm(a, g, b, backend="native" if backend == "cusparse" else backend)  # the gradient of spmm w.r.t. A's values: (g @ b^T) at A's entries
    full = torch.matmul(g.double().cpu(), b.double().cpu().transpose(-1, -2))  # (.., m, k)
    mask = st.to_dense(st.CSR(a.crow_indices, a.col_indices, torch.ones_like(a.values), a.shape)).cpu() != 0
    got = st.to_dense(s).cpu()
    if got.dim() == 2 and full.dim() == 3:
        got = got.expand_as(full)
    mask = mask.expand_as(full) if mask.dim() < full.dim() else mask
    # Repeated entries each hold the full sampled value, so their sum is count x value.
    counts = st.to_dense(st.CSR(a.crow_indices, a.col_indices, torch.ones_like(a.values, dtype=torch.float64),
                                a.shape)).cpu()
    counts = counts.expand_as(full) if counts.dim() < full.dim() else counts
    assert_matches(got[mask], (full * counts)[mask], dtype)


@hs.composite
def _elementwise_problems(draw):
    shape = draw(hs.lists(hs.integers(0, 7), min_size=1, max_size=3))
    dtype = draw(hs.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    activation = draw(hs.sampled_from(list(st.ACTIVATIONS)))
    op = draw(hs.sampled_from(["add", "sub", "mul", "div"]))
    offset = draw(hs.integers(0, 3))  # misaligned storage offsets
    transposed = draw(hs.booleans())
    seed = draw(hs.integers(0, 2**31 - 1))
    return shape, dtype, activation, op, offset, transposed, seed


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=_elementwise_problems())
def test_elementwise_properties(device, problem):
    """binary ops, activations and the fused bias_act against float64 torch, over random shapes (zeros
    included), every dtype, misaligned offsets and non-contiguous inputs."""
    import torch.nn.functional as F
    from _helpers import activation_refs

    shape, dtype, activation, op, offset, transposed, seed = problem
    rng = np.random.default_rng(seed)
    numel = int(np.prod(shape))

    def make(positive=False):
        flat = randn(rng, numel + offset, dtype=dtype, device=device)
        if positive:
            flat = flat.abs() + 0.5
        t = flat[offset:].view(shape)
        return t.transpose(0, -1) if transposed and len(shape) > 1 else t

    x, y = make(), make(positive=(op == "div"))
    ref_op = {"add": lambda a, b: a + 2 * b, "sub": lambda a, b: a - 2 * b, "mul": lambda a, b: a * b,
              "div": lambda a, b: a / b}[op]
    fn = {"add": st.add, "sub": st.sub}.get(op)
    out = fn(x, y, alpha=2.0) if fn else getattr(st, op)(x, y)
    assert_matches(out, ref_op(x.double().cpu(), y.double().cpu()), dtype)
    ref_act = activation_refs(0.01)[activation]
    assert_matches(st.activation(x, activation), ref_act(x.double().cpu()), dtype)
    n = x.shape[-1]
    bias = randn(rng, n, dtype=dtype, device=device)
    scale = randn(rng, n, dtype=dtype, device=device)
    fused = st.bias_act(x, bias=bias, scale=scale, activation=activation)
    ref = ref_act(x.double().cpu() * scale.double().cpu() + bias.double().cpu())
    assert_matches(fused, ref.to(dtype).double() if dtype in (torch.float16, torch.bfloat16) else ref, dtype)


@hs.composite
def _dense_problems(draw):
    m, k, n = draw(hs.integers(0, 9)), draw(hs.integers(0, 9)), draw(hs.integers(0, 9))
    batch = draw(hs.sampled_from([None, 1, 3]))
    broadcast = draw(hs.sampled_from(["none", "a", "b"]))  # which dense_bmm operand is unbatched
    dtype = draw(hs.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    activation = draw(hs.sampled_from(list(st.ACTIVATIONS)))
    with_bias = draw(hs.booleans())
    transposed = draw(hs.booleans())
    density = draw(hs.sampled_from([0.0, 0.3, 1.0]))
    seed = draw(hs.integers(0, 2**31 - 1))
    return m, k, n, batch, broadcast, dtype, activation, with_bias, transposed, density, seed


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=_dense_problems())
def test_linear_dense_bmm_and_scale_properties(device, problem):
    """linear (every activation, with/without bias, transposed operands), dense_bmm (batched or
    broadcast operands) and scale (row and column factors, batched A) against float64 torch."""
    m, k, n, batch, broadcast, dtype, activation, with_bias, transposed, density, seed = problem
    rng = np.random.default_rng(seed)
    x = randn(rng, *((batch, m, k) if batch else (m, k)), dtype=dtype, device=device)
    w = randn(rng, k, n, dtype=dtype, device=device).t() if transposed else randn(rng, n, k, dtype=dtype, device=device)
    bias = randn(rng, n, dtype=dtype, device=device) if with_bias else None
    y = st.linear(x, w, bias, activation=activation)
    z = x.double().cpu() @ w.double().cpu().t() + (bias.double().cpu() if with_bias else 0)
    assert_matches(y, activation_refs(0.01)[activation](z), dtype, input_scale=z)

    nb = batch or 2
    a = randn(rng, *((m, k) if broadcast == "a" else (nb, m, k)), dtype=dtype, device=device)
    b = randn(rng, *((k, n) if broadcast == "b" else (nb, k, n)), dtype=dtype, device=device)
    assert_matches(st.dense_bmm(a, b), torch.matmul(a.double().cpu(), b.double().cpu()), dtype)

    kw = dict(unsorted=True, duplicates=True, empty_rows=0.2)
    A = st.from_list([random_csr(rng, m, k, density, **kw) for _ in range(nb)], shape=(m, k), device=device,
                     dtype=dtype) if batch else st.from_scipy(random_csr(rng, m, k, density, **kw), device=device,
                                                                  dtype=dtype)
    lead = (nb,) if batch else ()
    row = randn(rng, *lead, m, dtype=dtype, device=device)
    col = randn(rng, k, dtype=dtype, device=device)
    values_before = A.values.clone()
    scaled = st.scale(A, row=row, col=col)
    assert torch.equal(A.values, values_before)
    # Entry by entry (scale keeps the pattern): densifying would sum repeated columns in the low
    # precision, and a near-cancelling pair then has an error far above the dtype's relative tolerance
    # (hypothesis found one in bf16 on the H200).
    assert torch.equal(scaled.col_indices, A.col_indices)
    crows = A.crow_indices.cpu().long().reshape(-1, m + 1)
    got, want = [], []
    for bi, crow_b in enumerate(crows):
        nnz_b = int(crow_b[-1])
        rows = torch.repeat_interleave(torch.arange(m), torch.diff(crow_b))
        cols = A.col_indices.cpu().long().reshape(len(crows), -1)[bi, :nnz_b]
        vals = A.values.cpu().double().reshape(len(crows), -1)[bi, :nnz_b]
        want.append(row.cpu().double().reshape(len(crows), m)[bi, rows] * vals * col.cpu().double()[cols])
        got.append(scaled.values.reshape(len(crows), -1)[bi, :nnz_b])
    assert_matches(torch.cat(got), torch.cat(want), dtype)

