// cp.async (sm_80+): global -> shared copies that bypass registers, for kernels that stage B (or A's
// layout) in shared memory while computing on the previous stage (spmm_tiled.cu, spmm_blocked.cu,
// bitmap_kernel.cuh).
#pragma once

namespace sparsetorch {
namespace cuda {

// 16 bytes, through L2 only (.cg); with copy == false the 16 bytes are filled with zeros and nothing
// is read (gmem need not point to valid memory then).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool copy = true) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = copy ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
// 8 and 4 bytes (.ca: the sizes .cg does not take).
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ void cp_async_wait_one() { cp_async_wait<1>(); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

}  // namespace cuda
}  // namespace sparsetorch
