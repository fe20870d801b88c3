"""The packed 2:4 format of the decode kernel (csrc/cuda/sparse24_decode_kernel.cuh): a weight W (M x K) pruned
2:4 (at most 2 nonzeros in every 4 consecutive columns of a row), stored as the per-lane registers of the
``mma.sp.m16n8k32`` A operand and metadata operand, so the kernel loads them with coalesced 16-byte loads
and decodes nothing.

Layout (PTX ISA, "Matrix multiply-accumulate operation using mma.sp instruction with sparse matrix A": sparse
matrix storage, and the m16n8k32 .f16/.bf16 fragments; details in the kernel header). ``lane = 4 g + t``.
A 16 x 32 tile keeps two values per 4-column chunk c (0..7); its compressed 16 x 16 matrix has chunk c at
compressed columns 2c, 2c + 1.

- ``values`` (M/16, KTP, 32, 8), the weight's dtype: lane's 4 registers of tile (row tile, k-tile) = (row g,
  chunk t), (row g+8, chunk t), (row g, chunk t+4), (row g+8, chunk t+4), two values each (compressed
  columns 2c, 2c+1).
- ``meta`` (M/16, KTP/8, 32, 4), int32: word w of a lane in block b is for the tile pair p = 4 b + w: the
  lane's tile is 2p + (t >> 1) (even tiles run with sparsity selector 0, whose metadata threads are t = 0, 1;
  odd tiles with selector 1: t = 2, 3) and its role is r = t & 1. Bits 15:0 = row g, chunks 4r .. 4r+3;
  bits 31:16 = row g+8, the same chunks; chunk 4r + j in bits 4j+3:4j as idx0 | idx1 << 2 (positions of the
  two kept values in the chunk, idx0 < idx1).

KTP is K / 32 rounded up to a multiple of 8; tiles past K hold zero values and the metadata nibble 0b0100.
Bytes per weight position: (16 + 2) / 16 / 2 * 2 = 1.125 for bf16/fp16 (0.5 values + 1/16 metadata per
position, at K a multiple of 256), against 2 dense.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from sparsetorch._ops import ops
from sparsetorch.pruned.packed import PackedWeight, csr_parts
from sparsetorch.pruned.sparse24 import Sparse24Split, check_2to4

__all__ = ["pack_sparse24_decode", "unpack_sparse24_decode", "expand_sparse24_decode", "decode_applies", "packed_ktiles", "TILE_K", "DTYPES",
           "Sparse24DecodeWeight", "sparse24_decode_linear", "DECODE_MAX_TOKENS"]

# Tokens up to which SparseLinear times the form against dense (H100, bf16, 14336 x 4096 and 4096 x 14336,
# 2026-11-27: 1.45-1.67x dense at N <= 16, 0.78-1.04x at 32; docs/formats.md). The op itself takes any N.
DECODE_MAX_TOKENS = 32

TILE_K = 32  # original columns per mma.sp k-step
TILE_PAD = 8  # k-tiles per metadata block: packed k-tiles are padded to a multiple
DTYPES = (torch.bfloat16, torch.float16)


def _nibble_of_mask() -> torch.Tensor:
    """For each 4-bit mask of a chunk's nonzeros: the metadata nibble idx0 | idx1 << 2 of the two positions
    kept (the nonzeros first, then the lowest zero positions; idx0 < idx1), or _NOT_24 for 3-4 nonzeros."""
    out = []
    for mask in range(16):
        chosen = [p for p in range(4) if mask >> p & 1]
        if len(chosen) > 2:
            out.append(_NOT_24)
            continue
        chosen += [p for p in range(4) if p not in chosen][:2 - len(chosen)]
        i0, i1 = sorted(chosen)
        out.append(i0 | i1 << 2)
    return torch.tensor(out, dtype=torch.uint8)


_NOT_24 = 0xFF
_NIBBLE_OF_MASK = _nibble_of_mask()


def packed_ktiles(in_features: int) -> int:
    """Packed k-tiles of a weight with ``in_features`` columns: K / 32 rounded up to a multiple of 8."""
    tiles = in_features // TILE_K
    return -(-tiles // TILE_PAD) * TILE_PAD


def decode_applies(shape, dtype: torch.dtype):
    """None when a weight of this shape and dtype can be packed, else why not."""
    if dtype not in DTYPES:
        return f"dtype {dtype}: the 2:4 decode kernel takes bfloat16 or float16"
    if len(shape) != 2:
        return f"expected a 2-D (out_features, in_features) weight, got shape {tuple(shape)}"
    out_f, in_f = int(shape[0]), int(shape[1])
    if out_f <= 0 or out_f % 16:
        return f"out_features must be a positive multiple of 16, got {out_f}"
    if in_f <= 0 or in_f % TILE_K:
        return f"in_features must be a positive multiple of {TILE_K}, got {in_f}"
    return None


def _check_weight(weight: torch.Tensor) -> None:
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight: expected a tensor, got {type(weight).__name__}")
    reason = decode_applies(tuple(weight.shape), weight.dtype)
    if reason is not None:
        raise ValueError(f"weight: {reason}")


def pack_sparse24_decode(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values, meta) of a 2:4 weight (out_features x in_features, bfloat16/float16) in the decode kernel's
    layout. Raises ValueError naming ``weight`` if it is not 2:4 (a group of 4 consecutive columns of a row
    with more than 2 nonzeros; NaN counts as nonzero) or its shape/dtype does not fit (out_features a
    multiple of 16, in_features a multiple of 32). Runs on the weight's device: each chunk's two kept values
    and columns by selects, then the pair CSR's pack (``sparse24_decode_pack_pairs``, one kernel on CUDA)."""
    _check_weight(weight)
    w = weight.detach()
    m, k = w.shape
    dev = w.device
    groups = w.reshape(m, k // 4, 4)
    nz = (groups != 0).to(torch.uint8)  # NaN counts as nonzero
    code = (nz * torch.tensor([1, 2, 4, 8], dtype=torch.uint8, device=dev)).sum(-1, dtype=torch.uint8)
    nib = _NIBBLE_OF_MASK.to(dev).index_select(0, code.flatten().to(torch.int32)).view(m, k // 4)
    if bool((nib == _NOT_24).any()):
        check_2to4(w)  # raises, naming the first such group
    # The two kept positions of each chunk (idx0 < idx1): selects on the nibble, no sort or int64 index.
    idx0, idx1 = nib & 3, nib >> 2  # idx0 in 0..2, idx1 in 1..3
    g0, g1, g2, g3 = groups.unbind(-1)
    kept = torch.stack([torch.where(idx0 == 0, g0, torch.where(idx0 == 1, g1, g2)),
                        torch.where(idx1 == 3, g3, torch.where(idx1 == 2, g2, g1))], dim=-1)  # (m, k/4, 2)
    # the pair CSR's columns: the kernel reads only their low 2 bits (the position inside the chunk)
    col = torch.stack([idx0, idx1], dim=-1).to(torch.int32)
    return tuple(ops.sparse24_decode_pack_pairs(kept.reshape(-1), col.reshape(-1), m, k))


def is_pair_layout(crow: torch.Tensor, col: torch.Tensor, shape) -> bool:
    """Whether a CSR stores exactly two entries in every group of 4 consecutive columns, in increasing column
    order (a 2:4 pruning's own CSR: its values, in storage order, are then the kept values chunk by chunk).
    One pass over the columns, one device-to-host read."""
    m, k = int(shape[0]), int(shape[1])
    if k % 4 or col.dim() != 1 or crow.dim() != 1 or col.numel() != m * k // 2 or crow.numel() != m + 1:
        return False
    first, second = col.view(m, k // 4, 2).unbind(-1)
    group = torch.arange(k // 4, device=col.device, dtype=col.dtype)
    rows = crow.long() == torch.arange(m + 1, device=crow.device) * (k // 2)
    pairs = ((first >> 2) == group) & ((second >> 2) == group) & (first < second)
    return bool(rows.all() & pairs.all())


def nibbles_of_pairs(col: torch.Tensor, shape) -> torch.Tensor:
    """The metadata nibbles (out, in / 4; uint8) of a CSR in the pair layout (:func:`is_pair_layout`, which
    the caller has checked): no pass but this one, no device-to-host read."""
    m, k = int(shape[0]), int(shape[1])
    first, second = col.view(m, k // 4, 2).unbind(-1)
    return ((first & 3) | ((second & 3) << 2)).to(torch.uint8)


def pair_nibbles(crow: torch.Tensor, col: torch.Tensor, shape) -> Optional[torch.Tensor]:
    """:func:`nibbles_of_pairs` of a CSR in the pair layout, None for any other CSR."""
    return nibbles_of_pairs(col, shape) if is_pair_layout(crow, col, shape) else None


def pack_sparse24_decode_pairs(values: torch.Tensor, col: torch.Tensor, shape) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values, meta) in the decode kernel's layout from a CSR in the pair layout (:func:`is_pair_layout`, which
    the caller has checked): its values and columns in storage order, one kernel (``sparse24_decode_pack_pairs``),
    no dense weight to read and no device sync."""
    m, k = int(shape[0]), int(shape[1])
    reason = decode_applies((m, k), values.dtype)
    if reason is not None:
        raise ValueError(f"weight: {reason}")
    return tuple(ops.sparse24_decode_pack_pairs(values.detach(), col, m, k))


def dense_from_pairs(values: torch.Tensor, nibbles: torch.Tensor, shape) -> torch.Tensor:
    """The dense weight (shape) of a pair-structured CSR (:func:`pair_nibbles`): each chunk of 4 positions made
    from its two kept values by two selects on its nibble idx0 | idx1 << 2, no scatter and no index per entry."""
    m, k = int(shape[0]), int(shape[1])
    kept, nib = values.detach().reshape(m, k // 4, 2), nibbles.view(m, k // 4, 1)
    positions = torch.arange(4, device=kept.device, dtype=torch.uint8)
    second = torch.where((nib >> 2) == positions, kept[..., 1:], torch.zeros((), dtype=kept.dtype, device=kept.device))
    return torch.where((nib & 3) == positions, kept[..., :1], second).view(m, k)


def unpack_sparse24_decode(values: torch.Tensor, meta: torch.Tensor, shape) -> torch.Tensor:
    """The dense weight (shape) that the decode kernel multiplies, reconstructed by reading the packed arrays
    the way the kernel's lanes do and placing each value where mma.sp puts it (the PTX register mapping):
    for each lane and register, its row and compressed column; for the chunk, the metadata word of the
    thread that the tile's sparsity selector names. Raises ValueError on shapes that do not match and on
    metadata the hardware does not define (idx0 >= idx1)."""
    if len(tuple(shape)) != 2:
        raise ValueError(f"shape: expected (out_features, in_features), got {tuple(shape)}")
    m, k = int(shape[0]), int(shape[1])
    reason = decode_applies((m, k), values.dtype)
    if reason is not None:
        raise ValueError(f"values/shape: {reason}")
    r16, ktp = m // 16, packed_ktiles(k)
    if tuple(values.shape) != (r16, ktp, 32, 8):
        raise ValueError(f"values: expected shape {(r16, ktp, 32, 8)} for a {m} x {k} weight, got {tuple(values.shape)}")
    if tuple(meta.shape) != (r16, ktp // 8, 32, 4) or meta.dtype != torch.int32:
        raise ValueError(f"meta: expected int32 of shape {(r16, ktp // 8, 32, 4)} for a {m} x {k} weight, got "
                         f"{meta.dtype} {tuple(meta.shape)}")
    dev = values.device
    dense = torch.zeros(r16, 16, ktp * TILE_K, dtype=values.dtype, device=dev)
    mw = meta.to(torch.int64) & 0xFFFFFFFF  # (R, B, lane, w)
    tiles = torch.arange(ktp, device=dev)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for reg in range(4):
            row = g + 8 * (reg & 1)          # A fragment: regs 1, 3 are row g + 8
            chunk = t + 4 * (reg >> 1)       # regs 2, 3 are compressed columns 2t + 8, 2t + 9 (chunk t + 4)
            h = reg & 1
            # Metadata of (row, chunk) for every tile: the selector of tile kt is kt & 1; its threads are
            # t' = 2 (kt & 1) + role in quad g; the word for pair kt >> 1 sits in block (kt >> 3), word (kt >> 1) & 3.
            role, shift = chunk // 4, 4 * (chunk % 4) + 16 * h
            lane_m = 4 * g + 2 * (tiles & 1) + role  # (KTP,)
            word = mw[:, tiles >> 3, lane_m, (tiles >> 1) & 3]  # (R, KTP)
            nib = (word >> shift) & 0xF
            idx0, idx1 = nib & 3, nib >> 2
            if bool((idx0 >= idx1).any()):
                raise ValueError("meta: a chunk's metadata is not two increasing positions (undefined for mma.sp)")
            for v, idx in ((0, idx0), (1, idx1)):
                col = tiles * TILE_K + 4 * chunk + idx  # (R, KTP)
                val = values[:, :, lane, 2 * reg + v]  # element 2 reg + v: the register's low / high half
                dense[:, row].scatter_(1, col, val)
    dense = dense.reshape(m, ktp * TILE_K)
    if bool((dense[:, k:] != 0).any()):
        raise ValueError("values: the padding past in_features holds nonzeros")
    return dense[:, :k].contiguous()


def expand_sparse24_decode(values: torch.Tensor, meta: torch.Tensor, shape) -> torch.Tensor:
    """The dense weight (shape) of packed (values, meta), as pack_sparse24_decode's inverse: one kernel
    (``sparse24_decode_to_dense``: a thread per chunk of 4 columns, its two values placed by its nibble), no
    device sync (usable inside CUDA graph capture). Unlike unpack_sparse24_decode it checks nothing but the
    arrays' shapes and dtypes: for a layout already checked (a layer's own, or one loaded through from_packed)."""
    return ops.sparse24_decode_to_dense(values, meta, int(shape[0]), int(shape[1]))


class Sparse24DecodeWeight:
    """A 2:4-pruned weight W (out_features, in_features; bfloat16/float16; out_features % 16 == 0, in_features %
    32 == 0) packed for :func:`sparse24_decode_linear` (the mma.sp decode kernel on CUDA, a float32 reference on
    the CPU): 1.125 bytes per position against dense's 2.

    Made from a dense 2:4 weight (the constructor, :meth:`from_dense`), from a :class:`Sparse24Split` of a CSR
    pattern and its values (:meth:`from_split`: the split must have no residual) or from anything
    :func:`sparsetorch.as_csr` takes (:meth:`from_csr`). Holds ``values`` and ``meta`` (pack_sparse24_decode) and,
    when made from a split, the split (for :meth:`set_values` in CSR order)."""

    def __init__(self, weight: torch.Tensor):
        _check_weight(weight)
        self.shape = (int(weight.shape[0]), int(weight.shape[1]))
        self.dtype, self.device = weight.dtype, weight.device
        self.split = self.pair_col = None
        with torch.no_grad():
            self.values, self.meta = pack_sparse24_decode(weight)

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> "Sparse24DecodeWeight":
        return cls(weight)

    @classmethod
    def from_pairs(cls, values: torch.Tensor, col: torch.Tensor, shape) -> "Sparse24DecodeWeight":
        """From a CSR in the pair layout (:func:`is_pair_layout`): its values and columns (no dense weight, no
        split). The columns are kept (a reference, not a copy): :meth:`set_values` repacks new values with them."""
        w = cls.__new__(cls)
        w.shape, w.dtype, w.device, w.split = (int(shape[0]), int(shape[1])), values.dtype, values.device, None
        w.pair_col = col
        with torch.no_grad():
            w.values, w.meta = pack_sparse24_decode_pairs(values, col, shape)
        return w

    @classmethod
    def from_split(cls, split, values: torch.Tensor) -> "Sparse24DecodeWeight":
        """From a :class:`sparsetorch.pruned.Sparse24Split` and the CSR's values (CSR order). ValueError naming
        ``weight`` when the pattern is not 2:4 (the split has a residual: the decode form holds none)."""
        if split.residual_nnz:
            raise ValueError(f"weight: not 2:4: {split.residual_nnz} entries are outside the 2:4 part (groups of 4 "
                             "consecutive columns holding more than 2 entries); the 2:4 decode form has no residual")
        with torch.no_grad():
            w = cls(split.dense24(values.detach()))
        w.split = split
        return w

    @classmethod
    def from_packed(cls, values: torch.Tensor, meta: torch.Tensor, shape) -> "Sparse24DecodeWeight":
        """From packed arrays (a compact layer's state_dict), checked first: shapes and dtypes, metadata the
        hardware defines (two increasing positions per chunk) and zero values in the padding past
        in_features. ValueError naming the array otherwise (one pass and one device-to-host read)."""
        m, k = int(shape[0]), int(shape[1])
        reason = decode_applies((m, k), getattr(values, "dtype", None))
        if reason is not None:
            raise ValueError(f"values: {reason}")
        r16, ktp = m // 16, packed_ktiles(k)
        if tuple(values.shape) != (r16, ktp, 32, 8):
            raise ValueError(f"values: expected shape {(r16, ktp, 32, 8)} for a {m} x {k} weight, got "
                             f"{tuple(values.shape)}")
        if not isinstance(meta, torch.Tensor) or meta.dtype != torch.int32 or tuple(meta.shape) != (r16, ktp // 8, 32, 4):
            raise ValueError(f"meta: expected int32 of shape {(r16, ktp // 8, 32, 4)} for a {m} x {k} weight, got "
                             f"{getattr(meta, 'dtype', type(meta).__name__)} {tuple(getattr(meta, 'shape', ()))}")
        if meta.device != values.device:
            raise ValueError(f"meta: expected device {values.device} (values'), got {meta.device}")
        words = meta.to(torch.int64) & 0xFFFFFFFF
        nibs = (words.unsqueeze(-1) >> (4 * torch.arange(8, device=meta.device))) & 0xF
        bad_meta = ((nibs & 3) >= (nibs >> 2)).any()
        dense = expand_sparse24_decode(values, meta, (m, ktp * TILE_K)) if ktp * TILE_K > k else None
        bad_pad = (dense[:, k:] != 0).any() if dense is not None else torch.zeros((), dtype=torch.bool)
        bad_meta, bad_pad = torch.stack([bad_meta.cpu(), bad_pad.cpu()]).tolist()
        if bad_meta:
            raise ValueError("meta: a chunk's metadata is not two increasing positions (undefined for mma.sp)")
        if bad_pad:
            raise ValueError("values: the padding past in_features holds nonzeros")
        w = cls.__new__(cls)
        w.shape, w.dtype, w.device, w.split, w.pair_col = (m, k), values.dtype, values.device, None, None
        w.values, w.meta = values, meta
        return w

    @classmethod
    def from_csr(cls, weight, dtype: Optional[torch.dtype] = None, device=None) -> "Sparse24DecodeWeight":
        """From anything :func:`sparsetorch.as_csr` takes; ``dtype`` converts the values, ``device`` places a SciPy
        weight (torch tensors are not moved)."""

        crow, col, values, shape = csr_parts(weight, dtype, device)
        reason = decode_applies(shape, values.dtype)
        if reason is not None:
            raise ValueError(f"weight: {reason}")
        return cls.from_split(Sparse24Split(crow, col, shape), values)

    @property
    def nbytes(self) -> int:
        """Packed values and metadata (plus the split's pattern when made from one)."""
        held = self.values.numel() * self.values.element_size() + self.meta.numel() * self.meta.element_size()
        return held + (self.split.nbytes if self.split is not None else 0)

    def set_values(self, values: torch.Tensor) -> None:
        """New values, repacked in place: the CSR's values (CSR order) for a weight made from a CSR, a split or
        pairs (:meth:`from_pairs`), else a dense 2:4 weight of the same shape (its pattern may differ)."""
        if values.dtype != self.dtype:
            raise ValueError(f"values: expected {self.dtype} (the weight's), got {values.dtype}")
        with torch.no_grad():
            if self.pair_col is not None or self.split is not None:
                nnz = self.pair_col.numel() if self.pair_col is not None else self.split.col.shape[-1]
                if values.dim() != 1 or values.numel() != nnz:
                    raise ValueError(f"values: expected ({nnz},) in the CSR's order, got {tuple(values.shape)}")
                if self.pair_col is not None:
                    v, m = pack_sparse24_decode_pairs(values.detach(), self.pair_col, self.shape)
                else:
                    v, m = pack_sparse24_decode(self.split.dense24(values.detach()))
            else:
                if tuple(values.shape) != self.shape:
                    raise ValueError(f"values: expected a dense weight of shape {self.shape}, got {tuple(values.shape)}")
                v, m = pack_sparse24_decode(values.detach())
            self.values.copy_(v)
            self.meta.copy_(m)

    def check_input(self, x: torch.Tensor) -> None:
        """x (..., in_features) of the weight's dtype, else TypeError / ValueError naming x (the packed forms'
        check)."""
        PackedWeight.check_input(self, x)

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: str = "none",
                 negative_slope: float = 0.01) -> torch.Tensor:
        return sparse24_decode_linear(x, self, bias, activation, negative_slope)


def sparse24_decode_linear(x: torch.Tensor, weight: Sparse24DecodeWeight, bias: Optional[torch.Tensor] = None,
                           activation: str = "none", negative_slope: float = 0.01) -> torch.Tensor:
    """``act(x @ W.T + bias)`` for x (..., in_features) of the weight's dtype; records no gradient (the layer
    differentiates through its CSR)."""
    weight.check_input(x)
    return ops.sparse24_decode_linear(x, weight.values, weight.meta, weight.shape[0], weight.shape[1], bias, activation,
                                      float(negative_slope))


@torch.library.register_fake("sparsetorch::sparse24_decode_to_dense")
def _sparse24_decode_to_dense_fake(values, meta, out_features, in_features):
    torch._check(values.dtype in DTYPES, lambda: f"values: expected bfloat16 or float16, got {values.dtype}")
    return values.new_empty((out_features, in_features))


@torch.library.register_fake("sparsetorch::sparse24_decode_pack_pairs")
def _sparse24_decode_pack_pairs_fake(values, col, out_features, in_features):
    r16, ktp = out_features // 16, packed_ktiles(in_features)
    return values.new_empty((r16, ktp, 32, 8)), values.new_empty((r16, ktp // 8, 32, 4), dtype=torch.int32)


@torch.library.register_fake("sparsetorch::sparse24_decode_linear")
def _sparse24_decode_linear_fake(x, values, meta, out_features, in_features, bias=None, activation="none",
                                 negative_slope=0.01):
    torch._check(x.dtype in DTYPES, lambda: f"x: expected bfloat16 or float16, got {x.dtype}")
    torch._check(values.dtype == x.dtype, lambda: f"values: expected {x.dtype} (x's dtype), got {values.dtype}")
    torch._check(meta.dtype == torch.int32, lambda: f"meta: expected int32, got {meta.dtype}")
    torch._check(x.shape[-1] == in_features, lambda: f"x: expected shape (..., {in_features}), got {tuple(x.shape)}")
    return x.new_empty((*x.shape[:-1], out_features))
