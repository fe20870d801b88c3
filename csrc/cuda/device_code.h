// What this build's device code can do on a device, asked of the loaded kernels (cudaFuncGetAttributes), not
// of the device's compute capability. The driver runs the best image the module holds for a device: SASS
// built for it, else PTX of the newest virtual architecture not above it, JIT-compiled. A build for
// compute_80 only runs, on an H100, device code compiled with __CUDA_ARCH__ == 800: a host-side
// `major >= 9` would launch a path (thread-block clusters) that the loaded kernel does not contain.
//
// Every file is compiled with one -gencode list (setup.py), so the driver picks the same target for every
// kernel of the module on a given device; a launcher still asks about the kernel it launches.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// Device code that needs sm_80 instructions is guarded by SPARSETORCH_SM80_DEVICE_CODE (cuda/cp_async.cuh).

namespace sparsetorch {
namespace cuda {

// The virtual architecture the loaded image of `kernel` on the current device was compiled from, as
// major * 10 + minor (cudaFuncAttributes::ptxVersion: 75, 80, 90): the __CUDA_ARCH__ / 10 its device code saw,
// also when the driver JIT-compiled PTX for a newer GPU (binaryVersion then names the GPU, not the code).
// Cached per (kernel, device). Raises the no-image error (check_kernel_image) when the module has none.
int kernel_arch(const void* kernel);

// Raises a clear error unless `kernel`'s loaded device code was compiled for at least `min_arch` (80:
// sm_80): `what` names the op, `needs` the instructions (e.g. "mma.sp, the 2:4 sparse tensor cores").
void require_device_code(const void* kernel, int min_arch, const char* what, const char* needs);

// The first CUDA op call on each device checks that the module has device code that device can load (one
// cudaFuncGetAttributes on a small kernel) and raises an error naming the GPU's compute capability, the
// build's targets and how to rebuild, never a bare "no kernel image" CUDA error. Cached per device.
void check_kernel_image(int device);

// What the loaded device code can do on `device` (sparsetorch._build_info.cuda_features): arch (ptxVersion of
// the loaded code), binary (its binaryVersion), and the instruction families the kernels choose by.
struct DeviceCode {
  int arch = 0, binary = 0;
  bool mma = false;        // mma.sync m16n8k16 on bf16/fp16 (bitmap, slots)
  bool mma_sp = false;     // mma.sp on the 2:4 sparse tensor cores (2:4 decode)
  bool clusters = false;   // thread-block clusters and distributed shared memory (2:4 decode's reduction)
  bool cp_async = false;   // asynchronous global -> shared copies (else synchronous stand-ins, cp_async.cuh)
  bool bf16 = false;       // bf16 tensor-core arithmetic (bf16 elementwise and SpMM convert to float32 anyway)
  bool cusparselt = false; // cuSPARSELt linked in and the device has the 2:4 tensor cores it needs (sm_80+)
};
DeviceCode device_code(int device);

// Test hook (sparsetorch_testing.simulate_no_kernel_image): the image check of every device then fails as
// if the module had no image for it; the per-device verdicts are forgotten either way.
void simulate_no_kernel_image(bool on);
// Test hook (sparsetorch_testing.device_code_probe): the __CUDA_ARCH__ a probe kernel's code saw on `device`,
// read back from the GPU, and kernel_arch() of the same kernel.
std::pair<int, int> device_code_probe(int device);

// A CUDA op's implementation registered through this (SPARSETORCH_CUDA_OP) checks the kernel image of the
// device of its first CUDA tensor argument before it runs.
inline int cuda_device_of(const at::Tensor& t) { return t.defined() && t.is_cuda() ? t.get_device() : -1; }
inline int cuda_device_of(const std::optional<at::Tensor>& t) { return t.has_value() ? cuda_device_of(*t) : -1; }
inline int cuda_device_of(at::TensorList ts) {
  for (const at::Tensor& t : ts) {
    if (cuda_device_of(t) >= 0) return cuda_device_of(t);
  }
  return -1;
}
template <typename T>
inline int cuda_device_of(const T&) {
  return -1;
}

template <auto F>
struct ImageChecked;
template <typename R, typename... Args, R (*F)(Args...)>
struct ImageChecked<F> {
  static R call(Args... args) {
    int device = -1;
    (void)((device = cuda_device_of(args), device >= 0) || ...);
    check_kernel_image(device);
    return F(std::forward<Args>(args)...);
  }
};

}  // namespace cuda
}  // namespace sparsetorch

// m.impl("name", SPARSETORCH_CUDA_OP(fn)) in a TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) block.
#define SPARSETORCH_CUDA_OP(fn) (&::sparsetorch::cuda::ImageChecked<&fn>::call)
