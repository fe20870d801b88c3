// Elementwise CUDA kernels: binary (tensor-tensor, tensor-scalar), activation and the fused
// y = act(x * scale + bias). Contiguous data is processed VEC elements (16 bytes) per access when
// every pointer is 16-byte aligned, with a scalar tail; other layouts are read through a contiguous
// copy (never by assuming contiguity). Math in float for half types.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <algorithm>
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

template <typename acc_t, Activation ACT>
struct ActivationFn {
  acc_t slope;
  __device__ acc_t operator()(acc_t x) const { return apply_activation<acc_t>(ACT, x, slope); }
};

int64_t grid_for(int64_t work) {
  const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 16;
  return std::max<int64_t>(1, std::min(ceil_div(work, kThreads), max_blocks));
}

// out[i] = f(x[i]) or f(x[i], y[i]). Each thread moves kUnroll vectors of VEC elements per step,
// all loads issued before any math, so several 16-byte loads per thread are in flight.
constexpr int kUnroll = 4;
enum class Arity { Unary, Binary };

template <typename scalar_t, int VEC, Arity ARITY, typename F>
__global__ void __launch_bounds__(kThreads)
    map_kernel(const scalar_t* x, const scalar_t* y, scalar_t* out, int64_t numel, F f) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Vec<scalar_t, VEC>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vec_count = numel / VEC;
  const VecT* xv = reinterpret_cast<const VecT*>(x);
  const VecT* yv = reinterpret_cast<const VecT*>(y);
  VecT* ov = reinterpret_cast<VecT*>(out);
  for (int64_t v0 = first; v0 < vec_count; v0 += stride * kUnroll) {
    VecT xs[kUnroll], ys[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * stride;
      if (v < vec_count) {
        xs[u] = xv[v];
        if constexpr (ARITY == Arity::Binary) ys[u] = yv[v];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * stride;
      if (v >= vec_count) break;
      VecT o;
#pragma unroll
      for (int q = 0; q < VEC; ++q) {
        const acc_t a = static_cast<acc_t>(xs[u].v[q]);
        if constexpr (ARITY == Arity::Unary) {
          o.v[q] = static_cast<scalar_t>(f(a));
        } else {
          o.v[q] = static_cast<scalar_t>(f(a, static_cast<acc_t>(ys[u].v[q])));
        }
      }
      ov[v] = o;
    }
  }
  for (int64_t i = vec_count * VEC + first; i < numel; i += stride) {  // tail (VEC > 1 only)
    const acc_t a = static_cast<acc_t>(x[i]);
    if constexpr (ARITY == Arity::Unary) {
      out[i] = static_cast<scalar_t>(f(a));
    } else {
      out[i] = static_cast<scalar_t>(f(a, static_cast<acc_t>(y[i])));
    }
  }
}

