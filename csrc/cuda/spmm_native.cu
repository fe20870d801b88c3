// Native CSR x dense kernel. Each output row is owned by a group of GROUP lanes (8, 16 or 32);
// lane l covers columns [tile + l*VEC, tile + l*VEC + VEC) of the row, so one group reads a B row
// as GROUP coalesced VEC-wide (16-byte) loads. The row's (column, value) pairs are loaded GROUP at
// a time, one per lane, and broadcast through warp shuffles. Batches are folded into the row
// index, so any batch count works (no grid.y limit).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename scalar_t, typename index_t>
struct NativeArgs {
  const index_t* crow;
  const index_t* col;
  const scalar_t* values;
  const scalar_t* dense;
  const scalar_t* accumulate;  // may be nullptr
  const scalar_t* bias;        // may be nullptr
  scalar_t* out;
  int64_t rows;  // batch * m
  int64_t m, k, n, L;
  int64_t crow_bstride, col_bstride, val_bstride, dense_bstride, ldb;
  double alpha, beta, negative_slope;
  Activation act;
};

template <typename scalar_t, typename index_t, int VEC, int GROUP>
__global__ void __launch_bounds__(kThreads) spmm_row_group_kernel(const NativeArgs<scalar_t, index_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Vec<scalar_t, VEC>;
  constexpr int kGroupsPerBlock = kThreads / GROUP;
  const int lane = threadIdx.x % GROUP;
  const int group_in_warp = (threadIdx.x % 32) / GROUP;
  const unsigned mask = GROUP == 32 ? 0xffffffffu : (((1u << GROUP) - 1u) << (group_in_warp * GROUP));
  const acc_t alpha = static_cast<acc_t>(a.alpha), beta = static_cast<acc_t>(a.beta);
  const acc_t slope = static_cast<acc_t>(a.negative_slope);

  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / GROUP; row < a.rows;
       row += static_cast<int64_t>(gridDim.x) * kGroupsPerBlock) {
    const int64_t b = row / a.m, r = row - b * a.m;
    const index_t* crow_b = a.crow + b * a.crow_bstride;
    const index_t* col_b = a.col + b * a.col_bstride;
    const scalar_t* val_b = a.values + b * a.val_bstride;
    const scalar_t* dense_b = a.dense + b * a.dense_bstride;
    // Clamp the span to the stored entries: a malformed crow cannot make us read out of bounds.
    const int64_t start = min(max(static_cast<int64_t>(crow_b[r]), int64_t(0)), a.L);
    const int64_t stop = min(max(static_cast<int64_t>(crow_b[r + 1]), start), a.L);

    for (int64_t tile = 0; tile < a.n; tile += GROUP * VEC) {
      const int64_t c0 = tile + lane * VEC;
      const bool active = c0 < a.n;
      acc_t acc[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] = acc_t(0);

      for (int64_t chunk = start; chunk < stop; chunk += GROUP) {
        const int64_t j = chunk + lane;
        int64_t my_col = -1;
        acc_t my_val = acc_t(0);
        if (j < stop) {
          my_col = col_b[j];
          my_val = static_cast<acc_t>(val_b[j]);
        }
        const int count = stop - chunk < GROUP ? static_cast<int>(stop - chunk) : GROUP;
        for (int t = 0; t < count; ++t) {
          const int64_t c = __shfl_sync(mask, my_col, t, GROUP);
          const acc_t v = __shfl_sync(mask, my_val, t, GROUP);
          if (!active || c < 0 || c >= a.k) continue;
          const scalar_t* brow = dense_b + c * a.ldb + c0;
          if (VEC > 1) {
            const VecT bv = *reinterpret_cast<const VecT*>(brow);
#pragma unroll
            for (int q = 0; q < VEC; ++q) acc[q] += v * static_cast<acc_t>(bv.v[q]);
          } else {
            acc[0] += v * static_cast<acc_t>(brow[0]);
          }
        }
      }
      if (!active) continue;
      const int64_t base = row * a.n + c0;
      if (VEC > 1) {
        VecT res;
        VecT cin;
        if (a.accumulate) cin = *reinterpret_cast<const VecT*>(a.accumulate + base);
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
          acc_t x = alpha * acc[q];
          if (a.accumulate) x += beta * static_cast<acc_t>(cin.v[q]);
          if (a.bias) x += static_cast<acc_t>(a.bias[c0 + q]);
          res.v[q] = static_cast<scalar_t>(apply_activation<acc_t>(a.act, x, slope));
        }
        *reinterpret_cast<VecT*>(a.out + base) = res;
      } else {
        acc_t x = alpha * acc[0];
        if (a.accumulate) x += beta * static_cast<acc_t>(a.accumulate[base]);
        if (a.bias) x += static_cast<acc_t>(a.bias[c0]);
        a.out[base] = static_cast<scalar_t>(apply_activation<acc_t>(a.act, x, slope));
      }
    }
  }
}

