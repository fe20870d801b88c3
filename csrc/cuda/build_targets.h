// The CUDA targets a build compiled and the error a GPU gets when none of them runs on it. Plain C++ (no CUDA
// headers), so that the CPU build's tests can check the message (csrc/testing_ops.cpp).
//
// setup.py passes the targets as one identifier, SPARSETORCH_CUDA_TARGETS=sm75_sm80_sm90_compute90 (no quotes
// or separators that a shell or ninja would take apart): "smXY" is SASS for compute capability X.Y, "computeXY"
// PTX that the driver JIT-compiles for X.Y and newer GPUs.
#pragma once

#include <string>
#include <vector>

namespace sparsetorch {
namespace cuda {

// "sm75_sm80_compute90" -> {"sm_75", "sm_80", "compute_90"} (nvcc's spelling); "" -> {}.
inline std::vector<std::string> parse_build_targets(const std::string& encoded) {
  std::vector<std::string> targets;
  size_t start = 0;
  while (start < encoded.size()) {
    size_t end = encoded.find('_', start);
    if (end == std::string::npos) end = encoded.size();
    const std::string token = encoded.substr(start, end - start);
    const size_t digits = token.find_first_of("0123456789");
    if (digits != std::string::npos && digits > 0) {
      targets.push_back(token.substr(0, digits) + "_" + token.substr(digits));
    } else if (!token.empty()) {
      targets.push_back(token);
    }
    start = end + 1;
  }
  return targets;
}

// This build's targets (device_code.cu reads SPARSETORCH_CUDA_TARGETS); {} where setup.py passed none.
std::vector<std::string> build_targets();

inline std::string join_targets(const std::vector<std::string>& targets) {
  std::string s;
  for (const std::string& t : targets) s += (s.empty() ? "" : ", ") + t;
  return s.empty() ? "(none)" : s;
}

// The error of a GPU (device index, name, compute capability major.minor) that can load none of `targets`.
inline std::string no_kernel_image_message(int device, const std::string& name, int major, int minor,
                                           const std::vector<std::string>& targets) {
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  std::string msg = "sparsetorch: this build has no device code for cuda:" + std::to_string(device) + " (" + name +
                    ", compute capability " + cc + "): it was compiled for " + join_targets(targets) + ". ";
  if (major * 10 + minor < 75) {
    return msg + "sparsetorch's CUDA code needs compute capability 7.5 or newer (nvcc 13 builds nothing older); "
                 "run on the CPU, or on a newer GPU.";
  }
  return msg + "Rebuild for this GPU: SPARSETORCH_CUDA_ARCH=" + cc +
         " bash scripts/install.sh (or, with SPARSETORCH_CUDA_ARCH and TORCH_CUDA_ARCH_LIST unset, build on a "
         "machine with this GPU: the build targets the GPUs it sees).";
}

// The error of an op whose kernel needs device code for `min_arch` (80: sm_80) or newer, on a build whose
// loaded code for this GPU was compiled for `arch` (kernel_arch).
inline std::string old_device_code_message(const std::string& what, const std::string& needs, int min_arch, int arch,
                                           int device, int major, int minor, const std::vector<std::string>& targets) {
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  std::string msg = what + ": needs device code for compute capability " + std::to_string(min_arch / 10) + "." +
                    std::to_string(min_arch % 10) + " or newer (" + needs + "), but this build runs code compiled " +
                    "for compute_" + std::to_string(arch) + " on cuda:" + std::to_string(device) +
                    " (compute capability " + cc + "; build targets " + join_targets(targets) + "). ";
  if (major * 10 + minor < min_arch) return msg + "This GPU lacks the instructions: use another form or route.";
  return msg + "Rebuild with SPARSETORCH_CUDA_ARCH=" + cc + " to use them.";
}

}  // namespace cuda
}  // namespace sparsetorch
