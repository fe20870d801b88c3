// slot_linear on CUDA: bf16 and fp16 through the tensor-core kernel of cuda/slot_kernel.cuh (the kernel,
// its design and the launch heuristic are described there). This file prepares the operands: x as a
// (tokens, k) matrix with rows of a multiple of 8 elements, 16-byte aligned (copied, zero-padded, only when
// it is not already), the entries 16-byte aligned, and, when the chunks are split among thread blocks,
// the fp32 workspace that the split-k kernel sums in split order.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "common/slot_checks.h"
#include "cuda/cuda_utils.h"
#include "cuda/slot_kernel.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

using slot::Launch;
using slot::Params;

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

template <typename T, int NT>
void launch_nt(const Params& p, const Launch& l, cudaStream_t stream) {
  allow_max_dynamic_smem(reinterpret_cast<const void*>(slot::slot_linear_kernel<T, NT>));
  slot::slot_linear_kernel<T, NT><<<dim3(static_cast<unsigned>(l.column_tiles), static_cast<unsigned>(l.row_blocks),
                                         static_cast<unsigned>(l.splits)),
                                    slot::kThreads, l.smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launch(const Params& p, const Launch& l, cudaStream_t stream) {
  switch (l.nt) {
    case 1:
      return launch_nt<T, 1>(p, l, stream);
    case 2:
      return launch_nt<T, 2>(p, l, stream);
    case 4:
      return launch_nt<T, 4>(p, l, stream);
    default:
      return launch_nt<T, 8>(p, l, stream);
  }
}

at::Tensor slot_linear_cuda(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& entries,
                            int64_t out_features, const std::optional<at::Tensor>& bias, c10::string_view activation,
                            double negative_slope) {
  const SlotProblem p = check_slot_linear_args(x, offsets, entries, out_features, bias);
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({p.n, p.m}, x.options());
  if (p.n == 0 || p.m == 0) return out.view(p.out_shape);

  // x as (n, ldx) rows, ldx % 8 == 0, 16-byte aligned; zero-padded columns when copied.
  at::Tensor x2 = x.reshape({p.n, p.k});
  const int64_t kx = (p.k + 7) / 8 * 8;
  if (!(x2.stride(1) == 1 && x2.stride(0) % 8 == 0 && p.k % 8 == 0 && aligned16(x2)) || p.k == 0) {
    at::Tensor padded = at::zeros({p.n, std::max<int64_t>(kx, 8)}, x.options());
    padded.narrow(1, 0, p.k).copy_(x2);
    x2 = padded;
  }
  const at::Tensor off = offsets.contiguous();
  at::Tensor ent = entries.contiguous();
  if (!aligned16(ent)) ent = ent.clone();  // one 16-byte copy per lane and trip
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();

  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const int64_t smem_per_block = static_cast<int64_t>(prop->sharedMemPerBlockOptin);
  const Launch l = slot::choose_launch(p.m, p.n, p.k, prop->multiProcessorCount,
                                       static_cast<int64_t>(prop->sharedMemPerMultiprocessor),
                                       static_cast<int64_t>(prop->reservedSharedMemPerBlock), smem_per_block);
  TORCH_CHECK(prop->major >= 8 && l.smem > 0, "slot_linear: needs mma.sync (sm_80+) and ", slot::block_smem(l.nt),
              " bytes of shared memory per block (this GPU: ", smem_per_block, ")");
  TORCH_CHECK_VALUE(l.row_blocks < 65536 && l.splits < 65536 && l.column_tiles < (int64_t{1} << 31),
                    "slot_linear: at most ", int64_t{65535} * 16 * slot::kWarps, " out_features, got ", p.m);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor work = l.splits > 1 ? at::empty({l.splits, p.n, p.m}, x.options().dtype(at::kFloat)) : at::Tensor();

  Params prm{};
  prm.offsets = off.data_ptr<int32_t>();
  prm.entries = reinterpret_cast<const uint32_t*>(ent.data_ptr<int32_t>());
  prm.nnz = static_cast<int>(ent.size(0));
  prm.x = reinterpret_cast<const uint16_t*>(x2.data_ptr());
  prm.ldx = x2.stride(0);
  prm.kx = static_cast<int>(std::min<int64_t>(kx, x2.size(1)));
  prm.n = static_cast<int>(p.n);
  prm.m = static_cast<int>(p.m);
  prm.strips = static_cast<int>(p.strips);
  prm.chunks = static_cast<int>(p.chunks);
  prm.out = l.splits > 1 ? work.data_ptr() : out.data_ptr();
  prm.bias = bias_c.defined() ? reinterpret_cast<const uint16_t*>(bias_c.data_ptr()) : nullptr;
  prm.act = act;
  prm.slope = static_cast<float>(negative_slope);
  prm.ws = l.ws;
  prm.wk = l.wk;
  prm.chunks_per_split = l.chunks_per_split;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  if (bf16) {
    launch<__nv_bfloat16>(prm, l, stream);
  } else {
    launch<__half>(prm, l, stream);
  }
  if (l.splits > 1) {
    const int64_t cells = p.n * p.m;
    const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((cells + 255) / 256, 8 * prop->multiProcessorCount)));
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
    if (bf16) {
      bitmap::bitmap_splitk_reduce_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(
          work.data_ptr<float>(), l.splits, cells, p.m, prm.bias, act, prm.slope, o);
    } else {
      bitmap::bitmap_splitk_reduce_kernel<__half><<<blocks, 256, 0, stream>>>(work.data_ptr<float>(), l.splits, cells,
                                                                               p.m, prm.bias, act, prm.slope, o);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out.view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("slot_linear", &slot_linear_cuda); }

}  // namespace cuda
}  // namespace sparsetorch
