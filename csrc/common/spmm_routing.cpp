#include "common/spmm_routing.h"

#include <limits>

namespace sparsetorch {
namespace {

bool is_half(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// --- measured thresholds (docs/routing.md has the tables they come from) ----------------------

// Densify (A expanded on the GPU + one cuBLAS GEMM) above a density that falls with the width of B.
// H200, uniform 4096 x 4096 (benchmarks/results/h200/spmm_densify_cuda.txt): densify over the best
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

// Tiled (B through shared memory) for long rows and wide B. H200, 4096 x 4096 row-pruned, B 4096 x
// 1024 (benchmarks/results/h200/spmm_tiled_cuda.txt): fp32 tiled 1.23x cuSPARSE / 1.41x native at 820
// entries per row, 0.83x / 0.90x at 410; bf16 1.06x native at 1229, 0.98x at 1024.
constexpr int64_t kTiledMinN = 1024;
constexpr int64_t kTiledMinRowLength = 640;
constexpr int64_t kTiledMinRowLengthHalf = 1280;

// Skew: the row-group kernel ("native") gives each row to one group of lanes, so its time is at least
// (longest row) x (one dependent gather). H200 graph suite (benchmarks/results/h200/spmm_graphs_cuda.txt),
// fp32: native is the fastest route on every matrix whose longest row is <= 41 entries (random graphs,
// meshes) and loses on every matrix from 99 (citeseer 2.0x slower than balanced at n = 32; power-law 100k,
// longest row 13,503: 16x slower than cuSPARSE).
constexpr int64_t kSkewedRow = 64;
// The balanced kernel (a block splits its 32 rows' entries among its lanes) wins over cuSPARSE on
// moderately skewed graphs at narrow B (cora, citeseer n <= 128: 1.2-1.8x; ca-CondMat n = 32: 1.2x) and
// loses from n = 64 on matrices with rows of thousands of entries (power-law 100k: 0.55x at n = 64).
constexpr int64_t kBalancedMaxRow = 1024;
constexpr int64_t kBalancedMaxN = 64;
// Native over cuSPARSE on uniform short rows up to n = 256 (random 100k: 2.9x at n = 32, 1.06x at 256);
// at n = 512 cuSPARSE is 1.18x faster on the large graphs, while on small ones (Erdos971, meshes: a
// few microseconds) the row-group kernel's lower launch cost still wins.
constexpr int64_t kNativeMaxN = 256;
constexpr double kLargeProduct = 1e8;  // nnz * n above which a product is bandwidth-bound, not launch-bound

// A row-per-group kernel is pathological beyond this: a plan does not even time it.
constexpr int64_t kNativeHopelessRow = 4096;

bool prefers_densify(const SpmmProblem& p, at::ScalarType dtype) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (p.m > kIntMax || p.k > kIntMax || p.n > kIntMax) return false;  // cuBLAS's int dimensions
  const int64_t positions = p.m * p.k;
  if (positions < kDensifyMinPositions) return false;
  if (p.a_batches() * positions > kDensifyMaxBytes / static_cast<int64_t>(c10::elementSize(dtype))) return false;
  return static_cast<double>(p.nnz_stride) >= densify_threshold(dtype, p.n) * static_cast<double>(positions);
}

bool densify_fits(const SpmmProblem& p, at::ScalarType dtype) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  const int64_t positions = p.m * p.k;
  return positions > 0 && p.m <= kIntMax && p.k <= kIntMax && p.n <= kIntMax &&
         p.a_batches() * positions <= kDensifyMaxBytes / static_cast<int64_t>(c10::elementSize(dtype));
}

// cuSPARSE: one matrix (a batch of patterns would be a block-diagonal copy per call), a validated
// pattern, at most one entry per position (it refuses more), float32/float64 (its half-type SpMM is
// slow on these shapes).
bool cusparse_applies(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a) {
  return a != nullptr && a->valid() && !p.pattern_batched && !p.values_batched && !is_half(dtype) &&
         p.nnz_stride <= p.m * p.k;
}

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

SpmmBackend choose_spmm_route(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a) {
  if (prefers_densify(p, dtype)) return SpmmBackend::Densify;
  const double mean_row = a ? a->mean_row() : (p.m > 0 ? static_cast<double>(p.nnz_stride) / p.m : 0.0);
  if (a == nullptr) {  // unchecked matrix: O(1) facts only, own kernels only
    return long_rows_wide_b(p, dtype, mean_row) ? SpmmBackend::Tiled : SpmmBackend::Native;
  }
  if (skewed(*a)) {
    if (a->max_row() <= kBalancedMaxRow && p.n <= kBalancedMaxN) return SpmmBackend::Balanced;
    return cusparse_applies(p, dtype, a) ? SpmmBackend::Cusparse : SpmmBackend::Balanced;
  }
  if (long_rows_wide_b(p, dtype, mean_row)) return SpmmBackend::Tiled;
  if (!cusparse_applies(p, dtype, a)) return SpmmBackend::Native;
  const double work = static_cast<double>(a->entries()) * static_cast<double>(p.n);
  return p.n <= kNativeMaxN || work < kLargeProduct ? SpmmBackend::Native : SpmmBackend::Cusparse;
}

std::vector<int64_t> spmm_measure_key(const SpmmProblem& p, at::ScalarType dtype) {
  return {p.n, static_cast<int64_t>(dtype), p.batch, p.pattern_batched, p.values_batched, p.dense_batched};
}

ResolvedRoute resolve_spmm_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                                 at::ScalarType dtype, SpmmBackend requested, bool validate) {
  TORCH_CHECK_VALUE(requested != SpmmBackend::Blocked,
                    "backend 'blocked' multiplies a layout built by sparsetorch.SpmmPlan(A, backend='blocked'); "
                    "the spmm op cannot take it");
  ResolvedRoute r{requested, checked_csr(crow, col, p.k, validate || requested == SpmmBackend::Cusparse, "spmm")};
  if (requested != SpmmBackend::Auto) return r;
  if (r.analysis) {
    std::lock_guard<std::mutex> lock(r.analysis->measured->mutex);
    const auto& routes = r.analysis->measured->routes;
    const auto it = routes.find(spmm_measure_key(p, dtype));
    if (it != routes.end() && it->second != CsrAnalysis::kSeenOnce) {
      r.route = static_cast<SpmmBackend>(it->second);
      r.measured = true;
      return r;
    }
  }
  r.route = choose_spmm_route(p, dtype, r.analysis.get());
  return r;
}

