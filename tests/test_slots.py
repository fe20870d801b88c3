"""slot_linear (the slot layout: each value with its slot in the tensor-core fragment tile; CUDA kernel on
mma.sync, CPU reference) against float64 products, in both of the layout's variants (plain and banded),
its argument checks and corrupt layouts, and SparseLinear's "slots" form."""
import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch._ops import ops
from sparsetorch.pruned.slots import (BANDED_MIN_STRIPS_PER_SM, SlotWeight, applies, num_groups, prefers_banded, slot_linear,
                                slot_of)
from _helpers import assert_matches, linear_reference, packed_weight, random_csr, randn

HALF_DTYPES = [torch.bfloat16, torch.float16]


BANDED = pytest.mark.parametrize("banded", [False, True], ids=["plain", "banded"])


def weight(rng, m, k, density, dtype, device, banded=False, **kw):
    return packed_weight(SlotWeight, rng, m, k, density, dtype, device, options=dict(banded=banded), **kw)


reference = linear_reference


def test_slot_is_the_inverse_of_the_fragment_position():
    """slot_of agrees with the bitmap layout's positions (bit b of quadrant q feeds register q % 4 of step
    q // 4, lane b // 2, half b % 2): every (row, column) of a group gets a distinct slot, the one the
    fragment register holding it reads."""
    from sparsetorch.pruned.bitmap import _position

    q = torch.arange(16).repeat_interleave(64)
    b = torch.arange(64).repeat(16)
    rows, cols = _position(q, b)
    slots = slot_of(rows, cols)
    expected = 8 * (32 * (q >> 2) + (b >> 1)) + 2 * (q & 3) + (b & 1)
    assert torch.equal(slots, expected)
    assert torch.equal(torch.sort(slots).values, torch.arange(1024))
    # banded: lane-consecutive, word 128 step + 32 register + lane of the tile
    banded = slot_of(rows, cols, banded=True)
    assert torch.equal(banded, 256 * (q >> 2) + 64 * (q & 3) + 2 * (b >> 1) + (b & 1))
    assert torch.equal(torch.sort(banded).values, torch.arange(1024))


def test_banded_layout_choice(device):
    """The banded layout where the weight has BANDED_MIN_STRIPS_PER_SM strips per multiprocessor or more
    (CUDA), the plain one otherwise and on the CPU; a SlotWeight takes the choice unless told."""
    if device == "cpu":
        assert not prefers_banded((1 << 20, 64), device)
        return
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = 16 * BANDED_MIN_STRIPS_PER_SM * sms
    assert prefers_banded((rows, 64), device) and not prefers_banded((rows - 16, 64), device)
    crow = torch.zeros(rows + 1, dtype=torch.int64, device=device)
    col = torch.zeros(0, dtype=torch.int64, device=device)
    values = torch.zeros(0, dtype=torch.bfloat16, device=device)
    assert SlotWeight(crow, col, values, (rows, 64)).banded
    assert not SlotWeight(crow, col, values, (rows, 64), banded=False).banded
    assert not SlotWeight(crow[:17], col, values, (16, 64)).banded


@BANDED
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 8, 9, 16, 17, 33, 64, 65, 200])
def test_matches_float64(device, rng, dtype, n, banded):
    """Token counts across the kernel's tiles (8, 16, 32, 64 per warp, the banded kernel's 32 at most;
    several column tiles), out_features not a multiple of 16 (five strips: the banded layout's last band
    half empty), in_features not a multiple of 8 or 64, empty rows."""
    a, w = weight(rng, 70, 333, 0.1, dtype, device, banded, empty_rows=0.2)
    x = randn(rng, n, 333, dtype=dtype, device=device)
    assert_matches(slot_linear(x, w), reference(a, x), dtype)


