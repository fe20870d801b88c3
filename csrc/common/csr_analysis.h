// The per-matrix analysis: one O(nnz) pass over a CSR pattern on its own device (validity and the
// row-length distribution), made once per pattern and cached, so that every op can validate its
// sparse operand by default and route on the matrix's shape without paying for it again.
//
// Why the cache lives here (in C++, keyed on the index tensors) and not in a Python object: every
// path that takes a sparse matrix -- st.spmm, plans, layers, autograd's backward, torch.compile'd
// graphs, direct torch.ops.sparsetorch calls -- goes through an op, so the op is the one place that
// sees them all. docs/routing.md explains the choice.
//
// Cache key: the storages of crow_indices and col_indices (held by weak reference, so a freed
// storage can never be mistaken for a new one), their offsets, sizes, strides, dtype and device,
// and the number of columns checked against. An entry is valid while both tensors' in-place
// version counters are unchanged: an in-place write through them (or any view sharing their
// version counter) is noticed. Inference tensors have no version counter and are never cached.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace sparsetorch {

// Layout of the int64 vector the csr_stats op returns, on CPU and CUDA alike.
namespace csr_stats {
constexpr int kCode = 0;      // first defect, a CsrCheckCode (0: valid), in the CPU scan order
constexpr int kBatch = 1;     // where it is: batch,
constexpr int kPos = 2;       // position in crow_indices or col_indices,
constexpr int kValue = 3;     // and the offending value
constexpr int kEntries = 4;   // stored entries, summed over batches (row spans clamped to the arrays)
constexpr int kMaxRow = 5;    // the longest row
constexpr int kEmptyRows = 6;
constexpr int kSumSquares = 7;  // sum of squared row lengths, the bits of a double
constexpr int kHistBins = 32;   // bin i: rows of length in [2^i, 2^(i+1)); the last bin is open
constexpr int kRowHist = 8;                       // rows per bin
constexpr int kEntryHist = kRowHist + kHistBins;  // entries in the rows of each bin
constexpr int kLength = kEntryHist + kHistBins;

// The layout by name: the one definition that Python reads the vector by (the csr_stats_layout op,
// sparsetorch/_stats.py). Every entry is an int64 except sum_sq, the bits of a double.
struct Field {
  const char* name;
  int offset;
  int length;
};
inline constexpr Field kFields[] = {
    {"code", kCode, 1},         {"batch", kBatch, 1},          {"pos", kPos, 1},
    {"value", kValue, 1},       {"entries", kEntries, 1},      {"max_row", kMaxRow, 1},
    {"empty_rows", kEmptyRows, 1}, {"sum_sq", kSumSquares, 1}, {"row_hist", kRowHist, kHistBins},
    {"entry_hist", kEntryHist, kHistBins},
};
constexpr bool covers_every_entry() {  // in order, no gaps, up to kLength
  int next = 0;
  for (const Field& f : kFields) {
    if (f.offset != next) return false;
    next += f.length;
  }
  return next == kLength;
}
static_assert(covers_every_entry(), "csr_stats::kFields must list every entry of the vector, in order");

// The bin of a row of length len >= 1.
inline int bin_of(int64_t len) {
  int b = 63 - __builtin_clzll(static_cast<unsigned long long>(len));
  return b < kHistBins ? b : kHistBins - 1;
}
// Row-length statistics accumulated row by row (a thread's share), merged, then written into a
// csr_stats vector's [kEntries, kLength) (the defect fields are left alone).
struct RowStats {
  int64_t entries = 0, max_row = 0, empty = 0;
  double sum_sq = 0.0;
  int64_t rows_hist[kHistBins] = {}, entries_hist[kHistBins] = {};

  void add(int64_t len) {
    entries += len;
    max_row = len > max_row ? len : max_row;
    sum_sq += static_cast<double>(len) * static_cast<double>(len);
    if (len == 0) {
      ++empty;
      return;
    }
    const int b = bin_of(len);
    ++rows_hist[b];
    entries_hist[b] += len;
  }
  void merge(const RowStats& o) {
    entries += o.entries;
    max_row = o.max_row > max_row ? o.max_row : max_row;
    empty += o.empty;
    sum_sq += o.sum_sq;
    for (int b = 0; b < kHistBins; ++b) {
      rows_hist[b] += o.rows_hist[b];
      entries_hist[b] += o.entries_hist[b];
    }
  }
  void write(int64_t* out) const {
    out[kEntries] = entries;
    out[kMaxRow] = max_row;
    out[kEmptyRows] = empty;
    std::memcpy(&out[kSumSquares], &sum_sq, sizeof(double));
    for (int b = 0; b < kHistBins; ++b) {
      out[kRowHist + b] = rows_hist[b];
      out[kEntryHist + b] = entries_hist[b];
    }
  }
};
}  // namespace csr_stats

// A check whose result arrives later: the fresh-graph builder's on CUDA (common/graph_build.h) copies
// its summary (the first out-of-range edge, both matrices' statistics) to pinned host memory behind an
// event instead of waiting for the GPU. Until the event has completed, the two matrices' analyses are
// provisional (valid by construction, statistics unknown: routed as if skewed, never tuned); the first
// lookup after it completes replaces them with the real ones, or raises IndexError for a bad index
// (the builder made every value NaN then, so no product on the graph returned a wrong number).
struct PendingCheck {
  at::Tensor summary;  // pinned CPU int64: [edges - first bad edge (0: none), stats of A, stats of A^T]
  c10::Event done{c10::DeviceType::CUDA};
  at::Tensor src, dst;  // the edges, read only to name a bad one; released once the check is found clean
  int64_t edges = 0, n_src = 0, n_dst = 0;
  std::string what;
  std::atomic<bool> reported{false};  // its IndexError was raised once

