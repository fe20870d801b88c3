// Ops that say what this build can run on a device (sparsetorch._build_info.cuda_features, the pruned forms'
// and SpmmPlan's availability checks): asked of the loaded device code (cuda/device_code.h) and the device's
// limits, not of its compute capability alone. A CPU-only build answers "nothing" for CUDA devices.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "common/checks.h"
#include "common/spmm_routing.h"

#ifdef SPARSETORCH_WITH_CUDA
#include "cuda/device_code.h"
#endif

namespace sparsetorch {
namespace {

// key=value lines: arch and binary (the loaded code's ptxVersion and binaryVersion), then one 0/1 per feature
// of cuda::DeviceCode. Empty in a CPU-only build.
std::string cuda_features_op(int64_t device) {
#ifdef SPARSETORCH_WITH_CUDA
  const cuda::DeviceCode dc = cuda::device_code(static_cast<int>(device));
  return "arch=" + std::to_string(dc.arch) + "\nbinary=" + std::to_string(dc.binary) +
         "\nmma=" + std::to_string(dc.mma) + "\nmma_sp=" + std::to_string(dc.mma_sp) +
         "\nclusters=" + std::to_string(dc.clusters) + "\ncp_async=" + std::to_string(dc.cp_async) +
         "\nbf16=" + std::to_string(dc.bf16) + "\ncusparselt=" + std::to_string(dc.cusparselt) + "\n";
#else
  (void)device;
  return "";
#endif
}

std::string spmm_route_unavailable_op(const std::string& route, at::ScalarType dtype, c10::Device device) {
  return spmm_route_unavailable(parse_spmm_backend(route), dtype, device);
}

}  // namespace
}  // namespace sparsetorch

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // What the loaded CUDA code can do on CUDA device `device` (cuda/device_code.h); "" without CUDA code.
  m.def("cuda_features(int device) -> str", &sparsetorch::cuda_features_op);
  // Why SpMM route `route` cannot run for `dtype` on `device` ("" if it can): common/spmm_routing.h.
  m.def("spmm_route_unavailable(str route, ScalarType dtype, Device device) -> str",
        &sparsetorch::spmm_route_unavailable_op);
}
