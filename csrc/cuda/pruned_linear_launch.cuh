// Host-side steps the two tensor-core pruned-weight ops share (bitmap_linear.cu, slot_linear.cu): the
// launch of a kernel at its token-tile width, and the second kernel that adds the partial sums of a launch
// whose chunks were split among blocks. (x's layout for 16-byte loads: rows_for_16byte_loads, cuda_utils.h.)
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>
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

// The shared fields of a tensor-core kernel's parameters for problem p (BitmapProblem, SlotProblem): x2 from
// rows_for_16byte_loads, the launch's split, and where the sums go (out, or the fp32 workspace `work`
// (splits, n, m) when the chunks are split among blocks).
template <typename Problem, typename Launch>
inline void set_tile_params(bitmap::TileParams& prm, const Problem& p, const at::Tensor& x2, const Launch& l,
                            const at::Tensor& out, const at::Tensor& work, const at::Tensor& bias, Activation act,
                            double negative_slope) {
  prm.x = reinterpret_cast<const uint16_t*>(x2.data_ptr());
  prm.ldx = x2.stride(0);
  prm.kx = static_cast<int>(x2.size(1));
  prm.n = static_cast<int>(p.n);
  prm.m = static_cast<int>(p.m);
  prm.strips = static_cast<int>(p.strips);
  prm.chunks = static_cast<int>(p.chunks);
  prm.out = l.splits > 1 ? work.data_ptr() : out.data_ptr();
  prm.bias = bias.defined() ? reinterpret_cast<const uint16_t*>(bias.data_ptr()) : nullptr;
  prm.act = act;
  prm.slope = static_cast<float>(negative_slope);
  prm.ws = l.ws;
  prm.wk = l.wk;
  prm.chunks_per_split = l.chunks_per_split;
}

// Launches a tensor-core kernel on the grid of its Launch l (column tiles x row blocks x chunk splits,
// bitmap::kThreads each, l.smem bytes of shared memory).
template <typename Params, typename Launch>
inline void launch_tiles(void (*kernel)(Params), const Launch& l, cudaStream_t stream, const Params& p) {
  allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel));
  kernel<<<dim3(static_cast<unsigned>(l.column_tiles), static_cast<unsigned>(l.row_blocks), static_cast<unsigned>(l.splits)),
           bitmap::kThreads, l.smem, stream>>>(p);
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
