"""The packed 2:4 decode format (sparsetorch/pruned/sparse24_decode.py, kernel csrc/cuda/sparse24_decode_kernel.cuh)
on the CPU: pack/unpack round trips (unpack emulates the kernel's per-lane mma.sp register mapping), the
metadata's validity, a Python replay of the kernel's address arithmetic and k-step loop for every (U, split)
combination against a float64 product, and the argument errors."""
import pytest
import torch

from sparsetorch.pruned.sparse24_decode import (META_LAYOUTS, TILE_K, pack_sparse24_decode, packed_ktiles,
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
@pytest.mark.parametrize("layout", META_LAYOUTS)
def test_round_trip(dtype, shape, layout):
    w = random_24(*shape, dtype, seed=shape[0] + shape[1])
    values, meta = pack_sparse24_decode(w, layout)
    m, k = shape
    ktp = packed_ktiles(k)
    assert ktp % 8 == 0 and ktp * TILE_K >= k
    assert values.shape == (m // 16, ktp, 32, 8) and values.dtype == dtype
    assert meta.shape == (m // 16, ktp // 8, 32, 4) and meta.dtype == torch.int32
    assert torch.equal(unpack_sparse24_decode(values, meta, shape, layout), w)


@pytest.mark.parametrize("fill", [0, 1, None])
def test_sparser_groups_and_specials(fill):
    """Groups with 0 or 1 nonzeros, -0.0, NaN and Inf values (NaN counts as a nonzero)."""
    w = random_24(32, 128, torch.bfloat16, seed=3, fill=fill)
    w[0, 0], w[0, 1], w[0, 2], w[0, 3] = float("nan"), 0.0, float("-inf"), 0.0
    w[1, 4:8] = torch.tensor([-0.0, 0.0, 0.0, 0.0])
    values, meta = pack_sparse24_decode(w)
    back = unpack_sparse24_decode(values, meta, w.shape)
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
    with pytest.raises(ValueError, match="meta_layout"):
        pack_sparse24_decode(w, "other")
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
