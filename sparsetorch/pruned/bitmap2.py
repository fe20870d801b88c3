"""The bitmap2 layout of a pruned bf16/fp16 weight (issue 48): packer, and a CPU emulation of the CUDA
kernel's decode (csrc/cuda/bitmap2_kernel.cuh), which is the layout's reference.

Torch only (no sparsetorch imports), so that a standalone probe can load this file by path.

Layout. W (m, k), m and k multiples of 16, is padded with zeros to mp = 64 ceil(m / 64) rows and
kp = 64 ceil(k / 64) columns and cut into groups of 16 rows x 64 columns. Groups are stored band-major:
``gi = (band * chunks + chunk) * 4 + sub`` (band: 64 rows, sub: its strip of 16 rows, chunk: 64 columns).
Group gi is a blob at byte ``16 * offsets[gi]`` of ``blob`` (uint8, 16-byte units; ``offsets`` int32, G + 1
entries, the last = the blob's units):

* 32 uint32 words: word ``h * 16 + t`` is half h (positions 32 h .. 32 h + 31) of the 64-bit bitmap of tile t;
* the group's nonzero values in value order: tile t = 0..15, within a tile position p = 0..63;
* zeros up to a multiple of 8 values (16 bytes).

Tile t is the A register ``r = t & 3`` of mma step ``s = t >> 2`` (mma.m16n8k16); its position
``p = 2 * lane + j`` (lane = 4 g + q; j the 16-bit half of the register) is the group's element

    row = g + 8 (r & 1),  col = 32 (s >> 1) + 8 q + 4 (s & 1) + 2 (r >> 1) + j.

The kernel's decode of tile t by lane l (h = l >> 4, i = l & 15, w = word h * 16 + t, start(t, h) = the
values of the words before w in value order, word order 2 t + h):

    y = (w << (30 - 2 i)) mod 2^32;   c = popcount(y);   e = start(t, h) + c
    va = value[e - 2];  vb = value[e - 1]            (16-bit loads; e - 2 may fall in the bitmap words)
    reg = prmt(va, vb, prmt(K0, K1, (y >> 30) * 0x22 + 0x10)),  K0 = 0x32543232, K1 = 0x54105432

i.e. bits (y >> 30) = 3: (va, vb), 1: (vb, 0), 2: (0, vb), 0: (0, 0) (low half first). :func:`unpack`
reconstructs W by running exactly that (prmt emulated byte by byte), so a round trip proves the packer and
the kernel's mapping together.

Bytes: 128 per group of 1024 elements (bitmaps) + 4 per group (offset) + 2 per nonzero + the padding
(~7 bytes per group): 1.14 / 0.74 / 0.34 bytes per element at 50 / 70 / 90% sparsity (dense: 2).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["pack", "unpack", "Bitmap2Weight", "fragment_positions", "K0", "K1"]

K0, K1 = 0x32543232, 0x54105432
_HALF = (torch.float16, torch.bfloat16)


def fragment_positions(device=None) -> torch.Tensor:
    """(16, 64) int64: the group element ``row * 64 + col`` of position p of tile t."""
    t = torch.arange(16, device=device).view(16, 1)
    p = torch.arange(64, device=device).view(1, 64)
    s, r, lane, j = t >> 2, t & 3, p >> 1, p & 1
    g, q = lane >> 2, lane & 3
    row = g + 8 * (r & 1)
    col = 32 * (s >> 1) + 8 * q + 4 * (s & 1) + 2 * (r >> 1) + j
    return row * 64 + col


def _popcount(v: torch.Tensor) -> torch.Tensor:
    """Popcount of the low 32 bits of an int64 tensor (values in [0, 2^32))."""
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) & 0xFFFFFFFF) >> 24


def _check_weight(weight, mask):
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D tensor (out_features, in_features), got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    if weight.dtype not in _HALF:
        raise ValueError(f"weight: expected bfloat16 or float16, got {weight.dtype}")
    m, k = weight.shape
    if m % 16 or k % 16 or m == 0 or k == 0:
        raise ValueError(f"weight: out_features and in_features must be positive multiples of 16, got ({m}, {k})")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
                             or tuple(mask.shape) != (m, k)):
        raise ValueError(f"mask: expected a bool tensor of shape ({m}, {k}), got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")


def pack(weight: torch.Tensor, mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(blob uint8, offsets int32) of ``weight`` (bf16/fp16, (m, k), m and k multiples of 16), keeping the
    positions where ``mask`` is true (default: the nonzeros). Torch ops on the weight's device."""
    _check_weight(weight, mask)
    dev = weight.device
    m, k = weight.shape
    mp, kp = -(-m // 64) * 64, -(-k // 64) * 64
    bands, chunks = mp // 64, kp // 64
    G = bands * chunks * 4
    if mask is None:
        mask = weight != 0
    mask = mask.to(dev)
    w16 = torch.zeros(mp, kp, dtype=torch.int16, device=dev)
    w16[:m, :k] = weight.detach().view(torch.int16)
    mk = torch.zeros(mp, kp, dtype=torch.bool, device=dev)
    mk[:m, :k] = mask
    # (bands, 4, 16, chunks, 64) -> (bands, chunks, 4, 16 * 64): groups in band-major order.
    perm = fragment_positions(dev).reshape(-1)
    wf = w16.view(bands, 4, 16, chunks, 64).permute(0, 3, 1, 2, 4).reshape(G, 1024)[:, perm]
    mf = mk.view(bands, 4, 16, chunks, 64).permute(0, 3, 1, 2, 4).reshape(G, 1024)[:, perm]
    # Words: (G, 16 tiles, 2 halves) of 32 bits, stored half-major (h * 16 + t).
    shifts = torch.arange(32, device=dev, dtype=torch.int64)
    words = torch.zeros(G, 16, 2, dtype=torch.int64, device=dev)
    mfv = mf.view(G, 16, 2, 32)
    for b in range(32):  # bit by bit: no (G, 1024) int64 temporary
        words |= mfv[..., b].to(torch.int64) << shifts[b]
    words = words.transpose(1, 2).reshape(G, 32)
    words32 = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    nnz = mf.sum(1, dtype=torch.int64)
    padded = (nnz + 7) // 8 * 8
    units = 8 + padded // 8  # 128 bytes of words + the padded values, in 16-byte units
    offsets = torch.zeros(G + 1, dtype=torch.int64, device=dev)
    torch.cumsum(units, 0, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 2**31:
        raise ValueError(f"weight: the layout needs {total} 16-byte units; int32 offsets take at most 2^31 - 1")
    blob16 = torch.zeros(total * 8, dtype=torch.int16, device=dev)
    blob32 = blob16.view(torch.int32)
    blob32[(offsets[:-1, None] * 4 + torch.arange(32, device=dev)).reshape(-1)] = words32.reshape(-1)
    vals = wf[mf]  # row-major over (group, tile, position): the value order
    if vals.numel():
        gv = torch.repeat_interleave(torch.arange(G, device=dev), nnz)
        first = torch.zeros(G, dtype=torch.int64, device=dev)
        torch.cumsum(nnz[:-1], 0, out=first[1:])
        rank = torch.arange(vals.numel(), device=dev) - first[gv]
        blob16[offsets[gv] * 8 + 64 + rank] = vals
    return blob16.view(torch.uint8), offsets.to(torch.int32)


def _prmt(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """PTX prmt.b32 (default mode) on int64 tensors holding uint32 values."""
    out = torch.zeros_like(a)
    for i in range(4):
        n = (s >> (4 * i)) & 15
        idx, sign = n & 7, (n & 8) != 0
        byte = torch.where(idx < 4, (a >> (8 * (idx & 3))) & 0xFF, (b >> (8 * (idx & 3))) & 0xFF)
        byte = torch.where(sign, torch.where((byte & 0x80) != 0, torch.full_like(byte, 0xFF), torch.zeros_like(byte)), byte)
        out |= byte << (8 * i)
    return out


def unpack(blob: torch.Tensor, offsets: torch.Tensor, shape, dtype: torch.dtype) -> torch.Tensor:
    """The dense (m, k) weight, rebuilt by emulating the kernel's per-lane decode (see the module doc) and
    its mma fragment positions: register r of step s of lane (g, q) multiplies x column
    32 (s >> 1) + 8 q + 4 (s & 1) + 2 (r >> 1) + j of the chunk and lands in row g + 8 (r & 1)."""
    m, k = int(shape[0]), int(shape[1])
    dev = blob.device
    mp, kp = -(-m // 64) * 64, -(-k // 64) * 64
    bands, chunks = mp // 64, kp // 64
    G = bands * chunks * 4
    blob16 = blob.view(torch.int16)
    blob32 = blob.view(torch.int32)
    off = offsets.to(torch.int64)[:G]
    words = blob32[off[:, None] * 4 + torch.arange(32, device=dev)].to(torch.int64) & 0xFFFFFFFF  # (G, 32) h*16+t
    w_ht = words.view(G, 2, 16)                                  # [h][t]
    cnt_vo = _popcount(w_ht.transpose(1, 2).reshape(G, 32))      # value order 2 t + h
    start_vo = torch.cumsum(cnt_vo, 1) - cnt_vo                  # exclusive scan (the warp scan)
    start_ht = start_vo.view(G, 16, 2).transpose(1, 2)           # [h][t]
    lane = torch.arange(32, device=dev)
    h, i = lane >> 4, lane & 15
    # (G, 16 tiles, 32 lanes)
    w = w_ht[:, h, :].transpose(1, 2)
    start = start_ht[:, h, :].transpose(1, 2)
    y = (w << (30 - 2 * i).view(1, 1, 32)) & 0xFFFFFFFF
    e = start + _popcount(y)
    base = off.view(G, 1, 1) * 8 + 64
    va = blob16[base + e - 2].to(torch.int64) & 0xFFFF
    vb = blob16[base + e - 1].to(torch.int64) & 0xFFFF
    sel = _prmt(torch.full_like(y, K0), torch.full_like(y, K1), (y >> 30) * 0x22 + 0x10)
    reg = _prmt(va, vb, sel)                                     # (G, t, lane)
    lo, hi = reg & 0xFFFF, reg >> 16
    # Position of each register half in the group, through the mma fragment semantics.
    t = torch.arange(16, device=dev).view(16, 1)
    s, r = t >> 2, t & 3
    g, q = (lane >> 2).view(1, 32), (lane & 3).view(1, 32)
    row = g + 8 * (r & 1)
    col0 = 32 * (s >> 1) + 8 * q + 4 * (s & 1) + 2 * (r >> 1)
    grp = torch.zeros(G, 16, 64, dtype=torch.int64, device=dev)
    grp.view(G, 1024).scatter_(1, (row * 64 + col0).reshape(1, -1).expand(G, -1), lo.reshape(G, -1))
    grp.view(G, 1024).scatter_(1, (row * 64 + col0 + 1).reshape(1, -1).expand(G, -1), hi.reshape(G, -1))
    vals16 = torch.where(grp >= 2**15, grp - 2**16, grp).to(torch.int16)
    dense = vals16.view(bands, chunks, 4, 16, 64).permute(0, 2, 3, 1, 4).reshape(mp, kp)
    return dense[:m, :k].contiguous().view(dtype)


class Bitmap2Weight:
    """A pruned weight in the bitmap2 layout: ``blob`` (uint8), ``offsets`` (int32), ``shape``, ``dtype``."""

    def __init__(self, blob: torch.Tensor, offsets: torch.Tensor, shape, dtype: torch.dtype):
        self.blob, self.offsets = blob, offsets
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = dtype

    @classmethod
    def from_dense(cls, weight: torch.Tensor, mask: Optional[torch.Tensor] = None) -> "Bitmap2Weight":
        blob, offsets = pack(weight, mask)
        return cls(blob, offsets, weight.shape, weight.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes the product streams: the blob and the offsets."""
        return self.blob.numel() + 4 * self.offsets.numel()

    def to_dense(self) -> torch.Tensor:
        return unpack(self.blob, self.offsets, self.shape, self.dtype)

    def to(self, device) -> "Bitmap2Weight":
        return Bitmap2Weight(self.blob.to(device), self.offsets.to(device), self.shape, self.dtype)
