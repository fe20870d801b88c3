#include "common/spmm_routing.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace sparsetorch {

#ifdef SPARSETORCH_WITH_CUDA
namespace cuda {
// spmm_cuda.cu: the device's limits and the loaded code (cuda/spmm_plans.h's route_limits_unmet).
std::string spmm_route_unavailable_cuda(SpmmBackend route, at::ScalarType dtype, c10::DeviceIndex device);
}
#endif

std::string spmm_route_unavailable(SpmmBackend route, at::ScalarType dtype, const c10::Device& device) {
  if (!device.is_cuda()) return "";
#ifdef SPARSETORCH_WITH_CUDA
  return cuda::spmm_route_unavailable_cuda(route, dtype, device.index());
#else
  return "this build of sparsetorch has no CUDA code";
#endif
}

namespace {

bool is_half(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// --- measured thresholds (docs/routing.md has the tables they come from) ----------------------

// Densify (A expanded on the GPU + one cuBLAS GEMM) above a density that falls with the width of B.
// H200, uniform 4096 x 4096 (`python -m benchmarks --suites density`; docs/history.md): densify over the best
// sparse route crosses 1.0x at about 3.5% / 2% / 1% (bf16, fp16) at n = 64 / 256 / 1024, 17% / 12% / 10%
// in fp32, 8% / 5.5% / 4% in fp64. The thresholds sit above those; A needs 2^20 positions (below,
// launch overheads decide) and its dense copy at most kDensifyMaxBytes.
constexpr int64_t kDensifyMinPositions = int64_t(1) << 20;
constexpr int64_t kDensifyMaxBytes = int64_t(1) << 30;

double densify_threshold(at::ScalarType dtype, int64_t n) {
  const int bucket = n < 128 ? 0 : n < 512 ? 1 : 2;
  static constexpr double kHalf[3] = {0.05, 0.03, 0.015};
  static constexpr double kFloat[3] = {0.25, 0.15, 0.12};
  static constexpr double kDouble[3] = {0.10, 0.07, 0.05};
  if (is_half(dtype)) return kHalf[bucket];
  return dtype == at::kFloat ? kFloat[bucket] : kDouble[bucket];
}

// A holds at least 1 / margin of densify's density threshold for its dtype and B's width: margin 1 is the
// rule, kDensifyTuningMargin makes densify a tuning candidate (below).
bool densify_density_reached(const SpmmProblem& p, at::ScalarType dtype, double margin) {
  return margin * static_cast<double>(p.nnz_stride) >=
         densify_threshold(dtype, p.n) * static_cast<double>(p.m) * static_cast<double>(p.k);
}
// Densify is a tuning candidate from a quarter of the rule's density (4x below every crossover measured).
// Looser, a tuning sample expanded matrices it cannot win on: at 1/512 (the former bound) a 5000 x 5000
// power-law matrix of 0.4% at n = 32 was expanded to 100 MB, the costliest of its first ten calls (0.57 ms
// against a steady call of ~0.02 ms; H100, fresh suite, 2026-11-27).
constexpr double kDensifyTuningMargin = 4.0;

// Tiled (B through shared memory) for long rows and wide B. H200, 4096 x 4096 row-pruned, B 4096 x
// 1024 (docs/history.md, SpMM routes): fp32 tiled 1.23x cuSPARSE / 1.41x native at 820
// entries per row, 0.83x / 0.90x at 410; bf16 1.06x native at 1229, 0.98x at 1024.
constexpr int64_t kTiledMinN = 1024;
constexpr int64_t kTiledMinRowLength = 640;
constexpr int64_t kTiledMinRowLengthHalf = 1280;

// The rules below come from the skew suite of the main job on an H100 (`python -m benchmarks --suites skew`:
// every route on 20 matrices x n = 1, 32, 128 x fp32, bf16) and from the split route's sweep (docs/history.md,
// SpMM routes). They pick the first call's route;
// "auto" tunes the route per matrix signature online (csrc/cuda/spmm_autotune.cu, docs/tuning.md).
//
// Skew: the row-group kernel ("native") gives each row to one group of lanes, so it waits on the
// longest row: on 100k-row power-law graphs (longest row 843 .. 21,082) it was 1.7-100x slower than the
// best route, while on even rows (meshes, banded, uniform, clustered; coefficient of variation < 1.3,
// longest row <= 41) it was the fastest route at n >= 32.
constexpr int64_t kSkewedRow = 64;
// Skewed matrices with fewer rows than this are small graphs (cora, citeseer, pubmed, ca-CondMat: 2.7k
// to 23k rows) where the balanced kernel (a block of 32 rows splits its entries among its lanes) was the
// fastest route at n <= 32 in fp32 (cora 12.7 vs cuSPARSE 23.4 us) and cuSPARSE's launch cost dominates.
constexpr int64_t kSmallRows = 50000;
// ... in half precision the balanced kernel is slower: it wins only on the smallest products.
constexpr double kSmallHalfProduct = 1.5e6;  // entries * n
// split (entries cut across blocks): fastest on large matrices (>= 8M entries) with >= 2% of entries
// in rows of >= 4096, and on large half-precision skewed matrices; the best own route wherever cuSPARSE
// cannot run (batched patterns, repeated positions).
constexpr int64_t kSplitLongRow = 4096;
constexpr double kSplitLongShare = 0.02;
constexpr int64_t kSplitMinEntries = 8000000;
// cuSPARSE sums half-precision products with half-precision partial sums (in C's type) once B has more
// than one column: its bf16 error against float64 grew with the row length -- 2.5e-3 at a longest row of
// 843, 5.9e-3 at 1000, 1.1e-2 at 21k, 1.8e-2 at 63k, 2.2-2.5e-2 at 205k -- where the own kernels (float
// sums) stay at 1.6-1.7e-3 (H100 skew suite). There the cuSPARSE route gives it a float32 C (mixed
// precision); below this row length, and for n <= 2 (its error equalled the own kernels'), a half C,
// which saves a float C and its rounding pass (~8 us on the host-bound small graphs: G51 bf16 28-30
// vs 20 us).
constexpr int64_t kCusparseHalfMaxRow = 256;
// n = 1 (a matrix-vector product): the row-group kernel wastes most lanes; cuSPARSE was the fastest route
// on every matrix of >= 200k entries (uniform 200k rows 47 vs 57 us; power-law 35 vs 125+ us).
constexpr int64_t kVectorMaxN = 2;
constexpr int64_t kVectorCusparseEntries = 200000;
// Native over cuSPARSE on even rows up to n = 256 (uniform 200k rows: 2.6x at n = 32, 1.17x at n = 128);
// above, cuSPARSE on large products (H200 random 100k graph: 1.18x at n = 512) and native on small ones.
constexpr int64_t kNativeMaxN = 256;
constexpr double kLargeProduct = 1e8;  // nnz * n above which a product is bandwidth-bound, not launch-bound
// Densify needs a wide enough B to pay for expanding A: at n = 1 it lost to cuSPARSE (46 vs 22 us, bf16
// 4096^2 at 10%) and won from n = 32 (45 vs 86 us).
constexpr int64_t kDensifyMinN = 16;

// A row-per-group kernel is pathological beyond this: a plan does not even time it.
constexpr int64_t kNativeHopelessRow = 4096;

bool prefers_densify(const SpmmProblem& p, at::ScalarType dtype) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (p.m > kIntMax || p.k > kIntMax || p.n > kIntMax) return false;  // cuBLAS's int dimensions
  const int64_t positions = p.m * p.k;
  if (positions < kDensifyMinPositions) return false;
  if (p.a_batches() * positions > kDensifyMaxBytes / static_cast<int64_t>(c10::elementSize(dtype))) return false;
  return densify_density_reached(p, dtype, 1.0);
}

bool densify_fits(const SpmmProblem& p, at::ScalarType dtype) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  const int64_t positions = p.m * p.k;
  return positions > 0 && p.m <= kIntMax && p.k <= kIntMax && p.n <= kIntMax &&
         p.a_batches() * positions <= kDensifyMaxBytes / static_cast<int64_t>(c10::elementSize(dtype));
}

