"""The strip layout of A that SpmmPlan's "blocked" route multiplies (csrc/common/blocked_layout.h).

Rows are taken eight at a time (a strip), each strip as four pairs of rows. For every column where a
strip has an entry, one block holds the column and the values of the pairs with an entry there (a
zero for a pair's row without one; repeated columns summed); which pairs is the block's pattern.
Blocks are ordered by (tile of 16 strips, 64-column chunk, strip, pattern, column), so that a CUDA
thread block finds one chunk's blocks of its 128 rows in one contiguous span, and each warp runs the
blocks of one pattern with code made for it. Built once per plan on A's device (a sort of the
entries); the values are scattered again only when a call substitutes new ones.
"""
from __future__ import annotations

import torch

from sparsetorch._validate import validate_csr

# Must match csrc/common/blocked_layout.h (the op checks run_ptr's shape against them).
STRIP_ROWS = 8
STRIP_PAIRS = STRIP_ROWS // 2
PATTERNS = 2 ** STRIP_PAIRS
TILE_STRIPS = 16
CHUNK_COLS = 64


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class BlockedLayout:
    """A (one unbatched CSR matrix) in the strip layout: ``run_ptr`` ((2, runs + 1): each run's first
    block and first pair), ``block_col`` (int32) and ``pair_values(values)`` (float32, (pairs, 2));
    ``blocks`` and ``pairs`` are their counts."""

    def __init__(self, a):
        if a.crow_indices.dim() != 1 or a.values.dim() != 1:
            raise ValueError(f"backend 'blocked': expected one unbatched matrix A, got shape {a.shape}")
        validate_csr(a, force=False)  # the layout is built from the indices as they are: they must be in range
        m, k = a.shape
        device = a.crow_indices.device
        crow = a.crow_indices.long()
        nnz = int(crow[-1]) if m > 0 else 0
        rows = torch.repeat_interleave(torch.arange(m, device=device), torch.diff(crow), output_size=nnz)
        cols = a.col_indices[:nnz].long()
        keys, entry_block = torch.unique((rows // STRIP_ROWS) * k + cols, sorted=True, return_inverse=True)
        blocks = keys.numel()
        strip, col = keys // max(k, 1), keys % max(k, 1)
        entry_pair = (rows % STRIP_ROWS) // 2
        present = torch.zeros(blocks, STRIP_PAIRS, dtype=torch.bool, device=device)
        present[entry_block, entry_pair] = True
        pattern = (present.long() << torch.arange(STRIP_PAIRS, device=device)).sum(1)
        chunks, tiles = _ceil_div(k, CHUNK_COLS), _ceil_div(_ceil_div(m, STRIP_ROWS), TILE_STRIPS)
        runs = tiles * chunks * TILE_STRIPS * PATTERNS
        run = (((strip // TILE_STRIPS) * chunks + col // CHUNK_COLS) * TILE_STRIPS + strip % TILE_STRIPS) * PATTERNS \
            + pattern
        order = torch.argsort(run, stable=True)  # keys are sorted by (strip, column): columns stay in order
        position = torch.empty_like(order)
        position[order] = torch.arange(blocks, device=device)
        run_ptr = torch.zeros(2, runs + 1, dtype=torch.int64, device=device)
        torch.cumsum(torch.bincount(run, minlength=runs), 0, out=run_ptr[0, 1:])
        pairs_per_block = present.sum(1)
        pairs_per_run = torch.zeros(runs, dtype=torch.int64, device=device).index_add_(0, run, pairs_per_block)
        torch.cumsum(pairs_per_run, 0, out=run_ptr[1, 1:])
        present = present[order]
        pairs = int(pairs_per_block.sum())
        if max(blocks, pairs) >= 2**31:
            raise ValueError(f"backend 'blocked': A needs {blocks} blocks and {pairs} pairs; at most 2^31 - 1")
        # Pairs numbered in storage order: block after block, pairs of a block in ascending j.
        pair_id = (torch.cumsum(present.flatten().long(), 0) - 1).view(blocks, STRIP_PAIRS)
        self.shape = (m, k)
        self.nnz = nnz
        self.blocks = blocks
        self.pairs = pairs
        self.run_ptr = run_ptr.int()
        self.block_col = (col % CHUNK_COLS)[order].int()
        self._entry_pair = pair_id[position[entry_block], entry_pair]  # pair of each stored entry
        self._entry_row = rows % 2                                     # its row within the pair

    def pair_values(self, values: torch.Tensor) -> torch.Tensor:
        """The pairs' values for A's entries holding ``values`` (repeated columns summed)."""
        out = torch.zeros(self.pairs, 2, dtype=torch.float32, device=values.device)
        with torch.no_grad():
            out.index_put_((self._entry_pair, self._entry_row), values[:self.nnz].to(torch.float32), accumulate=True)
        return out

    @property
    def fill(self) -> float:
        """Stored entries per value stored (1.0: no zeros multiplied)."""
        return self.nnz / max(1, 2 * self.pairs)


def blocked_applies(a, b_dim: int) -> bool:
    """Whether the blocked route can take A and a B of b_dim dimensions: one unbatched float32 A, a 2-D B,
    and on a GPU the kernel's shared memory per block (an H100 or H200; spmm_route_unavailable, the one
    availability rule of the SpMM routes)."""
    if a.dtype != torch.float32 or a.crow_indices.dim() != 1 or a.values.dim() != 1 or b_dim != 2:
        return False
    if a.device.type == "cpu":
        return True
    return torch.ops.sparsetorch.spmm_route_unavailable("blocked", torch.float32, a.device) == ""
