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

#include <algorithm>

#include "common/activation.h"
#include "common/checks.h"
#include "common/elementwise.h"
#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/device_code.h"

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

// Blocks resident per SM that the register budget must allow (__launch_bounds__ minimum): 4 blocks
// of 256 threads (64 registers per thread) for 1-, 2- and 4-byte types, 2 for double. Without the
// cap the bf16 fused kernel took 96 registers (2 blocks per SM) and ran at 79% of the copy rate.
template <typename scalar_t>
constexpr int min_blocks_per_sm() {
  return sizeof(scalar_t) >= 8 ? 2 : 4;
}

// Grids are sized to the work (one block per contiguous chunk, as Triton does): the blocks in
// flight then read one compact region of memory at a time. A grid-stride loop covers work beyond
// kMaxBlocks.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

int64_t blocks_for(int64_t chunks) { return std::max<int64_t>(1, std::min(chunks, kMaxBlocks)); }

// out[i] = f(x[i]) or f(x[i], y[i]). A block handles kUnroll * blockDim.x consecutive vectors of
// VEC elements per step; each thread loads its kUnroll vectors before any math, so several
// 16-byte loads per thread are in flight.
constexpr int kUnroll = 4;
enum class Arity { Unary, Binary };

template <typename scalar_t, int VEC, Arity ARITY, typename F>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<scalar_t>())
    map_kernel(const scalar_t* x, const scalar_t* y, scalar_t* out, int64_t numel, F f) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Packed<scalar_t, VEC>;
  const int64_t chunk = static_cast<int64_t>(blockDim.x) * kUnroll;
  const int64_t vec_count = numel / VEC;
  for (int64_t v0 = blockIdx.x * chunk + threadIdx.x; v0 < vec_count; v0 += gridDim.x * chunk) {
    VecT xs[kUnroll], ys[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * blockDim.x;
      if (v < vec_count) {
        xs[u].load(x + v * VEC);
        if constexpr (ARITY == Arity::Binary) ys[u].load(y + v * VEC);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * blockDim.x;
      if (v >= vec_count) break;
      VecT o;
#pragma unroll
      for (int q = 0; q < VEC; ++q) {
        if constexpr (ARITY == Arity::Unary) {
          o.set(q, f(xs[u].get(q)));
        } else {
          o.set(q, f(xs[u].get(q), ys[u].get(q)));
        }
      }
      o.store(out + v * VEC);
    }
  }
  // Tail of fewer than VEC elements (VEC > 1 only), one per thread of the first block.
  if (blockIdx.x == 0) {
    const int64_t i = vec_count * VEC + threadIdx.x;
    if (i < numel) {
      const acc_t a = static_cast<acc_t>(x[i]);
      if constexpr (ARITY == Arity::Unary) {
        out[i] = static_cast<scalar_t>(f(a));
      } else {
        out[i] = static_cast<scalar_t>(f(a, static_cast<acc_t>(y[i])));
      }
    }
  }
}

