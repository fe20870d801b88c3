// Native CSR x dense kernel. Each output row is owned by a group of GROUP lanes (8, 16 or 32);
// lane l covers columns [tile + l*VEC, tile + l*VEC + VEC) of the row, so one group reads a B row
// as GROUP coalesced VEC-wide (16-byte) loads. The row's (column, value) pairs are loaded GROUP at
// a time, one per lane, and broadcast through warp shuffles, up to 4 B rows loaded at once.
// Batches are folded into the row index, so any batch count works (no grid.y limit).
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
// B rows loaded before their FMAs, per group: 4 for groups of 8 and 16 lanes (narrow B, latency
// bound). Groups of 32 (n >= 128 fp32) load one at a time: with 4 the random 100k graph got 10-20%
// slower at n = 128..512 on the H200 (`python -m benchmarks --suites graphs` measures it).
template <int GROUP>
constexpr int in_flight() {
  return GROUP == 32 ? 1 : 4;
}

template <typename scalar_t, typename index_t, int VEC, int GROUP>
__global__ void __launch_bounds__(kThreads) spmm_row_group_kernel(const NativeArgs<scalar_t, index_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kGroupsPerBlock = kThreads / GROUP;
  const int lane = threadIdx.x % GROUP;
  const unsigned mask = group_lane_mask<GROUP>();
  if (a.run_only_if != nullptr && *a.run_only_if == 0) return;  // spmm_native_if: decided on the device

  // Work items are (row, column tile) pairs, the tiles of a row on neighbouring groups: a graph with
  // few rows and a wide B still fills the GPU (Erdos971, 472 rows, n = 512: 4 items per row).
  const int64_t col_tiles = ceil_div(a.n, GROUP * VEC);
  const int64_t items = a.rows * col_tiles;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / GROUP; item < items;
       item += static_cast<int64_t>(gridDim.x) * kGroupsPerBlock) {
    const int64_t row = item / col_tiles;
    const int64_t b = row / a.m, r = row - b * a.m;
    const index_t* crow_b = a.crow + b * a.crow_bstride;
    const index_t* col_b = a.col + b * a.col_bstride;
    const scalar_t* val_b = a.values + b * a.val_bstride;
    const scalar_t* dense_b = a.dense + b * a.dense_bstride;
    const auto [start, stop] = clamped_row_span(crow_b, r, a.L);
    const int64_t c0 = (item - row * col_tiles) * (GROUP * VEC) + lane * VEC;
    const bool active = c0 < a.n;
    acc_t acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = acc_t(0);

    for (int64_t chunk = start; chunk < stop; chunk += GROUP) {
      const EntryChunk<GROUP, scalar_t, index_t> entries(col_b, val_b, chunk, stop, lane);
      constexpr int K = in_flight<GROUP>();
      for (int t = 0; t < entries.count; t += K) {
        GatheredRows<scalar_t, VEC, K> g;
        g.template load<GROUP>(a, dense_b, mask, entries.col, entries.val, t, entries.count, c0, active);
#pragma unroll
        for (int u = 0; u < K; ++u) g.fma(u, acc);  // entries past count add zero
      }
    }
    if (!active) continue;
    store_outputs<scalar_t, index_t, VEC>(a, row * a.n + c0, c0, acc);
  }
}

template <typename scalar_t, typename index_t, int VEC, int GROUP>
void launch(const NativeArgs<scalar_t, index_t>& args, std::integral_constant<int, VEC>,
            std::integral_constant<int, GROUP>) {
  constexpr int kGroupsPerBlock = kThreads / GROUP;
  const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 64;
  const int64_t items = args.rows * ceil_div(args.n, GROUP * VEC);
  const int64_t blocks = std::min(ceil_div(items, kGroupsPerBlock), max_blocks);
  spmm_row_group_kernel<scalar_t, index_t, VEC, GROUP>
      <<<static_cast<unsigned>(blocks), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void spmm_native(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                 const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi) {
  run_row_group_kernel(p, crow, col, values, dense, out, epi,
                       [](const auto& args, auto vec, auto group) { launch(args, vec, group); });
}

void spmm_native_if(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                    const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi,
                    const at::Tensor& run_flag) {
  TORCH_INTERNAL_ASSERT(run_flag.scalar_type() == at::kInt && run_flag.numel() == 1 && run_flag.is_cuda());
  run_row_group_kernel(p, crow, col, values, dense, out, epi, [&](const auto& args, auto vec, auto group) {
    auto guarded = args;
    guarded.run_only_if = run_flag.data_ptr<int>();
    launch(guarded, vec, group);
  });
}

}  // namespace cuda
}  // namespace sparsetorch
