// csr16_linear on CUDA: the CUDA-core kernel of cuda/csr16_kernel.cuh (design and bounds there). This
// file prepares the operands: x as a (tokens, k) matrix with rows of a multiple of 8 elements, 16-byte
// aligned (copied, zero-padded, only when it is not already), the entries 16-byte aligned (copied when a
// view starts elsewhere), and picks the tokens per block and the grid.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <unordered_map>

#include "common/csr16_checks.h"
#include "cuda/csr16_kernel.cuh"
#include "cuda/cuda_utils.h"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

template <typename T, int NB>
void launch_nb(const csr16::Params& p, int64_t smem, int64_t token_tiles, int device, cudaStream_t stream) {
  auto* kernel = csr16::csr16_linear_kernel<T, NB>;
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel));
  // Blocks per SM, asked once per (device, shared-memory size): the occupancy query is host time on
  // every call otherwise.
  static thread_local std::unordered_map<int64_t, int> per_sm_by_smem;
  const int64_t key = smem * 1024 + device;
  auto found = per_sm_by_smem.find(key);
  if (found == per_sm_by_smem.end()) {
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, csr16::kThreads, static_cast<size_t>(smem)));
    found = per_sm_by_smem.emplace(key, per_sm).first;
  }
  const int per_sm = found->second;
  const int64_t blocks = csr16::row_blocks(p.m, per_sm, prop->multiProcessorCount);
  kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(token_tiles)), csr16::kThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launch(const csr16::Params& p, int nb, int64_t smem, int64_t token_tiles, int device, cudaStream_t stream) {
  csr16::with_tile_tokens(nb, [&](auto NB) { launch_nb<T, decltype(NB)::value>(p, smem, token_tiles, device, stream); });
}

at::Tensor csr16_linear_cuda(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& entries,
                             const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope) {
  const Csr16Problem p = check_csr16_linear_args(x, crow, entries, bias);
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({p.n, p.m}, x.options());
  if (p.n == 0 || p.m == 0) return out.view(p.out_shape);

  // k == 0: x2 is 8 zero columns, the kernel writes act(bias).
  const at::Tensor x2 = rows_for_16byte_loads(x, p.n, p.k);
  const int64_t kx = x2.size(1);
  const at::Tensor crow_c = crow.contiguous();
  at::Tensor entries_c = entries.contiguous();
  if (!is_aligned(entries_c.data_ptr(), 16)) entries_c = entries_c.clone();  // the kernel reads 4 entries at a time
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();

  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const int nb = csr16::tokens_per_block(p.n, kx, static_cast<int64_t>(prop->sharedMemPerBlockOptin));
  TORCH_CHECK(nb > 0, "csr16_linear: x's ", kx, " columns do not fit this GPU's ", prop->sharedMemPerBlockOptin,
              " bytes of shared memory per block");
  const int64_t token_tiles = (p.n + nb - 1) / nb;
  TORCH_CHECK_VALUE(token_tiles < 65536, "csr16_linear: at most ", int64_t{65535} * nb, " tokens per call, got ", p.n);

  csr16::Params prm{};
  prm.crow = crow_c.data_ptr<int32_t>();
  prm.entries = reinterpret_cast<const uint32_t*>(entries_c.data_ptr<int32_t>());
  prm.nnz = static_cast<int>(entries_c.size(0));
  prm.x = reinterpret_cast<const uint16_t*>(x2.data_ptr());
  prm.ldx = x2.stride(0);
  prm.n = static_cast<int>(p.n);
  prm.m = static_cast<int>(p.m);
  prm.k = static_cast<int>(p.k);
  prm.kx = static_cast<int>(kx);
  prm.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  prm.bias = bias_c.defined() ? reinterpret_cast<const uint16_t*>(bias_c.data_ptr()) : nullptr;
  prm.act = act;
  prm.slope = static_cast<float>(negative_slope);
  const int64_t smem = csr16::block_smem(prm.kx, nb);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (x.scalar_type() == at::kBFloat16) {
    launch<__nv_bfloat16>(prm, nb, smem, token_tiles, x.get_device(), stream);
  } else {
    launch<__half>(prm, nb, smem, token_tiles, x.get_device(), stream);
  }
  return out.view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("csr16_linear", SPARSETORCH_CUDA_OP(csr16_linear_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
