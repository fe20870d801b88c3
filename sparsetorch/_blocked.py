"""The 4-row blocked layout of A that SpmmPlan's "blocked" route multiplies (csrc/common/blocked_layout.h).

Rows are taken four at a time; for every column where any of the four has an entry, one block holds
their four values (zeros for the rows without one, repeated columns summed). Blocks are ordered by
(tile of 32 groups, 64-column chunk, group, column), so that a CUDA thread block finds one chunk's
blocks of its 128 rows in one contiguous span. Built once per plan on A's device (a sort of the
entries); the values are scattered again only when a call substitutes new ones.
"""
from __future__ import annotations

import torch

from sparsetorch._validate import validate_csr

# Must match csrc/common/blocked_layout.h (the op checks tile_ptr's length against them).
BLOCK_ROWS = 4
TILE_GROUPS = 32
CHUNK_COLS = 64
# Dynamic shared memory the CUDA kernel needs per thread block (csrc/cuda/spmm_blocked.cu, kSharedBytes).
SHARED_BYTES = 2 * (CHUNK_COLS * 256 * 4 + TILE_GROUPS * CHUNK_COLS * 20 + (TILE_GROUPS + 1) * 4)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class BlockedLayout:
    """A (one unbatched CSR matrix) in the blocked layout: ``tile_ptr``, ``block_col`` (int32) and
    ``block_values(values)`` (float32, (blocks, 4)); ``blocks`` is their count."""

    def __init__(self, a):
        if a.crow_indices.dim() != 1 or a.values.dim() != 1:
            raise ValueError(f"backend 'blocked': expected one unbatched matrix A, got shape {a.shape}")
        validate_csr(a)  # the layout is built from the indices as they are: they must be in range
        m, k = a.shape
        device = a.crow_indices.device
        crow = a.crow_indices.long()
        nnz = int(crow[-1]) if m > 0 else 0
        rows = torch.repeat_interleave(torch.arange(m, device=device), torch.diff(crow), output_size=nnz)
        cols = a.col_indices[:nnz].long()
        group = rows // BLOCK_ROWS
        keys, inverse = torch.unique(group * k + cols, sorted=True, return_inverse=True)
        block_group, block_col = keys // max(k, 1), keys % max(k, 1)
        chunks, tiles = _ceil_div(k, CHUNK_COLS), _ceil_div(_ceil_div(m, BLOCK_ROWS), TILE_GROUPS)
        slot = ((block_group // TILE_GROUPS) * chunks + block_col // CHUNK_COLS) * TILE_GROUPS + block_group % TILE_GROUPS
        order = torch.argsort(slot, stable=True)  # keys are sorted by (group, column): columns stay in order
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel(), device=device)
        tile_ptr = torch.zeros(tiles * chunks * TILE_GROUPS + 1, dtype=torch.int64, device=device)
        torch.cumsum(torch.bincount(slot, minlength=tiles * chunks * TILE_GROUPS), 0, out=tile_ptr[1:])
        if keys.numel() >= 2**31:
            raise ValueError(f"backend 'blocked': A needs {keys.numel()} blocks; at most 2^31 - 1")
        self.shape = (m, k)
        self.nnz = nnz
        self.blocks = keys.numel()
        self.tile_ptr = tile_ptr.int()
        self.block_col = (block_col % CHUNK_COLS)[order].int()
        self._entry_block = position[inverse]  # block of each stored entry
        self._entry_row = rows % BLOCK_ROWS      # its row within the block

    def block_values(self, values: torch.Tensor) -> torch.Tensor:
        """The blocks' values for A's entries holding ``values`` (repeated columns summed)."""
        out = torch.zeros(self.blocks, BLOCK_ROWS, dtype=torch.float32, device=values.device)
        with torch.no_grad():
            out.index_put_((self._entry_block, self._entry_row), values[:self.nnz].to(torch.float32),
                           accumulate=True)
        return out

    @property
    def fill(self) -> float:
        """Stored entries per block position (1.0: no zeros multiplied)."""
        return self.nnz / max(1, BLOCK_ROWS * self.blocks)


def blocked_applies(a, b_dim: int) -> bool:
    """Whether the blocked route can take A and a B of b_dim dimensions: one unbatched float32 A on
    a GPU with the kernel's shared memory (Hopper), a 2-D B."""
    if a.dtype != torch.float32 or a.crow_indices.dim() != 1 or a.values.dim() != 1 or b_dim != 2:
        return False
    if a.device.type == "cpu":
        return True
    props = torch.cuda.get_device_properties(a.device)
    optin = getattr(props, "shared_memory_per_block_optin", SHARED_BYTES if props.major >= 9 else 0)
    return props.major >= 8 and optin >= SHARED_BYTES
