// csr_stats on the CPU: the O(nnz) validity check and row-length statistics of a CSR pattern
// (layout in common/csr_analysis.h). Rows and entries are split among threads; each thread keeps
// its own partial statistics and first defect, merged in a fixed order.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>

#include "common/checks.h"
#include "common/csr_analysis.h"
#include "common/csr_check_codes.h"

namespace sparsetorch {
namespace {

namespace cs = csr_stats;

// A defect with its position in the CPU scan order (batch, then crow before columns, then position),
// so that the first one found by any thread is the one a serial scan would report.
struct Defect {
  int64_t batch = std::numeric_limits<int64_t>::max(), phase = 0, pos = 0, code = kCsrOk, value = 0;
  bool before(const Defect& o) const {
    if (batch != o.batch) return batch < o.batch;
    if (phase != o.phase) return phase < o.phase;
    return pos < o.pos;
  }
};

template <typename index_t>
void analyse(const index_t* crow, const index_t* col, const CsrShape& s, int64_t ncols, int64_t* out) {
  const int64_t m = s.m, L = s.nnz_stride, batches = s.batch;
  const bool exact_nnz = !s.batched;
  std::mutex mutex;
  Defect first;
  cs::RowStats total;
  auto report = [&](const Defect& d) {
    std::lock_guard<std::mutex> lock(mutex);
    if (d.before(first)) first = d;
  };
  // Rows: spans, monotonicity, crow[0] and crow[m].
  at::parallel_for(0, batches * m + batches, 1 << 14, [&](int64_t begin, int64_t end) {
    cs::RowStats local;
    Defect found;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / (m + 1), r = i - b * (m + 1);
      const index_t* c = crow + b * (m + 1);
      Defect d;
      if (r == 0 && c[0] != 0) d = Defect{b, 0, 0, kCrowFirstNotZero, c[0]};
      if (r > 0 && c[r] < c[r - 1]) d = Defect{b, 0, r, kCrowDecreasing, c[r]};
      if (r == m && (exact_nnz ? c[m] != L : c[m] > L) && d.code == kCsrOk) d = Defect{b, 1, m, kCrowLastMismatch, c[m]};
      if (d.code != kCsrOk && d.before(found)) found = d;
      if (r < m) {
        const int64_t start = std::min<int64_t>(std::max<int64_t>(c[r], 0), L);
        const int64_t stop = std::min<int64_t>(std::max<int64_t>(c[r + 1], start), L);
        local.add(stop - start);
      }
    }
    if (found.code != kCsrOk) report(found);
    std::lock_guard<std::mutex> lock(mutex);
    total.merge(local);
  });
  // Columns of every stored entry (slots before crow[b, m]).
  if (ncols >= 0 && L > 0) {
    at::parallel_for(0, batches * L, 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / L, j = i - b * L;
        const int64_t stored = std::min<int64_t>(std::max<int64_t>(crow[b * (m + 1) + m], 0), L);
        if (j < stored && (col[i] < 0 || col[i] >= ncols)) {
          report(Defect{b, 2, j, kColOutOfRange, col[i]});
          return;  // later entries of this chunk come after it in the scan order
        }
      }
    });
  }
  if (first.code != kCsrOk) {
    out[cs::kCode] = first.code;
    out[cs::kBatch] = first.batch;
    out[cs::kPos] = first.pos;
    out[cs::kValue] = first.value;
  }
  total.write(out);
}

at::Tensor csr_stats_cpu(const at::Tensor& crow_in, const at::Tensor& col_in, int64_t ncols) {
  const CsrShape s = check_csr_components(crow_in, col_in, nullptr);
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  at::Tensor result = at::zeros({cs::kLength}, crow.options().dtype(at::kLong));
  AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_stats_cpu", [&] {
    analyse<index_t>(crow.data_ptr<index_t>(), col.data_ptr<index_t>(), s, ncols, result.data_ptr<int64_t>());
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("csr_stats", &csr_stats_cpu); }

}  // namespace sparsetorch
