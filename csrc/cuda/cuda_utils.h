// Shared CUDA helpers: cuSPARSE / cuBLAS status checks that name the failing call, dtype mapping for cuSPARSE,
// RAII holders for cuSPARSE descriptors, and aligned vector types for 16-byte accesses.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cusparse.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include "cuda/launch_limits.h"

#define SPARSETORCH_CUSPARSE_CHECK(call)                                                              \
  do {                                                                                               \
    const cusparseStatus_t status_ = (call);                                                         \
    TORCH_CHECK(status_ == CUSPARSE_STATUS_SUCCESS, "cuSPARSE call ", #call, " failed: ",            \
                cusparseGetErrorString(status_), " (status ", static_cast<int>(status_), ")");        \
  } while (0)

#define SPARSETORCH_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                                   \
    const cublasStatus_t status_ = (call);                                                               \
    TORCH_CHECK(status_ == CUBLAS_STATUS_SUCCESS, "cuBLAS call ", #call, " failed: ",                    \
                cublasGetStatusString(status_), " (status ", static_cast<int>(status_), ")");             \
  } while (0)

namespace sparsetorch {
namespace cuda {

// Lets `kernel` use the current device's opt-in maximum of dynamic shared memory, once per (kernel,
// device): the attribute belongs to a device's context, so a flag per kernel alone would leave a second GPU
// at the 48 KB default (its launches would fail).
inline void allow_max_dynamic_smem(const void* kernel) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, device}) != 0) return;
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(prop->sharedMemPerBlockOptin)));
  done.insert({kernel, device});
}

// The limits a launch plan takes (cuda/launch_limits.h), read from a device's properties.
inline LaunchLimits launch_limits(const cudaDeviceProp* prop) {
  LaunchLimits l;
  l.sms = prop->multiProcessorCount;
  l.smem_per_sm = static_cast<int64_t>(prop->sharedMemPerMultiprocessor);
  l.smem_reserved = static_cast<int64_t>(prop->reservedSharedMemPerBlock);
  l.smem_per_block = static_cast<int64_t>(prop->sharedMemPerBlockOptin);
  return l;
}

inline cudaDataType cuda_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return CUDA_R_32F;
    case at::kDouble:
      return CUDA_R_64F;
    case at::kHalf:
      return CUDA_R_16F;
    case at::kBFloat16:
      return CUDA_R_16BF;
    default:
      TORCH_CHECK_TYPE(false, "no CUDA data type for ", t);
  }
}

// Half types accumulate in float32; float32 and float64 in themselves.
inline cudaDataType compute_dtype(at::ScalarType t) { return t == at::kDouble ? CUDA_R_64F : CUDA_R_32F; }

inline cusparseIndexType_t cusparse_index(at::ScalarType t) {
  return t == at::kInt ? CUSPARSE_INDEX_32I : CUSPARSE_INDEX_64I;
}

// alpha/beta in the compute type, passed to cuSPARSE by host pointer.
struct Scalar {
  double d = 0;
  float f = 0;
  Scalar(double v, at::ScalarType t) : d(v), f(static_cast<float>(v)), is_double(t == at::kDouble) {}
  const void* ptr() const { return is_double ? static_cast<const void*>(&d) : static_cast<const void*>(&f); }
  bool is_double;
};

class SpMatDescriptor {
 public:
  SpMatDescriptor() = default;
  SpMatDescriptor(const SpMatDescriptor&) = delete;
  SpMatDescriptor& operator=(const SpMatDescriptor&) = delete;
  SpMatDescriptor(SpMatDescriptor&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  ~SpMatDescriptor() {
    if (d_) cusparseDestroySpMat(d_);
  }
  // CSR of rows x cols with nnz entries; pointers must stay valid while the descriptor is used.
  void create_csr(int64_t rows, int64_t cols, int64_t nnz, const at::Tensor& crow, const at::Tensor& col,
                  const at::Tensor& values) {
    TORCH_INTERNAL_ASSERT(d_ == nullptr);
    TORCH_CHECK_VALUE(nnz <= rows * cols, "backend 'cusparse': A stores ", nnz, " entries in ", rows, " x ", cols,
                      " positions (repeated columns); cuSPARSE refuses more entries than positions. Use "
                      "backend 'native' or 'tiled' (they sum repeated columns), or merge the duplicates");
    SPARSETORCH_CUSPARSE_CHECK(cusparseCreateCsr(&d_, rows, cols, nnz, crow.data_ptr(), col.data_ptr(),
                                                 values.data_ptr(), cusparse_index(crow.scalar_type()),
                                                 cusparse_index(col.scalar_type()), CUSPARSE_INDEX_BASE_ZERO,
                                                 cuda_dtype(values.scalar_type())));
  }
  cusparseSpMatDescr_t get() const { return d_; }

 private:
  cusparseSpMatDescr_t d_ = nullptr;
};

class DnMatDescriptor {
 public:
  DnMatDescriptor() = default;
  DnMatDescriptor(const DnMatDescriptor&) = delete;
  DnMatDescriptor& operator=(const DnMatDescriptor&) = delete;
  ~DnMatDescriptor() {
    if (d_) cusparseDestroyDnMat(d_);
  }
  void create(int64_t rows, int64_t cols, int64_t ld, void* ptr, at::ScalarType dtype, cusparseOrder_t order) {
    TORCH_INTERNAL_ASSERT(d_ == nullptr);
    SPARSETORCH_CUSPARSE_CHECK(cusparseCreateDnMat(&d_, rows, cols, ld, ptr, cuda_dtype(dtype), order));
  }
  cusparseDnMatDescr_t get() const { return d_; }

