"""SpmmPlan's "blocked" route (sparsetorch/pruned/blocked.py, csrc/*/spmm_blocked*): A in 8-row strips of
row pairs, float32, on the CPU (reference kernel) and CUDA. Checked against float64 SciPy / dense
products: ragged shapes (rows not a multiple of 8, columns not of 64, widths not of 4, several tiles
of rows and of columns), sparse and dense strips (every pattern of pairs), empty rows, nnz = 0,
unsorted and repeated columns, int32/int64 indices, non-contiguous B, the epilogue, substituted
values, NaN/Inf in B, autograd, errors, a corrupted layout (an error on the CPU, no fault on CUDA)."""
import numpy as np
import pytest
import torch

import sparsetorch as st
from _helpers import activation_refs, assert_matches, randn, random_csr, rounded
from conftest import CUDA_READY, INDEX_DTYPES
from sparsetorch.pruned.blocked import CHUNK_COLS, PATTERNS, STRIP_PAIRS, STRIP_ROWS, TILE_STRIPS, BlockedLayout
from sparsetorch.plan import _autotune_candidates

ops = torch.ops.sparsetorch

SHAPES = [(1, 1, 1), (7, 65, 5), (130, 200, 260), (257, 129, 64), (64, 1000, 8), (13, 64, 33)]


def _dense_ref(a, b, alpha=1.0, beta=0.0, c=None, bias=None, act=None):
    z = alpha * (a.toarray() @ b.double().cpu().numpy())
    if c is not None and beta != 0.0:
        z = z + beta * c.double().cpu().numpy()
    if bias is not None:
        z = z + bias.double().cpu().numpy()
    z = torch.from_numpy(np.asarray(z))
    return z if act is None else activation_refs(0.01)[act](z)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("density", [0.2, 0.6])
def test_blocked_matches_scipy(device, rng, shape, index_dtype, density):
    m, k, n = shape
    a = rounded(random_csr(rng, m, k, density, unsorted=True, duplicates=True, empty_rows=0.2), torch.float32)
    A = st.from_scipy(a, device=device, dtype=torch.float32, index_dtype=index_dtype)
    b = randn(rng, k, n, device=device)
    plan = st.SpmmPlan(A, backend="blocked")
    out = plan(b)
    assert_matches(out, _dense_ref(a, b), torch.float32)
    # On CUDA these shapes have fewer output tiles than SMs, so the chunks are split among thread
    # blocks and the partial products summed: in a fixed order, so calls agree bit for bit.
    assert torch.equal(out, plan(b))


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_blocked_epilogue(device, rng, act):
    m, k, n = 37, 150, 20
    a = rounded(random_csr(rng, m, k, 0.3), torch.float32)
    A = st.from_scipy(a, device=device, dtype=torch.float32)
    b, c, bias = randn(rng, k, n, device=device), randn(rng, m, n, device=device), randn(rng, n, device=device)
    plan = st.SpmmPlan(A, alpha=0.5, bias=bias, activation=act, backend="blocked")
    assert_matches(plan(b, beta=2.0, c=c), _dense_ref(a, b, 0.5, 2.0, c, bias, act), torch.float32)
    out = torch.full((m, n), 3.0, device=device)
    plan(b, beta=-1.0, out=out)
    assert_matches(out, _dense_ref(a, b, 0.5, -1.0, torch.full((m, n), 3.0), bias, act), torch.float32)


def test_blocked_empty_and_zero_sized(device, rng):
    for m, k, n, density in [(9, 70, 6, 0.0), (0, 5, 3, 0.5), (6, 0, 4, 0.5), (5, 8, 0, 0.5)]:
        a = random_csr(rng, m, k, density)
        A = st.from_scipy(a, device=device, dtype=torch.float32)
        b = randn(rng, k, n, device=device)
        out = st.SpmmPlan(A, backend="blocked")(b)
        assert out.shape == (m, n)
        assert torch.equal(out.cpu(), torch.zeros(m, n)), f"A of shape {(m, k)} with nnz {a.nnz}"


def test_blocked_noncontiguous_b_and_inputs_unchanged(device, rng):
    m, k, n = 70, 130, 36
    a = rounded(random_csr(rng, m, k, 0.25, duplicates=True), torch.float32)
    A = st.from_scipy(a, device=device, dtype=torch.float32)
    b = randn(rng, n, k, device=device).t()  # (k, n) with strides (1, k)
    saved = [t.clone() for t in (A.crow_indices, A.col_indices, A.values, b)]
    assert_matches(st.SpmmPlan(A, backend="blocked")(b), _dense_ref(a, b), torch.float32)
    for before, after in zip(saved, (A.crow_indices, A.col_indices, A.values, b)):
        assert torch.equal(before, after)


