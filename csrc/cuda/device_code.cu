// cuda/device_code.h: the loaded device code's architecture per kernel and device, the kernel-image check of
// every CUDA op's first call on a device, and the features sparsetorch._build_info.cuda_features reports.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/build_targets.h"
#include "cuda/device_code.h"

#define SPARSETORCH_STRINGIZE_(...) #__VA_ARGS__
#define SPARSETORCH_STRINGIZE(...) SPARSETORCH_STRINGIZE_(__VA_ARGS__)

namespace sparsetorch {
namespace cuda {
namespace {

// The kernel the image check and cuda_features ask about: every file is built with the same targets. It
// writes the __CUDA_ARCH__ its code was compiled for (the device_code_probe test hook reads it).
__global__ void device_code_probe_kernel(int* arch) {
#ifdef __CUDA_ARCH__
  if (arch != nullptr) *arch = __CUDA_ARCH__;
#endif
}

constexpr int kMaxDevices = 64;
std::atomic<bool> g_image_ok[kMaxDevices];
std::atomic<bool> g_simulate_no_image{false};

bool is_no_image(cudaError_t err) {
  return err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction;
}

// cudaFuncGetAttributes on the current device, turning "no image for this GPU" into the clear error.
cudaFuncAttributes loaded_attributes(const void* kernel) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  cudaFuncAttributes attr{};
  const cudaError_t err =
      g_simulate_no_image.load() ? cudaErrorNoKernelImageForDevice : cudaFuncGetAttributes(&attr, kernel);
  if (err == cudaSuccess) return attr;
  (void)cudaGetLastError();  // neither error is sticky: the context stays usable
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  TORCH_CHECK(!is_no_image(err),
              no_kernel_image_message(device, prop->name, prop->major, prop->minor, build_targets()));
  TORCH_CHECK(err != cudaErrorUnsupportedPtxVersion,
              "sparsetorch: the CUDA driver cannot JIT-compile this build's PTX (",
              join_targets(build_targets()), ") for cuda:", device, " (", prop->name, ", compute capability ",
              prop->major, ".", prop->minor, "): the driver is older than the nvcc that built it. Update the driver, ",
              "or rebuild with SPARSETORCH_CUDA_ARCH=", prop->major, ".", prop->minor, " (SASS for this GPU)");
  C10_CUDA_CHECK(err);
  return attr;
}

}  // namespace

std::vector<std::string> build_targets() {
#ifdef SPARSETORCH_CUDA_TARGETS
  return parse_build_targets(SPARSETORCH_STRINGIZE(SPARSETORCH_CUDA_TARGETS));
#else
  return {};
#endif
}

void check_kernel_image(int device) {
  if (device < 0) device = c10::cuda::current_device();
  if (device < kMaxDevices && g_image_ok[device].load(std::memory_order_acquire)) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  (void)loaded_attributes(reinterpret_cast<const void*>(&device_code_probe_kernel));
  if (device < kMaxDevices) g_image_ok[device].store(true, std::memory_order_release);
}

void simulate_no_kernel_image(bool on) {
  g_simulate_no_image.store(on);
  for (auto& ok : g_image_ok) ok.store(false);
}

int kernel_arch(const void* kernel) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> cache;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = cache.find({kernel, device});
    if (it != cache.end()) return it->second;
  }
  const int arch = loaded_attributes(kernel).ptxVersion;
  const std::lock_guard<std::mutex> lock(mutex);
  cache[{kernel, device}] = arch;
  return arch;
}

void require_device_code(const void* kernel, int min_arch, const char* what, const char* needs) {
  const int arch = kernel_arch(kernel);
  if (arch >= min_arch) return;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  TORCH_CHECK(false, old_device_code_message(what, needs, min_arch, arch, device, prop->major, prop->minor,
                                             build_targets()));
}

DeviceCode device_code(int device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  check_kernel_image(device);
  const cudaFuncAttributes attr = loaded_attributes(reinterpret_cast<const void*>(&device_code_probe_kernel));
  DeviceCode dc;
  dc.arch = attr.ptxVersion;
  dc.binary = attr.binaryVersion;
  dc.mma = dc.mma_sp = dc.cp_async = dc.bf16 = dc.arch >= 80;
  int cluster_launch = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device));
  dc.clusters = dc.arch >= 90 && cluster_launch != 0;
#ifdef SPARSETORCH_WITH_CUSPARSELT
  dc.cusparselt = at::cuda::getDeviceProperties(device)->major >= 8;
#endif
  return dc;
}

// The test hook behind sparsetorch_testing.device_code_probe: the __CUDA_ARCH__ the probe kernel's code saw on
// `device`, read back from the device, next to what kernel_arch says about the same kernel.
std::pair<int, int> device_code_probe(int device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  check_kernel_image(device);
  const at::Tensor out = at::full({1}, -1, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device));
  device_code_probe_kernel<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(out.data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out.item<int>(), kernel_arch(reinterpret_cast<const void*>(&device_code_probe_kernel))};
}

}  // namespace cuda
}  // namespace sparsetorch
