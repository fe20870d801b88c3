"""CSR16: a pruned bfloat16/float16 weight as CSR whose entries pack the value's 16 bits over a 16-bit column
(one 32-bit word per nonzero; layout in csrc/common/csr16_checks.h), and ``csr16_linear``, its product with
few tokens on CUDA cores (csrc/cuda/csr16_kernel.cuh; a CPU reference in csrc/cpu/csr16_cpu.cpp).

At high sparsity and few tokens the weight's bytes decide the time, and CSR16 moves 4 bytes per nonzero
in one stream (CSR with int32 columns: 6 bytes in two). SparseLinear derives this form from its CSR and
times it against its other forms; its values follow the CSR's order, so new values are one repack.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from sparsetorch._ops import ops
from sparsetorch.pruned.packed import PackedWeight
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR

MAX_COLUMNS = 0xFFFF  # the CUDA kernel's filler entries use column 0xFFFF: never a real column
MAX_ENTRIES = 2**31 - 1024  # the kernel's lane offsets (up to 508 past a row's end) stay in int32
DTYPES = (torch.bfloat16, torch.float16)


def applies(shape: Tuple[int, int], dtype: torch.dtype, nnz: int) -> Optional[str]:
    """None when a weight of this shape, dtype and nonzero count fits CSR16, else why not."""
    if dtype not in DTYPES:
        return f"dtype {dtype}: CSR16 packs 16-bit values (bfloat16, float16)"
    if shape[1] > MAX_COLUMNS:
        return f"in_features {shape[1]}: CSR16's 16-bit columns take at most {MAX_COLUMNS}"
    if nnz > MAX_ENTRIES:
        return f"{nnz} nonzeros: CSR16 takes at most {MAX_ENTRIES}"
    return None


def _pack(values: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    bits = values.detach().contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return (bits << 16) | col.to(torch.int32)


class Csr16Weight(PackedWeight):
    """W (out_features, in_features) in CSR16, made from a CSR pattern with sorted or unsorted columns
    (duplicates are summed, as in the CSR) and its values."""

    def __init__(self, crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: Tuple[int, int]):
        reason = applies(shape, values.dtype, values.numel())
        if reason is not None:
            raise ValueError(f"weight: {reason}")
        if crow.numel() != int(shape[0]) + 1 or col.numel() != values.numel():
            raise ValueError(f"weight: expected {int(shape[0]) + 1} row pointers and as many columns as values, got "
                             f"{crow.numel()} and {col.numel()} for {values.numel()} values")
        # Columns and row pointers checked once per pattern (cached: a layer's own validated CSR costs a lookup).
        ensure_valid(CSR(crow, col, values, (int(shape[0]), int(shape[1]))))
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype, self.device = values.dtype, values.device
        self.crow = crow.to(torch.int32).contiguous()  # may share the caller's int32 row pointers
        self.entries = _pack(values, col)

    def set_values(self, values: torch.Tensor) -> None:
        """New values for the same pattern (the CSR's order), in place."""
        if values.dtype != self.dtype or values.shape != self.entries.shape:
            raise ValueError(f"values: expected {tuple(self.entries.shape)} of {self.dtype} (the weight's), got "
                             f"{tuple(values.shape)} of {values.dtype}")
        columns = self.entries & 0xFFFF
        self.entries.copy_(_pack(values, columns))

    def to_dense(self) -> torch.Tensor:
        """W as a dense (out_features, in_features) tensor (repeated columns summed; no device sync)."""
        m, k = self.shape
        n = self.entries.numel()
        rows = torch.repeat_interleave(torch.arange(m, device=self.crow.device), self.crow.long().diff(), output_size=n)
        values = (self.entries >> 16).to(torch.int16).view(self.dtype)
        dense = torch.zeros(m * k, dtype=self.dtype, device=self.entries.device)
        dense.index_put_((rows * k + (self.entries & 0xFFFF).long(),), values, accumulate=True)
        return dense.view(m, k)

    @property
    def nbytes(self) -> int:
        """Row pointers and entries (the row pointers may be the caller's own int32 tensor)."""
        return self.crow.numel() * 4 + self.entries.numel() * 4


def csr16_linear(x: torch.Tensor, weight: Csr16Weight, bias: Optional[torch.Tensor] = None,
                 activation: str = "none", negative_slope: float = 0.01) -> torch.Tensor:
    """``act(x @ W.T + bias)`` for x (..., in_features) of the weight's dtype; records no gradient (the
    layer differentiates through its CSR)."""
    weight.check_input(x)
    return ops.csr16_linear(x, weight.crow, weight.entries, bias, activation, float(negative_slope))


@torch.library.register_fake("sparsetorch::csr16_linear")
def _csr16_linear_fake(x, crow, entries, bias=None, activation="none", negative_slope=0.01):
    torch._check(x.dtype in DTYPES, lambda: f"x: expected bfloat16 or float16, got {x.dtype}")
    return x.new_empty((*x.shape[:-1], crow.shape[0] - 1))
