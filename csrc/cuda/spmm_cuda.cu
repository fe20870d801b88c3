// CUDA entry points of spmm / spmm_out: checks, device guard, and the choice of route.
//
// "auto" route, from benchmarks/results/h100/spmm_cuda.json (H100, torch 2.11, cuSPARSE 12.6, fp32):
//  - batches: native (38x / 119x over a loop of torch.sparse.mm; 1.26x / 1.67x over one
//    block-diagonal torch.sparse.mm; no block-diagonal copy and no host sync);
//  - one matrix: native for n <= 256 (random 100k x 100k, 20/row: 2.5x cuSPARSE at n = 32, 1.07x
//    at n = 128), cuSPARSE above (1.04x native at n = 512);
//  - half types: native (cuSPARSE's bf16/fp16 CSR SpMM is slow, DESIGN.md);
//  - long rows and wide B (pruned weights): the tiled kernel, see choose_route;
//  - A more than a few percent dense: the densify route, see prefers_densify.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "common/activation.h"
#include "common/checks.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {

SpmmEpilogue make_epilogue(double alpha, double beta, const at::Tensor& accumulate,
                           const std::optional<at::Tensor>& bias, c10::string_view activation,
                           double negative_slope) {
  SpmmEpilogue epi;
  epi.alpha = alpha;
  epi.beta = beta;
  if (beta != 0.0) epi.accumulate = accumulate;  // beta == 0: never read (NaN in it does not leak)
  if (bias.has_value()) epi.bias = bias->contiguous();
  epi.act = parse_activation(std::string(activation));
  epi.negative_slope = negative_slope;
  return epi;
}

namespace {

// "auto" takes the tiled kernel for long rows and wide B. From benchmarks/results/h200/spmm_tiled_cuda
// (4096 x 4096 row-pruned, B 4096 x 1024, H200): fp32 tiled 1.23x cuSPARSE / 1.41x native at 820
// entries per row (20%), 0.83x / 0.90x at 410 (10%); bf16 1.06x native at 1229 (30%), 0.98x at 1024.
// Below n = 1024 and for float64 it was not measured to win, so those keep the rules below.
constexpr int64_t kTiledMinN = 1024;
constexpr int64_t kTiledMinRowLength = 640;
constexpr int64_t kTiledMinRowLengthHalf = 1280;

// "auto" takes the densify route (A expanded + one cuBLAS GEMM) above a density that falls with the
// width of B. From benchmarks/results/h200/spmm_densify_cuda.txt (uniform 4096 x 4096, H200): densify
// over the best sparse route at n = 64 / 256 / 1024 crosses 1.0x at about 3.5% / 2% / 1% in bf16 and
// fp16 (10% at n = 1024: 80.7 us, 7.5x the row-group kernel, 9.0x torch.sparse.mm), 17% / 12% / 10%
// in fp32 (SGEMM on CUDA cores) and 8% / 5.5% / 4% in fp64 against "auto"'s old choice. The thresholds
// sit above those crossovers; A must have at least 2^20 positions (below, launch overheads decide)
// and its dense copy must stay within kDensifyMaxBytes.
constexpr int64_t kDensifyMinPositions = int64_t(1) << 20;
constexpr int64_t kDensifyMaxBytes = int64_t(1) << 30;

double densify_threshold(at::ScalarType dtype, int64_t n) {
  const int bucket = n < 128 ? 0 : n < 512 ? 1 : 2;
  static constexpr double kHalf[3] = {0.05, 0.03, 0.015};
  static constexpr double kFloat[3] = {0.25, 0.15, 0.12};
  static constexpr double kDouble[3] = {0.10, 0.07, 0.05};
  if (dtype == at::kHalf || dtype == at::kBFloat16) return kHalf[bucket];
  return dtype == at::kFloat ? kFloat[bucket] : kDouble[bucket];
}

bool prefers_densify(const SpmmProblem& p, at::ScalarType dtype) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (p.m > kIntMax || p.k > kIntMax || p.n > kIntMax) return false;  // cuBLAS's int dimensions
  const int64_t positions = p.m * p.k;
  if (positions < kDensifyMinPositions) return false;
  if (p.a_batches() * positions > kDensifyMaxBytes / static_cast<int64_t>(c10::elementSize(dtype))) return false;
  return static_cast<double>(p.nnz_stride) >= densify_threshold(dtype, p.n) * static_cast<double>(positions);
}

