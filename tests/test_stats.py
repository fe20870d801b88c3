"""sparsetorch/_stats.py: the row-statistics vector of the per-matrix analysis read by name, with the layout
that C++ defines (csr_stats::kFields through the csr_stats_layout op), field by field against the matrix."""
import numpy as np
import pytest
import torch

import sparsetorch as st
from sparsetorch import _stats
from _helpers import random_csr

ops = torch.ops.sparsetorch


def test_the_layout_covers_the_vector_in_order():
    offsets = [offset for offset, _ in _stats.FIELDS.values()]
    lengths = [length for _, length in _stats.FIELDS.values()]
    assert offsets == list(np.cumsum([0] + lengths[:-1]))
    assert _stats.LENGTH == sum(lengths) == ops.csr_stats(torch.tensor([0]), torch.tensor([], dtype=torch.long), 0).numel()
    assert {"code", "entries", "max_row", "empty_rows", "sum_sq", "row_hist", "entry_hist"} <= set(_stats.FIELDS)
    assert _stats.HIST_BINS == _stats.FIELDS["entry_hist"][1]


@pytest.mark.parametrize("lengths", [[], [0, 0], [3, 0, 1, 7, 1, 0, 64, 65, 1000], [1] * 50 + [4096]])
def test_named_fields_match_the_matrix(device, lengths):
    m, k = len(lengths), max(lengths + [1])
    rows = np.repeat(np.arange(m), lengths)
    cols = np.concatenate([np.arange(n) for n in lengths]) if rows.size else rows
    a = st.CSR(torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)).to(device),
               torch.from_numpy(cols.astype(np.int64)).to(device), torch.ones(rows.size, device=device), (m, k))
    native = _stats.RowStats(ops.csr_stats(a.crow_indices, a.col_indices, k))
    n = np.asarray(lengths, dtype=np.int64)
    assert native.valid and native.code == 0
    assert native.entries == n.sum() and native.max_row == (n.max() if m else 0) and native.empty_rows == (n == 0).sum()
    assert native.sum_sq == float((n.astype(np.float64) ** 2).sum())
    bins = np.minimum(np.floor(np.log2(np.maximum(n, 1))).astype(int), _stats.HIST_BINS - 1)
    assert native.row_hist == [int(((n > 0) & (bins == b)).sum()) for b in range(_stats.HIST_BINS)]
    assert native.entry_hist == [int(n[(n > 0) & (bins == b)].sum()) for b in range(_stats.HIST_BINS)]


def test_a_defect_is_named(rng):
    a = st.from_scipy(random_csr(rng, 6, 5, 0.5))
    col = a.col_indices.clone()
    col[2] = 9
    stats = _stats.RowStats(ops.csr_stats(a.crow_indices, col, 5))
    assert not stats.valid and stats.pos == 2 and stats.value == 9
    with pytest.raises(ValueError, match="raw: expected 72 statistics"):
        _stats.RowStats([0] * 5)


def test_analyze_reads_the_statistics_by_name(rng):
    a = random_csr(rng, 40, 30, 0.2, empty_rows=0.2)
    info = st.analyze(a)
    n = np.diff(a.indptr)
    assert info.entries == a.nnz and info.max_row == n.max() and info.empty_rows == (n == 0).sum()
    assert abs(info.row_cv - n.std() / n.mean()) < 1e-12
    assert sum(rows for rows, _ in info.row_histogram.values()) == (n > 0).sum()