// cuSPARSE: one matrix (a batch of patterns would be a block-diagonal copy per call), a validated
// pattern, at most one entry per position (it refuses more). Half types on long rows sum in float there
// (cusparse_sums_in_float).
bool cusparse_applies(const SpmmProblem& p, const CsrAnalysis* a) {
  return a != nullptr && a->valid() && !p.pattern_batched && !p.values_batched && p.nnz_stride <= p.m * p.k;
}

}  // namespace

bool cusparse_sums_in_float(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a) {
  return is_half(dtype) && p.n > kVectorMaxN && (a == nullptr || a->max_row() >= kCusparseHalfMaxRow);
}

namespace {

bool skewed(const CsrAnalysis& a) { return a.max_row() > kSkewedRow && a.mean_row() < kSkewedRow; }

bool long_rows_wide_b(const SpmmProblem& p, at::ScalarType dtype, double mean_row) {
  return dtype != at::kDouble && p.n >= kTiledMinN &&
         mean_row >= static_cast<double>(is_half(dtype) ? kTiledMinRowLengthHalf : kTiledMinRowLength);
}

}  // namespace

const char* spmm_route_name(SpmmBackend route) {
  switch (route) {
    case SpmmBackend::Auto: return "auto";
    case SpmmBackend::Cusparse: return "cusparse";
    case SpmmBackend::Native: return "native";
    case SpmmBackend::Balanced: return "balanced";
    case SpmmBackend::Split: return "split";
    case SpmmBackend::Tiled: return "tiled";
    case SpmmBackend::Densify: return "densify";
    case SpmmBackend::Blocked: return "blocked";
  }
  return "?";
}