std::vector<SpmmBackend> spmm_route_candidates(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a) {
  std::vector<SpmmBackend> routes;
  const bool hopeless_rows = a != nullptr && a->max_row() >= kNativeHopelessRow;
  const double mean_row = a ? a->mean_row() : (p.m > 0 ? static_cast<double>(p.nnz_stride) / p.m : 0.0);
  if (!hopeless_rows) routes.push_back(SpmmBackend::Native);
  routes.push_back(SpmmBackend::Balanced);
  routes.push_back(SpmmBackend::Split);
  // Tiled streams B through shared memory: it pays only on long, even rows and a wide B.
  if (dtype != at::kDouble && p.n >= 256 && mean_row >= 64 && !(a && skewed(*a))) routes.push_back(SpmmBackend::Tiled);
  if (cusparse_applies(p, dtype, a)) routes.push_back(SpmmBackend::Cusparse);
  // Densify: only where its m*k work can catch up with the sparse routes' nnz*n (A at least 1/512 dense).
  if (densify_fits(p, dtype) && p.m * p.k <= 512 * std::max<int64_t>(1, p.nnz_stride)) {
    routes.push_back(SpmmBackend::Densify);
  }
  // Blocked (8-row strips, float32, one matrix): multiplies the zero of a half-empty row pair, so it
  // only wins where rows are long and A is a few percent dense or more.
  constexpr double kBlockedMinDensity = 0.02;
  if (dtype == at::kFloat && !p.pattern_batched && !p.values_batched && !p.dense_batched && p.n >= 64 && p.m >= 8 &&
      static_cast<double>(p.nnz_stride) >= kBlockedMinDensity * static_cast<double>(p.m * p.k)) {
    routes.push_back(SpmmBackend::Blocked);
  }
  return routes;
}

}  // namespace sparsetorch
