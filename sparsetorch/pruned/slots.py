"""The slot layout: a pruned bfloat16/float16 weight in the bitmap layout's 16 x 64 groups, each nonzero
stored as one 32-bit word holding its value and its slot in the group's tensor-core fragment tile
(csrc/common/slot_layout.h), and ``slot_linear``, its product on tensor cores (csrc/cuda/slot_kernel.cuh;
a CPU reference in csrc/cpu/slot_cpu.cpp).

Why a second tensor-core layout: the bitmap layout moves fewer bytes (3.3 per nonzero at 90% sparsity
against 4 here) but its kernel spends ~400 instructions per group finding where the values go; this one
spends one shared-memory store per value, so at high sparsity and few tokens it runs near the memory
floor. SparseLinear derives it from its CSR and times it against its other forms; new values (same
pattern) are one scatter.

Two variants of the layout: the plain one, groups in (strip, chunk) order, and the banded one, groups in
(band of two strips, chunk, strip) order with lane-consecutive slots, whose kernel loads each chunk's x
once for two groups and resets its tile with atomic exchanges (slot_layout.h). The banded one is faster
where the weight has many strips of 16 rows for the GPU's multiprocessors (tall layers such as a Llama
MLP's gate and up projections) and slower where it halves too few work units, so ``SlotWeight`` picks it
from the weight's shape and the GPU (``prefers_banded``) unless told.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from sparsetorch._ops import ops
from sparsetorch.pruned.packed import PackedWeight
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR

GROUP_ROWS, GROUP_COLS, SLOTS = 16, 64, 1024
MAX_ENTRIES = 2**31 - 1024  # the kernel's stream positions (up to 128 past the end) stay in int32
DTYPES = (torch.bfloat16, torch.float16)
# The banded layout when the weight has at least this many strips of 16 rows per multiprocessor: then the
# bands alone (one per block, 3 blocks per SM planned) fill the GPU without splitting chunks among blocks,
# whose second pass costs more than x's sharing saves. Measured (H100, 90%, N = 16, banded / plain time,
# docs/history.md, pruned-weight kernels): 14336 x 4096 (6.8 strips per SM) 0.90,
# 11008 x 4096 (5.2) 0.82, 8192 x 4096 (3.9) 0.80; 6144 x 4096 (2.9) 1.17, 4096-row shapes (1.9) 1.06-1.27.
BANDED_MIN_STRIPS_PER_SM = 3


def applies(shape: Tuple[int, int], dtype: torch.dtype, nnz: int) -> Optional[str]:
    """None when a weight of this shape, dtype and nonzero count fits the slot layout, else why not."""
    if dtype not in DTYPES:
        return f"dtype {dtype}: the slot layout packs 16-bit values (bfloat16, float16)"
    if nnz > MAX_ENTRIES:
        return f"{nnz} nonzeros: the slot layout takes at most {MAX_ENTRIES}"
    if max(shape) >= 2**31:
        return f"shape {tuple(shape)}: at most 2^31 - 1 rows and columns"
    return None


def prefers_banded(shape: Tuple[int, int], device: torch.device) -> bool:
    """Whether the banded layout is the faster one for a weight of this shape on this device (CUDA: enough
    strips of 16 rows per multiprocessor; elsewhere the plain layout, which the CPU reads as fast)."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return -(-int(shape[0]) // GROUP_ROWS) >= BANDED_MIN_STRIPS_PER_SM * sms


def slot_of(rows: torch.Tensor, cols: torch.Tensor, banded: bool = False) -> torch.Tensor:
    """Slot (0..1023) of row rows % 16, column cols % 64 of a group: element 2 r + j of lane 4 g + t's
    fragment of mma step s, numbered 8 (32 s + lane) + 2 r + j, or lane-consecutively (the banded
    layout) 256 s + 64 r + 2 lane + j (the inverse of slot_position and fragment_slot in slot_layout.h)."""
    rr, cc = rows % GROUP_ROWS, cols % GROUP_COLS
    t, s, h, j = cc >> 4, (cc >> 2) & 3, (cc >> 1) & 1, cc & 1
    r = (rr >> 3) + 2 * h
    lane = 4 * (rr & 7) + t
    if banded:
        return 256 * s + 64 * r + 2 * lane + j
    return 8 * (32 * s + lane) + 2 * r + j


