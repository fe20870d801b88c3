// The device limits that the launch plans of the CUDA kernels depend on, and the host/device qualifier of
// the plan headers (cuda/*_plan.h). Plain C++: the plans are pure functions of (shape, dtype, these
// limits), compiled into the CPU build too, so that tests check them against smaller GPUs' limits with
// faked values (tests/test_launch_plans.py).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARSETORCH_HD __host__ __device__
#else
#define SPARSETORCH_HD
#endif

namespace sparsetorch {
namespace cuda {

// cudaDeviceProp's fields, by their meaning (cuda_utils.h's launch_limits() reads them from a device).
struct LaunchLimits {
  int sms = 0;                 // multiProcessorCount
  int64_t smem_per_sm = 0;     // sharedMemPerMultiprocessor
  int64_t smem_reserved = 0;   // reservedSharedMemPerBlock
  int64_t smem_per_block = 0;  // sharedMemPerBlockOptin: the most one block may ask for
};

}  // namespace cuda
}  // namespace sparsetorch