 private:
  cusparseDnMatDescr_t d_ = nullptr;
};

// VEC elements of T moved as one aligned access (16 bytes when VEC * sizeof(T) == 16).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// VEC elements moved as one aligned access and read/written as the math type (float for half
// types). Half types are held as packed 32-bit words and converted in pairs: indexing an array of
// 16-bit elements makes the compiler keep each element in its own register (the bf16 fused
// bias + activation kernel needed 96 registers that way, 2 blocks per SM).
template <typename T, int VEC, typename Enable = void>
struct Packed {
  using acc_t = at::opmath_type<T>;
  Vec<T, VEC> raw;
  __device__ __forceinline__ void load(const T* p) { raw = *reinterpret_cast<const Vec<T, VEC>*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Vec<T, VEC>*>(p) = raw; }
  __device__ __forceinline__ acc_t get(int q) const { return static_cast<acc_t>(raw.v[q]); }
  __device__ __forceinline__ void set(int q, acc_t x) { raw.v[q] = static_cast<T>(x); }
};

template <typename T, int VEC>
struct Packed<T, VEC, std::enable_if_t<sizeof(T) == 2 && VEC % 2 == 0>> {
  static constexpr bool kIsBf16 = std::is_same_v<T, c10::BFloat16>;
  static_assert(kIsBf16 || std::is_same_v<T, c10::Half>, "2-byte types: Half or BFloat16");
  using acc_t = float;
  struct alignas(sizeof(T) * VEC) Words {
    uint32_t w[VEC / 2];
  } raw;
  __device__ __forceinline__ void load(const T* p) { raw = *reinterpret_cast<const Words*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Words*>(p) = raw; }
  __device__ __forceinline__ float get(int q) const {
    const uint32_t w = raw.w[q / 2];
    const uint16_t bits = static_cast<uint16_t>(q % 2 ? w >> 16 : w & 0xffffu);
    if constexpr (kIsBf16) {
      return __uint_as_float(static_cast<uint32_t>(bits) << 16);
    } else {
      return __half2float(__ushort_as_half(bits));
    }
  }
  __device__ __forceinline__ void set(int q, float x) {
    uint16_t bits;
    if constexpr (kIsBf16) {
      bits = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    } else {
      bits = __half_as_ushort(__float2half_rn(x));
    }
    uint32_t& w = raw.w[q / 2];
    w = q % 2 ? (w & 0xffffu) | (static_cast<uint32_t>(bits) << 16) : (w & 0xffff0000u) | bits;
  }
};

inline bool is_aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// x (any shape, n * k elements) as (n, ldx) rows that 16-byte loads can read: unit column stride, ldx a
// multiple of 8, 16-byte aligned (the pruned-weight kernels' x). Copied (zero-padded to k rounded up to 8,
// at least 8 columns) only when x is not already so, or k == 0. Its size(1) is the kernels' kx, the columns
// they may read (a multiple of 8; zeros past k).
inline at::Tensor rows_for_16byte_loads(const at::Tensor& x, int64_t n, int64_t k) {
  const at::Tensor x2 = x.reshape({n, k});
  // A view only where rows are k apart or more (a broadcast x, stride 0, is copied: the kernels take ldx >= k).
  if (k > 0 && k % 8 == 0 && x2.stride(1) == 1 && x2.stride(0) >= k && x2.stride(0) % 8 == 0 &&
      is_aligned(x2.data_ptr(), 16)) {
    return x2;
  }
  at::Tensor padded = at::zeros({n, std::max<int64_t>(8, (k + 7) / 8 * 8)}, x.options());
  padded.narrow(1, 0, k).copy_(x2);
  return padded;
}

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of `threads` for a grid-stride loop over `work` items: enough for every item, at most
// blocks_per_sm per SM of the current device (the loop covers the rest), at least one.
inline int grid_stride_blocks(int64_t work, int threads, int blocks_per_sm) {
  const int64_t most =
      static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * blocks_per_sm;
  return static_cast<int>(std::max<int64_t>(1, std::min(ceil_div(work, threads), most)));
}

// Row kernels give each row to a group of GROUP lanes (8, 16 or 32) of one warp: the mask of this
// thread's group for the *_sync intrinsics.
template <int GROUP>
__device__ __forceinline__ unsigned group_lane_mask() {
  if constexpr (GROUP == 32) {
    return 0xffffffffu;
  } else {
    const int group_in_warp = (threadIdx.x % 32) / GROUP;
    return ((1u << GROUP) - 1u) << (group_in_warp * GROUP);
  }
}

// Entries [start, stop) of row r, clamped to the L stored entries: a malformed crow cannot make a
// kernel read out of bounds (validate=True reports it; without it the row is cut short).
struct RowSpan {
  int64_t start, stop;
};
template <typename index_t>
__device__ __forceinline__ RowSpan clamped_row_span(const index_t* crow, int64_t r, int64_t L) {
  const int64_t start = min(max(static_cast<int64_t>(crow[r]), int64_t(0)), L);
  const int64_t stop = min(max(static_cast<int64_t>(crow[r + 1]), start), L);
  return {start, stop};
}

// Smallest group of lanes (8, 16 or 32) covering `lanes_needed` lanes in one pass.
inline int row_group_size(int64_t lanes_needed) { return lanes_needed <= 8 ? 8 : lanes_needed <= 16 ? 16 : 32; }

}  // namespace cuda
}  // namespace sparsetorch
