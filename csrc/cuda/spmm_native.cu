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

#include <type_traits>

#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/spmm_kernel_args.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename scalar_t, typename index_t, int VEC, int GROUP>
__global__ void __launch_bounds__(kThreads) spmm_row_group_kernel(const NativeArgs<scalar_t, index_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Vec<scalar_t, VEC>;
  constexpr int kGroupsPerBlock = kThreads / GROUP;
  const int lane = threadIdx.x % GROUP;
  const unsigned mask = group_lane_mask<GROUP>();

  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / GROUP; row < a.rows;
       row += static_cast<int64_t>(gridDim.x) * kGroupsPerBlock) {
    const int64_t b = row / a.m, r = row - b * a.m;
    const index_t* crow_b = a.crow + b * a.crow_bstride;
    const index_t* col_b = a.col + b * a.col_bstride;
    const scalar_t* val_b = a.values + b * a.val_bstride;
    const scalar_t* dense_b = a.dense + b * a.dense_bstride;
    const auto [start, stop] = clamped_row_span(crow_b, r, a.L);

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
      store_outputs<scalar_t, index_t, VEC>(a, row * a.n + c0, c0, acc);
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

template <typename scalar_t, typename index_t>
void launch_for_width(const NativeArgs<scalar_t, index_t>& args, bool aligned) {
  auto with_group = [&](auto vec_tag) {
    constexpr int V = decltype(vec_tag)::value;
    switch (row_group_size(ceil_div(args.n, V))) {
      case 8:
        return launch<scalar_t, index_t, V, 8>(args);
      case 16:
        return launch<scalar_t, index_t, V, 16>(args);
      default:
        return launch<scalar_t, index_t, V, 32>(args);
    }
  };
  if (aligned) {
    with_group(std::integral_constant<int, 16 / sizeof(scalar_t)>{});
  } else {
    with_group(std::integral_constant<int, 1>{});
  }
}

}  // namespace

void spmm_native(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                 const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi) {
  run_native_kernel(p, crow, col, values, dense, out, epi,
                    [](const auto& args, bool aligned) { launch_for_width(args, aligned); });
}

}  // namespace cuda
}  // namespace sparsetorch
