// The rows of a (possibly batched) CSR pattern as the CPU kernels walk them: every row span checked
// once up front (IndexError naming the row), then the work split among threads by rows and entries
// together (merge path: Merrill & Garland, "Merge-based parallel sparse matrix-vector
// multiplication", SC'16), so that one row holding most of the entries is shared by all threads
// instead of serialising one of them.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "common/checks.h"

namespace sparsetorch::cpu {
inline namespace CPU_CAPABILITY {

// Row g = b * m + r of batch b; entries numbered globally, batch b's after batch b - 1's (a batch
// holds crow[b, 0] .. crow[b, m] of its slots; one pattern may serve every batch: crow_bstride 0).
template <typename I>
class CsrRows {
 public:
  // Checks every row span (0 <= crow[b, r] <= crow[b, r + 1] <= L), so offsets never decrease.
  CsrRows(const I* crow, int64_t crow_bstride, int64_t m, int64_t batch, int64_t L)
      : crow_(crow), crow_bstride_(crow_bstride), m_(m), batch_(batch), offset_(batch + 1, 0) {
    const int64_t checked = crow_bstride == 0 ? std::min<int64_t>(batch, 1) : batch;
    at::parallel_for(0, checked, std::max<int64_t>(1, 65536 / std::max<int64_t>(m, 1)), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) check_spans(crow + b * crow_bstride, m, L, b);
    });
    for (int64_t b = 0; b < batch; ++b) {
      const I* c = this->crow(b);
      offset_[b + 1] = offset_[b] + (m > 0 ? static_cast<int64_t>(c[m]) - c[0] : 0);
    }
  }

  int64_t rows() const { return batch_ * m_; }
  int64_t offset(int64_t b) const { return offset_[b]; }  // global number of batch b's first entry
  int64_t nnz() const { return offset_[batch_]; }
  int64_t m() const { return m_; }
  const I* crow(int64_t b) const { return crow_ + b * crow_bstride_; }
  // Global entry number of batch b's local slot j, and back.
  int64_t global(int64_t b, int64_t j) const { return offset_[b] + j - crow(b)[0]; }
  int64_t local(int64_t b, int64_t e) const { return crow(b)[0] + (e - offset_[b]); }
  int64_t row_begin(int64_t g) const { return global(g / m_, crow(g / m_)[g % m_]); }
  int64_t row_end(int64_t g) const { return global(g / m_, crow(g / m_)[g % m_ + 1]); }

 private:
  // One batch: crow[0] >= 0, crow[m] <= L and no decrease, as a branch-free pass (vectorised); the
  // row-by-row check, which names the first bad row, only when that fails.
  static void check_spans(const I* c, int64_t m, int64_t L, int64_t b) {
    // (The flag in I, not bool: GCC vectorises an I-typed OR reduction, not a bool one.)
    I decreasing = 0;
    for (int64_t r = 0; r < m; ++r) decreasing |= static_cast<I>(c[r] > c[r + 1]);
    const bool bad = decreasing != 0 || (m > 0 && (c[0] < 0 || static_cast<int64_t>(c[m]) > L));
    if (C10_LIKELY(!bad)) return;
    for (int64_t r = 0; r < m; ++r) check_row_span(c[r], c[r + 1], L, r, b);
  }

  const I* crow_;
  int64_t crow_bstride_, m_, batch_;
  c10::SmallVector<int64_t, 8> offset_;
};

// A point on the merge path: `row` rows finished, `entry` entries (global numbering) consumed.
struct PathPoint {
  int64_t row = 0, entry = 0;
};

// One piece of a part's walk: entries [lo, hi) (local slots of batch b) of row r of batch b.
// `begins`: the piece starts at the row's first entry; `ends`: it finishes the row. A row that both
// begins and ends in one piece is whole; other rows are shared with neighbouring parts.
struct RowPiece {
  int64_t g, b, r, lo, hi;
  bool begins, ends;
};

// The merge path cut into `parts` pieces of equal rows + entries.
// (Held inline up to 16 threads: a call on a small matrix should not pay for heap allocations.)
using PathCuts = c10::SmallVector<PathPoint, 17>;

template <typename I>
PathCuts split_path(const CsrRows<I>& rows, int64_t parts) {
  const int64_t R = rows.rows(), N = rows.nnz(), total = R + N;
  PathCuts cut(parts + 1);
  for (int64_t t = 0; t <= parts; ++t) {
    const int64_t d = t == parts ? total : total / parts * t + total % parts * t / parts;
    // Rows finished at diagonal d: the first g whose end marker (at path index row_end(g) + g)
    // is not before d. row_end(g) + g increases strictly with g.
    int64_t lo = std::max<int64_t>(0, d - N), hi = std::min(d, R);
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (rows.row_end(mid) + mid < d) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    cut[t] = {lo, d - lo};
  }
  return cut;
}

// Calls f(piece) for the rows of the path between `from` and `to`, in order. Rows and batches are
// stepped incrementally (one division per call, not per row: short rows make this the hot path),
// and the walk is always inlined, so that it and f compile into the caller's loop.
template <typename I, typename F>
C10_ALWAYS_INLINE void walk_path(const CsrRows<I>& rows, PathPoint from, PathPoint to, F&& f) {
  const int64_t m = rows.m(), last = std::min(to.row, rows.rows() - 1);
  if (from.row > last) return;
  int64_t b = from.row / m, r = from.row % m;
  const I* crow = rows.crow(b);
  int64_t delta = static_cast<int64_t>(crow[0]) - rows.offset(b);  // local slot = global entry + delta
  int64_t lo = from.entry + delta;
  for (int64_t g = from.row; g <= last; ++g) {
    const bool ends = g < to.row;
    const int64_t stop = ends ? static_cast<int64_t>(crow[r + 1]) : to.entry + delta;
    if (!ends && lo == stop) break;  // the next part starts this row
    f(RowPiece{g, b, r, lo, stop, lo == crow[r], ends});
    lo = stop;
    if (++r == m && g < last) {
      r = 0;
      crow = rows.crow(++b);
      delta = static_cast<int64_t>(crow[0]) - rows.offset(b);
      lo = crow[0];
    }
  }
}