@functools.lru_cache(maxsize=16)
def _slot_table(banded: bool, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """slot_of for every position of a group, indexed by 64 * (row in group) + column in group (4 KB a table)."""
    inside = torch.arange(SLOTS, dtype=torch.int64)
    return slot_of(inside // GROUP_COLS, inside % GROUP_COLS, banded).to(device, dtype)


def group_of(strips: torch.Tensor, chunks: torch.Tensor, num_chunks: int, banded: bool = False) -> torch.Tensor:
    """Index of group (strip, chunk): (strip, chunk) order, or (band, chunk, strip in band) in the banded
    layout (slot_group in slot_layout.h)."""
    if banded:
        return ((strips >> 1) * num_chunks + chunks) * 2 + (strips & 1)
    return strips * num_chunks + chunks


def position_of(groups: torch.Tensor, slots: torch.Tensor, num_chunks: int, banded: bool = False):
    """(row, column) in W of slot ``slots`` of group ``groups``: the inverse of group_of and slot_of."""
    j = slots & 1
    if banded:
        lane, r, s = (slots >> 1) & 31, (slots >> 6) & 3, slots >> 8
        strips, chunks = 2 * ((groups >> 1) // num_chunks) + (groups & 1), (groups >> 1) % num_chunks
    else:
        r, lane, s = (slots >> 1) & 3, (slots >> 3) & 31, slots >> 8
        strips, chunks = groups // num_chunks, groups % num_chunks
    t, h = lane & 3, r >> 1
    rr = (lane >> 2) + 8 * (r & 1)
    cc = 16 * t + 4 * s + 2 * h + j
    return strips * GROUP_ROWS + rr, chunks * GROUP_COLS + cc


def num_groups(shape: Tuple[int, int], banded: bool = False) -> int:
    """Groups of a weight of this shape: the offsets hold one more (the banded layout pads to whole bands)."""
    strips, chunks = -(-int(shape[0]) // GROUP_ROWS), -(-int(shape[1]) // GROUP_COLS)
    return (2 * -(-strips // 2) if banded else strips) * chunks


def _increasing_in_rows(crow: torch.Tensor, col: torch.Tensor) -> bool:
    """Whether every row's columns strictly increase (sorted, no repeated position): one pass, one read."""
    n = col.numel()
    if n < 2:
        return True
    starts = torch.zeros(n + 1, dtype=torch.bool, device=col.device)
    starts[crow[1:-1].clamp(0, n)] = True  # the first slot of every row but the first
    return bool(((col[1:] > col[:-1]) | starts[1:n]).all())


def _pack(values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    bits = values.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return (bits << 16) | slots.to(torch.int32)


class SlotWeight(PackedWeight):
    """W (out_features, in_features) in the slot layout, made from a CSR pattern with sorted or unsorted
    columns (repeated positions are summed, as in the CSR) and its values. ``banded``: the layout's
    variant (module docstring); None picks the faster one for the shape and device (``prefers_banded``)."""

    def __init__(self, crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: Tuple[int, int],
                 banded: Optional[bool] = None):
        reason = applies(shape, values.dtype, values.numel())
        if reason is not None:
            raise ValueError(f"weight: {reason}")
        m, k = int(shape[0]), int(shape[1])
        if crow.numel() != m + 1 or col.numel() != values.numel():
            raise ValueError(f"weight: expected {m + 1} row pointers and as many columns as values, got "
                             f"{crow.numel()} and {col.numel()} for {values.numel()} values")
        # Columns and row pointers checked once per pattern (cached: a layer's own validated CSR costs a lookup).
        ensure_valid(CSR(crow, col, values, (m, k)))
        self.shape = (m, k)
        self.dtype, self.device = values.dtype, values.device
        self.banded = prefers_banded(self.shape, values.device) if banded is None else bool(banded)
        chunks, groups = -(-k // GROUP_COLS), num_groups(self.shape, self.banded)
        # int32 keys where group * 1024 + slot fits (every pass over the entries moves half the bytes)
        index = torch.int32 if groups * SLOTS < 2**31 else torch.int64
        crow = crow.to(device=values.device, dtype=torch.int64)
        col = col.to(device=values.device, dtype=index)
        rows = torch.repeat_interleave(torch.arange(m, device=values.device, dtype=index), crow.diff(),
                                       output_size=col.numel())  # the size known: no device sync
        # key = group * 1024 + slot; the slot (a function of the position inside the group) read from a table
        # of the group's 16 x 64 positions: a few passes over the entries instead of slot_of's dozen
        group = group_of(rows // GROUP_ROWS, col // GROUP_COLS, chunks, self.banded)
        inside = (rows % GROUP_ROWS) * GROUP_COLS + col % GROUP_COLS
        key = group * SLOTS + _slot_table(self.banded, values.device, index)[inside]
        if _increasing_in_rows(crow, col):
            # no repeated position: the keys are distinct, a sort orders them and its permutation inverts
            unique, order = torch.sort(key)
            inverse = torch.empty_like(order, dtype=torch.int32)
            inverse[order] = torch.arange(order.numel(), device=order.device, dtype=torch.int32)
            packed = values.detach()[order]  # nothing to sum: the values in packed order
        else:
            unique, inverse = torch.unique(key, sorted=True, return_inverse=True)
            packed = None
        # CSR entry i goes to packed entry _into[i] (a permutation unless the CSR repeats positions).
        self._into = inverse.to(torch.int32)
        self._slots = (unique % SLOTS).to(torch.int32)
        # group g's entries start at the first key >= 1024 g (the keys are sorted): no count, no device sync
        starts = torch.arange(groups + 1, device=values.device, dtype=index) * SLOTS
        self.offsets = torch.searchsorted(unique, starts, out_int32=True)
        self.entries = _pack(packed if packed is not None else self._packed(values.detach()), self._slots)

    @classmethod
    def from_packed(cls, offsets: torch.Tensor, entries: torch.Tensor, shape: Tuple[int, int], dtype: torch.dtype,
                    banded: bool = False) -> "SlotWeight":
        """From the packed arrays (a compact layer's state_dict), checked first: dtypes and sizes, offsets
        from 0 to len(entries) never decreasing, every slot below 1024 and inside the weight's shape.
        ValueError naming the array otherwise (one pass and one device-to-host read). The result holds no
        refresh maps (no set_values)."""
        m, k = int(shape[0]), int(shape[1])
        reason = applies((m, k), dtype, int(getattr(entries, "numel", lambda: 0)()))
        if reason is not None:
            raise ValueError(f"entries: {reason}")
        groups = num_groups((m, k), banded)
        for name, t, n in (("offsets", offsets, groups + 1), ("entries", entries, None)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or (n is not None and t.numel() != n):
                raise ValueError(f"{name}: expected a 1-D int32 tensor{f' of {n} entries' if n else ''} for a {m} x {k} "
                                 f"weight, got {getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
        if offsets.device != entries.device:
            raise ValueError(f"offsets: expected device {entries.device} (entries'), got {offsets.device}")
        o = offsets.long()
        bad_offsets = (o[0] != 0) | (o[-1] != entries.numel()) | (o.diff() < 0).any()
        group = torch.repeat_interleave(torch.arange(groups, device=o.device), o.diff().clamp(min=0),
                                        output_size=entries.numel()) if entries.numel() else o[:0]
        slot = (entries & 0xFFFF).long()
        rows, cols = position_of(group, slot.clamp(max=SLOTS - 1), -(-k // GROUP_COLS), banded)
        bad_slots = ((slot >= SLOTS) | (rows >= m) | (cols >= k)).any() if entries.numel() else bad_offsets & False
        bad_offsets, bad_slots = torch.stack([bad_offsets.cpu(), bad_slots.cpu()]).tolist()
        if bad_offsets:
            raise ValueError("offsets: expected 0 first, len(entries) last and no decrease")
        if bad_slots:
            raise ValueError("entries: a slot is past 1023 or outside the weight's shape")
        w = cls.__new__(cls)
        w.shape, w.dtype, w.device, w.banded = (m, k), dtype, entries.device, bool(banded)
        w.offsets, w.entries, w._into, w._slots = offsets, entries, None, None
        return w

    def drop_refresh_maps(self) -> None:
        """Forget the maps from the CSR's order (a compact layer holds no CSR): no set_values after this."""
        self._into = self._slots = None

    def to_dense(self) -> torch.Tensor:
        """W as a dense (out_features, in_features) tensor: one kernel, no device sync (``slot_to_dense``)."""
        return ops.slot_to_dense(self.offsets, self.entries, self.shape[0], self.shape[1], self.dtype, self.banded)

    def _packed(self, values: torch.Tensor) -> torch.Tensor:
        """The CSR's values in packed order, repeated positions summed (in float32, rounded once)."""
        out = torch.zeros(self._slots.numel(), dtype=torch.float32, device=values.device)
        out.index_add_(0, self._into.long(), values.float())
        return out.to(self.dtype)

    def set_values(self, values: torch.Tensor) -> None:
        """New values for the same pattern (the CSR's order), in place."""
        if self._into is None:
            raise ValueError("values: this SlotWeight holds no map from a CSR's order (made from packed arrays)")
        if values.dtype != self.dtype or values.shape != self._into.shape:
            raise ValueError(f"values: expected {tuple(self._into.shape)} of {self.dtype} (the weight's), got "
                             f"{tuple(values.shape)} of {values.dtype}")
        self.entries.copy_(_pack(self._packed(values.detach()), self._slots))

    @property
    def nbytes(self) -> int:
        """Offsets and entries, and the maps that refresh the values (a slot and a target per entry)."""
        maps = [t for t in (self._slots, self._into) if t is not None]
        return (self.offsets.numel() + self.entries.numel() + sum(t.numel() for t in maps)) * 4


def slot_linear(x: torch.Tensor, weight: SlotWeight, bias: Optional[torch.Tensor] = None,
                activation: str = "none", negative_slope: float = 0.01) -> torch.Tensor:
    """``act(x @ W.T + bias)`` for x (..., in_features) of the weight's dtype; records no gradient (the
    layer differentiates through its CSR)."""
    weight.check_input(x)
    return ops.slot_linear(x, weight.offsets, weight.entries, weight.shape[0], bias, activation,
                           float(negative_slope), weight.banded)


@torch.library.register_fake("sparsetorch::slot_to_dense")
def _slot_to_dense_fake(offsets, entries, out_features, in_features, dtype, banded=False):
    return entries.new_empty((out_features, in_features), dtype=dtype)


@torch.library.register_fake("sparsetorch::slot_linear")
def _slot_linear_fake(x, offsets, entries, out_features, bias=None, activation="none", negative_slope=0.01,
                      banded=False):
    torch._check(x.dtype in DTYPES, lambda: f"x: expected bfloat16 or float16, got {x.dtype}")
    return x.new_empty((*x.shape[:-1], out_features))