@BANDED
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
def test_bias_activation_batch_dims_and_repeated_positions(device, rng, dtype, act, banded):
    a, w = weight(rng, 45, 96, 0.3, dtype, device, banded, unsorted=True, duplicates=True)
    x = randn(rng, 2, 3, 96, dtype=dtype, device=device)
    bias = randn(rng, 45, dtype=dtype, device=device)
    a.sum_duplicates()
    a.data = torch.from_numpy(a.data).to(dtype).double().numpy()  # summed in float32, rounded once
    z = reference(a, x, bias)
    out = slot_linear(x, w, bias, act or "none")
    assert out.shape == (2, 3, 45) and out.dtype == dtype
    assert_matches(out, reference(a, x, bias, act), dtype, input_scale=z)


@BANDED
@pytest.mark.parametrize("density", [0.002, 0.05, 0.5, 0.97])
@pytest.mark.parametrize("n", [1, 16, 100])
def test_densities_and_work_splits(device, rng, density, n, banded):
    """Groups from nearly empty (most groups hold nothing, a trip spans many groups) to nearly full (a
    group spans eight trips of the warp's stream); 40 rows x 4096 columns: few strips, many chunks, so
    the chunks are split among the warps of a block and among blocks (the split-k sum)."""
    a, w = weight(rng, 40, 4096, density, torch.bfloat16, device, banded)
    x = randn(rng, n, 4096, dtype=torch.bfloat16, device=device)
    assert_matches(slot_linear(x, w), reference(a, x), torch.bfloat16)


