// "auto" measures what the rules cannot know. No rule over row-length statistics picks the fastest
// route on every matrix (the skew suite has cases where the best route is 1.3x the rules' choice), but a
// matrix used again -- a graph in training, a fixed pruned weight, autograd's A^T -- can simply be
// timed once. The second call with the same matrix and B shape times the candidate routes on that B
// and the matrix's analysis keeps the fastest; every later call takes it. A matrix used once never
// pays for it. See spmm_cuda.h for the contract, docs/routing.md for the design.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraphsUtils.cuh>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "common/spmm_routing.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {
namespace {

// The cost (ms) of `route` on this problem as a caller in a loop sees it: the larger of its median
// device time, each call after an L2 flush (the previous call's B does not sit in L2 then), and its
// host time per call (descriptors, workspace queries, launches): on small matrices the host is the
// limit, and a route that is quick on the device but slow to launch (cuSPARSE, ~20 us) loses there.
// 3 calls, up to 15 for calls under 0.2 ms.
double time_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                  const at::Tensor& dense, SpmmBackend route, const at::Tensor& out, const at::Tensor& flush) {
  SpmmEpilogue epi;  // the product alone: every route's epilogue is the same
  run_spmm_route(p, crow, col, values, dense, out, epi, route);  // warm-up: workspaces, descriptors, code
  auto timed = [&](int reps) {
    std::vector<float> ms;
    double host_ms = 0.0;
    for (int i = 0; i < reps; ++i) {
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
      flush.zero_();
      start.record();
      const auto t0 = std::chrono::steady_clock::now();
      run_spmm_route(p, crow, col, values, dense, out, epi, route);
      host_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      stop.record();
      stop.synchronize();
      ms.push_back(start.elapsed_time(stop));
    }
    std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
    return std::max(static_cast<double>(ms[reps / 2]), host_ms / reps);
  };
  const double first = timed(3);
  return first < 0.2 ? timed(15) : first;
}

}  // namespace

SpmmBackend measure_spmm_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                               const at::Tensor& values, const at::Tensor& dense, const CsrAnalysis& a) {
  std::vector<SpmmBackend> candidates = spmm_route_candidates(p, values.scalar_type(), &a);
  candidates.erase(std::remove(candidates.begin(), candidates.end(), SpmmBackend::Blocked), candidates.end());
  SpmmBackend best = choose_spmm_route(p, values.scalar_type(), &a);
  if (candidates.size() > 1) {
    const int64_t l2 = at::cuda::getCurrentDeviceProperties()->l2CacheSize;
    const at::Tensor flush = at::empty({2 * std::max<int64_t>(l2, 1 << 20)}, values.options().dtype(at::kByte));
    const at::Tensor out = at::empty(p.out_shape(), values.options());
    double best_ms = std::numeric_limits<double>::infinity();
    for (SpmmBackend route : candidates) {
      double ms;
      try {
        ms = time_route(p, crow, col, values, dense, route, out, flush);
      } catch (const c10::Error&) {
        continue;  // a route that cannot take this problem (out of memory for densify, ...) is skipped
      }
      if (ms < best_ms) {
        best_ms = ms;
        best = route;
      }
    }
  }
  std::lock_guard<std::mutex> lock(a.measured->mutex);
  a.measured->routes[spmm_measure_key(p, values.scalar_type())] = static_cast<int>(best);
  return best;
}

SpmmBackend measured_route_on_repeat(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                                     const at::Tensor& values, const at::Tensor& dense, const CsrAnalysis& a,
                                     SpmmBackend rules_route) {
  if (!spmm_autotune_enabled() || at::cuda::currentStreamCaptureStatus() != at::cuda::CaptureStatus::None) {
    return rules_route;
  }
  {
    std::lock_guard<std::mutex> lock(a.measured->mutex);
    auto [it, first_time] = a.measured->routes.emplace(spmm_measure_key(p, values.scalar_type()),
                                                       CsrAnalysis::kSeenOnce);
    if (first_time) return rules_route;
    if (it->second != CsrAnalysis::kSeenOnce) return static_cast<SpmmBackend>(it->second);
  }
  return measure_spmm_route(p, crow, col, values, dense, a);
}

namespace {
std::string spmm_tune_cuda(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                           const at::Tensor& dense) {
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, std::nullopt);
  const c10::cuda::CUDAGuard guard(values.device());
  const auto a = checked_csr(crow, col, p.k, /*validate=*/true, "SpmmPlan");
  TORCH_CHECK(at::cuda::currentStreamCaptureStatus() == at::cuda::CaptureStatus::None,
              "spmm_tune: routes cannot be timed during CUDA graph capture");
  return spmm_route_name(measure_spmm_route(p, crow, col, values, dense, *a));
}
}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("spmm_tune", &spmm_tune_cuda); }

}  // namespace cuda
}  // namespace sparsetorch
