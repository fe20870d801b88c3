// sparse24_decode_linear on CUDA: the mma.sp kernel of cuda/sparse24_decode_kernel.cuh (design, packed layout
// and bounds there). This file prepares the operands: x as (tokens, in_features) rows that 16-byte loads can
// read (copied only when not already so), values / meta contiguous and 16-byte aligned (copied otherwise),
// and runs the tokens 64 at a time (the kernel's bound). Where the loaded kernel was compiled for sm_90 the splits
// are summed inside a cluster (no workspace); elsewhere the split-k workspace comes from the caching allocator and
// its counters are cleared by one memset on the stream per launch that splits.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <string>

#include "common/activation.h"
#include "common/sparse24_decode_checks.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_code.h"
#include "cuda/sparse24_decode_kernel.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

static_assert(static_cast<int>(Activation::None) == sp24d::kNone && static_cast<int>(Activation::Relu) == sp24d::kRelu &&
                  static_cast<int>(Activation::LeakyRelu) == sp24d::kLeakyRelu &&
                  static_cast<int>(Activation::Gelu) == sp24d::kGelu &&
                  static_cast<int>(Activation::GeluTanh) == sp24d::kGeluTanh &&
                  static_cast<int>(Activation::Silu) == sp24d::kSilu &&
                  static_cast<int>(Activation::Sigmoid) == sp24d::kSigmoid &&
                  static_cast<int>(Activation::Tanh) == sp24d::kTanh,
              "the kernel's activation codes are sparsetorch::Activation's");

at::Tensor aligned16(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  if (!is_aligned(c.data_ptr(), 16)) c = c.clone();  // a view that starts mid-allocation
  return c;
}

at::Tensor sparse24_decode_linear_cuda(const at::Tensor& x, const at::Tensor& values, const at::Tensor& meta,
                                       int64_t out_features, int64_t in_features,
                                       const std::optional<at::Tensor>& bias, c10::string_view activation,
                                       double negative_slope) {
  const Sparse24DecodeProblem p =
      check_sparse24_decode_linear_args(x, values, meta, out_features, in_features, bias);
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x.device());
  // What the loaded kernel was compiled for decides, not the device: a compute_80 build JIT-compiled on an
  // H100 has no cluster path (device_code.h). Every instantiation comes from this file's one set of targets.
  const void* kernel = reinterpret_cast<const void*>(&sp24d::sparse24_decode_kernel<__half, 1, 1, 8>);
  require_device_code(kernel, 80, "sparse24_decode_linear", "mma.sp on the 2:4 sparse tensor cores");
  const bool cluster = kernel_arch(kernel) >= 90;
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  at::Tensor out = at::empty({p.n, p.m}, x.options());
  if (p.n == 0) return out.view(p.out_shape);

  const at::Tensor x2 = rows_for_16byte_loads(x, p.n, p.k);  // k % 32 == 0: a copy only for strided / unaligned x
  const at::Tensor values_c = aligned16(values), meta_c = aligned16(meta);
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const int sms = prop->multiProcessorCount;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int m = static_cast<int>(p.m), k = static_cast<int>(p.k);
  const sp24d::Config cfg =
      sp24d::library_config(m, k, cluster, static_cast<int64_t>(prop->sharedMemPerBlockOptin));
  // The tokens run 64 at a time: at most two chunk sizes (full and the rest), planned once each here. The
  // workspace (last-block mode only: the partials grow with the tokens) fits the larger plan.
  const int full = static_cast<int>(std::min<int64_t>(p.n, sp24d::kMaxTokens));
  const int rest = static_cast<int>(p.n % full);
  const sp24d::Plan plan_full = sp24d::plan(m, full, k, sms, cfg);
  const sp24d::Plan plan_rest = rest > 0 ? sp24d::plan(m, rest, k, sms, cfg) : plan_full;
  const int64_t ws_bytes = std::max(plan_full.workspace_bytes, plan_rest.workspace_bytes);
  const at::Tensor workspace = ws_bytes > 0 ? at::empty({ws_bytes}, x.options().dtype(at::kByte)) : at::Tensor();
  for (int64_t t0 = 0; t0 < p.n; t0 += full) {
    const int n = static_cast<int>(std::min<int64_t>(p.n - t0, full));
    const cudaError_t err = launch_sparse24_decode(
        n == full ? plan_full : plan_rest, cfg, bf16, values_c.data_ptr(), meta_c.data_ptr(),
        static_cast<const char*>(x2.data_ptr()) + t0 * x2.stride(0) * 2, x2.stride(0),
        bias_c.defined() ? bias_c.data_ptr() : nullptr, static_cast<char*>(out.data_ptr()) + t0 * p.m * 2, p.m, m, n, k,
        static_cast<int>(act), static_cast<float>(negative_slope), workspace.defined() ? workspace.data_ptr() : nullptr,
        ws_bytes, /*counters_zeroed=*/false, stream);
    TORCH_CHECK(err == cudaSuccess, "sparse24_decode_linear: kernel launch failed for a ", p.m, " x ", p.k,
                " weight and ", n, " tokens: ", cudaGetErrorString(err));
  }
  return out.view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) {
  m.impl("sparse24_decode_linear", SPARSETORCH_CUDA_OP(sparse24_decode_linear_cuda));
}

}  // namespace cuda
}  // namespace sparsetorch
