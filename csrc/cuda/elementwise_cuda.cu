// Elementwise CUDA kernels: binary (tensor-tensor, tensor-scalar), activation and the fused
// y = act(x * scale + bias). Contiguous data is processed VEC elements (16 bytes) per access when
// every pointer is 16-byte aligned, with a scalar tail; other layouts are read through a contiguous
// copy (never by assuming contiguity). Math in float for half types.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/activation.h"
#include "common/checks.h"
#include "common/elementwise.h"
#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename acc_t>
struct BinaryFn {
  BinaryOp op;
  acc_t alpha;
  __device__ acc_t operator()(acc_t x, acc_t y) const { return apply_binary<acc_t>(op, x, y, alpha); }
};

template <typename acc_t>
struct ScalarFn {
  BinaryOp op;
  acc_t other;
  __device__ acc_t operator()(acc_t x) const { return apply_binary<acc_t>(op, x, other, acc_t(1)); }
};

template <typename acc_t>
struct ActivationFn {
  Activation act;
  acc_t slope;
  __device__ acc_t operator()(acc_t x) const { return apply_activation<acc_t>(act, x, slope); }
};

// y = act(x * scale[c] + bias[c]), c the position in the last dimension (length n).
template <typename acc_t, typename scalar_t>
struct BiasActFn {
  const scalar_t* scale;
  const scalar_t* bias;
  int64_t n;
  Activation act;
  acc_t slope;
  __device__ acc_t operator()(acc_t x, int64_t i) const {
    const int64_t c = i % n;
    if (scale) x *= static_cast<acc_t>(scale[c]);
    if (bias) x += static_cast<acc_t>(bias[c]);
    return apply_activation<acc_t>(act, x, slope);
  }
};

int64_t grid_for(int64_t work) {
  const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 16;
  return std::max<int64_t>(1, std::min(ceil_div(work, kThreads), max_blocks));
}

// out[i] = f(x[i]) (UNARY) or f(x[i], y[i]) or f(x[i], i) (INDEXED), VEC per access.
enum class Arity { Unary, Binary, Indexed };

template <typename scalar_t, int VEC, Arity ARITY, typename F>
__global__ void __launch_bounds__(kThreads)
    map_kernel(const scalar_t* x, const scalar_t* y, scalar_t* out,  // out may alias x (in place)
               int64_t numel, F f) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Vec<scalar_t, VEC>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vec_count = numel / VEC;
  for (int64_t v = first; v < vec_count; v += stride) {
    const VecT xv = reinterpret_cast<const VecT*>(x)[v];
    VecT yv;
    if (ARITY == Arity::Binary) yv = reinterpret_cast<const VecT*>(y)[v];
    VecT ov;
#pragma unroll
    for (int q = 0; q < VEC; ++q) {
      const acc_t a = static_cast<acc_t>(xv.v[q]);
      acc_t r;
      if constexpr (ARITY == Arity::Unary) r = f(a);
      else if constexpr (ARITY == Arity::Binary) r = f(a, static_cast<acc_t>(yv.v[q]));
      else r = f(a, v * VEC + q);
      ov.v[q] = static_cast<scalar_t>(r);
    }
    reinterpret_cast<VecT*>(out)[v] = ov;
  }
  for (int64_t i = vec_count * VEC + first; i < numel; i += stride) {  // tail (VEC > 1 only)
    const acc_t a = static_cast<acc_t>(x[i]);
    acc_t r;
    if constexpr (ARITY == Arity::Unary) r = f(a);
    else if constexpr (ARITY == Arity::Binary) r = f(a, static_cast<acc_t>(y[i]));
    else r = f(a, i);
    out[i] = static_cast<scalar_t>(r);
  }
}

