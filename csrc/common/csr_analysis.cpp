#include "common/csr_analysis.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "common/checks.h"
#include "common/csr_check_codes.h"
#include "common/native_caches.h"

namespace sparsetorch {

double CsrAnalysis::row_cv() const {
  const double n = static_cast<double>(rows());
  if (n <= 0 || entries() <= 0) return 0.0;
  double sum_sq;
  std::memcpy(&sum_sq, &raw[csr_stats::kSumSquares], sizeof(double));
  const double mean = static_cast<double>(entries()) / n;
  const double var = std::max(0.0, sum_sq / n - mean * mean);
  return std::sqrt(var) / mean;
}

double CsrAnalysis::share_in_rows_of_at_least(int64_t len) const {
  if (entries() <= 0) return 0.0;
  int64_t total = 0;
  for (int b = len <= 1 ? 0 : csr_stats::bin_of(len - 1) + 1; b < csr_stats::kHistBins; ++b) {
    total += raw[csr_stats::kEntryHist + b];
  }
  return static_cast<double>(total) / static_cast<double>(entries());
}

int64_t CsrAnalysis::rows_of_at_least(int64_t len) const {
  int64_t total = 0;
  for (int b = len <= 1 ? 0 : csr_stats::bin_of(len - 1) + 1; b < csr_stats::kHistBins; ++b) {
    total += raw[csr_stats::kRowHist + b];
  }
  return total;
}

std::string CsrAnalysis::defect(const char* what) const {
  const int64_t code = raw[csr_stats::kCode];
  if (code == kCsrOk) return "";
  const int64_t b = raw[csr_stats::kBatch], pos = raw[csr_stats::kPos], value = raw[csr_stats::kValue];
  std::ostringstream where, s;
  if (batched) {
    where << "[" << b << ", " << pos << "]";
  } else {
    where << "[" << pos << "]";
  }
  s << what << ": invalid CSR matrix (";
  if (batched) s << batch << " x ";
  s << m << " rows";
  if (ncols >= 0) s << ", " << ncols << " columns";
  s << "): ";
  switch (code) {
    case kCrowFirstNotZero:
      s << "crow_indices" << where.str() << " = " << value << ", expected 0 (the first row starts at entry 0)";
      break;
    case kCrowDecreasing:
      s << "crow_indices is not non-decreasing: crow_indices" << where.str() << " = " << value
        << " is less than the entry before it";
      break;
    case kCrowLastMismatch:
      if (batched) {
        s << "crow_indices" << where.str() << " = " << value << " exceeds the " << nnz_stride
          << " entries per batch of col_indices";
      } else {
        s << "crow_indices" << where.str() << " = " << value << ", expected nnz = " << nnz_stride
          << " (the length of col_indices)";
      }
      break;
    case kColOutOfRange:
      s << "col_indices" << where.str() << " = " << value << " is out of range for a matrix with " << ncols
        << " columns";
      break;
    default:
      s << "unknown defect code " << code;
  }
  return s.str();
}

namespace {

constexpr size_t kMaxEntries = 1024;
// A full cache is swept for the entries of dropped matrices at most once per this many inserts; between
// sweeps the least recently used entry makes room. A sweep visits every entry: when it ran on every insert
// into a cache full of live matrices, it was 24% of a first st.spmm call (2-core CPU, 500 x 500, 2000 entries).
constexpr size_t kSweepInterval = kMaxEntries / 8;

struct Key {
  const c10::StorageImpl* crow_storage;
  const c10::StorageImpl* col_storage;
  int64_t crow_offset, col_offset, ncols;
  // Per tensor: its dim, then size and stride per dimension (index tensors have 1 or 2 dimensions;
  // check_csr_components refuses more, and a key is made before that check, so more are cut short
  // and told apart by the dims). A fixed array: a key is made on every call, a heap vector cost a
  // malloc and a free each time.
  std::array<int64_t, 10> geometry{};
  at::ScalarType index_dtype;
  c10::Device device;

