// The rows of a (possibly batched) CSR pattern as the CPU kernels walk them: every row span checked
// once up front (IndexError naming the row), then the work split among threads by rows and entries
// together (merge path: Merrill & Garland, "Merge-based parallel sparse matrix-vector
// multiplication", SC'16), so that one row holding most of the entries is shared by all threads
// instead of serialising one of them.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
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
    at::parallel_for(0, checked * m, 16384, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const I* c = crow + (g / m) * crow_bstride;
        const int64_t r = g % m;
        check_row_span(c[r], c[r + 1], L, r, g / m);
      }
    });
    for (int64_t b = 0; b < batch; ++b) {
      const I* c = this->crow(b);
      offset_[b + 1] = offset_[b] + (m > 0 ? static_cast<int64_t>(c[m]) - c[0] : 0);
    }
  }

  int64_t rows() const { return batch_ * m_; }
  int64_t nnz() const { return offset_[batch_]; }
  int64_t m() const { return m_; }
  const I* crow(int64_t b) const { return crow_ + b * crow_bstride_; }
  // Global entry number of batch b's local slot j, and back.
  int64_t global(int64_t b, int64_t j) const { return offset_[b] + j - crow(b)[0]; }
  int64_t local(int64_t b, int64_t e) const { return crow(b)[0] + (e - offset_[b]); }
  int64_t row_begin(int64_t g) const { return global(g / m_, crow(g / m_)[g % m_]); }
  int64_t row_end(int64_t g) const { return global(g / m_, crow(g / m_)[g % m_ + 1]); }

 private:
  const I* crow_;
  int64_t crow_bstride_, m_, batch_;
  std::vector<int64_t> offset_;
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
template <typename I>
std::vector<PathPoint> split_path(const CsrRows<I>& rows, int64_t parts) {
  const int64_t R = rows.rows(), N = rows.nnz(), total = R + N;
  std::vector<PathPoint> cut(parts + 1);
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

// Calls f(piece) for the rows of the path between `from` and `to`, in order.
template <typename I, typename F>
void walk_path(const CsrRows<I>& rows, PathPoint from, PathPoint to, F&& f) {
  const int64_t m = rows.m();
  int64_t e = from.entry;
  for (int64_t g = from.row; g <= to.row && g < rows.rows(); ++g) {
    const bool ends = g < to.row;
    const int64_t stop = ends ? rows.row_end(g) : to.entry;
    if (!ends && e == stop) break;  // the next part starts this row
    const int64_t b = g / m;
    f(RowPiece{g, b, g % m, rows.local(b, e), rows.local(b, stop), e == rows.row_begin(g), ends});
    e = stop;
  }
}

// How many parts to cut `work` (multiply-adds, bytes, ...) into: one per thread, none smaller
// than min_work.
inline int64_t parts_for(double work, double min_work) {
  const int64_t threads = at::get_num_threads();
  return std::max<int64_t>(1, std::min<int64_t>(threads, static_cast<int64_t>(work / min_work)));
}

}  // namespace CPU_CAPABILITY
}  // namespace sparsetorch::cpu