// Launches map_kernel with 16-byte accesses when all pointers allow it. `vec_ok_extra` lets the
// caller veto vectorisation (bias_act needs n % VEC == 0 so a vector stays within one row).
template <typename scalar_t, Arity ARITY, typename F>
void launch_map(const scalar_t* x, const scalar_t* y, scalar_t* out, int64_t numel, F f, bool vec_ok_extra = true) {
  if (numel == 0) return;
  constexpr int kVec = 16 / sizeof(scalar_t);
  const bool vec_ok = vec_ok_extra && is_aligned(x, 16) && is_aligned(out, 16) && (y == nullptr || is_aligned(y, 16));
  const auto stream = at::cuda::getCurrentCUDAStream();
  if (vec_ok) {
    map_kernel<scalar_t, kVec, ARITY, F><<<grid_for(ceil_div(numel, kVec)), kThreads, 0, stream>>>(x, y, out, numel, f);
  } else {
    map_kernel<scalar_t, 1, ARITY, F><<<grid_for(numel), kThreads, 0, stream>>>(x, y, out, numel, f);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define SPARSETORCH_DISPATCH_FLOATS(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

at::Tensor binary_cuda(const at::Tensor& x_in, const at::Tensor& y_in, c10::string_view op_name, double alpha) {
  check_binary_args(x_in, y_in);
  const BinaryOp op = parse_binary_op(std::string(op_name), /*allow_rsub=*/false);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), y = y_in.contiguous();
  at::Tensor out = at::empty_like(x);
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "binary_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_map<scalar_t, Arity::Binary>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                        x.numel(), BinaryFn<acc_t>{op, static_cast<acc_t>(alpha)});
  });
  return out;
}

at::Tensor binary_scalar_cuda(const at::Tensor& x_in, double other, c10::string_view op_name) {
  check_float_dtype(x_in, "x");
  const BinaryOp op = parse_binary_op(std::string(op_name), /*allow_rsub=*/true);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "binary_scalar_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_map<scalar_t, Arity::Unary>(x.data_ptr<scalar_t>(), nullptr, out.data_ptr<scalar_t>(), x.numel(),
                                       ScalarFn<acc_t>{op, static_cast<acc_t>(other)});
  });
  return out;
}

at::Tensor activation_cuda(const at::Tensor& x_in, c10::string_view activation, double negative_slope) {
  check_float_dtype(x_in, "x");
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "activation_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_map<scalar_t, Arity::Unary>(x.data_ptr<scalar_t>(), nullptr, out.data_ptr<scalar_t>(), x.numel(),
                                       ActivationFn<acc_t>{act, static_cast<acc_t>(negative_slope)});
  });
  return out;
}

// out may be x itself (in place).
void bias_act_into(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias, Activation act,
                   double negative_slope, const at::Tensor& out) {
  const int64_t n = x.size(-1);
  if (x.numel() == 0) return;
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "bias_act_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVec = 16 / sizeof(scalar_t);
    BiasActFn<acc_t, scalar_t> f{scale.defined() ? scale.data_ptr<scalar_t>() : nullptr,
                                 bias.defined() ? bias.data_ptr<scalar_t>() : nullptr, n, act,
                                 static_cast<acc_t>(negative_slope)};
    launch_map<scalar_t, Arity::Indexed>(x.data_ptr<scalar_t>(), nullptr, out.data_ptr<scalar_t>(), x.numel(), f,
                                         /*vec_ok_extra=*/n % kVec == 0);
  });
}

at::Tensor bias_act_cuda(const at::Tensor& x_in, const std::optional<at::Tensor>& scale,
                         const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope) {
  check_bias_act_args(x_in, scale, bias);
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  bias_act_into(x, scale.has_value() ? scale->contiguous() : at::Tensor(),
                bias.has_value() ? bias->contiguous() : at::Tensor(), act, negative_slope, out);
  return out;
}

}  // namespace

void bias_act_inplace_cuda(const at::Tensor& out, const at::Tensor& bias, Activation act, double negative_slope) {
  TORCH_INTERNAL_ASSERT(out.is_contiguous());
  bias_act_into(out, at::Tensor(), bias, act, negative_slope, out);
}

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) {
  m.impl("binary", &binary_cuda);
  m.impl("binary_scalar", &binary_scalar_cuda);
  m.impl("activation", &activation_cuda);
  m.impl("bias_act", &bias_act_cuda);
}

}  // namespace cuda
}  // namespace sparsetorch
