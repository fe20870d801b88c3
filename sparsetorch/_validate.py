"""CSR validation, on by default: every op that takes a sparse matrix checks it on its first use.

The check (one O(nnz) pass on the matrix's own device; on CUDA a kernel that writes an error code,
never a device assert, and one small device-to-host read) runs in C++ and its verdict is cached with
the matrix's analysis, keyed on the index tensors and their in-place version counters
(csrc/common/csr_analysis.h): later calls with the same, unmodified matrix pay a dictionary lookup.
This module is the Python side: the explicit check and the one the Python-level entry points run.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from sparsetorch._ops import ops
from sparsetorch._stats import RowStats
from sparsetorch.csr import CSR, as_csr

__all__ = ["validate_csr", "ensure_valid", "MatrixInfo", "analyze"]


def validate_csr(a: Any, force: bool = True) -> None:
    """Raise ValueError naming the first defect if ``a`` is not a well-formed CSR matrix of its shape.

    ``a`` is anything :func:`sparsetorch.as_csr` takes (an st.CSR, a torch sparse CSR tensor, a
    scipy.sparse matrix, a ``(crow_indices, col_indices, values, shape)`` tuple, a list of 2-D
    matrices). Checks: ``crow_indices[..., 0] == 0``; ``crow_indices`` non-decreasing; ``crow_indices[-1] ==
    nnz`` (unbatched) or ``<= L`` (batched); every stored column in ``[0, k)``. ``force`` (default)
    re-checks even if the matrix's verdict is cached; ``force=False`` uses the cache.
    """
    if type(a) is not CSR:
        a = as_csr(a)
    ops.csr_validate(a.crow_indices, a.col_indices, a.shape[-1], bool(force))


def ensure_valid(a: CSR, validate: Optional[bool] = None) -> None:
    """The check of the Python-level entry points: ``None`` (default) checks once per pattern (cached),
    ``True`` re-checks, ``False`` trusts the caller. Skipped while torch.compile traces: the compiled
    ops check at run time."""
    if validate is False or torch.compiler.is_compiling():
        return
    ops.csr_validate(a.crow_indices, a.col_indices, a.shape[-1], validate is True)


class MatrixInfo:
    """What the per-matrix analysis found (``st.analyze(A)``): validity and the row-length
    distribution that the routing decision reads (sparsetorch/_stats.py names its fields)."""

    def __init__(self, a: CSR, raw: torch.Tensor):
        stats = RowStats(raw)
        self.shape = a.shape
        self.valid = stats.valid
        self.rows = (a.crow_indices.shape[0] if a.crow_indices.dim() == 2 else 1) * (a.shape[-2])
        self.entries, self.max_row, self.empty_rows = stats.entries, stats.max_row, stats.empty_rows
        self.mean_row = self.entries / self.rows if self.rows else 0.0
        var = max(0.0, stats.sum_sq / self.rows - self.mean_row**2) if self.rows else 0.0
        self.row_cv = var**0.5 / self.mean_row if self.mean_row else 0.0
        self.row_histogram = {2**i: (rows, entries) for i, (rows, entries)
                              in enumerate(zip(stats.row_hist, stats.entry_hist)) if rows}
        m, k = a.shape[-2:]
        self.density = self.entries / max(1, self.rows * k)

    def share_in_rows_of_at_least(self, length: int) -> float:
        """Fraction of the entries held by rows of at least ``length`` entries (rounded up to a power of 2)."""
        total = sum(e for start, (_, e) in self.row_histogram.items() if start >= length)
        return total / self.entries if self.entries else 0.0

    def __repr__(self) -> str:
        return (f"MatrixInfo(shape={self.shape}, valid={self.valid}, entries={self.entries}, "
                f"mean_row={self.mean_row:.3g}, max_row={self.max_row}, row_cv={self.row_cv:.3g}, "
                f"empty_rows={self.empty_rows}, density={self.density:.3g})")


def analyze(a: CSR, force: bool = False) -> MatrixInfo:
    """The cached analysis of ``a`` (computed now if the matrix was not analysed before)."""
    return MatrixInfo(a, ops.csr_analysis(a.crow_indices, a.col_indices, a.shape[-1], bool(force)))
