"""The row statistics of a CSR pattern, read by name.

The per-matrix analysis (csrc/common/csr_analysis.h) describes a pattern by one int64 vector: its first
defect (``code``: 0 when valid, then ``batch``, ``pos`` and ``value`` say where and what) and its
row-length distribution (``entries``, ``max_row``, ``empty_rows``, ``sum_sq`` -- the sum of squared row
lengths, the bits of a double -- and per power-of-two bin of row length, ``row_hist`` rows and
``entry_hist`` entries: bin i holds the rows of length in [2^i, 2^(i+1)), the last bin is open). The layout
is defined once, in C++ (``csr_stats::kFields``); this module reads it from the ``csr_stats_layout`` op when
imported, so that no Python code indexes the vector by number.

Also here, for the fake kernel of the fresh-graph builder's op (_ops.py): the builder's summary layout and
its index dtype rule (csrc/common/graph_build.h), low enough for every module to import.
"""
from __future__ import annotations

import struct
from typing import Dict, Tuple

import torch

from sparsetorch import _C  # noqa: F401  (defines torch.ops.sparsetorch.*)

__all__ = ["FIELDS", "LENGTH", "HIST_BINS", "GRAPH_SUMMARY_LENGTH", "RowStats", "graph_index_dtype"]


def _layout() -> Dict[str, Tuple[int, int]]:
    names, offsets, lengths = torch.ops.sparsetorch.csr_stats_layout()
    return {name: (int(offset), int(length)) for name, offset, length in zip(names, offsets, lengths)}


# name -> (offset, length), in the vector's order.
FIELDS: Dict[str, Tuple[int, int]] = _layout()
LENGTH: int = sum(length for _, length in FIELDS.values())
HIST_BINS: int = FIELDS["row_hist"][1]

# The fresh-graph builder's summary (the last output of torch.ops.sparsetorch._build_graph, on the CPU): the
# first bad edge counted from the end (0: none), then the statistics of A, then those of A^T.
GRAPH_SUMMARY_LENGTH: int = 1 + 2 * LENGTH


class RowStats:
    """One statistics vector, by field name. Scalars are ints (``sum_sq`` a float), the histograms lists
    of ``HIST_BINS`` ints."""

    __slots__ = tuple(FIELDS)

    def __init__(self, raw):
        values = raw.tolist() if isinstance(raw, torch.Tensor) else list(raw)
        if len(values) != LENGTH:
            raise ValueError(f"raw: expected {LENGTH} statistics, got {len(values)}")
        for name, (offset, length) in FIELDS.items():
            setattr(self, name, values[offset] if length == 1 else values[offset:offset + length])
        self.sum_sq = struct.unpack("<d", struct.pack("<q", self.sum_sq))[0]  # the bits of a double

    @property
    def valid(self) -> bool:
        return self.code == 0


def graph_index_dtype(n_src: int, n_dst: int, entries: int) -> torch.dtype:
    """The index dtype of the fresh-graph builder's matrices (common/graph_build.cpp): int32 while the
    counts and row pointers, which reach ``entries``, fit."""
    return torch.int32 if max(n_src, n_dst, entries) < 2**31 - 2 else torch.int64