// As walk_path, but the rows this part holds whole go to whole(b, r0, r1, g0) in runs -- rows r0 .. r1 - 1
// of batch b, the first being global row g0, each spanning local slots crow[r] .. crow[r + 1] -- so that
// the caller loops over them with nothing but crow to read per row; only the (at most two) rows shared
// with the neighbouring parts go to piece(RowPiece), as walk_path would give them.
template <typename I, typename P, typename W>
C10_ALWAYS_INLINE void walk_path_runs(const CsrRows<I>& rows, PathPoint from, PathPoint to, P&& piece, W&& whole) {
  const int64_t m = rows.m(), R = rows.rows();
  int64_t g = from.row;
  if (g >= R || g > to.row) return;
  {
    const int64_t b = g / m, r = g % m;
    const I* crow = rows.crow(b);
    const int64_t begin = rows.global(b, crow[r]);
    if (g == to.row) {  // the part lies inside one row, which it does not finish
      const int64_t lo = rows.local(b, from.entry), hi = rows.local(b, to.entry);
      if (lo < hi) piece(RowPiece{g, b, r, lo, hi, from.entry == begin, false});
      return;
    }
    if (from.entry > begin) {  // a row begun by an earlier part, finished here
      piece(RowPiece{g, b, r, rows.local(b, from.entry), static_cast<int64_t>(crow[r + 1]), false, true});
      ++g;
    }
  }
  while (g < to.row) {
    const int64_t b = g / m, r0 = g % m, r1 = std::min(m, r0 + (to.row - g));
    whole(b, r0, r1, g);
    g += r1 - r0;
  }
  if (g < R) {  // a row begun here and finished by a later part
    const int64_t b = g / m, r = g % m;
    const int64_t lo = rows.crow(b)[r], hi = rows.local(b, to.entry);
    if (lo < hi) piece(RowPiece{g, b, r, lo, hi, true, false});
  }
}

// The first slot of [lo, hi) whose column is outside [0, k), or -1: min/max reductions (which
// compilers vectorise; never inlined, so also into callers compiled without the vectoriser), then a
// search only when one fails.
template <typename I>
C10_NOINLINE int64_t first_bad_column(const I* c, int64_t lo, int64_t hi, int64_t k) {
  I least = std::numeric_limits<I>::max(), most = std::numeric_limits<I>::lowest();
  for (int64_t j = lo; j < hi; ++j) {
    least = std::min(least, c[j]);
    most = std::max(most, c[j]);
  }
  if (C10_LIKELY(lo >= hi || (least >= 0 && static_cast<int64_t>(most) < k))) return -1;
  for (int64_t j = lo; j < hi; ++j) {
    if (c[j] < 0 || c[j] >= k) return j;
  }
  return -1;
}

// Checks the columns of the pieces a walk visits, ahead of their use, in chunks of kChunk slots:
// the kernel that then reads them finds them in cache, and its loops need no branch per entry (nor
// an error message's arguments kept in memory). Pieces must come in walk order.
template <typename I>
class ColumnCheck {
 public:
  static constexpr int64_t kChunk = 8192;

  ColumnCheck(const CsrRows<I>& rows, const I* col, int64_t col_bstride, int64_t k)
      : rows_(rows), col_(col), col_bstride_(col_bstride), k_(k) {}

  // (batch, slot) of an out-of-range column at or after the piece's first entry, or batch -1. The
  // piece's fields go by value: a reference would make the row loop store every piece to memory for
  // the rare call below (measured: ~5 ns per row on a short-row matrix).
  C10_ALWAYS_INLINE std::pair<int64_t, int64_t> check(const RowPiece& p) { return check(p.b, p.lo, p.hi); }
  // The same for slots [lo, hi) of batch b.
  C10_ALWAYS_INLINE std::pair<int64_t, int64_t> check(int64_t b, int64_t lo, int64_t hi) {
    if (C10_LIKELY(b == b_ && hi <= until_)) return {-1, 0};
    return extend(b, lo, hi);
  }

 private:
  C10_NOINLINE std::pair<int64_t, int64_t> extend(int64_t b, int64_t lo, int64_t hi) {
    if (b != b_) {
      b_ = b;
      until_ = lo;
    }
    const int64_t end = std::max(hi, std::min(until_ + kChunk, static_cast<int64_t>(rows_.crow(b_)[rows_.m()])));
    const int64_t bad = first_bad_column(col_ + b_ * col_bstride_, std::max(until_, lo), end, k_);
    until_ = end;
    return {bad >= 0 ? b_ : -1, bad};
  }

  const CsrRows<I>& rows_;
  const I* col_;
  int64_t col_bstride_, k_, b_ = -1, until_ = 0;
};

// How many parts to cut `work` (multiply-adds, bytes, ...) into: one per thread, none smaller
// than min_work.
inline int64_t parts_for(double work, double min_work) {
  const int64_t threads = at::get_num_threads();
  return std::max<int64_t>(1, std::min<int64_t>(threads, static_cast<int64_t>(work / min_work)));
}

}  // namespace CPU_CAPABILITY
}  // namespace sparsetorch::cpu
