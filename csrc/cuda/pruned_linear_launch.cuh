// Host-side steps the two tensor-core pruned-weight ops share (bitmap_linear.cu, slot_linear.cu): the
// launch of a kernel at its token-tile width, and how the partial sums of a launch whose chunks were split
// among blocks are added: in a thread-block cluster (sm_90), else by a second kernel. (x's layout for
// 16-byte loads: rows_for_16byte_loads, cuda_utils.h.)
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda/bitmap_kernel.cuh"
#include "cuda/cuda_utils.h"

namespace sparsetorch {
namespace cuda {

// f(std::integral_constant<int, NT>{}) for the tensor-core kernels' tiles of 8 tokens per warp (1, 2, 4
// or 8): the one place that turns a launch's nt into the template argument.
template <typename F>
inline void with_tokens_per_warp(int nt, F&& f) {
  switch (nt) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

// Whether a launch of `splits` chunk splits, `smem` bytes per block and tiles of 8 * nt tokens (sets: the
// kernel's SETS) can add its splits in a cluster (write_block_sums, for kernels compiled Clusterable): sm_90
// and newer, 2..kMaxClusterSplits splits, and room for the block's sums. That saves the workspace and the second kernel's launch (H100,
// bitmap kernel, N = 1: 2.7 us of 35 on 11008 x 4096, 3.9 of 13.6 on 1024 x 4096).
// SPARSETORCH_SPLIT_REDUCE=kernel keeps the second kernel (for benchmarks; read per call).
inline bool reduce_in_cluster(int splits, int64_t smem, int nt, int sets, int major) {
  const char* env = std::getenv("SPARSETORCH_SPLIT_REDUCE");
  if (env != nullptr && std::strcmp(env, "kernel") == 0) return false;
  return major >= 9 && splits >= 2 && splits <= bitmap::kMaxClusterSplits && smem >= bitmap::reduce_smem(nt, sets, true);
}

// The shared fields of a tensor-core kernel's parameters for problem p (BitmapProblem, SlotProblem): x2 from
// rows_for_16byte_loads, the launch's split, and where the sums go (out, or the fp32 workspace `work`
// (splits, n, m) when the chunks are split among blocks that do not add in a cluster).
template <typename Problem, typename Launch>
inline void set_tile_params(bitmap::TileParams& prm, const Problem& p, const at::Tensor& x2, const Launch& l,
                            const at::Tensor& out, const at::Tensor& work, bool cluster, const at::Tensor& bias,
                            Activation act, double negative_slope) {
  prm.x = reinterpret_cast<const uint16_t*>(x2.data_ptr());
  prm.ldx = x2.stride(0);
  prm.kx = static_cast<int>(x2.size(1));
  prm.n = static_cast<int>(p.n);
  prm.m = static_cast<int>(p.m);
  prm.strips = static_cast<int>(p.strips);
  prm.chunks = static_cast<int>(p.chunks);
  prm.out = l.splits > 1 && !cluster ? work.data_ptr() : out.data_ptr();
  prm.bias = bias.defined() ? reinterpret_cast<const uint16_t*>(bias.data_ptr()) : nullptr;
  prm.act = act;
  prm.slope = static_cast<float>(negative_slope);
  prm.ws = l.ws;
  prm.wk = l.wk;
  prm.chunks_per_split = l.chunks_per_split;
}

// Launches a tensor-core kernel on the grid of its Launch l (column tiles x row blocks x chunk splits,
// bitmap::kThreads each, l.smem bytes of shared memory); with `cluster` a tile's splits are one cluster
// along z.
template <typename Params, typename Launch>
inline void launch_tiles(void (*kernel)(Params), const Launch& l, cudaStream_t stream, const Params& p,
                         bool cluster = false) {
  allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel));
  const dim3 grid(static_cast<unsigned>(l.column_tiles), static_cast<unsigned>(l.row_blocks), static_cast<unsigned>(l.splits));
  if (cluster) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(bitmap::kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(l.smem);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 1;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = static_cast<unsigned>(l.splits);
    config.attrs = attribute;
    config.numAttrs = 1;
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
    return;
  }
  kernel<<<grid, bitmap::kThreads, l.smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// out (n, m), bf16 or fp16 = act(the splits of work (splits, n, m) added in split order + bias).
inline void reduce_splits(const at::Tensor& work, const at::Tensor& out, const uint16_t* bias, Activation act, float slope,
                          int sms, cudaStream_t stream) {
  const int splits = static_cast<int>(work.size(0));
  const int64_t m = work.size(2), cells = work.size(1) * m;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((cells + 255) / 256, int64_t{8} * sms)));
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  if (out.scalar_type() == at::kBFloat16) {
    bitmap::bitmap_splitk_reduce_kernel<__nv_bfloat16>
        <<<blocks, 256, 0, stream>>>(work.data_ptr<float>(), splits, cells, m, bias, act, slope, o);
  } else {
    bitmap::bitmap_splitk_reduce_kernel<__half>
        <<<blocks, 256, 0, stream>>>(work.data_ptr<float>(), splits, cells, m, bias, act, slope, o);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace sparsetorch
