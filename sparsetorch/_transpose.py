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

The cache is keyed on the index tensors themselves (identity, in-place version counter, k) and
an entry lives as long as ``crow_indices`` does. It is not used while tracing (fake tensors,
torch.compile) or for inference-mode tensors, which have no version counter.

Symmetric patterns (``mark_symmetric``): a graph layer that knows its matrix is symmetric (GCN's
``D^-1/2 (A + I) D^-1/2`` of an undirected graph) or knows its transpose on the same pattern
(mean aggregation ``D^-1 A``: A^T's values are A's times 1/deg of the column) says so once per
graph. ``transpose_pattern`` then returns A's own ``crow``/``col`` (nothing is built) and a slot
map that ``transpose_values`` answers without a gather for the values that were marked; for any
other values on that pattern (sddmm's backward, an unmarked matrix sharing the indices) it
computes the real slot map once, so results never depend on the mark being used.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Tuple

import torch

__all__ = ["transpose_pattern", "transpose_values", "row_indices", "transpose_cache_clear", "mark_symmetric",
           "symmetric_slots", "remember_transpose"]

_MAX_ENTRIES = 64
_cache: "OrderedDict[int, tuple]" = OrderedDict()


def row_indices(crow: torch.Tensor, length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """For every slot 0..length-1 of a (possibly batched, 2-D) crow: its row and whether the slot
    holds an entry (``crow[0] <= slot < crow[-1]``). Both (B, length), int64 / bool."""
    c2 = crow.long().reshape(-1, crow.shape[-1])
    m = c2.shape[-1] - 1
    # row(slot) = how many of crow[1:] are <= slot: a cumulative count of the row ends (written
    # without searchsorted, whose Inductor lowering fails on a reshaped crow in torch 2.11 CUDA).
    ends = torch.zeros(c2.shape[0], length + 1, dtype=torch.int64, device=crow.device)
    ends.scatter_add_(1, c2[:, 1:].clamp(0, length), torch.ones_like(c2[:, 1:]))
    rows = torch.cumsum(ends, dim=1)[:, :length]
    slots = torch.arange(length, device=crow.device).unsqueeze(0)
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


def _cacheable(*tensors: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return False
    return all(type(t) is torch.Tensor and not t.is_inference() for t in tensors)


def transpose_pattern(crow: torch.Tensor, col: torch.Tensor, k: int):
    """``(crow_t, col_t, perm)`` of A^T for A's pattern (see the module docstring)."""
    if not _cacheable(crow, col):
        return _compute(crow, col, k)
    marked = _symmetric_entry(crow, col, k)
    if marked is not None:
        return crow, col, marked
    key = id(crow)
    hit = _cache.get(key)
    if hit is not None:
        crow_ref, col_ref, versions, hit_k, result = hit
        if crow_ref() is crow and col_ref() is col and versions == (crow._version, col._version) and hit_k == k:
            _cache.move_to_end(key)
            return result
    result = _compute(crow, col, k)
    _store(crow, col, k, result)
    return result


def _store(crow: torch.Tensor, col: torch.Tensor, k: int, result: tuple) -> None:
    key = id(crow)

    def drop(_ref, key=key, cache=_cache):  # the dict bound here: callbacks may run at interpreter exit
        entry = cache.get(key)
        if entry is not None and entry[0] is _ref:
            del cache[key]

    _cache[key] = (weakref.ref(crow, drop), weakref.ref(col), (crow._version, col._version), k, result)
    _cache.move_to_end(key)
    while len(_cache) > _MAX_ENTRIES:
        _cache.popitem(last=False)


def remember_transpose(crow: torch.Tensor, col: torch.Tensor, k: int, crow_t: torch.Tensor, col_t: torch.Tensor,
                       perm: torch.Tensor, values: "torch.Tensor | None" = None,
                       values_t: "torch.Tensor | None" = None) -> None:
    """Record A^T's pattern (and, for ``values``, A^T's values ``values_t``) made by a caller that
    built it anyway (the fresh-graph builder, _graph_build.py: one sort by source beside the sort by
    target), so that the backward neither sorts nor gathers. The caller guarantees that (crow_t,
    col_t, perm) is what ``transpose_pattern`` would compute up to the order within a row. Ignored
    while tracing and for tensors without a version counter."""
    if not _cacheable(crow, col):
        return
    _store(crow, col, k, (crow_t, col_t, perm))
    if values is not None and values_t is not None and _cacheable(values):
        key = id(values)

        def drop(_ref, key=key, known=_known_values):
            entry = known.get(key)
            if entry is not None and entry[0] is _ref:
                del known[key]

        _known_values[key] = (weakref.ref(values, drop), values._version, perm, values_t)
        _known_values.move_to_end(key)
        while len(_known_values) > _MAX_ENTRIES:
            _known_values.popitem(last=False)


# id(values) -> (weakref(values), version, perm it belongs to, A^T's values): remember_transpose's
# values, answered by transpose_values without a gather.
_known_values: "OrderedDict[int, tuple]" = OrderedDict()


def transpose_cache_clear() -> None:
    """Forget every cached transpose and every symmetric mark."""
    _cache.clear()
    _symmetric.clear()
    _known_values.clear()


def transpose_values(values: torch.Tensor, perm) -> torch.Tensor:
    """A^T's values from A's values (``(L,)`` or ``(b, L)``) and the slot map ``perm``."""
    if isinstance(perm, _SymmetricPattern):
        known = perm.transpose_of(values)
        if known is not None:
            return known
        perm = perm.slots()
    known = _known_values.get(id(values))
    if known is not None and known[2] is perm and known[0]() is values and known[1] == values._version:
        return known[3]
    if perm.dim() == 1:
        return values[..., perm]
    return values.gather(-1, perm)


# --- symmetric patterns ----------------------------------------------------------------------

_symmetric: "OrderedDict[int, _SymmetricPattern]" = OrderedDict()


def symmetric_slots(crow: torch.Tensor, col: torch.Tensor, k: int):
    """For an unbatched square pattern: the slot map of A^T *on A's own pattern* (``values[slots]``
    are A^T's values at A's slots) when the pattern is symmetric (as a multiset of (row, column)
    pairs), else None. Two stable sorts and one comparison (a device sync); O(nnz log nnz)."""
    if crow.dim() != 1 or crow.shape[0] - 1 != k:
        return None
    length = col.shape[0]
    rows, valid = row_indices(crow, length)
    rows, valid = rows[0], valid[0]
    cols = col.long()
    if not bool((valid & (cols >= 0) & (cols < k)).all()):
        return None
    # Sorted by (row, col) and by (col, row): a symmetric pattern gives the same key sequence, and
    # the t-th slot of one order holds the transpose of the t-th slot of the other.
    key_rc, by_rc = torch.sort(rows * k + cols, stable=True)
    key_cr, by_cr = torch.sort(cols * k + rows, stable=True)
    if not torch.equal(key_rc, key_cr):
        return None
    slots = torch.empty_like(by_rc)
    slots[by_rc] = by_cr
    return slots


class _SymmetricPattern:
    """A pattern marked symmetric: the transposes known for given values, and the real slot map
    made on first need (for values nobody marked)."""

    def __init__(self, crow: torch.Tensor, col: torch.Tensor, k: int):
        self._crow = weakref.ref(crow)
        self._col = weakref.ref(col)
        self.versions = (crow._version, col._version)
        self.k = k
        self.known: "dict[int, tuple]" = {}  # id(values) -> (weakref(values), version, transpose or None)
        self._slots = None

    def alive_for(self, crow, col, k) -> bool:
        return (self._crow() is crow and self._col() is col and self.k == k
                and self.versions == (crow._version, col._version))

    def transpose_of(self, values: torch.Tensor):
        hit = self.known.get(id(values))
        if hit is None or hit[0]() is not values or hit[1] != values._version:
            return None
        return values if hit[2] is None else hit[2]

    def slots(self) -> torch.Tensor:
        if self._slots is None:
            crow, col = self._crow(), self._col()
            slots = symmetric_slots(crow, col, self.k)
            if slots is None:
                raise ValueError("mark_symmetric: the pattern marked symmetric is not symmetric")
            self._slots = slots
        return self._slots


def _symmetric_entry(crow, col, k):
    entry = _symmetric.get(id(crow))
    if entry is not None and entry.alive_for(crow, col, k):
        return entry
    return None


def mark_symmetric(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor,
                   transpose: "torch.Tensor | None" = None) -> None:
    """Declare that the unbatched square CSR pattern (crow, col) is symmetric and that A^T, for A
    with ``values``, has A's pattern with the values ``transpose`` (default: ``values`` itself, i.e.
    A is symmetric). The caller guarantees it (``symmetric_slots`` checks a pattern). From then on,
    as long as crow, col and values are alive and unmodified, A^T @ X in spmm's backward runs on
    A's own indices with no transpose built and no values gathered. Ignored for tensors that have
    no version counter (inference mode) and while tracing."""
    if crow.dim() != 1 or values.dim() != 1:
        raise ValueError(f"mark_symmetric: expected an unbatched pattern, got crow_indices "
                         f"{tuple(crow.shape)} and values {tuple(values.shape)}")
    k = crow.shape[0] - 1
    if transpose is not None and transpose.shape != values.shape:
        raise ValueError(f"transpose: expected the shape of values {tuple(values.shape)}, got "
                         f"{tuple(transpose.shape)}")
    if not _cacheable(crow, col, values):
        return
    entry = _symmetric_entry(crow, col, k)
    if entry is None:
        entry = _SymmetricPattern(crow, col, k)
        key = id(crow)

        def drop(_ref, key=key, marks=_symmetric):  # bound here: callbacks may run at interpreter exit
            current = marks.get(key)
            if current is not None and current._crow is _ref:
                del marks[key]

        entry._crow = weakref.ref(crow, drop)
        _symmetric[key] = entry
    for vid in [vid for vid, hit in entry.known.items() if hit[0]() is None]:
        del entry.known[vid]
    entry.known[id(values)] = (weakref.ref(values), values._version, transpose)
    _symmetric.move_to_end(id(crow))
    while len(_symmetric) > _MAX_ENTRIES:
        _symmetric.popitem(last=False)
