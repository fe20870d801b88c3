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
#include "common/native_caches.h"
#include "cuda/csr16_kernel.cuh"
#include "cuda/cuda_utils.h"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

// Blocks per SM of a kernel, asked once per (kernel, shared-memory size, device) and thread: the occupancy
// query is host time on every call otherwise. Listed with the native caches (common/native_caches.h).
struct OccupancyKey {
  const void* kernel;
  int64_t smem;
  int device;
  bool operator==(const OccupancyKey& o) const { return kernel == o.kernel && smem == o.smem && device == o.device; }
};
struct OccupancyKeyHash {
  size_t operator()(const OccupancyKey& k) const {
    return std::hash<const void*>()(k.kernel) ^ (std::hash<int64_t>()(k.smem * 1024 + k.device) << 1);
  }
};
thread_local std::unordered_map<OccupancyKey, int, OccupancyKeyHash> thread_occupancy;
thread_local uint64_t thread_occupancy_generation = 0;
native_caches::Generation occupancy_generation;

std::unordered_map<OccupancyKey, int, OccupancyKeyHash>& occupancy_of_this_thread() {
  if (occupancy_generation.stale(thread_occupancy_generation)) thread_occupancy.clear();
  return thread_occupancy;
}

const bool kCacheListed = native_caches::add(
    "csr16_occupancy",
    [] {
      thread_occupancy.clear();
      occupancy_generation.bump();
    },
    [] { return static_cast<int64_t>(occupancy_of_this_thread().size()); });

int blocks_per_sm(const void* kernel, int64_t smem, int device) {
  auto& known = occupancy_of_this_thread();
  const OccupancyKey key{kernel, smem, device};
  auto found = known.find(key);
  if (found == known.end()) {
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, csr16::kThreads, static_cast<size_t>(smem)));
    found = known.emplace(key, per_sm).first;
  }
  return found->second;
}

template <typename T, int NB>
void launch_nb(const csr16::Params& p, int64_t smem, int64_t token_tiles, int device, cudaStream_t stream) {
  auto* kernel = csr16::csr16_linear_kernel<T, NB>;
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel));
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), smem, device);
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