SpmmBackend choose_spmm_route(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a,
                              const c10::Device& device) {
  // A rule picks its route only where it can run (spmm_route_available); the row-group kernels (native,
  // balanced, split) run everywhere.
  auto ok = [&](SpmmBackend route) { return spmm_route_available(route, dtype, device); };
  if (p.n >= kDensifyMinN && prefers_densify(p, dtype) && ok(SpmmBackend::Densify)) return SpmmBackend::Densify;
  const double mean_row = a ? a->mean_row() : (p.m > 0 ? static_cast<double>(p.nnz_stride) / p.m : 0.0);
  const bool tiled = long_rows_wide_b(p, dtype, mean_row) && ok(SpmmBackend::Tiled);
  if (a == nullptr) {
    // Unchecked matrix (validate=False, never analysed): O(1) facts only, own kernels only, and the row
    // lengths unknown, so the route whose speed does not hang on the longest row. The row-per-group
    // kernel took 4.8 ms where balanced took 0.4 (100k-row power-law matrix, n = 32, H200); over the
    // skew suite's 120 cases balanced is 0.75x native's time (geomean), at worst 4.6x.
    return tiled ? SpmmBackend::Tiled : SpmmBackend::Balanced;
  }
  const bool cusparse = cusparse_applies(p, a) && ok(SpmmBackend::Cusparse);
  const double product = static_cast<double>(a->entries()) * static_cast<double>(p.n);
  if (p.n <= kVectorMaxN && cusparse && a->entries() >= kVectorCusparseEntries) return SpmmBackend::Cusparse;
  // A provisional analysis (PendingCheck: row lengths unknown until the fresh-graph builder's check lands)
  // takes the skewed rules: routes whose speed does not hang on the longest row.
  if (!a->provisional() && !skewed(*a)) {
    if (tiled) return SpmmBackend::Tiled;
    if (!cusparse || is_half(dtype)) return SpmmBackend::Native;
    return p.n <= kNativeMaxN || product < kLargeProduct ? SpmmBackend::Native : SpmmBackend::Cusparse;
  }
  const bool long_rows = a->share_in_rows_of_at_least(kSplitLongRow) >= kSplitLongShare;
  if (a->entries() >= kSplitMinEntries && (long_rows || is_half(dtype))) return SpmmBackend::Split;
  if (a->rows() < kSmallRows && (!is_half(dtype) || product <= kSmallHalfProduct)) return SpmmBackend::Balanced;
  if (cusparse) return SpmmBackend::Cusparse;
  return long_rows ? SpmmBackend::Split : SpmmBackend::Balanced;
}

namespace {
std::atomic<bool>& autotune_flag() {
  static std::atomic<bool> flag([] {
    const char* env = std::getenv("SPARSETORCH_AUTOTUNE");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }());
  return flag;
}
}  // namespace

bool spmm_autotune_enabled() { return autotune_flag().load(); }

