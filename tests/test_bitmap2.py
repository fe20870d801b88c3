"""The bitmap2 layout (sparsetorch/pruned/bitmap2.py, csrc/cuda/bitmap2_kernel.cuh) on the CPU: the packer
and the emulation of the CUDA kernel's per-lane decode (popcount rule, end-anchored loads, prmt selection,
mma fragment positions) rebuild the weight bit for bit, at densities 0..100%, empty rows and fully dense
tiles, bf16 and fp16, several shapes; byte counts; bad input raises ValueError naming the argument."""
import pytest
import torch

from _helpers import randn
from sparsetorch.pruned import bitmap2 as bm2

HALF = [torch.bfloat16, torch.float16]
SHAPES = [(16, 16), (48, 96), (64, 64), (128, 192), (80, 272)]
DENSITIES = [0.0, 0.05, 0.3, 0.5, 0.7, 1.0]


def _weight(rng, m, k, density, dtype, empty_rows=0.0):
    w = randn(rng, m, k, dtype=torch.float64)
    # Heavy-tailed row and column scales, as pruned LLM weights have.
    w = w * torch.from_numpy(rng.lognormal(0, 1.5, (m, 1))) * torch.from_numpy(rng.lognormal(0, 1.5, (1, k)))
    keep = torch.from_numpy(rng.random((m, k)) < density)
    w = torch.where(keep, w, torch.zeros_like(w))
    if empty_rows:
        w[torch.from_numpy(rng.random(m) < empty_rows)] = 0.0
    w = w.to(dtype)
    return w


def _same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip(rng, shape, density, dtype):
    w = _weight(rng, *shape, density, dtype)
    blob, offsets = bm2.pack(w)
    _same_bits(bm2.unpack(blob, offsets, shape, dtype), w)


@pytest.mark.parametrize("dtype", HALF)
def test_empty_rows_and_dense_tiles(rng, dtype):
    m, k = 192, 320
    w = _weight(rng, m, k, 0.5, dtype, empty_rows=0.3)
    w[16:32] = randn(rng, 16, k, dtype=dtype) + 3.0  # a fully dense strip (every tile full, no zero)
    w[:, 64:128] = 0                                  # an empty chunk
    blob, offsets = bm2.pack(w)
    _same_bits(bm2.unpack(blob, offsets, (m, k), dtype), w)


def test_mask_keeps_explicit_zeros_and_negative_zero(rng):
    w = _weight(rng, 64, 128, 0.5, torch.bfloat16)
    mask = torch.from_numpy(rng.random((64, 128)) < 0.6)
    w[~mask] = 0
    w[0, :8] = -0.0
    mask[0, :8] = True
    blob, offsets = bm2.pack(w, mask)
    got = bm2.unpack(blob, offsets, (64, 128), torch.bfloat16)
    _same_bits(got, w)
    # The stored values are exactly the masked positions.
    assert int(offsets[-1]) * 16 == blob.numel()


def test_unpack_reads_through_the_decode(rng):
    # Changing one stored value changes exactly the element the decode maps it to.
    w = _weight(rng, 64, 64, 0.5, torch.float16)
    blob, offsets = bm2.pack(w)
    b16 = blob.view(torch.int16).clone()
    b16[64 + 5] = torch.tensor(0x3C00, dtype=torch.int16)  # 6th value of group 0 := 1.0
    got = bm2.unpack(b16.view(torch.uint8), offsets, (64, 64), torch.float16)
    diff = (got.view(torch.int16) != w.view(torch.int16)).nonzero()
    assert diff.shape[0] <= 1
    # Group 0 is rows 0..15, columns 0..63; its values are in fragment order.
    pos = bm2.fragment_positions().reshape(-1)
    grp = w[:16, :64].reshape(-1)[pos]
    nz = (grp.view(torch.int16) != 0).nonzero().flatten()
    r, c = divmod(int(pos[nz[5]]), 64)
    assert got[r, c].item() == 1.0


def test_fragment_positions_are_a_permutation():
    pos = bm2.fragment_positions().reshape(-1)
    assert torch.equal(pos.sort().values, torch.arange(1024))


def test_prmt_selection_table():
    # bits (b1 b0) -> register (low half first) from va = 0x1111, vb = 0x2222.
    va, vb = torch.tensor([0x1111] * 4), torch.tensor([0x2222] * 4)
    bits = torch.arange(4)
    sel = bm2._prmt(torch.full_like(bits, bm2.K0), torch.full_like(bits, bm2.K1), bits * 0x22 + 0x10)
    reg = bm2._prmt(va, vb, sel)
    assert reg.tolist() == [0, 0x2222, 0x2222 << 16, 0x1111 | (0x2222 << 16)]


@pytest.mark.parametrize("density,per_element", [(0.5, 1.14), (0.3, 0.74), (0.1, 0.34)])
def test_bytes(rng, density, per_element):
    m, k = 512, 1024
    w = _weight(rng, m, k, density, torch.bfloat16)
    blob, offsets = bm2.pack(w)
    nbytes = blob.numel() + 4 * offsets.numel()
    assert abs(nbytes / (m * k) - per_element) < 0.02
    groups = (m // 16) * (k // 64)
    assert blob.numel() == 16 * int(offsets[-1]) and offsets.numel() == groups + 1
    assert (offsets.diff() >= 8).all()  # every group has its 128 bytes of bitmaps


def test_product_through_the_layout(rng):
    # x @ W^T through the decoded weight against float64 (what the CUDA probe checks on the device).
    w = _weight(rng, 96, 160, 0.3, torch.bfloat16)
    x = randn(rng, 5, 160, dtype=torch.bfloat16)
    blob, offsets = bm2.pack(w)
    got = x.double() @ bm2.unpack(blob, offsets, w.shape, w.dtype).double().t()
    torch.testing.assert_close(got, x.double() @ w.double().t(), rtol=0, atol=0)


@pytest.mark.parametrize("bad,match", [
    (lambda: bm2.pack(torch.zeros(20, 32, dtype=torch.bfloat16)), "weight: out_features and in_features"),
    (lambda: bm2.pack(torch.zeros(32, 24, dtype=torch.bfloat16)), "weight: out_features and in_features"),
    (lambda: bm2.pack(torch.zeros(32, 32)), "weight: expected bfloat16 or float16"),
    (lambda: bm2.pack(torch.zeros(32, dtype=torch.bfloat16)), "weight: expected a 2-D tensor"),
    (lambda: bm2.pack(torch.zeros(32, 32, dtype=torch.bfloat16), torch.ones(32, 16, dtype=torch.bool)), "mask:"),
    (lambda: bm2.pack(torch.zeros(32, 32, dtype=torch.bfloat16), torch.ones(32, 32)), "mask:"),
])
def test_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