template <typename scalar_t, typename index_t, int VEC, int GROUP>
void launch(const NativeArgs<scalar_t, index_t>& args) {
  constexpr int kGroupsPerBlock = kThreads / GROUP;
  const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 64;
  const int64_t blocks = std::min(ceil_div(args.rows, kGroupsPerBlock), max_blocks);
  spmm_row_group_kernel<scalar_t, index_t, VEC, GROUP>
      <<<static_cast<unsigned>(blocks), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, typename index_t, int VEC>
void launch_for_width(const NativeArgs<scalar_t, index_t>& args) {
  // Smallest group whose lanes cover the row in one tile (at least 8 lanes, at most a warp).
  const int64_t lanes_needed = ceil_div(args.n, VEC);
  if (lanes_needed <= 8) return launch<scalar_t, index_t, VEC, 8>(args);
  if (lanes_needed <= 16) return launch<scalar_t, index_t, VEC, 16>(args);
  return launch<scalar_t, index_t, VEC, 32>(args);
}

}  // namespace

void spmm_native(const SpmmProblem& p, const at::Tensor& crow_in, const at::Tensor& col_in,
                 const at::Tensor& values_in, const at::Tensor& dense_in, const at::Tensor& out,
                 const SpmmEpilogue& epi) {
  if (out.numel() == 0) return;
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
  const at::Tensor dense = dense_in.stride(-1) == 1 ? dense_in : dense_in.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "spmm_native", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "spmm_native", [&] {
      NativeArgs<scalar_t, index_t> args;
      args.crow = crow.data_ptr<index_t>();
      args.col = col.data_ptr<index_t>();
      args.values = values.data_ptr<scalar_t>();
      args.dense = dense.data_ptr<scalar_t>();
      args.accumulate = epi.accumulate.defined() ? epi.accumulate.data_ptr<scalar_t>() : nullptr;
      args.bias = epi.bias.defined() ? epi.bias.data_ptr<scalar_t>() : nullptr;
      args.out = out.data_ptr<scalar_t>();
      args.rows = p.batch * p.m;
      args.m = p.m;
      args.k = p.k;
      args.n = p.n;
      args.L = p.nnz_stride;
      args.crow_bstride = p.pattern_batched ? p.m + 1 : 0;
      args.col_bstride = p.pattern_batched ? p.nnz_stride : 0;
      args.val_bstride = p.values_batched ? p.nnz_stride : 0;
      args.dense_bstride = p.dense_batched ? dense.stride(0) : 0;
      args.ldb = dense.stride(-2);
      args.alpha = epi.alpha;
      args.beta = epi.beta;
      args.negative_slope = epi.negative_slope;
      args.act = epi.act;
      if (args.rows == 0) return;
      // 16-byte accesses need every row start of B, out and accumulate on a 16-byte boundary.
      constexpr int kVec = 16 / sizeof(scalar_t);
      bool vec_ok = p.n % kVec == 0 && args.ldb % kVec == 0 && args.dense_bstride % kVec == 0 &&
                    is_aligned(args.dense, 16) && is_aligned(args.out, 16);
      if (args.accumulate) vec_ok = vec_ok && is_aligned(args.accumulate, 16);
      if (vec_ok) {
        launch_for_width<scalar_t, index_t, kVec>(args);
      } else {
        launch_for_width<scalar_t, index_t, 1>(args);
      }
    });
  });
}

}  // namespace cuda
}  // namespace sparsetorch
