"""Row partitioning and the split of a rank's row block into the part that multiplies its own rows
of B (local columns) and the part that multiplies rows other ranks own (the halo).

All of it runs once per graph, with torch ops on the matrix's device.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from sparsetorch.csr import CSR

__all__ = ["balanced_row_bounds", "even_bounds", "entry_rows", "split_block", "append_diagonal", "halo_counts"]


def balanced_row_bounds(crow_indices: torch.Tensor, parts: int, row_weight: float = 1.0) -> List[int]:
    """Contiguous row blocks ``[bounds[r], bounds[r+1])`` of about equal cost, one per part.

    A row costs its stored entries plus ``row_weight`` (each entry gathers a row of B, each row writes
    a row of the output), so a power-law graph is split by entries, not rows: the block holding the
    hub rows gets fewer rows. ``crow_indices`` is the global (m + 1,) row pointer (or any prefix sum
    of the entries per row). Blocks may be empty when there are more parts than rows.
    """
    if parts < 1:
        raise ValueError(f"parts: expected at least 1, got {parts}")
    if crow_indices.dim() != 1 or crow_indices.numel() < 1:
        raise ValueError(f"crow_indices: expected a 1-D (m + 1,) row pointer, got shape {tuple(crow_indices.shape)}")
    m = crow_indices.numel() - 1
    prefix = crow_indices.to(torch.float64)
    cost = prefix - prefix[0] + float(row_weight) * torch.arange(m + 1, dtype=torch.float64, device=prefix.device)
    targets = cost[-1] * torch.arange(1, parts, dtype=torch.float64, device=prefix.device) / parts
    upper = torch.searchsorted(cost, targets).clamp(0, m)  # first boundary at or past each target
    lower = (upper - 1).clamp(min=0)
    nearer = torch.where(targets - cost[lower] < cost[upper] - targets, lower, upper)
    inner = torch.cummax(nearer, 0).values.tolist() if parts > 1 else []
    return [0] + [int(b) for b in inner] + [m]


def even_bounds(size: int, parts: int) -> List[int]:
    """``size`` split into ``parts`` contiguous ranges of sizes differing by at most one."""
    return [size * r // parts for r in range(parts + 1)]


def check_bounds(bounds: Sequence[int], size: int, parts: int, name: str) -> List[int]:
    b = [int(x) for x in bounds]
    if len(b) != parts + 1 or b[0] != 0 or b[-1] != size or any(x > y for x, y in zip(b, b[1:])):
        raise ValueError(f"{name}: expected {parts + 1} non-decreasing boundaries from 0 to {size}, got {b}")
    return b


def entry_rows(crow: torch.Tensor, nnz: int) -> torch.Tensor:
    """The row (int64) of every stored entry of a 1-D row pointer."""
    crow = crow.long()
    counts = crow[1:] - crow[:-1]
    return torch.repeat_interleave(torch.arange(counts.numel(), device=crow.device), counts, output_size=nnz)


def _rebuild(counts: torch.Tensor, index_dtype: torch.dtype) -> torch.Tensor:
    crow = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(counts, 0, out=crow[1:])
    return crow.to(index_dtype)


def split_block(block: CSR, col_start: int, col_end: int) -> Tuple[CSR, CSR, torch.Tensor]:
    """(local, remote, halo) of a row block whose columns are global.

    ``local`` holds the entries with a column in ``[col_start, col_end)`` (this rank's rows of B),
    columns shifted to start at 0; ``remote`` the others, columns renumbered into ``halo``: the
    sorted distinct global columns outside the range, i.e. the rows of B this rank must receive.
    Entries keep their order within each row.
    """
    m = block.shape[0]
    col = block.col_indices.long()
    nnz = col.numel()
    rows = entry_rows(block.crow_indices, nnz)
    is_local = (col >= col_start) & (col < col_end)
    local_counts = torch.zeros(m, dtype=torch.int64, device=col.device).index_add_(0, rows, is_local.long())
    all_counts = block.crow_indices[1:].long() - block.crow_indices[:-1].long()
    idx = block.index_dtype
    local = CSR(_rebuild(local_counts, idx), (col[is_local] - col_start).to(idx), block.values[is_local],
                (m, col_end - col_start))
    remote_mask = ~is_local
    halo, compact = torch.unique(col[remote_mask], sorted=True, return_inverse=True)
    remote = CSR(_rebuild(all_counts - local_counts, idx), compact.to(idx), block.values[remote_mask],
                 (m, halo.numel()))
    return local, remote, halo


def append_diagonal(a: CSR, fill: float) -> CSR:
    """``a + fill * I`` for a square block: one entry appended to the end of each row (an existing
    diagonal entry stays; repeated entries sum). O(nnz), no sort."""
    m, k = a.shape
    if m != k:
        raise ValueError(f"append_diagonal: expected a square block, got shape {a.shape}")
    crow = a.crow_indices.long()
    nnz = a.col_indices.numel()
    rows = entry_rows(crow, nnz)
    ar = torch.arange(m, device=crow.device)
    moved = torch.arange(nnz, device=crow.device) + rows          # entry e of row i shifts by i
    diag = crow[1:] + ar                                           # the last slot of row i
    col = torch.empty(nnz + m, dtype=a.col_indices.dtype, device=crow.device)
    col[moved] = a.col_indices
    col[diag] = ar.to(col.dtype)
    values = torch.empty(nnz + m, dtype=a.dtype, device=crow.device)
    values[moved] = a.values
    values[diag] = fill
    new_crow = (crow + torch.arange(m + 1, device=crow.device)).to(a.index_dtype)
    return CSR(new_crow, col, values, a.shape)


# --- the halo of a partition, off line ------------------------------------------------------------

def halo_counts(a: CSR, row_bounds: Sequence[int], col_bounds: Optional[Sequence[int]] = None,
                dense_fraction: Optional[float] = None) -> Dict[str, list]:
    """The halo of a row partition of the whole matrix ``a``, computed in one process (no group):
    what :class:`~sparsetorch.distributed.halo.HaloPlan` would give each part, without building it.

    Returns ``needed``: per part, the distinct columns outside its column block that its rows
    reference (the minimum rows of B any exchange of this partition must bring it); ``received``:
    the rows it receives under the plan's rule (a peer's whole block when it needs at least
    ``dense_fraction`` of it; default the plan's); ``pairs``: ``pairs[r][p]``, rows part r needs from
    part p; ``entries``, ``local_entries`` (those with a column in the part's own block: the product
    that overlaps the exchange) and ``rows`` per part. Bytes per product: rows x n x element size.
    ``col_bounds`` default: ``row_bounds`` for a square matrix, else an even split. One part at a
    time: the memory beyond ``a`` is one part's entries.
    """
    from sparsetorch.distributed.halo import DENSE_FRACTION, received_counts

    rows, cols = a.shape
    parts = len(row_bounds) - 1
    rb = check_bounds(row_bounds, rows, parts, "row_bounds")
    if col_bounds is None:
        col_bounds = rb if rows == cols else even_bounds(cols, parts)
    cb = check_bounds(col_bounds, cols, parts, "col_bounds")
    fraction = DENSE_FRACTION if dense_fraction is None else dense_fraction
    crow = a.crow_indices.long()
    starts = torch.tensor(cb[1:], dtype=torch.int64, device=crow.device)
    block_rows = [cb[p + 1] - cb[p] for p in range(parts)]
    out: Dict[str, list] = {"needed": [], "received": [], "pairs": [], "entries": [], "local_entries": [],
                            "rows": []}
    for r in range(parts):
        e0, e1 = int(crow[rb[r]]), int(crow[rb[r + 1]])
        col = a.col_indices[e0:e1].long()
        outside = (col < cb[r]) | (col >= cb[r + 1])
        remote = torch.unique(col[outside])
        local_entries = (e1 - e0) - int(outside.sum())
        del col, outside
        owners = torch.searchsorted(starts, remote, right=True)
        pair = torch.bincount(owners, minlength=parts).tolist()
        out["needed"].append(int(remote.numel()))
        out["received"].append(sum(received_counts(pair, block_rows, fraction)))
        out["pairs"].append(pair)
        out["entries"].append(e1 - e0)
        out["local_entries"].append(local_entries)
        out["rows"].append(rb[r + 1] - rb[r])
    return out

