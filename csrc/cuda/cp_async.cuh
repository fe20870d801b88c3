// cp.async (sm_80+): global -> shared copies that bypass registers, for kernels that stage B (or A's
// layout) in shared memory while computing on the previous stage (spmm_tiled.cu, spmm_blocked.cu,
// bitmap_kernel.cuh). Device code compiled for a target below sm_80 (a compute_75 build) gets the same
// functions as plain synchronous copies: a copy has landed when the call returns, so commit and wait have
// nothing to do, and the callers' barriers order the copies as before. Correct, without the overlap.
#pragma once

#include <cstdint>

namespace sparsetorch {
namespace cuda {

// The shared-window address of a pointer into shared memory (for PTX's .shared operands).
__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 1 in device code compiled for sm_80 or newer (and in host code), 0 for an older target (a compute_75 build).
// There cp.async takes the synchronous stand-ins below, and the kernels that need other sm_80 instructions
// (mma.sync on bf16/fp16, mma.sp) keep a body that traps: their launchers refuse such a build first
// (require_device_code, cuda/device_code.h), so it never runs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define SPARSETORCH_SM80_DEVICE_CODE 0
#else
#define SPARSETORCH_SM80_DEVICE_CODE 1
#endif

// 16 bytes, through L2 only (.cg); with copy == false the 16 bytes are filled with zeros and nothing
// is read (gmem need not point to valid memory then).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool copy = true) {
#if !SPARSETORCH_SM80_DEVICE_CODE
  *static_cast<uint4*>(smem) = copy ? __ldcg(static_cast<const uint4*>(gmem)) : make_uint4(0, 0, 0, 0);
#else
  const unsigned dst = smem_address(smem);
  const int src_bytes = copy ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
#endif
}
// 8 and 4 bytes (.ca: the sizes .cg does not take).
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem) {
#if !SPARSETORCH_SM80_DEVICE_CODE
  *static_cast<uint2*>(smem) = *static_cast<const uint2*>(gmem);
#else
  const unsigned dst = smem_address(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(gmem));
#endif
}
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
#if !SPARSETORCH_SM80_DEVICE_CODE
  *static_cast<uint32_t*>(smem) = *static_cast<const uint32_t*>(gmem);
#else
  const unsigned dst = smem_address(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem));
#endif
}
#if !SPARSETORCH_SM80_DEVICE_CODE
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
__device__ __forceinline__ void cp_async_wait_all() {}
#else
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
#endif
__device__ __forceinline__ void cp_async_wait_one() { cp_async_wait<1>(); }

// Bulk copies (sm_90: cp.async.bulk, the copy engine of TMA without a tensor map) into shared memory,
// completed on an mbarrier: one thread issues a whole stage (bitmap_kernel.cuh). Addresses and sizes are
// multiples of 16 bytes.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals));
}
// The initialised barriers are visible to the copy engine (and the other threads, after a sync).
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::); }
__device__ __forceinline__ void mbarrier_invalidate(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)));
}
// One arrival that also announces `bytes` still to come from bulk copies.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// Waits for the completion of phase `parity` (0, 1, 0, ...) of the barrier.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}
// Orders this thread's (and, after a sync, its peers') ordinary shared-memory writes before later bulk
// copies into the same bytes.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* gmem, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_address(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}
#endif

}  // namespace cuda
}  // namespace sparsetorch