  bool operator==(const Key& o) const {
    return crow_storage == o.crow_storage && col_storage == o.col_storage && crow_offset == o.crow_offset &&
           col_offset == o.col_offset && ncols == o.ncols && geometry == o.geometry &&
           index_dtype == o.index_dtype && device == o.device;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<const void*>()(k.crow_storage);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(std::hash<const void*>()(k.col_storage));
    mix(static_cast<size_t>(k.crow_offset));
    mix(static_cast<size_t>(k.col_offset));
    mix(static_cast<size_t>(k.ncols));
    for (int64_t g : k.geometry) mix(static_cast<size_t>(g));
    return h;
  }
};

struct Entry {
  c10::weak_intrusive_ptr<c10::StorageImpl> crow_ref, col_ref;
  uint32_t crow_version, col_version;
  std::shared_ptr<const CsrAnalysis> analysis;
  std::list<Key>::iterator lru;  // position in the recency list (front: most recent)
};

class AnalysisCache {
 public:
  std::shared_ptr<const CsrAnalysis> find(const Key& key, const at::Tensor& crow, const at::Tensor& col) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    Entry& e = it->second;
    if (e.crow_ref.expired() || e.col_ref.expired() || e.crow_version != version(crow) ||
        e.col_version != version(col)) {
      erase(it);
      return nullptr;
    }
    order_.splice(order_.begin(), order_, e.lru);
    return e.analysis;
  }

