// bitmap_linear on CUDA: bf16 and fp16 through the tensor-core kernel of cuda/bitmap_kernel.cuh (the
// kernel, its design and the launch heuristic are described there). This file prepares the operands:
// x as a (tokens, k) matrix with rows of a multiple of 8 elements, 16-byte aligned (copied, zero-padded,
// only when it is not already), the layout's tensors contiguous and aligned, and, when the chunks are
// split among thread blocks, the fp32 workspace that the second kernel sums in split order.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>

#include "common/bitmap_checks.h"
#include "cuda/bitmap_kernel.cuh"
#include "cuda/device_code.h"
#include "cuda/pruned_linear_launch.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

using bitmap::Launch;
using bitmap::Params;

// Groups with at most this many values take the kernel's scatter path (work ~ values), the others the
// gather path (work ~ positions). SPARSETORCH_BITMAP_SCATTER overrides it (-1: never, 1024: always),
// for benchmarks; read per call (a getenv) so that one process can compare.
int scatter_max() {
  const char* env = std::getenv("SPARSETORCH_BITMAP_SCATTER");
  return env != nullptr ? std::atoi(env) : 256;
}

at::Tensor bitmap_linear_cuda(const at::Tensor& x, const at::Tensor& bitmaps, const at::Tensor& offsets,
                              const at::Tensor& values, int64_t out_features, const std::optional<at::Tensor>& bias,
                              c10::string_view activation, double negative_slope, const std::optional<at::Tensor>&,
                              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                              const std::optional<at::Tensor>&) {
  const BitmapProblem p = check_bitmap_linear_args(x, bitmaps, offsets, values, out_features, bias);
  TORCH_CHECK_TYPE(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
                   "bitmap_linear on CUDA: expected bfloat16 or float16 (tensor cores), got ", x.scalar_type(),
                   "; float32/float64 weights run on the CPU or as CSR (st.spmm)");
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({p.n, p.m}, x.options());
  if (p.n == 0 || p.m == 0) return out.view(p.out_shape);

  const at::Tensor x2 = rows_for_16byte_loads(x, p.n, p.k);
  at::Tensor bm = bitmaps.contiguous(), off = offsets.contiguous(), val = values.contiguous();
  if (!is_aligned(bm.data_ptr(), 16)) bm = bm.clone();
  if (!is_aligned(val.data_ptr(), 16)) val = val.clone();
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();

  require_device_code(reinterpret_cast<const void*>(&bitmap::bitmap_linear_kernel<__half, 1, true>), 80,
                      "bitmap_linear", "mma.sync on bf16/fp16 tensor cores");
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  // The kernels may use this device's opt-in maximum (allow_max_dynamic_smem, per kernel and device).
  const LaunchLimits lim = launch_limits(prop);
  const Launch l = bitmap::choose_launch(p.m, p.n, p.k, val.size(0), lim.sms, lim.smem_per_sm, lim.smem_reserved,
                                         lim.smem_per_block);
  TORCH_CHECK(l.smem > 0, "bitmap_linear: this weight needs more shared memory per block than this GPU's ",
              lim.smem_per_block, " bytes");
  TORCH_CHECK_VALUE(l.row_blocks < 65536 && l.splits < 65536, "bitmap_linear: at most ",
                    int64_t{65535} * 16 * bitmap::kWarps, " out_features, got ", p.m);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor work = l.splits > 1 ? at::empty({l.splits, p.n, p.m}, x.options().dtype(at::kFloat)) : at::Tensor();

  Params prm{};
  prm.bitmaps = reinterpret_cast<const uint64_t*>(bm.data_ptr<int64_t>());
  prm.offsets = off.data_ptr<int32_t>();
  prm.values = reinterpret_cast<const uint16_t*>(val.data_ptr());
  prm.nvalues = val.size(0);
  set_tile_params(prm, p, x2, l, out, work, bias_c, act, negative_slope);
  prm.scatter_max = scatter_max();
  prm.batch = l.batch;
  prm.stage_values = l.stage_values;
  with_tokens_per_warp(l.nt, [&](auto NT) {
    constexpr int nt = decltype(NT)::value;
    if (x.scalar_type() == at::kBFloat16) {
      launch_tiles(l.dense ? bitmap::bitmap_linear_kernel<__nv_bfloat16, nt, true>
                           : bitmap::bitmap_linear_kernel<__nv_bfloat16, nt, false>,
                   l, stream, prm);
    } else {
      launch_tiles(l.dense ? bitmap::bitmap_linear_kernel<__half, nt, true>
                           : bitmap::bitmap_linear_kernel<__half, nt, false>,
                   l, stream, prm);
    }
  });
  if (l.splits > 1) reduce_splits(work, out, prm.bias, act, prm.slope, prop->multiProcessorCount, stream);
  return out.view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("bitmap_linear", SPARSETORCH_CUDA_OP(bitmap_linear_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
