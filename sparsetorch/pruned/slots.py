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
# benchmarks/results/nvidia-h100-80gb-hbm3/slots_banded@a742d0f): 14336 x 4096 (6.8 strips per SM) 0.90,
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


def group_of(strips: torch.Tensor, chunks: torch.Tensor, num_chunks: int, banded: bool = False) -> torch.Tensor:
    """Index of group (strip, chunk): (strip, chunk) order, or (band, chunk, strip in band) in the banded
    layout (slot_group in slot_layout.h)."""
    if banded:
        return ((strips >> 1) * num_chunks + chunks) * 2 + (strips & 1)
    return strips * num_chunks + chunks


def num_groups(shape: Tuple[int, int], banded: bool = False) -> int:
    """Groups of a weight of this shape: the offsets hold one more (the banded layout pads to whole bands)."""
    strips, chunks = -(-int(shape[0]) // GROUP_ROWS), -(-int(shape[1]) // GROUP_COLS)
    return (2 * -(-strips // 2) if banded else strips) * chunks


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
        crow = crow.to(device=values.device, dtype=torch.int64)
        col = col.to(device=values.device, dtype=torch.int64)
        rows = torch.repeat_interleave(torch.arange(m, device=values.device), crow.diff())
        group = group_of(rows // GROUP_ROWS, col // GROUP_COLS, chunks, self.banded)
        key = group * SLOTS + slot_of(rows, col, self.banded)
        unique, inverse = torch.unique(key, sorted=True, return_inverse=True)
        # CSR entry i goes to packed entry _into[i] (a permutation unless the CSR repeats positions).
        self._into = inverse.to(torch.int32)
        self._slots = (unique % SLOTS).to(torch.int32)
        self.offsets = torch.zeros(groups + 1, dtype=torch.int32, device=values.device)
        torch.cumsum(torch.bincount(unique // SLOTS, minlength=groups), 0, out=self.offsets[1:])
        self.entries = _pack(self._packed(values.detach()), self._slots)

    def _packed(self, values: torch.Tensor) -> torch.Tensor:
        """The CSR's values in packed order, repeated positions summed (in float32, rounded once)."""
        out = torch.zeros(self._slots.numel(), dtype=torch.float32, device=values.device)
        out.index_add_(0, self._into.long(), values.float())
        return out.to(self.dtype)

    def set_values(self, values: torch.Tensor) -> None:
        """New values for the same pattern (the CSR's order), in place."""
        if values.dtype != self.dtype or values.shape != self._into.shape:
            raise ValueError(f"values: expected {tuple(self._into.shape)} of {self.dtype} (the weight's), got "
                             f"{tuple(values.shape)} of {values.dtype}")
        self.entries.copy_(_pack(self._packed(values.detach()), self._slots))

    @property
    def nbytes(self) -> int:
        """Offsets and entries, and the maps that refresh the values (a slot and a target per entry)."""
        return (self.offsets.numel() + self.entries.numel() + self._slots.numel() + self._into.numel()) * 4


def slot_linear(x: torch.Tensor, weight: SlotWeight, bias: Optional[torch.Tensor] = None,
                activation: str = "none", negative_slope: float = 0.01) -> torch.Tensor:
    """``act(x @ W.T + bias)`` for x (..., in_features) of the weight's dtype; records no gradient (the
    layer differentiates through its CSR)."""
    weight.check_input(x)
    return ops.slot_linear(x, weight.offsets, weight.entries, weight.shape[0], bias, activation,
                           float(negative_slope), weight.banded)


@torch.library.register_fake("sparsetorch::slot_linear")
def _slot_linear_fake(x, offsets, entries, out_features, bias=None, activation="none", negative_slope=0.01,
                      banded=False):
    torch._check(x.dtype in DTYPES, lambda: f"x: expected bfloat16 or float16, got {x.dtype}")
    return x.new_empty((*x.shape[:-1], out_features))