  void insert(const Key& key, const at::Tensor& crow, const at::Tensor& col,
              std::shared_ptr<const CsrAnalysis> analysis) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it != map_.end()) erase(it);
    ++inserts_since_sweep_;
    if (map_.size() >= kMaxEntries) evict();
    order_.push_front(key);
    map_.emplace(key, Entry{crow.storage().getWeakStorageImpl(), col.storage().getWeakStorageImpl(), version(crow),
                            version(col), std::move(analysis), order_.begin()});
  }

  // Swaps a provisional analysis for its final one, if the entry still holds it.
  void replace(const Key& key, const CsrAnalysis* old, std::shared_ptr<const CsrAnalysis> analysis) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it != map_.end() && it->second.analysis.get() == old) it->second.analysis = std::move(analysis);
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    map_.clear();
    order_.clear();
    inserts_since_sweep_ = kSweepInterval;
  }

  int64_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(map_.size());
  }

  static uint32_t version(const at::Tensor& t) { return t.unsafeGetTensorImpl()->version_counter().current_version(); }

 private:
  void erase(std::unordered_map<Key, Entry, KeyHash>::iterator it) {
    order_.erase(it->second.lru);
    map_.erase(it);
  }

  // Makes room for one entry: drops every entry whose tensors are gone (at most once per kSweepInterval
  // inserts); if that frees nothing, the least recently used one.
  void evict() {
    if (inserts_since_sweep_ >= kSweepInterval) {
      inserts_since_sweep_ = 0;
      for (auto it = map_.begin(); it != map_.end();) {
        if (it->second.crow_ref.expired() || it->second.col_ref.expired()) {
          order_.erase(it->second.lru);
          it = map_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (map_.size() >= kMaxEntries) erase(map_.find(order_.back()));
  }

  std::mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> map_;
  std::list<Key> order_;
  size_t inserts_since_sweep_ = kSweepInterval;  // the first full cache is swept
};

AnalysisCache& cache() {
  static AnalysisCache* instance = new AnalysisCache();  // never destroyed: ops may run during shutdown
  return *instance;
}

Key make_key(const at::Tensor& crow, const at::Tensor& col, int64_t ncols) {
  std::array<int64_t, 10> geometry{};
  size_t i = 0;
  for (const at::Tensor* t : {&crow, &col}) {
    const int64_t dims = t->dim();
    geometry[i++] = dims;
    for (int64_t d = 0; d < std::min<int64_t>(dims, 2); ++d) {
      geometry[i++] = t->size(d);
      geometry[i++] = t->stride(d);
    }
  }
  return Key{crow.storage().unsafeGetStorageImpl(), col.storage().unsafeGetStorageImpl(), crow.storage_offset(),
             col.storage_offset(), ncols, geometry, crow.scalar_type(), crow.device()};
}

bool cacheable(const at::Tensor& crow, const at::Tensor& col) {
  return !crow.is_inference() && !col.is_inference() && crow.has_storage() && col.has_storage();
}

// The analysis of a matrix of shape s from its statistics (csr_stats::kLength values).
std::shared_ptr<CsrAnalysis> make_analysis(const CsrShape& s, int64_t ncols, const int64_t* raw) {
  auto a = std::make_shared<CsrAnalysis>();
  a->batch = s.batch;
  a->batched = s.batched;
  a->m = s.m;
  a->ncols = ncols;
  a->nnz_stride = s.nnz_stride;
  std::memcpy(a->raw.data(), raw, sizeof(int64_t) * csr_stats::kLength);
  return a;
}

std::shared_ptr<const CsrAnalysis> compute(const at::Tensor& crow, const at::Tensor& col, int64_t ncols) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("sparsetorch::csr_stats", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
  const CsrShape s = check_csr_components(crow, col, nullptr);
  const at::Tensor raw = op.call(crow, col, ncols).to(at::kCPU).contiguous();  // on CUDA: the one sync
  TORCH_INTERNAL_ASSERT(raw.numel() == csr_stats::kLength && raw.scalar_type() == at::kLong);
  return make_analysis(s, ncols, raw.data_ptr<int64_t>());
}

// --- checks in flight (PendingCheck) -----------------------------------------------------------

// Every check not yet known to be finished, so that a bad graph nobody multiplies is still reported.
struct PendingRegistry {
  std::mutex mutex;
  std::vector<std::shared_ptr<PendingCheck>> checks;
};

PendingRegistry& registry() {
  static PendingRegistry* instance = new PendingRegistry();
  return *instance;
}

// Checks in flight beyond this are waited for (oldest first): they hold their graphs' edge lists.
constexpr size_t kMaxPendingChecks = 64;

void report_once(const PendingCheck& check) {
  if (!const_cast<PendingCheck&>(check).reported.exchange(true)) check.raise_bad_edge();
}

// Statistics that send a matrix of unknown row lengths to the routes that do not depend on them: all
// entries in one row (skewed), so "auto" takes the balanced / split / cuSPARSE routes, never the
// row-per-group kernel, and a half-precision cuSPARSE product sums in float.
void provisional_stats(int64_t entries, std::array<int64_t, csr_stats::kLength>& raw) {
  raw.fill(0);
  raw[csr_stats::kEntries] = entries;
  raw[csr_stats::kMaxRow] = entries;
  const double squares = static_cast<double>(entries) * static_cast<double>(entries);
  std::memcpy(&raw[csr_stats::kSumSquares], &squares, sizeof(double));
  if (entries > 0) {
    raw[csr_stats::kRowHist + csr_stats::bin_of(entries)] = 1;
    raw[csr_stats::kEntryHist + csr_stats::bin_of(entries)] = entries;
  }
}

// The final analysis of a provisional one whose check completed without a bad index.
std::shared_ptr<const CsrAnalysis> finalize(const CsrAnalysis& a) {
  auto out = std::make_shared<CsrAnalysis>(a);  // the shape, and the buffers made from the pattern
  std::memcpy(out->raw.data(), a.pending->summary.data_ptr<int64_t>() + a.pending_offset,
              sizeof(int64_t) * csr_stats::kLength);
  out->pending = nullptr;
  out->pending_offset = 0;
  return out;
}

// A cached analysis, with a provisional one resolved if its check has completed (or, wait: once it has).
std::shared_ptr<const CsrAnalysis> resolve(const Key& key, std::shared_ptr<const CsrAnalysis> a, bool wait) {
  if (!a->provisional()) return a;
  const std::shared_ptr<PendingCheck> check = a->pending;
  const auto capturing = cuda_stream_capturing.load();
  if (capturing != nullptr && capturing()) return a;
  if (wait) {
    check->done.synchronize();
  } else if (!check->ready()) {
    return a;
  }
  if (check->first_bad_edge() >= 0) {  // the entry stays: every later use of the graph raises too
    check->reported = true;
    check->raise_bad_edge();
  }
  auto final_analysis = finalize(*a);
  cache().replace(key, a.get(), final_analysis);
  return final_analysis;
}

}  // namespace

std::atomic<bool (*)()> cuda_stream_capturing{nullptr};

int64_t PendingCheck::first_bad_edge() const {
  const int64_t code = summary.data_ptr<int64_t>()[0];
  return code == 0 ? -1 : edges - code;
}

void PendingCheck::raise_bad_edge() const {
  const int64_t e = first_bad_edge();
  const int64_t s = src[e].item<int64_t>(), d = dst[e].item<int64_t>();  // the error path: syncs are fine
  TORCH_CHECK_INDEX(false, what, ": edge ", e, " (source ", s, ", target ", d, ") is out of range for a graph of ",
                    n_src, " sources and ", n_dst, " targets (found by the graph's check on the GPU, which ran after "
                    "the graph was built: its matrix holds NaN values, so no product on it returned a number)");
}

void store_pending_csr_analysis(const at::Tensor& crow, const at::Tensor& col, int64_t ncols,
                                const std::shared_ptr<PendingCheck>& check, int64_t offset) {
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.checks.empty() || r.checks.back() != check) r.checks.push_back(check);
  }
  if (!cacheable(crow, col)) {
    // No lookup will find this pattern (inference tensors): the check is read now, so a bad index raises.
    check->done.synchronize();
    if (check->first_bad_edge() >= 0) report_once(*check);
    return;
  }
  const CsrShape s = check_csr_components(crow, col, nullptr);
  std::array<int64_t, csr_stats::kLength> stats;
  provisional_stats(s.nnz_stride, stats);
  auto a = make_analysis(s, ncols, stats.data());
  a->pending = check;
  a->pending_offset = offset;
  cache().insert(make_key(crow, col, ncols), crow, col, std::move(a));
}