  bool ready() const { return done.query(); }
  int64_t first_bad_edge() const;  // -1: none (call when ready)
  [[noreturn]] void raise_bad_edge() const;
};

struct CsrAnalysis {
  int64_t batch = 1;        // pattern batches (1 for one pattern shared by every batch)
  bool batched = false;     // crow_indices is 2-D
  int64_t m = 0;            // rows per batch
  int64_t ncols = 0;        // columns checked against (< 0: columns were not checked)
  int64_t nnz_stride = 0;   // L: slots per batch of col_indices
  std::array<int64_t, csr_stats::kLength> raw{};

  bool valid() const { return raw[csr_stats::kCode] == 0; }
  int64_t rows() const { return batch * m; }
  int64_t entries() const { return raw[csr_stats::kEntries]; }
  int64_t max_row() const { return raw[csr_stats::kMaxRow]; }
  int64_t empty_rows() const { return raw[csr_stats::kEmptyRows]; }
  double mean_row() const { return rows() > 0 ? static_cast<double>(entries()) / static_cast<double>(rows()) : 0.0; }
  // Coefficient of variation (std / mean) of the row lengths: 0 for uniform rows, > 1 when skewed.
  double row_cv() const;
  // Fraction of all entries held by rows of at least `len` entries (len rounded up to a power of 2).
  double share_in_rows_of_at_least(int64_t len) const;
  // Rows of at least `len` entries (len rounded up to a power of 2).
  int64_t rows_of_at_least(int64_t len) const;
  // The defect of an invalid matrix, as the message of the ValueError ops raise ("" when valid).
  std::string defect(const char* what) const;

  // Set while the pattern's check is in flight (PendingCheck): `raw` holds provisional statistics, and
  // the real ones sit at pending->summary[pending_offset ...] once it completes.
  std::shared_ptr<PendingCheck> pending;
  int64_t pending_offset = 0;
  bool provisional() const { return pending != nullptr; }

  // Device buffers a route makes from the pattern alone (the split route's unit plan, spmm_split.cu),
  // keyed by the route's parameters; kept with the analysis, so dropped with it (an in-place change of the
  // indices, a freed matrix). Tuned routes live apart, keyed by the matrix's signature (spmm_tuning.h).
  struct Derived {
    std::mutex mutex;
    std::map<std::vector<int64_t>, at::Tensor> buffers;
  };
  std::shared_ptr<Derived> derived = std::make_shared<Derived>();
};

enum class AnalysisMode {
  kLookup,   // only the cache: nullptr when the matrix was not analysed (no device work, no sync)
  kCompute,  // from the cache, else analysed now (one O(nnz) pass and, on CUDA, one sync) and cached
  kForce,    // analysed now whatever the cache holds (validate=True)
  kFinal,    // as kCompute, but a provisional analysis waits for its check (st.analyze: the real statistics)
};

// The analysis of the pattern (crow, col) against ncols columns (ncols < 0: columns unchecked).
// Thread-safe. Under CUDA graph capture a matrix not analysed before cannot be analysed (a sync):
// kCompute then raises a RuntimeError saying to call once before capturing or to pass validate=False.
std::shared_ptr<const CsrAnalysis> analyze_csr(const at::Tensor& crow, const at::Tensor& col, int64_t ncols,
                                               AnalysisMode mode);

// What every op that takes a sparse matrix runs first. validate=true: the matrix is analysed once
// per pattern and a malformed one raises ValueError naming the defect; validate=false: the caller
// vouches for the matrix, nothing is raised and only the cache is consulted (nullptr unless it holds a
// valid verdict: the caller then gets the routes for an unchecked matrix). `what` names the op.
std::shared_ptr<const CsrAnalysis> checked_csr(const at::Tensor& crow, const at::Tensor& col, int64_t ncols,
                                               bool validate, const char* what);

// Records the analysis of a pattern whose statistics the caller computed while building it (the
// fresh-graph builder on the CPU, and its torch-op path for differentiable weights: they know every row
// length from their own counts). `raw` is the csr_stats vector (kLength int64 values,
// on the CPU); the pattern must be valid by construction and is not checked again. Later ops find
// the entry as if analyze_csr had computed it. Nothing is stored for tensors that cannot be cached.
void store_csr_analysis(const at::Tensor& crow, const at::Tensor& col, int64_t ncols, const at::Tensor& raw);

// Set by the CUDA build (graph_build_cuda.cu): whether the current CUDA stream is capturing a graph. A
// check in flight is not queried then (an event query is illegal during capture): the analysis stays
// provisional until a lookup outside the capture.
extern std::atomic<bool (*)()> cuda_stream_capturing;

// Records the fresh-graph builder's pattern with its check in flight (see PendingCheck): a provisional
// analysis now, its statistics at check->summary[offset ...] once the check's event has completed.
void store_pending_csr_analysis(const at::Tensor& crow, const at::Tensor& col, int64_t ncols,
                                const std::shared_ptr<PendingCheck>& check, int64_t offset);

// Raises the IndexError of every completed check that found a bad index and has not raised yet
// (the builder calls it for each new graph, so a bad graph is reported by the next one at the latest);
// wait=true waits for every check in flight first. Drops completed checks.
void poll_pending_checks(bool wait);

void clear_csr_analysis_cache();
int64_t csr_analysis_cache_size();

}  // namespace sparsetorch