// Launches map_kernel with 16-byte accesses when every pointer is 16-byte aligned.
template <typename scalar_t, Arity ARITY, typename F>
void launch_map(const scalar_t* x, const scalar_t* y, scalar_t* out, int64_t numel, F f) {
  if (numel == 0) return;
  constexpr int kVec = 16 / sizeof(scalar_t);
  const bool vec_ok = is_aligned(x, 16) && is_aligned(out, 16) && (y == nullptr || is_aligned(y, 16));
  const auto stream = at::cuda::getCurrentCUDAStream();
  if (vec_ok) {
    map_kernel<scalar_t, kVec, ARITY, F>
        <<<grid_for(ceil_div(numel, kVec * kUnroll)), kThreads, 0, stream>>>(x, y, out, numel, f);
  } else {
    map_kernel<scalar_t, 1, ARITY, F><<<grid_for(ceil_div(numel, kUnroll)), kThreads, 0, stream>>>(x, y, out, numel, f);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// y = act(x * scale[c] + bias[c]) over rows of length n. Each thread owns one vector of VEC
// columns (n % VEC == 0, so a vector never crosses a row) and walks rows, keeping its scale and bias
// in registers: no per-element index arithmetic and no re-reads of scale/bias. A block covers
// `rows_per_block` whole rows of one column tile (`tile` vectors wide), so its accesses are
// contiguous; kUnroll rows are loaded before any math.
template <typename scalar_t, int VEC, Activation ACT>
__global__ void __launch_bounds__(kThreads)
    bias_act_kernel(const scalar_t* x, const scalar_t* scale, const scalar_t* bias, scalar_t* out, int64_t rows,
                    int64_t n, int tile, int rows_per_block, double negative_slope) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Vec<scalar_t, VEC>;
  const int r_off = threadIdx.x / tile;
  const int64_t col_vec = static_cast<int64_t>(blockIdx.y) * tile + threadIdx.x % tile;
  if (r_off >= rows_per_block || col_vec * VEC >= n) return;
  const int64_t c0 = col_vec * VEC;
  const acc_t slope = static_cast<acc_t>(negative_slope);
  acc_t s[VEC], b[VEC];
#pragma unroll
  for (int q = 0; q < VEC; ++q) {
    s[q] = scale ? static_cast<acc_t>(scale[c0 + q]) : acc_t(1);
    b[q] = bias ? static_cast<acc_t>(bias[c0 + q]) : acc_t(0);
  }
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * rows_per_block;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block + r_off; r0 < rows;
       r0 += row_stride * kUnroll) {
    VecT xs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * row_stride;
      if (r < rows) xs[u] = *reinterpret_cast<const VecT*>(x + r * n + c0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * row_stride;
      if (r >= rows) break;
      VecT o;
#pragma unroll
      for (int q = 0; q < VEC; ++q) {
        acc_t z = static_cast<acc_t>(xs[u].v[q]);
        if (scale) z *= s[q];
        if (bias) z += b[q];
        o.v[q] = static_cast<scalar_t>(apply_activation<acc_t>(ACT, z, slope));
      }
      *reinterpret_cast<VecT*>(out + r * n + c0) = o;
    }
  }
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
    dispatch_activation(act, [&](auto tag) {
      constexpr Activation ACT = decltype(tag)::value;
      launch_map<scalar_t, Arity::Unary>(x.data_ptr<scalar_t>(), nullptr, out.data_ptr<scalar_t>(), x.numel(),
                                         ActivationFn<acc_t, ACT>{static_cast<acc_t>(negative_slope)});
    });
  });
  return out;
}