// Launches map_kernel with 16-byte accesses when every pointer is 16-byte aligned.
template <typename scalar_t, Arity ARITY, typename F>
void launch_map(const scalar_t* x, const scalar_t* y, scalar_t* out, int64_t numel, F f) {
  if (numel == 0) return;
  constexpr int kVec = 16 / sizeof(scalar_t);
  static_assert(kVec <= kThreads, "the tail is handled by one block");
  const bool vec_ok = is_aligned(x, 16) && is_aligned(out, 16) && (y == nullptr || is_aligned(y, 16));
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int vec = vec_ok ? kVec : 1;
  const int64_t blocks = blocks_for(ceil_div(numel / vec, kThreads * kUnroll));
  if (vec_ok) {
    map_kernel<scalar_t, kVec, ARITY, F><<<blocks, kThreads, 0, stream>>>(x, y, out, numel, f);
  } else {
    map_kernel<scalar_t, 1, ARITY, F><<<blocks, kThreads, 0, stream>>>(x, y, out, numel, f);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// y = act(x * scale[c] + bias[c]) over rows of length n. Each thread owns one vector of VEC
// columns (n % VEC == 0, so a vector never crosses a row) and walks rows, keeping its scale and bias
// in registers: no per-element index arithmetic and no re-reads of scale/bias. A block covers
// `rows_per_block` whole rows of one column tile (`tile` vectors wide) per row step and kUnroll
// consecutive row steps, so its accesses form one contiguous region; the kUnroll rows are loaded
// before any math.
template <typename scalar_t, int VEC, Activation ACT>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<scalar_t>())
    bias_act_kernel(const scalar_t* x, const scalar_t* scale, const scalar_t* bias, scalar_t* out, int64_t rows,
                    int64_t n, int tile, int rows_per_block, double negative_slope) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Packed<scalar_t, VEC>;
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
  const int64_t rows_per_step = static_cast<int64_t>(rows_per_block) * kUnroll;
  for (int64_t r0 = blockIdx.x * rows_per_step + r_off; r0 < rows; r0 += gridDim.x * rows_per_step) {
    VecT xs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * rows_per_block;
      if (r < rows) xs[u].load(x + r * n + c0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * rows_per_block;
      if (r >= rows) break;
      VecT o;
#pragma unroll
      for (int q = 0; q < VEC; ++q) {
        acc_t z = xs[u].get(q);
        if (scale) z *= s[q];
        if (bias) z += b[q];
        o.set(q, apply_activation<acc_t>(ACT, z, slope));
      }
      o.store(out + r * n + c0);
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
    const int64_t row_blocks = blocks_for(ceil_div(rows, static_cast<int64_t>(rows_per_block) * kUnroll));
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
// Half types hold 8 columns per thread (sums, scale and bias in fp32: 32 registers), so they unroll
// over 2 rows instead of 4 to stay within the register cap (it was 173 registers, 1 block per SM).
constexpr int kBwdRows = 8;

template <typename scalar_t>
constexpr int bwd_unroll() {
  return sizeof(scalar_t) <= 2 ? 2 : 4;
}

template <typename scalar_t>
constexpr int bwd_min_blocks_per_sm() {
  return sizeof(scalar_t) >= 8 ? 1 : 3;
}

template <typename scalar_t, int VEC, Activation ACT>
__global__ void __launch_bounds__(32 * kBwdRows, bwd_min_blocks_per_sm<scalar_t>())
    bias_act_backward_kernel(const scalar_t* grad, const scalar_t* x, const scalar_t* scale, const scalar_t* bias,
                             scalar_t* grad_x, at::opmath_type<scalar_t>* partial_scale,
                             at::opmath_type<scalar_t>* partial_bias, int64_t rows, int64_t n,
                             int64_t rows_per_chunk, double negative_slope) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Packed<scalar_t, VEC>;
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
    // UNROLL rows per step, all loads first, so several 16-byte loads per thread are in flight.
    constexpr int UNROLL = bwd_unroll<scalar_t>();
    for (int64_t r0 = r_begin + threadIdx.y; r0 < r_end; r0 += kBwdRows * UNROLL) {
      VecT gv[UNROLL], xv[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int64_t r = r0 + u * kBwdRows;
        if (r < r_end) {
          gv[u].load(grad + r * n + c0);
          xv[u].load(x + r * n + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int64_t r = r0 + u * kBwdRows;
        if (r >= r_end) break;
        VecT out;
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
          const acc_t xq = xv[u].get(q);
          const acc_t d = gv[u].get(q) * activation_derivative<acc_t>(ACT, xq * s[q] + b[q], slope);
          sb[q] += d;
          ss[q] += d * xq;
          out.set(q, d * s[q]);
        }
        if (grad_x) out.store(grad_x + r * n + c0);
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
    const dim3 block(32, kBwdRows);
    auto* gx = output_mask[0] ? grad_x.data_ptr<scalar_t>() : nullptr;
    const scalar_t* sp = scale.defined() ? scale.data_ptr<scalar_t>() : nullptr;
    const scalar_t* bp = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
    const auto acc_opts = x.options().dtype(at::toOpMathType(x.scalar_type()));
    at::Tensor partial_scale, partial_bias;
    const auto stream = at::cuda::getCurrentCUDAStream();
    dispatch_activation(act, [&](auto tag) {
      constexpr Activation ACT = decltype(tag)::value;
      auto* kernel = vec_ok ? &bias_act_backward_kernel<scalar_t, kVec, ACT> : &bias_act_backward_kernel<scalar_t, 1, ACT>;
      // One wave: exactly as many (column block, row chunk) blocks as are resident at once, so no
      // partial last wave and the fewest partial-sum rows.
      int blocks_per_sm = 0;
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, 32 * kBwdRows, 0));
      const int64_t resident =
          static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * std::max(1, blocks_per_sm);
      const int64_t chunks = std::max<int64_t>(
          1, std::min<int64_t>({resident / col_blocks, ceil_div(rows, kBwdRows), 65535}));
      const int64_t rows_per_chunk = ceil_div(rows, chunks);
      if (want_scale) partial_scale = at::empty({chunks, n}, acc_opts);
      if (want_bias) partial_bias = at::empty({chunks, n}, acc_opts);
      const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
      kernel<<<grid, block, 0, stream>>>(grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), sp, bp, gx,
                                         want_scale ? partial_scale.data_ptr<acc_t>() : nullptr,
                                         want_bias ? partial_bias.data_ptr<acc_t>() : nullptr, rows, n,
                                         rows_per_chunk, negative_slope);
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
  m.impl("binary", SPARSETORCH_CUDA_OP(binary_cuda));
  m.impl("binary_scalar", SPARSETORCH_CUDA_OP(binary_scalar_cuda));
  m.impl("activation", SPARSETORCH_CUDA_OP(activation_cuda));
  m.impl("bias_act", SPARSETORCH_CUDA_OP(bias_act_cuda));
  m.impl("bias_act_backward", SPARSETORCH_CUDA_OP(bias_act_backward_cuda));
}

}  // namespace cuda
}  // namespace sparsetorch
