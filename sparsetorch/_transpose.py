"""The transpose of a CSR pattern, made once per pattern and cached.

``transpose_pattern(crow, col, k)`` returns ``(crow_t, col_t, perm)``: the CSR pattern of A^T
(k rows) and, for every slot of A^T, the slot of A its value comes from, so that
``values_t = values.gather(-1, perm)`` (or ``values[..., perm]`` for a shared pattern) is A^T's
values for any values on A's pattern. The backward of spmm (``grad_B = A^T @ grad``) and of sddmm
use it; training a sparse layer changes the values every step but never the pattern, so the cache
holds the pattern part only and each backward pays one gather.

Built with torch ops on A's device (one stable sort of the slots by column: O(nnz log nnz)).
Batched patterns ``(b, m+1)`` / ``(b, L)`` give ``(b, k+1)`` / ``(b, L)``; each batch's padding
slots (after ``crow[i, -1]``) and entries with a column outside ``[0, k)`` (which the CUDA kernels
skip) go to the end as padding of A^T, so A^T has the same semantics.

Two caches (sparsetorch/_cache.py, listed in ``st.cache_info()``), keyed on the tensors themselves
(identity and in-place version counter) and dropped with them: the patterns (keyed on crow and col,
and k), and the values of A^T that a caller made together with A (keyed on A's values, for one slot
map): the fresh-graph builder makes A^T beside A (``remember_transpose``), so a graph layer's
backward neither sorts nor gathers. Neither is used while tracing (fake tensors, torch.compile) or
for inference-mode tensors, which have no version counter: a compiled graph layer passes A^T to its
product itself (sparsetorch/nn/_pyg.py).
"""
from __future__ import annotations

from typing import Tuple

import torch

from sparsetorch._cache import MISS, TensorCache

__all__ = ["transpose_pattern", "transpose_values", "row_indices", "transpose_cache_clear", "remember_transpose"]

# A layer trains on a few graphs (a full graph, or a mini-batch's one at a time): a few dozen is plenty.
_patterns = TensorCache("transpose.patterns", max_entries=64)
_values = TensorCache("transpose.values", max_entries=64)


def row_indices(crow: torch.Tensor, length: int, dtype: torch.dtype = torch.int64) -> Tuple[torch.Tensor, torch.Tensor]:
    """For every slot 0..length-1 of a (possibly batched, 2-D) crow: its row and whether the slot
    holds an entry (``crow[0] <= slot < crow[-1]``). Both (B, length), ``dtype`` (int64, or int32 where
    the caller knows length fits: half the bytes of each pass) / bool."""
    c2 = crow.long().reshape(-1, crow.shape[-1])
    m = c2.shape[-1] - 1
    # row(slot) = how many of crow[1:] are <= slot: a cumulative count of the row ends (written
    # without searchsorted, whose Inductor lowering fails on a reshaped crow in torch 2.11 CUDA).
    ends = torch.zeros(c2.shape[0], length + 1, dtype=dtype, device=crow.device)
    ends.scatter_add_(1, c2[:, 1:].clamp(0, length), torch.ones(c2[:, 1:].shape, dtype=dtype, device=crow.device))
    rows = torch.cumsum(ends, dim=1, dtype=dtype)[:, :length]
    slots = torch.arange(length, device=crow.device, dtype=dtype).unsqueeze(0)
    valid = (slots >= c2[:, :1]) & (slots < c2[:, -1:])
    return rows.clamp(0, max(m - 1, 0)), valid


def _compute(crow: torch.Tensor, col: torch.Tensor, k: int):
    batched = crow.dim() == 2
    length = col.shape[-1]
    rows, valid = row_indices(crow, length)
    col2 = col.long().reshape(rows.shape[0], length)  # explicit rows: length may be 0
    valid &= (col2 >= 0) & (col2 < k)
    key = torch.where(valid, col2, torch.full_like(col2, k))
    # Stable: within one column of A^T the entries stay in A's row order.
    key_sorted, perm = torch.sort(key, dim=-1, stable=True)
    counts = torch.zeros(key.shape[0], k + 1, dtype=torch.int64, device=crow.device)
    counts.scatter_add_(1, key, torch.ones_like(key))
    crow_t = torch.zeros(key.shape[0], k + 1, dtype=torch.int64, device=crow.device)
    torch.cumsum(counts[:, :k], dim=1, out=crow_t[:, 1:])
    col_t = torch.where(key_sorted < k, rows.gather(1, perm), torch.zeros_like(perm))
    index_dtype = crow.dtype
    crow_t, col_t = crow_t.to(index_dtype), col_t.to(index_dtype)
    if not batched:
        crow_t, col_t, perm = crow_t[0], col_t[0], perm[0]
    return crow_t, col_t, perm


def transpose_pattern(crow: torch.Tensor, col: torch.Tensor, k: int):
    """``(crow_t, col_t, perm)`` of A^T for A's pattern (see the module docstring)."""
    return _patterns.get((crow, col), (k,), lambda: _compute(crow, col, k))


def remember_transpose(crow: torch.Tensor, col: torch.Tensor, k: int, crow_t: torch.Tensor, col_t: torch.Tensor,
                       perm: torch.Tensor, values: "torch.Tensor | None" = None,
                       values_t: "torch.Tensor | None" = None) -> None:
    """Record A^T's pattern (and, for ``values``, A^T's values ``values_t``) made by a caller that
    built it anyway (the fresh-graph builder, _graph_build.py: one sort by source beside the sort by
    target), so that the backward neither sorts nor gathers. The caller guarantees that (crow_t,
    col_t, perm) is what ``transpose_pattern`` would compute up to the order within a row. Ignored
    while tracing and for tensors without a version counter."""
    _patterns.store((crow, col), (k,), (crow_t, col_t, perm))
    if values is not None and values_t is not None:
        _values.store((values,), (), (perm, values_t))


def transpose_cache_clear() -> None:
    """Forget every cached transpose (``st.clear_caches()`` clears these with every other cache)."""
    _patterns.clear()
    _values.clear()


def transpose_values(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """A^T's values from A's values (``(L,)`` or ``(b, L)``) and the slot map ``perm``."""
    if not torch.compiler.is_compiling():
        known = _values.lookup((values,))
        if known is not MISS and known[0] is perm:
            return known[1]
    if perm.dim() == 1:
        return values[..., perm]
    return values.gather(-1, perm)