SpmmBackend choose_route(const SpmmProblem& p, at::ScalarType dtype, SpmmBackend backend) {
  if (backend != SpmmBackend::Auto) return backend;
  if (prefers_densify(p, dtype)) return SpmmBackend::Densify;
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  const int64_t mean_row_length = p.m > 0 ? p.nnz_stride / p.m : 0;
  if (dtype != at::kDouble && p.n >= kTiledMinN &&
      mean_row_length >= (half ? kTiledMinRowLengthHalf : kTiledMinRowLength)) {
    return SpmmBackend::Tiled;
  }
  if (p.batched || half) return SpmmBackend::Native;
  // cuSPARSE refuses more stored entries than positions (repeated columns); the own kernels sum them.
  if (p.nnz_stride > p.m * p.k) return SpmmBackend::Native;
  return p.n <= 256 ? SpmmBackend::Native : SpmmBackend::Cusparse;
}

void run(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
         const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi, SpmmBackend backend) {
  switch (choose_route(p, values.scalar_type(), backend)) {
    case SpmmBackend::Tiled:
      return spmm_tiled(p, crow, col, values, dense, out, epi);
    case SpmmBackend::Balanced:
      return spmm_balanced(p, crow, col, values, dense, out, epi);
    case SpmmBackend::Split:
      return spmm_split(p, crow, col, values, dense, out, epi);
    case SpmmBackend::Densify:
      return spmm_densify(p, crow, col, values, dense, out, epi);
    case SpmmBackend::Cusparse:
      return spmm_cusparse(p, crow, col, values, dense, out, epi);
    default:
      return spmm_native(p, crow, col, values, dense, out, epi);
  }
}

at::Tensor spmm_cuda(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                     double alpha, const std::optional<at::Tensor>& accumulate, double beta,
                     const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope,
                     c10::string_view backend) {
  const SpmmBackend route = parse_spmm_backend(std::string(backend));
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, accumulate, bias);
  const c10::cuda::CUDAGuard guard(values.device());
  at::Tensor out = at::empty(p.out_shape(), values.options());
  const at::Tensor acc = accumulate.has_value() ? accumulate->contiguous() : at::Tensor();
  run(p, crow, col, values, dense, out, make_epilogue(alpha, beta, acc, bias, activation, negative_slope), route);
  return out;
}

void spmm_out_cuda(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                   const at::Tensor& out, double alpha, double beta, const std::optional<at::Tensor>& bias,
                   c10::string_view activation, double negative_slope, c10::string_view backend) {
  const SpmmBackend route = parse_spmm_backend(std::string(backend));
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, bias);
  check_spmm_out(p, values, out);
  for (const at::Tensor* input : {&crow, &col, &values, &dense}) at::assert_no_overlap(out, *input);
  if (bias.has_value()) at::assert_no_overlap(out, *bias);
  const c10::cuda::CUDAGuard guard(values.device());
  const bool direct = out.is_contiguous();
  at::Tensor target = direct ? out : out.contiguous();
  run(p, crow, col, values, dense, target, make_epilogue(alpha, beta, target, bias, activation, negative_slope),
      route);
  if (!direct) out.copy_(target);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) {
  m.impl("spmm", &spmm_cuda);
  m.impl("spmm_out", &spmm_out_cuda);
}

}  // namespace cuda
}  // namespace sparsetorch