void poll_pending_checks(bool wait) {
  std::vector<std::shared_ptr<PendingCheck>> finished;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const size_t must_wait = wait ? r.checks.size()
                                  : (r.checks.size() > kMaxPendingChecks ? r.checks.size() - kMaxPendingChecks : 0);
    for (size_t i = 0; i < must_wait; ++i) r.checks[i]->done.synchronize();
    std::vector<std::shared_ptr<PendingCheck>> still;
    for (auto& c : r.checks) (c->ready() ? finished : still).push_back(c);
    r.checks.swap(still);
  }
  // A clean check never reads its edges again: let them go (stale cache entries of dropped graphs may
  // hold the check until they are evicted).
  for (const auto& c : finished) {
    if (c->first_bad_edge() < 0) {
      c->src = at::Tensor();
      c->dst = at::Tensor();
    }
  }
  // One IndexError per call: checks still to report go back to the registry for the next poll.
  std::shared_ptr<PendingCheck> bad;
  std::vector<std::shared_ptr<PendingCheck>> later;
  for (const auto& c : finished) {
    if (c->first_bad_edge() < 0 || c->reported) continue;
    if (bad) {
      later.push_back(c);
    } else {
      bad = c;
    }
  }
  if (!later.empty()) {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.checks.insert(r.checks.begin(), later.begin(), later.end());
  }
  if (bad) report_once(*bad);
}

std::shared_ptr<const CsrAnalysis> analyze_csr(const at::Tensor& crow, const at::Tensor& col, int64_t ncols,
                                               AnalysisMode mode) {
  std::optional<Key> key;
  if (cacheable(crow, col)) key = make_key(crow, col, ncols);
  if (key && mode != AnalysisMode::kForce) {
    if (auto hit = cache().find(*key, crow, col)) return resolve(*key, std::move(hit), mode == AnalysisMode::kFinal);
  }
  if (mode == AnalysisMode::kLookup) return nullptr;
  auto analysis = compute(crow, col, ncols);
  if (key) cache().insert(*key, crow, col, analysis);
  return analysis;
}

std::shared_ptr<const CsrAnalysis> checked_csr(const at::Tensor& crow, const at::Tensor& col, int64_t ncols,
                                               bool validate, const char* what) {
  if (!validate) {
    // The caller vouches for the matrix: never an error from here; a verdict of "malformed" only means
    // the routes must treat it as unchecked.
    auto a = analyze_csr(crow, col, ncols, AnalysisMode::kLookup);
    return a && a->valid() ? a : nullptr;
  }
  auto a = analyze_csr(crow, col, ncols, AnalysisMode::kCompute);
  if (!a->valid()) TORCH_CHECK_VALUE(false, a->defect(what));
  return a;
}

void store_csr_analysis(const at::Tensor& crow, const at::Tensor& col, int64_t ncols, const at::Tensor& raw) {
  TORCH_CHECK(raw.device().is_cpu() && raw.scalar_type() == at::kLong && raw.dim() == 1 &&
                  raw.numel() == csr_stats::kLength,
              "store_csr_analysis: raw must be a CPU int64 vector of ", csr_stats::kLength, " values, got ",
              raw.sizes(), " ", raw.scalar_type(), " on ", raw.device());
  if (!cacheable(crow, col)) return;
  const CsrShape s = check_csr_components(crow, col, nullptr);
  const at::Tensor stats = raw.contiguous();
  cache().insert(make_key(crow, col, ncols), crow, col, make_analysis(s, ncols, stats.data_ptr<int64_t>()));
}

void clear_csr_analysis_cache() { cache().clear(); }

int64_t csr_analysis_cache_size() { return cache().size(); }

namespace {

// Forgets every check in flight: each is waited for first (its pinned summary is still being written), and
// a bad graph it would have reported is not (the graph's values are NaN, see PendingCheck). Under CUDA graph
// capture nothing is waited for, and the registry is left as it is.
void clear_pending_checks() {
  const auto capturing = cuda_stream_capturing.load();
  if (capturing != nullptr && capturing()) return;
  std::vector<std::shared_ptr<PendingCheck>> checks;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    checks.swap(r.checks);
  }
  for (const auto& c : checks) c->done.synchronize();
}

int64_t pending_checks_size() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return static_cast<int64_t>(r.checks.size());
}

const bool registered = native_caches::add("csr_analysis", clear_csr_analysis_cache, csr_analysis_cache_size) &&
                        native_caches::add("pending_checks", clear_pending_checks, pending_checks_size);

}  // namespace

}  // namespace sparsetorch
