"""The packed 2:4 decode format (sparsetorch/pruned/sparse24_decode.py, kernel csrc/cuda/sparse24_decode_kernel.cuh)
on the CPU: pack/unpack round trips (unpack emulates the kernel's per-lane mma.sp register mapping), the
metadata's validity, a Python replay of the kernel's address arithmetic and k-step loop for every (U, split)
combination against a float64 product, and the argument errors; the expansion op back to dense on every device."""
import pytest
import torch

from sparsetorch._ops import ops
from sparsetorch.pruned.sparse24_decode import (TILE_K, dense_from_pairs, expand_sparse24_decode, pack_sparse24_decode,
                                               pack_sparse24_decode_pairs, packed_ktiles, pair_nibbles,
                                               unpack_sparse24_decode)

HALF_DTYPES = [torch.bfloat16, torch.float16]


def random_24(m, k, dtype, seed=0, fill=2):
    """A random 2:4 weight; each group of 4 keeps `fill` (0..2) random positions (fill=None: 0, 1 or 2 at random)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, 1, generator=g))
    keys = torch.rand(m, k // 4, 4, generator=g)
    order = keys.argsort(-1)
    if fill is None:
        counts = torch.randint(0, 3, (m, k // 4, 1), generator=g)
    else:
        counts = torch.full((m, k // 4, 1), fill)
    keep = torch.zeros(m, k // 4, 4, dtype=torch.bool)
    keep.scatter_(-1, order, torch.arange(4).expand(m, k // 4, 4) < counts)
    return (w * keep.reshape(m, k)).to(dtype)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", [(16, 32), (48, 96), (256, 512), (32, 800), (64, 2048)])
def test_round_trip(dtype, shape):
    w = random_24(*shape, dtype, seed=shape[0] + shape[1])
    values, meta = pack_sparse24_decode(w)
    m, k = shape
    ktp = packed_ktiles(k)
    assert ktp % 8 == 0 and ktp * TILE_K >= k
    assert values.shape == (m // 16, ktp, 32, 8) and values.dtype == dtype
    assert meta.shape == (m // 16, ktp // 8, 32, 4) and meta.dtype == torch.int32
    assert torch.equal(unpack_sparse24_decode(values, meta, shape), w)
    assert torch.equal(expand_sparse24_decode(values, meta, shape), w)


def _pair_csr(w, index_dtype=torch.int32):
    """The CSR a 2:4 pruning keeps: exactly 2 positions per group of 4 (zero values where the group had fewer
    nonzeros), rows in order, columns increasing."""
    m, k = w.shape
    keys = (w != 0).float().reshape(m, k // 4, 4) * 2 + torch.arange(4, 0, -1) / 8  # nonzeros first, then low zeros
    keep = torch.zeros(m, k // 4, 4, dtype=torch.bool)
    keep.scatter_(-1, keys.topk(2, dim=-1).indices, True)
    rows, cols = keep.reshape(m, k).nonzero(as_tuple=True)
    crow = torch.arange(m + 1) * (k // 2)
    return crow.to(index_dtype), cols.to(index_dtype), w[rows, cols]


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(16, 32), (48, 96), (32, 800)])
def test_pairs_of_a_24_csr_pack_and_expand_without_the_dense_weight(shape, index_dtype):
    """A 2:4 pruning's own CSR (two stored entries per group, in order; some stored values zero) packs from its
    values as stored into the same product as the dense weight's pack, and expands to the dense weight."""
    w = random_24(*shape, torch.bfloat16, seed=7, fill=None)
    crow, col, values = _pair_csr(w, index_dtype)
    nibbles = pair_nibbles(crow, col, shape)
    assert nibbles is not None and nibbles.shape == (shape[0], shape[1] // 4)
    assert torch.equal(dense_from_pairs(values, nibbles, shape), w)
    packed_values, meta = pack_sparse24_decode_pairs(values, col, shape)
    reference = pack_sparse24_decode(w)
    assert torch.equal(meta, reference[1]) and torch.equal(packed_values, reference[0])
    assert torch.equal(unpack_sparse24_decode(packed_values, meta, shape), w)
    assert torch.equal(expand_sparse24_decode(packed_values, meta, shape), w)
    # the weight made from pairs repacks new values (CSR order) with the columns it keeps
    W = Sparse24DecodeWeight.from_pairs(values, col, shape)
    values2 = (values.float() * -2).to(values.dtype)
    W.set_values(values2)
    assert torch.equal(W.values, pack_sparse24_decode_pairs(values2, col, shape)[0])
    assert torch.equal(unpack_sparse24_decode(W.values, W.meta, shape), dense_from_pairs(values2, nibbles, shape))
    with pytest.raises(ValueError, match="values: expected"):
        W.set_values(values2[:-1])


def test_pairs_refuse_every_other_csr():
    """Unsorted or repeated columns in a group, a group of 3, a missing entry or padding slots: no pair layout."""
    w = random_24(16, 64, torch.bfloat16, seed=8)
    crow, col, values = _pair_csr(w)
    assert pair_nibbles(crow, col, w.shape) is not None
    swapped = col.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    repeated = col.clone()
    repeated[1] = repeated[0]
    moved = col.clone()
    moved[1] = (moved[1] // 4 + 1) * 4  # the pair's second entry in the next group: that group holds 3
    assert pair_nibbles(crow, swapped, w.shape) is None
    assert pair_nibbles(crow, repeated, w.shape) is None
    assert pair_nibbles(crow, moved, w.shape) is None
    shifted = crow.clone()
    shifted[1:-1] += 1  # row 0 one entry longer, the last one shorter
    assert pair_nibbles(shifted, col, w.shape) is None
    padded = torch.cat([col, torch.zeros(4, dtype=col.dtype)])
    assert pair_nibbles(crow, padded, w.shape) is None
    assert pair_nibbles(crow[:-1], col, w.shape) is None


@pytest.mark.parametrize("fill", [0, 1, None])
def test_sparser_groups_and_specials(fill):
    """Groups with 0 or 1 nonzeros, -0.0, NaN and Inf values (NaN counts as a nonzero)."""
    w = random_24(32, 128, torch.bfloat16, seed=3, fill=fill)
    w[0, 0], w[0, 1], w[0, 2], w[0, 3] = float("nan"), 0.0, float("-inf"), 0.0
    w[1, 4:8] = torch.tensor([-0.0, 0.0, 0.0, 0.0])
    values, meta = pack_sparse24_decode(w)
    for back in (unpack_sparse24_decode(values, meta, w.shape), expand_sparse24_decode(values, meta, w.shape)):
        same = (back == w) | (back.isnan() & w.isnan())
        assert bool(same.all())


def test_metadata_is_valid_and_ordered():
    """Every nibble holds two increasing positions (mma.sp::ordered_metadata), the padding tiles 0b0100."""
    w = random_24(64, 96, torch.float16, fill=None)  # 3 k-tiles: 5 tiles of padding
    _, meta = pack_sparse24_decode(w)
    words = meta.to(torch.int64) & 0xFFFFFFFF
    nibs = torch.stack([(words >> (4 * j)) & 0xF for j in range(8)], -1)
    assert bool(((nibs & 3) < (nibs >> 2)).all())
    # tiles 3..7 are padding: tile 2p + s, role r -> lane 4 g + 2 s + r, word p
    for tile in range(3, 8):
        lanes = [4 * g + 2 * (tile & 1) + r for g in range(8) for r in range(2)]
        assert bool((nibs[:, 0, lanes, tile >> 1] == 0b0100).all())


def _mma_sp_tile(a_regs, e_words, sel):
    """The dense 16 x 32 A of one mma.sp.m16n8k32 (f16/bf16) from its 32 lanes' registers, as PTX defines it:
    a_regs (32, 8) values (4 registers of 2), e_words (32,) metadata, sel the sparsity selector."""
    a = torch.zeros(16, 32, dtype=torch.float64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(8):  # element i: register i // 2, row g or g+8, compressed column 2t + (i&1) (+8)
            reg = i // 2
            row = g + 8 * (reg & 1)
            ccol = 2 * t + (i & 1) + 8 * (reg >> 1)
            chunk, slot = ccol // 2, ccol % 2
            # metadata of (row, chunk): thread 2 sel + chunk // 4 of quad g; half row // 8; nibble chunk % 4
            word = int(e_words[4 * g + 2 * sel + chunk // 4]) & 0xFFFFFFFF
            nib = (word >> (16 * (row // 8) + 4 * (chunk % 4))) & 0xF
            pos = (nib >> (2 * slot)) & 3
            a[row, 4 * chunk + pos] += float(a_regs[lane, i])
    return a


@pytest.mark.parametrize("u", [2, 4, 8])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_kernel_replay(u, splits):
    """The kernel's loop replayed in Python with its flat addresses: values at (tile * ktp + step0 * U) * 32 +
    lane + (s * U + u) * 32 (16-byte units), metadata at tile * (ktp / 8) * 128 + lane * 4 + (pair0 >> 2) * 128
    + (pair0 & 3) + (u >> 1) (words), selector u & 1; split sums added in split order."""
    m, k, n = 32, 800, 3  # 25 k-tiles -> 32 packed
    w = random_24(m, k, torch.bfloat16, seed=11, fill=None)
    values, meta = pack_sparse24_decode(w)
    ktp = packed_ktiles(k)
    flat_v = values.reshape(-1, 8)   # 16-byte units
    flat_m = meta.reshape(-1)        # words
    x = torch.randn(n, k, dtype=torch.float64)
    total_steps = ktp // u
    sps = -(-total_steps // splits)
    parts = []
    for split in range(-(-total_steps // sps)):
        step0 = split * sps
        nsteps = min(sps, total_steps - step0)
        k0 = step0 * u * TILE_K
        xs = torch.zeros(n, sps * u * TILE_K, dtype=torch.float64)  # the staged slice, zero past k
        cols = max(0, min(k - k0, xs.shape[1]))
        xs[:, :cols] = x[:, k0:k0 + cols]
        y = torch.zeros(n, m, dtype=torch.float64)
        for tile in range(m // 16):
            vbase = (tile * ktp + step0 * u) * 32
            mbase = tile * (ktp // 8) * 128
            for s in range(nsteps):
                pair0 = ((step0 + s) * u) >> 1
                for uu in range(u):
                    lanes = torch.arange(32)
                    a_regs = flat_v[vbase + (s * u + uu) * 32 + lanes]
                    e = flat_m[mbase + lanes * 4 + (pair0 >> 2) * 128 + (pair0 & 3) + (uu >> 1)]
                    a = _mma_sp_tile(a_regs, e, uu & 1)
                    kt = s * u + uu
                    y[:, tile * 16:(tile + 1) * 16] += xs[:, kt * TILE_K:(kt + 1) * TILE_K] @ a.t()
        parts.append(y)
    total = torch.zeros(n, m, dtype=torch.float64)
    for p in parts:
        total += p
    ref = x @ w.double().t()
    assert torch.allclose(total, ref, rtol=1e-12, atol=1e-9)


def test_errors():
    w = random_24(32, 64, torch.bfloat16)
    bad = w.clone()
    bad[5, 8:12] = torch.tensor([1.0, 2.0, 3.0, 0.0])
    with pytest.raises(ValueError, match=r"weight: not 2:4 sparse: row 5, columns 8..11 hold 3"):
        pack_sparse24_decode(bad)
    bad[5, 8:12] = torch.tensor([float("nan"), 2.0, 3.0, 0.0])
    with pytest.raises(ValueError, match="weight: not 2:4"):
        pack_sparse24_decode(bad)
    with pytest.raises(ValueError, match="weight: .*out_features must be a positive multiple of 16"):
        pack_sparse24_decode(torch.zeros(24, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="weight: .*in_features must be a positive multiple of 32"):
        pack_sparse24_decode(torch.zeros(32, 48, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="weight: .*2-D"):
        pack_sparse24_decode(torch.zeros(32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="weight: dtype torch.float32"):
        pack_sparse24_decode(torch.zeros(32, 64))
    with pytest.raises(ValueError, match="weight: expected a tensor"):
        pack_sparse24_decode([[0.0] * 64] * 32)
    values, meta = pack_sparse24_decode(w)
    with pytest.raises(ValueError, match="values: expected shape"):
        unpack_sparse24_decode(values[:1], meta, (32, 64))
    with pytest.raises(ValueError, match="meta: expected int32"):
        unpack_sparse24_decode(values, meta.to(torch.int64), (32, 64))
    with pytest.raises(ValueError, match="shape: expected"):
        unpack_sparse24_decode(values, meta, (32,))
    broken = meta.clone()
    broken[0, 0, 0, 0] = 0  # nibble 0b0000: two equal positions
    with pytest.raises(ValueError, match="meta: a chunk's metadata"):
        unpack_sparse24_decode(values, broken, (32, 64))


# ---------------------------------------------------------------------------------------------------------------
# The op (sparsetorch::sparse24_decode_linear) and Sparse24DecodeWeight: the CPU reference here, the CUDA kernel
# against float64 below (skipped without a GPU).

import torch.nn.functional as F  # noqa: E402

import sparsetorch as st  # noqa: E402
from sparsetorch.pruned import Sparse24DecodeWeight, sparse24_decode_linear  # noqa: E402

ops = torch.ops.sparsetorch
ACTS = ["none", "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]


def act_ref(z, name, slope=0.01):
    return {"none": lambda v: v, "relu": torch.relu, "leaky_relu": lambda v: F.leaky_relu(v, slope), "gelu": F.gelu,
            "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "silu": F.silu, "sigmoid": torch.sigmoid,
            "tanh": torch.tanh}[name](z)


def reference(x, w, bias, act, slope=0.01):
    z = x.double() @ w.double().t()
    if bias is not None:
        z = z + bias.double()
    return act_ref(z, act, slope)


def rel_err(y, ref):
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape,lead", [((16, 32), (1,)), ((48, 96), (3,)), ((64, 800), (2, 5)), ((32, 256), (17,))])
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu"])
def test_op_cpu_reference(dtype, shape, lead, act):
    m, k = shape
    w = random_24(m, k, dtype, seed=m + k, fill=None)
    W = Sparse24DecodeWeight(w)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*lead, k, generator=g).to(dtype)
    bias = torch.randn(m, generator=g).to(dtype)
    y = W(x, bias, act)
    assert y.shape == (*lead, m) and y.dtype == dtype
    assert rel_err(y, reference(x, w, bias, act)) < (1e-2 if dtype == torch.bfloat16 else 2e-3)
    # the op's float32 result, rounded once: the same as the float32 product of the dense weight
    want = act_ref(F.linear(x.float(), w.float(), bias.float()), act).to(dtype)
    assert torch.allclose(y.float(), want.float(), rtol=1e-2, atol=1e-3)


def test_op_cpu_noncontiguous_and_empty():
    w = random_24(32, 64, torch.bfloat16, seed=5)
    W = Sparse24DecodeWeight(w)
    wide = torch.randn(6, 128).to(torch.bfloat16)
    x = wide[:, ::2]  # stride 2 in the last dimension
    assert not x.is_contiguous()
    assert torch.equal(W(x), W(x.contiguous()))
    xt = torch.randn(64, 5).to(torch.bfloat16).t()  # (5, 64), column-major
    assert torch.equal(W(xt), W(xt.contiguous()))
    assert W(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 32)
    assert W(torch.empty(2, 0, 64, dtype=torch.bfloat16)).shape == (2, 0, 32)
    # non-contiguous packed arrays are accepted (copied)
    v2 = W.values.transpose(0, 1).contiguous().transpose(0, 1)
    assert not v2.is_contiguous()
    assert torch.equal(ops.sparse24_decode_linear(x, v2, W.meta, 32, 64), W(x))


def test_weight_forms_and_set_values():
    w = random_24(48, 128, torch.float16, seed=7, fill=None)
    W = Sparse24DecodeWeight.from_dense(w)
    assert W.shape == (48, 128) and W.dtype == torch.float16
    assert W.nbytes == W.values.numel() * 2 + W.meta.numel() * 4
    assert W.nbytes == 48 * 256 * 9 // 8  # 1.125 bytes per position, K = 128 padded to 8 k-tiles (256 columns)
    assert torch.equal(unpack_sparse24_decode(W.values, W.meta, W.shape), w)
    C = Sparse24DecodeWeight.from_csr(w.float().to_sparse_csr(), dtype=torch.float16)
    assert torch.equal(unpack_sparse24_decode(C.values, C.meta, C.shape), w)
    assert C.split is not None and C.nbytes > W.nbytes
    x = torch.randn(3, 128).to(torch.float16)
    assert torch.equal(C(x), W(x))
    # new values in CSR order (the split's), and a new dense weight
    csr = st.from_dense(w.float())
    C2 = Sparse24DecodeWeight.from_csr(csr, dtype=torch.float16)
    new = (csr.values * 3).to(torch.float16)
    C2.set_values(new)
    assert torch.equal(unpack_sparse24_decode(C2.values, C2.meta, C2.shape), (w.float() * 3).to(torch.float16))
    w2 = random_24(48, 128, torch.float16, seed=8)
    W.set_values(w2)
    assert torch.equal(unpack_sparse24_decode(W.values, W.meta, W.shape), w2)
    with pytest.raises(ValueError, match=r"values: expected \(\d+,\) in the CSR's order"):
        C2.set_values(new[:-1])
    with pytest.raises(ValueError, match="values: expected a dense weight of shape"):
        W.set_values(w2[:16])
    with pytest.raises(ValueError, match="values: expected torch.float16"):
        W.set_values(w2.float())
    with pytest.raises(ValueError, match="weight: not 2:4"):
        W.set_values(torch.ones(48, 128, dtype=torch.float16))


def test_weight_errors():
    dense = torch.ones(32, 64)
    with pytest.raises(ValueError, match=r"weight: not 2:4: \d+ entries are outside the 2:4 part"):
        Sparse24DecodeWeight.from_csr(dense.to_sparse_csr(), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight: .*multiple of 16"):
        Sparse24DecodeWeight.from_csr(torch.zeros(24, 64).to_sparse_csr(), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight: dtype torch.float32"):
        Sparse24DecodeWeight.from_csr(torch.zeros(32, 64).to_sparse_csr())
    W = Sparse24DecodeWeight(random_24(32, 64, torch.bfloat16))
    with pytest.raises(TypeError, match="x: expected torch.bfloat16"):
        W(torch.randn(2, 64))
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 64\)"):
        W(torch.randn(2, 32).to(torch.bfloat16))


def test_op_argument_errors():
    w = random_24(32, 64, torch.bfloat16)
    values, meta = pack_sparse24_decode(w)
    x = torch.randn(3, 64).to(torch.bfloat16)
    op = ops.sparse24_decode_linear
    with pytest.raises(TypeError, match="x: expected bfloat16 or float16"):
        op(x.float(), values, meta, 32, 64)
    with pytest.raises(TypeError, match="values: expected BFloat16"):
        op(x, values.half(), meta, 32, 64)
    with pytest.raises(TypeError, match="meta: expected int32"):
        op(x, values, meta.long(), 32, 64)
    with pytest.raises(ValueError, match="out_features: expected a positive multiple of 16"):
        op(x, values, meta, 24, 64)
    with pytest.raises(ValueError, match="in_features: expected a positive multiple of 32"):
        op(x, values, meta, 32, 48)
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 320\)"):
        op(x, values, meta, 32, 64 + 32 * 8)
    with pytest.raises(ValueError, match=r"values: expected shape \(2, 8, 32, 8\)"):
        op(x, values[:1], meta, 32, 64)
    with pytest.raises(ValueError, match=r"meta: expected shape \(2, 1, 32, 4\)"):
        op(x, values, meta[:, :, :16], 32, 64)
    with pytest.raises(ValueError, match=r"values: expected shape \(4, 8, 32, 8\)"):
        op(x, values, meta, 64, 64)
    with pytest.raises(ValueError, match="bias: expected shape"):
        op(x, values, meta, 32, 64, torch.zeros(31, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bias"):
        op(x, values, meta, 32, 64, torch.zeros(32))
    with pytest.raises(ValueError, match="activation"):
        op(x, values, meta, 32, 64, None, "swish")
    broken = meta.clone()
    broken[0, 0, 0, 0] = 0  # nibble 0b0000: two equal positions
    with pytest.raises(ValueError, match="meta: row 0, k-tile 0, chunk 0: metadata nibble 0"):
        op(x, values, broken, 32, 64)
    padded = values.clone()
    padded[0, 7, 0, 0] = 1.0  # k-tile 7 is padding past in_features = 64
    with pytest.raises(ValueError, match="values: row 0 holds a nonzero at column 224, in the padding"):
        op(x, padded, meta, 32, 64)


def test_op_fake_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    w = random_24(32, 64, torch.bfloat16)
    values, meta = pack_sparse24_decode(w)
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(2, 3, 64).to(torch.bfloat16))
        y = ops.sparse24_decode_linear(x, mode.from_tensor(values), mode.from_tensor(meta), 32, 64)
        assert y.shape == (2, 3, 32) and y.dtype == torch.bfloat16


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernel")


@needs_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", [(16, 32), (48, 96), (256, 512), (64, 800), (1024, 4096), (4096, 1024)])
def test_op_cuda_against_float64(dtype, shape):
    m, k = shape
    w = random_24(m, k, dtype, seed=m * 7 + k, fill=None).cuda()
    W = Sparse24DecodeWeight(w)
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    g = torch.Generator().manual_seed(m + k)
    for n in list(range(1, 18)) + [23, 31, 32, 33, 47, 63, 64, 65, 130]:
        x = torch.randn(n, k, generator=g).to(dtype).cuda()
        for act, with_bias in ((ACTS[n % len(ACTS)], True), ("none", False)):
            bias = torch.randn(m, generator=g).to(dtype).cuda() if with_bias else None
            y = W(x, bias, act, 0.05)
            assert y.shape == (n, m)
            err = rel_err(y, reference(x, w, bias, act, 0.05))
            assert err < tol, (n, act, with_bias, err)


@needs_cuda
def test_op_cuda_layouts_and_determinism():
    w = random_24(512, 1024, torch.bfloat16, seed=3).cuda()
    W = Sparse24DecodeWeight(w)
    wide = torch.randn(4, 5, 2048, device="cuda").to(torch.bfloat16)
    x = wide[..., ::2]  # leading batch dims, non-contiguous
    bias = torch.randn(512, device="cuda").to(torch.bfloat16)
    y = W(x, bias, "gelu_tanh")
    assert y.shape == (4, 5, 512)
    assert rel_err(y, reference(x, w, bias, "gelu_tanh")) < 1e-2
    assert torch.equal(y, W(x.contiguous(), bias, "gelu_tanh"))
    xt = torch.randn(1024, 9, device="cuda").to(torch.bfloat16).t()  # column-major
    assert torch.equal(W(xt), W(xt.contiguous()))
    first = W(x, bias)
    for _ in range(3):
        assert torch.equal(W(x, bias), first)  # split-k sums in a fixed order
    # CPU reference and CUDA kernel agree (both round one float32-accumulated sum)
    cpu = Sparse24DecodeWeight(w.cpu())(x.cpu(), bias.cpu())
    assert rel_err(first.cpu(), cpu.double()) < 1e-2


@needs_cuda
def test_op_cuda_opcheck_and_compile():
    w = random_24(64, 256, torch.float16, seed=4).cuda()
    W = Sparse24DecodeWeight(w)
    x = torch.randn(5, 256, device="cuda").to(torch.float16)
    torch.library.opcheck(ops.sparse24_decode_linear, (x, W.values, W.meta, 64, 256),
                          dict(bias=torch.randn(64, device="cuda").to(torch.float16), activation="silu"))
    f = torch.compile(lambda v: sparse24_decode_linear(v, W, None, "relu"), fullgraph=True)
    assert torch.equal(f(x), W(x, None, "relu"))


@needs_cuda
def test_layer_runs_a_pure_2to4_weight_on_the_decode_kernel():
    """SparseLinear(format="2:4") takes the decode kernel up to SPARSE24_DECODE_TOKENS tokens; "auto" takes it by
    rule and prepare() times it among the forms; new values reach it after an optimizer step (the layer trains
    through its CSR)."""
    from sparsetorch.nn.linear import SPARSE24_DECODE_TOKENS

    torch.manual_seed(6)
    lin = torch.nn.Linear(512, 256, device="cuda", dtype=torch.bfloat16)
    layer = st.nn.SparseLinear.from_dense(lin, scheme="2:4", format="2:4", activation="silu")
    if not st.cuda_features()["mma_sp"]:
        # a build without mma.sp code for this GPU (compute_75): the decode form does not apply, and
        # format="2:4" runs cuSPARSELt at every token count where cuSPARSELt runs (sm_80 GPUs), else says why
        x = torch.randn(5, 512, device="cuda", dtype=torch.bfloat16)
        if not st.cuda_features()["cusparselt"]:
            with pytest.raises(ValueError, match="cuSPARSELt"), torch.no_grad():
                layer(x)
            pytest.skip("this GPU runs neither the decode kernel nor cuSPARSELt")
        assert layer._forced(5) == "2:4"
        with torch.no_grad():
            assert rel_err(layer(x), F.silu(x.double() @ layer.to_dense().double().t() + layer.bias.double())) < 1e-2
        assert "2:4 decode" not in layer.memory()
        pytest.skip("this build's code for the GPU has no mma.sp: the decode kernel is not compiled")
    for n in (1, 5, SPARSE24_DECODE_TOKENS):
        x = torch.randn(n, 512, device="cuda", dtype=torch.bfloat16)
        assert layer._forced(n) == "2:4 decode"
        ref = F.silu(x.double() @ layer.to_dense().double().t() + layer.bias.double())
        with torch.no_grad():
            assert rel_err(layer(x), ref) < 1e-2, n
    assert "2:4 decode" in layer.memory()
    x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer(x).float().square().mean().backward()
    opt.step()
    with torch.no_grad():
        ref = F.silu(x.double() @ layer.to_dense().double().t() + layer.bias.double())
        assert rel_err(layer(x), ref) < 1e-2  # the packed weight was rebuilt from the stepped values
    auto = st.nn.SparseLinear.from_dense(lin, scheme="2:4")
    with torch.no_grad():
        auto(x[:4])
    assert auto.routes[4] == "2:4 decode"  # the rule's form for a 2:4 weight and few tokens
    auto.prepare([4])
    assert "2:4 decode" in auto.route_times[4]
    unstructured = st.nn.SparseLinear.from_dense(lin, sparsity=0.5, scheme="row", format="2:4")
    assert unstructured._forced(8) != "2:4 decode"  # not 2:4: cuSPARSELt with a residual


@needs_cuda
def test_op_cuda_broadcast_x():
    """x with stride-0 rows (an expanded token) is copied for the kernel, which takes rows >= k apart."""
    w = random_24(64, 128, torch.bfloat16, seed=3, fill=None).cuda()
    row = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    for x in (row.expand(5, 128), row.expand(2, 3, 128)):
        y = Sparse24DecodeWeight(w)(x)
        assert y.shape == (*x.shape[:-1], 64)
        assert rel_err(y, reference(x, w, None, "none")) < 1e-2


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", [(16, 32), (48, 96), (32, 800), (64, 2048)])
def test_to_dense_op_is_the_weight(device, dtype, shape):
    """sparse24_decode_to_dense (the expansion of a compact layer: one kernel on CUDA) gives back the packed weight
    exactly (bit for bit as the reference walk, unpack_sparse24_decode, places the stored values), on shapes with
    and without padding tiles, NaN and -0.0 included; non-contiguous arrays are read as their values."""
    w = random_24(*shape, dtype, seed=shape[1], fill=None)
    w[0, :4] = torch.tensor([float("nan"), 0.0, -0.0, 0.0], dtype=dtype)  # -0.0 is a zero: not kept
    values, meta = (t.to(device) for t in pack_sparse24_decode(w))
    back = expand_sparse24_decode(values, meta, shape)
    assert back.is_contiguous() and back.dtype == dtype
    ref, back = unpack_sparse24_decode(values.cpu(), meta.cpu(), shape), back.cpu()
    nan = ref.isnan()
    assert torch.equal(back.isnan(), nan) and torch.equal(back.view(torch.int16)[~nan], ref.view(torch.int16)[~nan])
    assert bool(((back == w) | (back.isnan() & w.isnan())).all())
    strided = torch.empty(values.shape + (2,), dtype=dtype, device=device)[..., 0]
    strided.copy_(values)
    assert torch.equal(expand_sparse24_decode(strided, meta, shape).cpu().view(torch.int16), back.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
def test_to_dense_op_stays_inside_chunks_and_checks_its_arguments(device):
    """Metadata the hardware does not define (idx0 >= idx1) still writes only inside its chunk; wrong shapes and
    dtypes raise naming the argument."""
    w = random_24(32, 64, torch.bfloat16, seed=5)
    values, meta = (t.to(device) for t in pack_sparse24_decode(w))
    for word in (0, -1, 0x0F0F0F0F):  # positions (0, 0), (3, 3), (3, 3) / (0, 0)
        dense = ops.sparse24_decode_to_dense(values, torch.full_like(meta, word), 32, 64)
        if device == "cuda":
            torch.cuda.synchronize()
        assert dense.shape == (32, 64)
        groups = (dense != 0).reshape(32, 16, 4).sum(-1)
        assert int(groups.max()) <= 1  # both values of a chunk on one position: the second one kept
    with pytest.raises(ValueError, match="values: expected shape"):
        ops.sparse24_decode_to_dense(values[:1], meta, 32, 64)
    with pytest.raises(ValueError, match="meta: expected shape"):
        ops.sparse24_decode_to_dense(values, meta[:, :, :16], 32, 64)
    with pytest.raises(TypeError, match="meta: expected int32"):
        ops.sparse24_decode_to_dense(values, meta.long(), 32, 64)
    with pytest.raises(TypeError, match="values: expected bfloat16 or float16"):
        ops.sparse24_decode_to_dense(values.float(), meta, 32, 64)
    with pytest.raises(ValueError, match="in_features: expected a positive multiple of 32"):
        ops.sparse24_decode_to_dense(values, meta, 32, 48)
    with pytest.raises(ValueError, match="out_features: expected a positive multiple of 16"):
        ops.sparse24_decode_to_dense(values, meta, 24, 64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(16, 32), (48, 96), (32, 800), (64, 2048)])
def test_pack_pairs_op_is_the_dense_pack(device, index_dtype, shape):
    """sparse24_decode_pack_pairs (one kernel on CUDA) packs a 2:4 pruning's own CSR into the layout the reference
    walk (unpack_sparse24_decode) reads back as the weight, and into exactly what pack_sparse24_decode makes
    from its dense weight on the CPU (padding tiles included); a pair whose stored value is a zero packs as that
    zero; non-contiguous values are read as their values."""
    w = random_24(*shape, torch.float16, seed=shape[0], fill=None)
    crow, col, values = _pair_csr(w, index_dtype)
    expected = pack_sparse24_decode(w)
    packed, meta = ops.sparse24_decode_pack_pairs(values.to(device), col.to(device), *shape)
    assert torch.equal(unpack_sparse24_decode(packed.cpu(), meta.cpu(), shape), w)
    assert torch.equal(meta.cpu(), expected[1]) and torch.equal(packed.cpu(), expected[0])
    strided = torch.empty(values.numel(), 2, dtype=values.dtype, device=device)[:, 1]
    strided.copy_(values)
    again = ops.sparse24_decode_pack_pairs(strided, col.to(device), *shape)
    assert torch.equal(again[0].cpu(), expected[0]) and torch.equal(again[1].cpu(), expected[1])


@pytest.mark.parametrize("device", DEVICES)
def test_pack_pairs_op_checks_its_arguments_and_never_leaves_the_layout(device):
    w = random_24(32, 64, torch.bfloat16, seed=9)
    crow, col, values = _pair_csr(w)
    values, col = values.to(device), col.to(device)
    wild = torch.full_like(col, -(2**31) + 5)  # columns the caller never checked: low 2 bits only are read
    packed, meta = ops.sparse24_decode_pack_pairs(values, wild, 32, 64)
    if device == "cuda":
        torch.cuda.synchronize()
    assert packed.shape == (2, 8, 32, 8) and meta.shape == (2, 1, 32, 4)
    with pytest.raises(ValueError, match="values: expected shape \\(1024,\\)"):
        ops.sparse24_decode_pack_pairs(values[:-2], col, 32, 64)
    with pytest.raises(ValueError, match="col_indices: expected shape \\(1024,\\)"):
        ops.sparse24_decode_pack_pairs(values, col[:-2], 32, 64)
    with pytest.raises(TypeError, match="col_indices: expected int32 or int64"):
        ops.sparse24_decode_pack_pairs(values, col.short(), 32, 64)
    with pytest.raises(TypeError, match="values: expected bfloat16 or float16"):
        ops.sparse24_decode_pack_pairs(values.float(), col, 32, 64)
    with pytest.raises(ValueError, match="in_features: expected a positive multiple of 32"):
        ops.sparse24_decode_pack_pairs(values, col, 32, 48)
