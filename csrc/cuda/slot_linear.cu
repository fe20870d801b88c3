// slot_linear on CUDA: bf16 and fp16, plain or banded layout, through the tensor-core kernel of
// cuda/slot_kernel.cuh (the kernel, its design and the launch heuristic are described there). This file
// prepares the operands: x as a (tokens, k) matrix with rows of a multiple of 8 elements, 16-byte aligned
// (copied, zero-padded, only when it is not already), the entries 16-byte aligned, and, when the chunks are
// split among thread blocks, the fp32 workspace that the split-k kernel sums in split order.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "common/slot_checks.h"
#include "cuda/device_code.h"
#include "cuda/pruned_linear_launch.cuh"
#include "cuda/slot_kernel.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

using slot::Launch;
using slot::Params;

at::Tensor slot_linear_cuda(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& entries,
                            int64_t out_features, const std::optional<at::Tensor>& bias, c10::string_view activation,
                            double negative_slope, bool banded) {
  const SlotProblem p = check_slot_linear_args(x, offsets, entries, out_features, bias, banded);
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({p.n, p.m}, x.options());
  if (p.n == 0 || p.m == 0) return out.view(p.out_shape);

  const at::Tensor x2 = rows_for_16byte_loads(x, p.n, p.k);
  const at::Tensor off = offsets.contiguous();
  at::Tensor ent = entries.contiguous();
  if (!is_aligned(ent.data_ptr(), 16)) ent = ent.clone();  // one 16-byte copy per lane and trip
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();

  require_device_code(reinterpret_cast<const void*>(&slot::slot_linear_kernel<__half, 1, false>), 80, "slot_linear",
                      "mma.sync on bf16/fp16 tensor cores");
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const LaunchLimits lim = launch_limits(prop);
  const Launch l = slot::choose_launch(p.m, p.n, p.k, banded, lim.sms, lim.smem_per_sm, lim.smem_reserved,
                                       lim.smem_per_block);
  TORCH_CHECK(l.smem > 0, "slot_linear: needs ", slot::block_smem(l.nt, banded),
              " bytes of shared memory per block (this GPU: ", lim.smem_per_block, ")");
  TORCH_CHECK_VALUE(l.row_blocks < 65536 && l.splits < 65536 && l.column_tiles < (int64_t{1} << 31),
                    "slot_linear: out_features = ", p.m, " (in_features = ", p.k, ") needs ", l.row_blocks,
                    " row blocks in the launch grid, at most 65535 are possible");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor work = l.splits > 1 ? at::empty({l.splits, p.n, p.m}, x.options().dtype(at::kFloat)) : at::Tensor();

  Params prm{};
  prm.offsets = off.data_ptr<int32_t>();
  prm.entries = reinterpret_cast<const uint32_t*>(ent.data_ptr<int32_t>());
  prm.nnz = static_cast<int>(ent.size(0));
  set_tile_params(prm, p, x2, l, out, work, bias_c, act, negative_slope);
  prm.strips = static_cast<int>(l.units);  // bands in the banded layout
  // The kernel for tile width NT, layout variant and launch bound (slot_kernel.cuh's kHeldBlocks).
  auto launch = [&](auto NT, auto banded_c, auto min_blocks_c) {
    constexpr int kNT = decltype(NT)::value, kMinBlocks = decltype(min_blocks_c)::value;
    constexpr bool kBanded = decltype(banded_c)::value;
    if constexpr (kNT <= slot::max_nt(kBanded)) {
      if (x.scalar_type() == at::kBFloat16) {
        launch_tiles(slot::slot_linear_kernel<__nv_bfloat16, kNT, kBanded, kMinBlocks>, l, stream, prm);
      } else {
        launch_tiles(slot::slot_linear_kernel<__half, kNT, kBanded, kMinBlocks>, l, stream, prm);
      }
    }
  };
  with_tokens_per_warp(l.nt, [&](auto NT) {
    constexpr int kNT = decltype(NT)::value;
    using Planned = std::integral_constant<int, slot::blocks_per_sm(kNT, true)>;
    if (!banded) {
      launch(NT, std::false_type{}, std::integral_constant<int, slot::blocks_per_sm(kNT, false)>{});
    } else if constexpr (kNT == 1) {
      if (l.held) {
        launch(NT, std::true_type{}, std::integral_constant<int, slot::kHeldBlocks>{});
      } else {
        launch(NT, std::true_type{}, Planned{});
      }
    } else {
      launch(NT, std::true_type{}, Planned{});
    }
  });
  if (l.splits > 1) reduce_splits(work, out, prm.bias, act, prm.slope, prop->multiProcessorCount, stream);
  return out.view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("slot_linear", SPARSETORCH_CUDA_OP(slot_linear_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