// out may be x itself (in place).
void bias_act_into(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias, Activation act,
                   double negative_slope, const at::Tensor& out) {
  const int64_t n = x.size(-1);
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / n;
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "bias_act_cuda", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const scalar_t* sp = scale.defined() ? scale.data_ptr<scalar_t>() : nullptr;
    const scalar_t* bp = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
    const bool vec_ok = n % kVec == 0 && is_aligned(x.data_ptr(), 16) && is_aligned(out.data_ptr(), 16);
    const int vec = vec_ok ? kVec : 1;
    // Column tiles of at most kThreads vectors, as even as possible; as many whole rows per block as fit.
    const int64_t col_vecs = n / vec;
    const int64_t tiles = ceil_div(col_vecs, kThreads);
    TORCH_CHECK(tiles <= 65535, "bias_act: rows of ", n, " elements are too long");
    const int tile = static_cast<int>(ceil_div(col_vecs, tiles));
    const int rows_per_block = std::max(1, kThreads / tile);
    const int threads = static_cast<int>(ceil_div(static_cast<int64_t>(rows_per_block) * tile, 32) * 32);
    const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 16;
    const int64_t row_blocks =
        std::max<int64_t>(1, std::min(ceil_div(rows, rows_per_block * kUnroll), std::max<int64_t>(1, max_blocks / tiles)));
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(tiles));
    const auto stream = at::cuda::getCurrentCUDAStream();
    dispatch_activation(act, [&](auto tag) {
      constexpr Activation ACT = decltype(tag)::value;
      if (vec_ok) {
        bias_act_kernel<scalar_t, kVec, ACT><<<grid, threads, 0, stream>>>(
            x.data_ptr<scalar_t>(), sp, bp, out.data_ptr<scalar_t>(), rows, n, tile, rows_per_block, negative_slope);
      } else {
        bias_act_kernel<scalar_t, 1, ACT><<<grid, threads, 0, stream>>>(
            x.data_ptr<scalar_t>(), sp, bp, out.data_ptr<scalar_t>(), rows, n, tile, rows_per_block, negative_slope);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
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

// Backward of bias_act, one pass: a block of (32, 8) threads covers 32*VEC columns and one chunk of
// rows; each thread walks rows y, y+8, ... of the chunk writing grad_x and keeping per-column sums
// of d and d*x in registers, then the 8 rows of partial sums are added in shared memory and one
// row per chunk goes to `partial` (chunks x n); a final sum over chunks gives the column gradients.
constexpr int kBwdRows = 8;

template <typename scalar_t, int VEC, Activation ACT>
__global__ void __launch_bounds__(32 * kBwdRows)
    bias_act_backward_kernel(const scalar_t* grad, const scalar_t* x, const scalar_t* scale, const scalar_t* bias,
                             scalar_t* grad_x, at::opmath_type<scalar_t>* partial_scale,
                             at::opmath_type<scalar_t>* partial_bias, int64_t rows, int64_t n,
                             int64_t rows_per_chunk, double negative_slope) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Vec<scalar_t, VEC>;
  __shared__ acc_t sum_bias[kBwdRows][32 * VEC];
  __shared__ acc_t sum_scale[kBwdRows][32 * VEC];
  const acc_t slope = static_cast<acc_t>(negative_slope);
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * VEC;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r_end = min(rows, r_begin + rows_per_chunk);
  acc_t sb[VEC], ss[VEC], s[VEC], b[VEC];
#pragma unroll
  for (int q = 0; q < VEC; ++q) {
    sb[q] = ss[q] = acc_t(0);
    const bool in = c0 + q < n;
    s[q] = (scale && in) ? static_cast<acc_t>(scale[c0 + q]) : acc_t(1);
    b[q] = (bias && in) ? static_cast<acc_t>(bias[c0 + q]) : acc_t(0);
  }
  if (c0 < n) {
    // kUnroll rows per step, all loads first, so several 16-byte loads per thread are in flight.
    for (int64_t r0 = r_begin + threadIdx.y; r0 < r_end; r0 += kBwdRows * kUnroll) {
      VecT gv[kUnroll], xv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * kBwdRows;
        if (r < r_end) {
          gv[u] = *reinterpret_cast<const VecT*>(grad + r * n + c0);
          xv[u] = *reinterpret_cast<const VecT*>(x + r * n + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * kBwdRows;
        if (r >= r_end) break;
        VecT out;
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
          const acc_t xq = static_cast<acc_t>(xv[u].v[q]);
          const acc_t d =
              static_cast<acc_t>(gv[u].v[q]) * activation_derivative<acc_t>(ACT, xq * s[q] + b[q], slope);
          sb[q] += d;
          ss[q] += d * xq;
          out.v[q] = static_cast<scalar_t>(d * s[q]);
        }
        if (grad_x) *reinterpret_cast<VecT*>(grad_x + r * n + c0) = out;
      }
    }
  }
#pragma unroll
  for (int q = 0; q < VEC; ++q) {
    sum_bias[threadIdx.y][threadIdx.x * VEC + q] = sb[q];
    sum_scale[threadIdx.y][threadIdx.x * VEC + q] = ss[q];
  }
  __syncthreads();
  if (threadIdx.y == 0 && c0 < n) {
#pragma unroll
    for (int q = 0; q < VEC; ++q) {
      acc_t tb = 0, ts = 0;
      for (int y = 0; y < kBwdRows; ++y) {
        tb += sum_bias[y][threadIdx.x * VEC + q];
        ts += sum_scale[y][threadIdx.x * VEC + q];
      }
      if (c0 + q < n) {
        if (partial_bias) partial_bias[blockIdx.y * n + c0 + q] = tb;
        if (partial_scale) partial_scale[blockIdx.y * n + c0 + q] = ts;
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bias_act_backward_cuda(
    const at::Tensor& grad_in, const at::Tensor& x_in, const std::optional<at::Tensor>& scale_in,
    const std::optional<at::Tensor>& bias_in, c10::string_view activation, double negative_slope,
    std::array<bool, 3> output_mask) {
  check_bias_act_backward_args(grad_in, x_in, scale_in, bias_in);
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), grad = grad_in.contiguous();
  const at::Tensor scale = scale_in.has_value() ? scale_in->contiguous() : at::Tensor();
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  const int64_t n = x.size(-1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  at::Tensor grad_x = output_mask[0] ? at::empty_like(x) : at::empty({0}, x.options());
  at::Tensor grad_scale = at::empty({0}, x.options()), grad_bias = at::empty({0}, x.options());
  const bool want_scale = output_mask[1], want_bias = output_mask[2];
  if (rows == 0) {
    if (want_scale) grad_scale = at::zeros({n}, x.options());
    if (want_bias) grad_bias = at::zeros({n}, x.options());
    return {grad_x, grad_scale, grad_bias};
  }
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "bias_act_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr int kVec = 16 / sizeof(scalar_t);
    const bool vec_ok = n % kVec == 0 && is_aligned(x.data_ptr(), 16) && is_aligned(grad.data_ptr(), 16) &&
                        (!output_mask[0] || is_aligned(grad_x.data_ptr(), 16));
    const int vec = vec_ok ? kVec : 1;
    const int64_t col_blocks = ceil_div(n, 32 * vec);
    // Enough (column block, row chunk) blocks to fill the GPU several times over.
    const int64_t target = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 8;
    const int64_t chunks = std::max<int64_t>(
        1, std::min<int64_t>({ceil_div(target, col_blocks), ceil_div(rows, kBwdRows), 65535}));
    const int64_t rows_per_chunk = ceil_div(rows, chunks);
    const auto acc_opts = x.options().dtype(at::toOpMathType(x.scalar_type()));
    at::Tensor partial_scale = want_scale ? at::empty({chunks, n}, acc_opts) : at::Tensor();
    at::Tensor partial_bias = want_bias ? at::empty({chunks, n}, acc_opts) : at::Tensor();
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
    const dim3 block(32, kBwdRows);
    auto* gx = output_mask[0] ? grad_x.data_ptr<scalar_t>() : nullptr;
    auto* ps = want_scale ? partial_scale.data_ptr<acc_t>() : nullptr;
    auto* pb = want_bias ? partial_bias.data_ptr<acc_t>() : nullptr;
    const scalar_t* sp = scale.defined() ? scale.data_ptr<scalar_t>() : nullptr;
    const scalar_t* bp = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
    const auto stream = at::cuda::getCurrentCUDAStream();
    dispatch_activation(act, [&](auto tag) {
      constexpr Activation ACT = decltype(tag)::value;
      if (vec_ok) {
        bias_act_backward_kernel<scalar_t, kVec, ACT><<<grid, block, 0, stream>>>(
            grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), sp, bp, gx, ps, pb, rows, n, rows_per_chunk,
            negative_slope);
      } else {
        bias_act_backward_kernel<scalar_t, 1, ACT><<<grid, block, 0, stream>>>(
            grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), sp, bp, gx, ps, pb, rows, n, rows_per_chunk,
            negative_slope);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    if (want_scale) grad_scale = partial_scale.sum(0).to(x.scalar_type());
    if (want_bias) grad_bias = partial_bias.sum(0).to(x.scalar_type());
  });
  return {grad_x, grad_scale, grad_bias};
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
  m.impl("bias_act_backward", &bias_act_backward_cuda);
}

}  // namespace cuda
}  // namespace sparsetorch