def test_blocked_layout_holds_a(rng):
    """Expanding the layout gives A back (repeated columns summed); runs are in order, each block
    stores as many pairs as its pattern says, columns lie in their chunk."""
    m, k = 133, 300
    a = random_csr(rng, m, k, 0.15, unsorted=True, duplicates=True, empty_rows=0.1)
    A = st.from_scipy(a, dtype=torch.float32)
    layout = BlockedLayout(A)
    block_ptr, pair_ptr = layout.run_ptr.long()
    cols = layout.block_col.long()
    pairs = layout.pair_values(A.values).double()
    assert torch.all(block_ptr[1:] >= block_ptr[:-1]) and int(block_ptr[-1]) == layout.blocks
    assert int(pair_ptr[-1]) == layout.pairs == pairs.shape[0]
    assert torch.all((cols >= 0) & (cols < CHUNK_COLS))
    chunks = -(-k // CHUNK_COLS)
    dense = torch.zeros(-(-m // STRIP_ROWS) * STRIP_ROWS, k, dtype=torch.float64)
    for run in range(block_ptr.numel() - 1):
        rest, pattern = divmod(run, PATTERNS)
        rest, strip_in_tile = divmod(rest, TILE_STRIPS)
        tile, chunk = divmod(rest, chunks)
        strip = tile * TILE_STRIPS + strip_in_tile
        stored = [j for j in range(STRIP_PAIRS) if pattern >> j & 1]
        assert int(pair_ptr[run + 1] - pair_ptr[run]) == len(stored) * int(block_ptr[run + 1] - block_ptr[run])
        pair = int(pair_ptr[run])
        for e in range(int(block_ptr[run]), int(block_ptr[run + 1])):
            for j in stored:
                row = strip * STRIP_ROWS + 2 * j
                dense[row:row + 2, chunk * CHUNK_COLS + int(cols[e])] += pairs[pair]
                pair += 1
    torch.testing.assert_close(dense[:m], torch.from_numpy(rounded(a, torch.float32).toarray()), rtol=1e-6, atol=1e-6)
    assert 0 < layout.fill <= 1


def test_blocked_substituted_values(device, rng):
    a = random_csr(rng, 50, 90, 0.3)
    A = st.from_scipy(a, device=device, dtype=torch.float32)
    plan = st.SpmmPlan(A, backend="blocked")
    b = randn(rng, 90, 12, device=device)
    plan(b)  # block values of A's own values cached
    new = randn(rng, *A.values.shape, device=device)
    a2 = a.copy()
    a2.data = new.double().cpu().numpy()
    assert_matches(plan(b, values=new), _dense_ref(a2, b), torch.float32)
    assert_matches(plan(b), _dense_ref(rounded(a, torch.float32), b), torch.float32)


def test_blocked_nonfinite_b_stays_sparse(device, rng):
    """A block multiplies its zeros; NaN/Inf in B must still reach only the rows with an entry there."""
    m, k, n = 40, 70, 16
    a = rounded(random_csr(rng, m, k, 0.1, empty_rows=0.2), torch.float32)
    A = st.from_scipy(a, device=device, dtype=torch.float32)
    b = randn(rng, k, n, device=device)
    b[3, 5] = float("nan")
    b[7, :] = float("inf")
    b[11, 2] = -float("inf")
    ref = st.spmm(A.to(device="cpu", dtype=torch.float64), b.double().cpu())
    assert not torch.isnan(ref).all()
    assert_matches(st.SpmmPlan(A, backend="blocked")(b), ref, torch.float32)


def test_blocked_autograd(device, rng):
    m, k, n = 21, 80, 10
    a = rounded(random_csr(rng, m, k, 0.3), torch.float32)
    A = st.from_scipy(a, device=device, dtype=torch.float32)
    values = A.values.clone().requires_grad_(True)
    b = randn(rng, k, n, device=device).requires_grad_(True)
    bias = randn(rng, n, device=device).requires_grad_(True)
    plan = st.SpmmPlan(A, alpha=1.5, bias=bias, activation="gelu", backend="blocked")
    grad = randn(rng, m, n, device=device)
    (plan(b, values=values) * grad).sum().backward()

    dense = torch.zeros(m, k, dtype=torch.float64, device=device)
    rows = torch.repeat_interleave(torch.arange(m, device=device), torch.diff(A.crow_indices.long()))
    v64 = values.detach().double().requires_grad_(True)
    b64, bias64 = b.detach().double().requires_grad_(True), bias.detach().double().requires_grad_(True)
    dense = dense.index_put((rows, A.col_indices.long()), v64, accumulate=True)
    ref = torch.nn.functional.gelu(1.5 * dense @ b64 + bias64)
    (ref * grad.double()).sum().backward()
    for got, want in ((values.grad, v64.grad), (b.grad, b64.grad), (bias.grad, bias64.grad)):
        assert_matches(got, want, torch.float32)


def test_blocked_opcheck(device, rng):
    a = random_csr(rng, 10, 70, 0.3)
    A = st.from_scipy(a, device=device, dtype=torch.float32)
    layout = BlockedLayout(A)
    args = (A.crow_indices, A.col_indices, A.values.clone().requires_grad_(True), layout.run_ptr, layout.block_col,
            layout.pair_values(A.values), randn(rng, 70, 8, device=device).requires_grad_(True))
    torch.library.opcheck(ops.spmm_blocked, args)


def test_blocked_errors(device, rng):
    a = random_csr(rng, 8, 16, 0.5)
    with pytest.raises(ValueError, match="backend 'blocked'"):
        st.SpmmPlan(st.from_scipy(a, device=device, dtype=torch.float64), backend="blocked")
    with pytest.raises(ValueError, match="backend 'blocked'"):
        st.SpmmPlan(st.from_list([a, a], device=device, dtype=torch.float32), backend="blocked")
    plan = st.SpmmPlan(st.from_scipy(a, device=device, dtype=torch.float32), backend="blocked")
    with pytest.raises(ValueError, match="2-D B"):
        plan(randn(rng, 2, 16, 3, device=device))
    with pytest.raises(TypeError, match="same dtype"):
        plan(randn(rng, 16, 3, device=device).double())
    A = st.from_scipy(a, device=device, dtype=torch.float32)
    layout = BlockedLayout(A)
    b = randn(rng, 16, 3, device=device)
    pairs = layout.pair_values(A.values)
    with pytest.raises(ValueError, match="run_ptr"):
        ops.spmm_blocked(A.crow_indices, A.col_indices, A.values, layout.run_ptr[:, :-1], layout.block_col, pairs, b)
    with pytest.raises(ValueError, match="run_ptr"):
        ops.spmm_blocked(A.crow_indices, A.col_indices, A.values, layout.run_ptr[0], layout.block_col, pairs, b)
    with pytest.raises(TypeError, match="run_ptr"):
        ops.spmm_blocked(A.crow_indices, A.col_indices, A.values, layout.run_ptr.long(), layout.block_col, pairs, b)
    with pytest.raises(ValueError, match="pair_values"):
        ops.spmm_blocked(A.crow_indices, A.col_indices, A.values, layout.run_ptr, layout.block_col, pairs[:, :1], b)
    with pytest.raises(TypeError, match="pair_values"):
        ops.spmm_blocked(A.crow_indices, A.col_indices, A.values, layout.run_ptr, layout.block_col, pairs.double(), b)


def test_blocked_corrupt_layout(device, rng):
    """The CPU kernel checks the layout's contents (IndexError); the CUDA kernel clamps what it reads
    to the arrays and its shared-memory stages, so a corrupted layout gives a wrong product, never a
    fault (the process survives and later work runs)."""
    m, k, n = 300, 200, 40
    A = st.from_scipy(random_csr(rng, m, k, 0.3), device=device, dtype=torch.float32)
    layout = BlockedLayout(A)
    pairs, b = layout.pair_values(A.values), randn(rng, k, n, device=device)
    g = torch.Generator(device="cpu").manual_seed(0)
    corrupt = [
        (torch.randint(-2**31, 2**31 - 1, layout.run_ptr.shape, generator=g, dtype=torch.int64).int(), layout.block_col),
        (layout.run_ptr.flip(1).contiguous(), layout.block_col),
        (layout.run_ptr * 7, layout.block_col),
        (layout.run_ptr, layout.block_col + 1000),
        (layout.run_ptr, -layout.block_col - 1),
    ]
    for run_ptr, block_col in corrupt:
        run_ptr, block_col = run_ptr.to(device), block_col.to(device)
        if device == "cpu":
            with pytest.raises(IndexError):
                ops.spmm_blocked(A.crow_indices, A.col_indices, A.values, run_ptr, block_col, pairs, b)
        else:
            ops.spmm_blocked(A.crow_indices, A.col_indices, A.values, run_ptr, block_col, pairs, b)
            torch.cuda.synchronize()
    # a misaligned (4-byte offset) pair_values is copied, not read 8 bytes at a time from a bad address
    shifted = torch.empty(pairs.numel() + 1, device=device)[1:].view(-1, 2)
    shifted.copy_(pairs)
    out = ops.spmm_blocked(A.crow_indices, A.col_indices, A.values, layout.run_ptr, layout.block_col, shifted, b)
    assert_matches(out, _dense_ref(rounded(A.to_scipy(), torch.float32), b), torch.float32)


@pytest.mark.skipif(not CUDA_READY, reason="needs a CUDA device and a CUDA build of sparsetorch")
def test_autotune_times_blocked_on_dense_ish_float32():
    rng = np.random.default_rng(7)
    a = random_csr(rng, 256, 512, 0.2)
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    assert "blocked" in _autotune_candidates(A, 256, 2)
    assert "blocked" not in _autotune_candidates(A, 256, 3)
    assert "blocked" not in _autotune_candidates(A.to(dtype=torch.float64), 256, 2)
    plan = st.SpmmPlan(A)
    b = randn(rng, 512, 256, device="cuda")
    assert_matches(plan(b), _dense_ref(rounded(a, torch.float32), b), torch.float32)
    assert set(plan.routes.values()) <= set(_autotune_candidates(A, 256, 2))
