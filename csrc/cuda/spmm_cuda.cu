// CUDA entry points of spmm / spmm_out: checks, validation, device guard, and the route.
//
// The matrix is validated on its first use (common/csr_analysis.h: one O(nnz) pass, cached per
// pattern) unless the caller passes validate=False; the route "auto" takes comes from the one routing
// module (common/spmm_routing.h), which sees that analysis. cuSPARSE never runs on a matrix that has
// not passed the check, whatever validate says: it reads out of bounds on corrupt indices.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/activation.h"
#include "common/checks.h"
#include "common/spmm_routing.h"
#include "cuda/spmm_cuda.h"
#include "cuda/spmm_plans.h"
#include "cuda/device_code.h"

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

void apply_bias_act(const at::Tensor& out, const SpmmEpilogue& epi) {
  if (epi.bias.defined() || epi.act != Activation::None) {
    bias_act_inplace_cuda(out, epi.bias, epi.act, epi.negative_slope);
  }
}

void run_spmm_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                    const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi, SpmmBackend route) {
  switch (route) {
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
    case SpmmBackend::Native:
      return spmm_native(p, crow, col, values, dense, out, epi);
    default:
      TORCH_CHECK(false, "spmm: route ", spmm_route_name(route), " cannot run here");
  }
}

std::string spmm_route_unavailable_cuda(SpmmBackend route, at::ScalarType dtype, c10::DeviceIndex index) {
  const int device = index >= 0 ? index : c10::cuda::current_device();
  check_kernel_image(device);
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  return route_limits_unmet(route, dtype, static_cast<int64_t>(prop->sharedMemPerBlockOptin), prop->major, prop->minor);
}

namespace {

// The route of this call: resolve_spmm_route's answer (for "auto", the signature's decided route or the
// rules'), or while the matrix's signature tunes, the next candidate as a timed sample (spmm_autotune.cu).
SpmmCallRoute route_for(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                        const at::Tensor& dense, SpmmBackend requested, bool validate) {
  const ResolvedRoute r =
      resolve_spmm_route(p, crow, col, values.scalar_type(), requested, validate, tuning::b_layout(dense));
  if (requested != SpmmBackend::Auto || r.measured || !r.has_signature) return SpmmCallRoute{r.route};
  return tuned_spmm_route(p, values.scalar_type(), r);
}

at::Tensor spmm_cuda(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                     double alpha, const std::optional<at::Tensor>& accumulate, double beta,
                     const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope,
                     c10::string_view backend, bool validate) {
  const SpmmBackend requested = parse_spmm_backend(std::string(backend));
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, accumulate, bias);
  const c10::cuda::CUDAGuard guard(values.device());
  const SpmmCallRoute route = route_for(p, crow, col, values, dense, requested, validate);
  at::Tensor out = at::empty(p.out_shape(), values.options());
  const at::Tensor acc = accumulate.has_value() ? accumulate->contiguous() : at::Tensor();
  run_spmm_call(route, p, crow, col, values, dense, out,
                make_epilogue(alpha, beta, acc, bias, activation, negative_slope));
  return out;
}

void spmm_out_cuda(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                   const at::Tensor& out, double alpha, double beta, const std::optional<at::Tensor>& bias,
                   c10::string_view activation, double negative_slope, c10::string_view backend, bool validate) {
  const SpmmBackend requested = parse_spmm_backend(std::string(backend));
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, bias);
  check_spmm_out(p, values, out);
  for (const at::Tensor* input : {&crow, &col, &values, &dense}) at::assert_no_overlap(out, *input);
  if (bias.has_value()) at::assert_no_overlap(out, *bias);
  const c10::cuda::CUDAGuard guard(values.device());
  const SpmmCallRoute route = route_for(p, crow, col, values, dense, requested, validate);
  const bool direct = out.is_contiguous();
  at::Tensor target = direct ? out : out.contiguous();
  run_spmm_call(route, p, crow, col, values, dense, target,
                make_epilogue(alpha, beta, target, bias, activation, negative_slope));
  if (!direct) out.copy_(target);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) {
  m.impl("spmm", SPARSETORCH_CUDA_OP(spmm_cuda));
  m.impl("spmm_out", SPARSETORCH_CUDA_OP(spmm_out_cuda));
}

}  // namespace cuda
}  // namespace sparsetorch