bool set_spmm_autotune(bool enabled) { return autotune_flag().exchange(enabled); }

ResolvedRoute resolve_spmm_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                                 at::ScalarType dtype, SpmmBackend requested, bool validate, int64_t b_layout) {
  TORCH_CHECK_VALUE(requested != SpmmBackend::Blocked,
                    "backend 'blocked' multiplies a layout built by sparsetorch.SpmmPlan(A, backend='blocked'); "
                    "the spmm op cannot take it");
  ResolvedRoute r{requested, checked_csr(crow, col, p.k, validate || requested == SpmmBackend::Cusparse, "spmm")};
  if (requested != SpmmBackend::Auto) {
    const std::string why = spmm_route_unavailable(requested, dtype, crow.device());
    TORCH_CHECK(why.empty(), "spmm: backend '", spmm_route_name(requested), "' cannot run on ", crow.device(), ": ",
                why, ". backend='auto' picks among the routes that can");
    return r;
  }
  r.route = r.rules_route = choose_spmm_route(p, dtype, r.analysis.get(), crow.device());
  if (r.analysis && !r.analysis->provisional()) {  // a provisional analysis (PendingCheck) is routed by the rules
    // The signature's decided route (common/spmm_tuning.h), where this matrix can take it: a decision
    // (or a cache file) never sends a matrix to a route its own candidates exclude (cuSPARSE on
    // repeated positions, densify beyond its memory bound, ...).
    r.signature = tuning::signature(p, dtype, *r.analysis, b_layout, tuning::device_id(crow.device()));
    r.has_signature = true;
    const std::optional<SpmmBackend> decided = tuning::TuningTable::global().decided(r.signature);
    if (decided) {
      const auto candidates = spmm_tuning_candidates(p, dtype, *r.analysis, r.rules_route, crow.device());
      if (std::find(candidates.begin(), candidates.end(), *decided) != candidates.end()) {
        r.route = *decided;
        r.measured = true;
      }
    }
  }
  return r;
}

std::vector<SpmmBackend> spmm_tuning_candidates(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis& a,
                                                SpmmBackend rules_route, const c10::Device& device) {
  std::vector<SpmmBackend> routes{rules_route};
  for (SpmmBackend r : spmm_route_candidates(p, dtype, &a, device)) {
    if (r != SpmmBackend::Blocked && r != rules_route) routes.push_back(r);
  }
  return routes;
}

std::vector<SpmmBackend> spmm_route_candidates(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a,
                                               const c10::Device& device) {
  std::vector<SpmmBackend> routes;
  const bool hopeless_rows = a != nullptr && a->max_row() >= kNativeHopelessRow;
  const double mean_row = a ? a->mean_row() : (p.m > 0 ? static_cast<double>(p.nnz_stride) / p.m : 0.0);
  if (!hopeless_rows) routes.push_back(SpmmBackend::Native);
  routes.push_back(SpmmBackend::Balanced);
  routes.push_back(SpmmBackend::Split);
  // Tiled streams B through shared memory: it pays only on long, even rows and a wide B.
  if (dtype != at::kDouble && p.n >= 256 && mean_row >= 64 && !(a && skewed(*a))) routes.push_back(SpmmBackend::Tiled);
  if (cusparse_applies(p, a)) routes.push_back(SpmmBackend::Cusparse);
  if (densify_fits(p, dtype) && densify_density_reached(p, dtype, kDensifyTuningMargin)) {
    routes.push_back(SpmmBackend::Densify);
  }
  // Blocked (8-row strips, float32, one matrix): multiplies the zero of a half-empty row pair, so it
  // only wins where rows are long and A is a few percent dense or more.
  constexpr double kBlockedMinDensity = 0.02;
  if (dtype == at::kFloat && !p.pattern_batched && !p.values_batched && !p.dense_batched && p.n >= 64 && p.m >= 8 &&
      static_cast<double>(p.nnz_stride) >= kBlockedMinDensity * static_cast<double>(p.m * p.k)) {
    routes.push_back(SpmmBackend::Blocked);
  }
  routes.erase(std::remove_if(routes.begin(), routes.end(),
                              [&](SpmmBackend r) { return !spmm_route_available(r, dtype, device); }),
               routes.end());
  return routes;
}

}  // namespace sparsetorch