@BANDED
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams and graphs")
def test_two_streams_and_a_cuda_graph(rng, banded):
    """Calls on two streams at once and a captured CUDA graph replayed give the eager result (the split-k
    workspace comes from the caching allocator per call; 64 x 4096 at N = 16, four strips of 64 chunks,
    has its chunks split between two blocks, a split-k sum)."""
    a, w = weight(rng, 64, 4096, 0.1, torch.bfloat16, "cuda", banded)
    xs = [randn(rng, 16, 4096, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    expected = [slot_linear(x, w) for x in xs]
    assert_matches(expected[0], reference(a, xs[0]), torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    outs = []
    for _ in range(20):
        with torch.cuda.stream(side):
            outs.append((0, slot_linear(xs[0], w)))
        outs.append((1, slot_linear(xs[1], w)))
    torch.cuda.synchronize()
    for i, out in outs:
        assert torch.equal(out, expected[i])

    static_x = xs[0].clone()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        slot_linear(static_x, w)  # warm-up
        with torch.cuda.graph(graph):
            static_out = slot_linear(static_x, w)
    torch.cuda.current_stream().wait_stream(side)
    for x, e in ((xs[1], expected[1]), (xs[0], expected[0]), (xs[1], expected[1])):
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, e)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA launch")
@pytest.mark.parametrize("n", [1, 8])
def test_banded_grid_past_three_blocks_per_sm(rng, n):
    """A banded weight whose grid at N <= 8 is between 3 and 4 blocks per SM (one band of 32 rows per
    block, 2048 columns): the launch takes the banded kernel held to 4 blocks per SM (slot_kernel.cuh)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m = 32 * (3 * sms + 20)
    a, w = weight(rng, m, 2048, 0.02, torch.bfloat16, "cuda", True)
    x = randn(rng, n, 2048, dtype=torch.bfloat16, device="cuda")
    assert_matches(slot_linear(x, w), reference(a, x), torch.bfloat16)


@BANDED
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA launch grid")
def test_too_many_rows_for_the_grid_raises(banded):
    """More strips (bands) than 65535 blocks of 8 hold: a ValueError naming out_features, not a failed launch;
    the banded layout holds twice as many rows."""
    rows_ok = (32 if banded else 16) * 8 * 65535  # 65535 row blocks of 8 strips (bands)
    groups = lambda m: num_groups((m, 64), banded)  # noqa: E731
    offsets = torch.zeros(groups(rows_ok + 16) + 1, dtype=torch.int32, device="cuda")
    entries = torch.zeros(0, dtype=torch.int32, device="cuda")
    x = torch.ones(1, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="out_features = .* row blocks"):
        ops.slot_linear(x, offsets, entries, rows_ok + 16, banded=banded)
    out = ops.slot_linear(x, offsets[:groups(rows_ok) + 1], entries, rows_ok, banded=banded)
    assert out.shape == (1, rows_ok) and not out.any()


@BANDED
@pytest.mark.parametrize("n", [1, 16, 64])
def test_llm_shape(device, rng, n, banded):
    """A pruned 11008 x 4096 layer at 90% sparsity (the shape the kernel is tuned on) and its transpose's
    shape 4096 x 11008 at 70%, against float64, in either layout."""
    if device == "cpu" and (n > 1 or banded):
        pytest.skip("the CPU reference at this size is slow; plain n = 1 covers it (the small tests, banded)")
    for m, k, density in ((11008, 4096, 0.1), (4096, 11008, 0.3)):
        dense = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
        dense *= torch.from_numpy(rng.random((m, k)) < density)
        w16 = dense.to(torch.bfloat16)
        w = SlotWeight.from_csr(w16.to_sparse_csr().to(device), banded=banded)
        x = randn(rng, n, k, dtype=torch.bfloat16, device=device)
        assert_matches(slot_linear(x, w), x.double().cpu() @ w16.double().T, torch.bfloat16)


def test_empty_shapes(device):
    offsets = torch.zeros(2, dtype=torch.int32, device=device)  # 4 x 10: one group
    entries = torch.zeros(0, dtype=torch.int32, device=device)
    bias = torch.arange(4, dtype=torch.bfloat16, device=device) - 1
    # no entries: act(bias) for every token
    out = ops.slot_linear(torch.randn(3, 10, dtype=torch.bfloat16, device=device), offsets, entries, 4, bias, "relu")
    torch.testing.assert_close(out, torch.relu(bias).expand(3, 4))
    # k == 0 (no chunks: one offset), n == 0, m == 0
    one = torch.zeros(1, dtype=torch.int32, device=device)
    torch.testing.assert_close(ops.slot_linear(torch.empty(2, 0, dtype=torch.bfloat16, device=device), one, entries, 4,
                                               bias), bias.expand(2, 4))
    assert ops.slot_linear(torch.empty(0, 10, dtype=torch.bfloat16, device=device), offsets, entries, 4).shape == (0, 4)
    assert ops.slot_linear(torch.randn(3, 10, dtype=torch.bfloat16, device=device), one, entries, 0).shape == (3, 0)
    # banded: one band of two strips (the second past the weight), one chunk: three offsets
    three = torch.zeros(3, dtype=torch.int32, device=device)
    out = ops.slot_linear(torch.randn(3, 10, dtype=torch.bfloat16, device=device), three, entries, 4, bias, "relu",
                          banded=True)
    torch.testing.assert_close(out, torch.relu(bias).expand(3, 4))
    # a CSR without entries
    w = SlotWeight(torch.zeros(5, dtype=torch.int64, device=device), torch.zeros(0, dtype=torch.int64, device=device),
                   torch.zeros(0, dtype=torch.float16, device=device), (4, 100))
    assert torch.equal(slot_linear(torch.ones(2, 100, dtype=torch.float16, device=device), w),
                       torch.zeros(2, 4, dtype=torch.float16, device=device))


def test_argument_errors(device):
    offsets = torch.tensor([0, 1], dtype=torch.int32, device=device)
    entries = torch.tensor([2], dtype=torch.int32, device=device)
    x = torch.randn(2, 8, dtype=torch.bfloat16, device=device)
    with pytest.raises(TypeError, match="x: expected bfloat16 or float16"):
        ops.slot_linear(x.float(), offsets, entries, 1)
    with pytest.raises(TypeError, match="offsets: expected int32"):
        ops.slot_linear(x, offsets.long(), entries, 1)
    with pytest.raises(TypeError, match="entries: expected int32"):
        ops.slot_linear(x, offsets, entries.long(), 1)
    with pytest.raises(ValueError, match=r"offsets: expected shape \(3,\)"):
        ops.slot_linear(x, offsets, entries, 17)  # two strips: three offsets
    with pytest.raises(ValueError, match=r"offsets: expected shape \(3,\) .*whole bands.*banded layout"):
        ops.slot_linear(x, offsets, entries, 1, banded=True)  # one strip, padded to a band: three offsets
    with pytest.raises(ValueError, match="out_features"):
        ops.slot_linear(x, offsets, entries, -1)
    with pytest.raises(ValueError, match="entries: expected a 1-D"):
        ops.slot_linear(x, offsets, entries.view(1, 1), 1)
    with pytest.raises(ValueError, match="bias: expected shape"):
        ops.slot_linear(x, offsets, entries, 1, torch.zeros(3, dtype=torch.bfloat16, device=device))
    with pytest.raises(TypeError, match="bias"):
        ops.slot_linear(x, offsets, entries, 1, torch.zeros(1, dtype=torch.float16, device=device))
    crow = torch.tensor([0, 1], device=device)
    w = SlotWeight(crow, entries.long(), torch.ones(1, dtype=torch.bfloat16, device=device), (1, 8))
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 8\)"):
        slot_linear(torch.randn(2, 9, dtype=torch.bfloat16, device=device), w)
    with pytest.raises(TypeError, match="x: expected torch.bfloat16"):
        slot_linear(torch.randn(2, 8, dtype=torch.float16, device=device), w)
    with pytest.raises(ValueError, match="values: expected"):
        w.set_values(torch.ones(1, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="values: expected"):
        w.set_values(torch.ones(2, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="row pointers"):
        SlotWeight(crow, entries.long(), torch.ones(1, dtype=torch.bfloat16, device=device), (3, 8))
    assert "nonzeros" in applies((4, 8), torch.bfloat16, 2**31 - 1000)
    assert "dtype torch.float32" in applies((4, 8), torch.float32, 1)
    assert applies((4, 70000), torch.float16, 1) is None  # no 16-bit column limit (unlike CSR16)
    with pytest.raises(ValueError, match="weight: dtype"):
        SlotWeight(crow, entries.long(), torch.ones(1, device=device), (1, 8))


def test_corrupt_layout_cpu_raises():
    x = torch.randn(2, 70, dtype=torch.bfloat16)  # 3 x 70: one strip, two chunks
    good = torch.tensor([0, 1, 2], dtype=torch.int32)
    one = 0x3F80 << 16  # 1.0 at slot 0 (row 0, column 0)
    entries = torch.tensor([one, one], dtype=torch.int32)
    with pytest.raises(IndexError, match="offsets: expected to run from 0 to 2"):
        ops.slot_linear(x, torch.tensor([0, 1, 3], dtype=torch.int32), entries, 3)
    with pytest.raises(IndexError, match="non-decreasing"):  # 3 x 150: three chunks
        ops.slot_linear(torch.randn(2, 150, dtype=torch.bfloat16), torch.tensor([0, 2, 1, 2], dtype=torch.int32),
                        entries, 3)
    with pytest.raises(IndexError, match="slot 1024"):
        ops.slot_linear(x, good, torch.tensor([one, one | 1024], dtype=torch.int32), 3)
    # slot 8 * 4 * 3 = lane 12: row 3 (only 3 rows); slot 8 * 3 = lane 3: column 48 + 64 = 112 >= 70
    with pytest.raises(IndexError, match="row 3"):
        ops.slot_linear(x, good, torch.tensor([one | 96, one], dtype=torch.int32), 3)
    with pytest.raises(IndexError, match="column 112"):
        ops.slot_linear(x, good, torch.tensor([one, one | 24], dtype=torch.int32), 3)
    with pytest.raises(IndexError, match="repeats slot 0"):
        ops.slot_linear(x, torch.tensor([0, 2, 2], dtype=torch.int32), entries, 3)
    out = ops.slot_linear(x, good, entries, 3)  # the valid layout: x[:, 0] and x[:, 64] into row 0
    torch.testing.assert_close(out[:, 0], (x[:, 0].float() + x[:, 64].float()).bfloat16())
    # banded: groups (chunk 0, strip 0), (chunk 0, strip 1), (chunk 1, strip 0), (chunk 1, strip 1); strip 1
    # is the band's padding (rows 16..31 of a 3-row weight)
    banded_good = torch.tensor([0, 1, 1, 2, 2], dtype=torch.int32)
    with pytest.raises(IndexError, match="row 16"):
        ops.slot_linear(x, torch.tensor([0, 1, 2, 2, 2], dtype=torch.int32), entries, 3, banded=True)
    # banded slot 2 = lane 1 (lane-consecutive): column 16 + 64 = 80 >= 70 in chunk 1
    with pytest.raises(IndexError, match="column 80"):
        ops.slot_linear(x, banded_good, torch.tensor([one, one | 2], dtype=torch.int32), 3, banded=True)
    # banded slot 64 = register 1 of lane 0: row 8 (the plain layout's slot 64 is lane 8: row 2, column 0)
    with pytest.raises(IndexError, match="row 8"):
        ops.slot_linear(x, banded_good, torch.tensor([one | 64, one], dtype=torch.int32), 3, banded=True)
    out = ops.slot_linear(x, banded_good, entries, 3, banded=True)
    torch.testing.assert_close(out[:, 0], (x[:, 0].float() + x[:, 64].float()).bfloat16())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernel")
def test_corrupt_layout_cuda_stays_in_bounds():
    """The CUDA kernel does not read the layout on the host: out-of-range and decreasing offsets are clamped
    and the slots masked on the device (a wrong product, never a fault); the process goes on."""
    x = torch.randn(3, 200, dtype=torch.bfloat16, device="cuda")  # 40 x 200: 3 strips x 4 chunks
    bad_offsets = torch.tensor([-5, 1 << 30, 2, -1, 7, 3, 2**31 - 1, 0, 5, 6, 1, -7, 9], dtype=torch.int32,
                               device="cuda")
    bad_entries = torch.tensor([0x3F80FFFF, -1, 0x7FFFFFFF, 0x3F800400, 5, 6, 7, 8, 9], dtype=torch.int32,
                               device="cuda")
    out = ops.slot_linear(x, bad_offsets, bad_entries, 40)
    torch.cuda.synchronize()
    assert out.shape == (3, 40)
    # banded: 2 bands x 4 chunks x 2 strips, 17 offsets; at 1, 16 and 40 tokens (NT = 1, 2, 4)
    bad_banded = torch.cat([bad_offsets, bad_offsets.flip(0)[:4]])
    for n in (1, 16, 40):
        out = ops.slot_linear(torch.randn(n, 200, dtype=torch.bfloat16, device="cuda"), bad_banded, bad_entries, 40,
                              banded=True)
        torch.cuda.synchronize()
        assert out.shape == (n, 40)
    # the same GPU computes a correct product afterwards
    ok = ops.slot_linear(x, torch.tensor([0, 1] + [1] * 11, dtype=torch.int32, device="cuda"),
                         torch.tensor([0x3F800000], dtype=torch.int32, device="cuda"), 40)
    expected = torch.zeros(3, 40, dtype=torch.bfloat16, device="cuda")
    expected[:, 0] = x[:, 0]
    torch.testing.assert_close(ok, expected)


@BANDED
def test_from_csr_set_values_and_public_names(device, rng, banded):
    a = random_csr(rng, 20, 130, 0.3)
    w = st.SlotWeight.from_csr(st.from_scipy(a, device=device, dtype=torch.float16), banded=banded)
    assert w.banded == banded
    x = randn(rng, 3, 130, dtype=torch.float16, device=device)
    a.data = torch.from_numpy(a.data).half().double().numpy()
    assert_matches(st.slot_linear(x, w), reference(a, x), torch.float16)
    entries = w.entries
    new = torch.from_numpy(rng.standard_normal(a.nnz)).to(dtype=torch.float16, device=device)
    w.set_values(new)
    assert w.entries is entries
    a.data = new.double().cpu().numpy()
    assert_matches(st.slot_linear(x, w), reference(a, x), torch.float16)
    assert w.nbytes == 4 * (2 * 3 + 1 + 3 * a.nnz)
    with pytest.raises(ValueError, match="2-D"):
        st.SlotWeight.from_csr(st.from_list([a, a], device=device, dtype=torch.float16))


@pytest.mark.parametrize("banded", [False, True])
def test_a_sorted_csr_packs_as_the_general_path_does(monkeypatch, device, rng, banded):
    """A CSR with increasing columns per row (empty rows included) is packed by one sort of distinct keys:
    the same offsets, entries and refresh map as the general path (unique with repeated positions)."""
    import sparsetorch.pruned.slots as slots_module

    a = sp_random_rows(rng, 70, 200, 0.2)
    crow, col, vals = (torch.from_numpy(t).to(device) for t in (a.indptr.astype(np.int64), a.indices.astype(np.int64),
                                                                a.data.astype(np.float32)))
    vals = vals.to(torch.bfloat16)
    assert slots_module._increasing_in_rows(crow, col)
    fast = SlotWeight(crow, col, vals, a.shape, banded=banded)
    monkeypatch.setattr(slots_module, "_increasing_in_rows", lambda crow, col: False)
    general = SlotWeight(crow, col, vals, a.shape, banded=banded)
    for name in ("offsets", "entries", "_into", "_slots"):
        assert torch.equal(getattr(fast, name), getattr(general, name)), name


def test_increasing_in_rows_sees_unsorted_and_repeated_columns():
    import sparsetorch.pruned.slots as slots_module

    crow = torch.tensor([0, 2, 2, 5])
    assert slots_module._increasing_in_rows(crow, torch.tensor([1, 3, 0, 2, 9]))
    assert slots_module._increasing_in_rows(crow, torch.tensor([1, 3, 4, 5, 6]))  # row 2 starts lower: fine
    assert not slots_module._increasing_in_rows(crow, torch.tensor([3, 1, 0, 2, 9]))
    assert not slots_module._increasing_in_rows(crow, torch.tensor([1, 3, 0, 2, 2]))


def sp_random_rows(rng, m, k, density):
    """A SciPy CSR with sorted columns and a few empty rows."""
    import scipy.sparse as sp

    a = sp.random(m, k, density=density, format="csr", random_state=np.random.default_rng(rng.integers(1 << 31)))
    a = a.tolil()
    a[5] = 0
    a[m - 1] = 0
    a = a.tocsr()
    a.eliminate_zeros()
    a.sort_indices()
    return a


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", [(20, 130), (48, 64), (3, 70), (33, 257)])
@BANDED
def test_to_dense_is_the_weight(device, rng, dtype, shape, banded):
    """slot_to_dense (one kernel on CUDA) gives back the CSR's dense weight exactly, edge groups and a banded
    layout's padding strip included; an empty weight gives zeros."""
    a = random_csr(rng, *shape, 0.3)
    A = st.from_scipy(a, device=device, dtype=dtype)
    w = SlotWeight(A.crow_indices, A.col_indices, A.values, shape, banded=banded)
    expected = torch.from_numpy(a.toarray()).to(device=device, dtype=dtype)
    assert torch.equal(w.to_dense(), expected)
    assert torch.equal(ops.slot_to_dense(w.offsets, w.entries, *shape, dtype, banded), expected)
    empty = SlotWeight(torch.zeros(shape[0] + 1, dtype=torch.int64, device=device),
                       torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, dtype=dtype, device=device),
                       shape, banded=banded)
    assert torch.equal(empty.to_dense(), torch.zeros(shape, dtype=dtype, device=device))


def test_to_dense_argument_errors(device):
    offsets = torch.tensor([0, 1, 1], dtype=torch.int32, device=device)  # 3 x 70: one strip, two chunks
    entries = torch.tensor([0x3F800000], dtype=torch.int32, device=device)
    dense = ops.slot_to_dense(offsets, entries, 3, 70, torch.bfloat16)
    assert dense[0, 0] == 1 and int((dense != 0).sum()) == 1
    with pytest.raises(TypeError, match="dtype: expected bfloat16 or float16"):
        ops.slot_to_dense(offsets, entries, 3, 70, torch.float32)
    with pytest.raises(TypeError, match="offsets: expected int32"):
        ops.slot_to_dense(offsets.long(), entries, 3, 70, torch.bfloat16)
    with pytest.raises(ValueError, match="offsets: expected shape \\(3,\\)"):
        ops.slot_to_dense(offsets[:2], entries, 3, 70, torch.bfloat16)
    with pytest.raises(ValueError, match="in_features"):
        ops.slot_to_dense(offsets, entries, 3, -1, torch.bfloat16)


def test_to_dense_corrupt_layout_cpu_raises():
    good = torch.tensor([0, 1, 2], dtype=torch.int32)
    one = 0x3F80 << 16
    with pytest.raises(IndexError, match="offsets: expected to run from 0 to 2"):
        ops.slot_to_dense(torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([one, one], dtype=torch.int32), 3,
                          70, torch.bfloat16)
    with pytest.raises(IndexError, match="slot 1024"):
        ops.slot_to_dense(good, torch.tensor([one, one | 1024], dtype=torch.int32), 3, 70, torch.bfloat16)
    with pytest.raises(IndexError, match="column 112"):
        ops.slot_to_dense(good, torch.tensor([one, one | 24], dtype=torch.int32), 3, 70, torch.bfloat16)
    with pytest.raises(IndexError, match="repeats slot 0"):
        ops.slot_to_dense(torch.tensor([0, 2, 2], dtype=torch.int32), torch.tensor([one, one], dtype=torch.int32), 3,
                          70, torch.bfloat16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernel")
def test_to_dense_corrupt_layout_cuda_stays_in_bounds():
    """Wild offsets and slots: clamped and skipped on the device, never a fault; a good layout after is exact."""
    bad_offsets = torch.tensor([-5, 1 << 30, 2, -1, 7, 3, 2**31 - 1, 0, 5, 6, 1, -7, 9], dtype=torch.int32,
                               device="cuda")
    bad_entries = torch.tensor([0x3F80FFFF, -1, 0x7FFFFFFF, 0x3F800400, 5, 6, 7, 8, 9], dtype=torch.int32,
                               device="cuda")
    for banded, offsets in ((False, bad_offsets), (True, torch.cat([bad_offsets, bad_offsets.flip(0)[:4]]))):
        dense = ops.slot_to_dense(offsets, bad_entries, 40, 200, torch.bfloat16, banded)
        torch.cuda.synchronize()
        assert dense.shape == (40, 200)
    ok = ops.slot_to_dense(torch.tensor([0, 1] + [1] * 11, dtype=torch.int32, device="cuda"),
                           torch.tensor([0x3F800000], dtype=torch.int32, device="cuda"), 40, 200, torch.bfloat16)
    expected = torch.zeros(40, 200, dtype=torch.bfloat16, device="cuda")
    expected[0, 0] = 1
    assert torch.equal(ok, expected)
