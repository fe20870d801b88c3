// SpMM as a dense GEMM: A expanded to a dense matrix, multiplied by cuBLAS, the epilogue as a second pass.
//
// Where A holds more than a few percent of its positions, tensor-core GEMM outruns any gather-based
// kernel: 4096 x 4096 at 10% @ 4096 x 1024 in bf16 is 46 us as a dense GEMM on the H200 against
// 513 us for the row-group kernel and 727 us for torch.sparse.mm
// (docs/history.md, SpMM routes). What keeps this a sparse product:
//  - the values are summed per position in fp32 (fp64 for doubles) in shared memory, so repeated
//    columns count once each, and the GEMM accumulates in fp32 with TF32 and reduced-precision
//    split-K reductions off: the result differs from the other routes by rounding only;
//  - a dense product spreads a NaN/Inf of B through A's structural zeros (0 * inf = NaN), which the
//    sparse routes skip. A device-side check of B raises a flag on any non-finite value, and the
//    row-group kernel then recomputes the whole output (spmm_native_if): no host sync, so the route
//    is also safe inside CUDA graph capture.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "common/checks.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_code.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;          // the check of B
constexpr int kDensifyThreads = 128;   // 13 blocks (rows in flight) per SM with 16 KB of shared memory each
constexpr int kEntriesInFlight = 8;    // per thread: a row of up to 1024 entries in one round of loads
constexpr int kChunkBytes = 16 * 1024; // one chunk of a dense row, accumulated in shared memory

template <typename scalar_t, typename index_t>
struct DensifyArgs {
  const index_t* crow;
  const index_t* col;
  const scalar_t* values;
  scalar_t* dense_a;  // (batches, m, k), contiguous
  int64_t batches, m, k, L;
  int64_t crow_bstride, col_bstride, val_bstride;
};

// A block writes one chunk of columns of one dense row: the chunk is zeroed in shared memory, the
// row's entries falling in it are added (shared atomics: repeated columns are summed; the order of
// that sum is the only non-determinism of the route), then the chunk is stored VEC elements at a time
// (VEC sums = 16 bytes of shared memory per lane).
// Each thread loads up to kEntriesInFlight entries before adding them (one round of loads per row).
// H200, 4096 x 4096 bf16 at 10% (a profile; docs/history.md): 25.6 us per call with 256
// threads and one load per thread per round, 22.8 us as below, 18.9 us with 16-byte shared accesses;
// fp32 at 0.2%: 38.7 -> 24.5 us (64 MB written, 2.6 TB/s). ncu: L1/shared 80% busy, DRAM 12% (the
// dense A stays in L2 for the GEMM). Entries with a column outside [0, k) are skipped and row spans
// are clamped to [0, L].
template <typename scalar_t, typename index_t, int VEC>
__global__ void __launch_bounds__(kDensifyThreads) densify_kernel(const DensifyArgs<scalar_t, index_t> a) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kChunk = kChunkBytes / sizeof(acc_t);
  __shared__ alignas(sizeof(acc_t) * VEC) acc_t chunk[kChunk];
  const int64_t chunks = ceil_div(a.k, kChunk);
  const int64_t items = a.batches * a.m * chunks;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / chunks;  // batch * m + r
    const int64_t c0 = (item - row * chunks) * kChunk;
    const int width = static_cast<int>(min(static_cast<int64_t>(kChunk), a.k - c0));
    const int64_t b = row / a.m, r = row - b * a.m;
    const index_t* col_b = a.col + b * a.col_bstride;
    const scalar_t* val_b = a.values + b * a.val_bstride;
    const auto [start, stop] = clamped_row_span(a.crow + b * a.crow_bstride, r, a.L);
    for (int t = threadIdx.x * VEC; t < kChunk; t += kDensifyThreads * VEC) {
      *reinterpret_cast<Vec<acc_t, VEC>*>(&chunk[t]) = Vec<acc_t, VEC>{};
    }
    __syncthreads();
    for (int64_t base = start; base < stop; base += kDensifyThreads * kEntriesInFlight) {
      int64_t c[kEntriesInFlight];
      acc_t v[kEntriesInFlight];
#pragma unroll
      for (int u = 0; u < kEntriesInFlight; ++u) {
        const int64_t j = base + u * kDensifyThreads + threadIdx.x;
        c[u] = j < stop ? static_cast<int64_t>(col_b[j]) - c0 : -1;
        v[u] = j < stop ? static_cast<acc_t>(val_b[j]) : acc_t(0);
      }
#pragma unroll
      for (int u = 0; u < kEntriesInFlight; ++u) {
        if (c[u] >= 0 && c[u] < width) atomicAdd(&chunk[c[u]], v[u]);
      }
    }
    __syncthreads();
    scalar_t* dst = a.dense_a + row * a.k + c0;
    for (int t = threadIdx.x * VEC; t < width; t += kDensifyThreads * VEC) {
      // 16 bytes of sums per lane, lanes contiguous: conflict-free shared loads
      const Vec<acc_t, VEC> sums = *reinterpret_cast<const Vec<acc_t, VEC>*>(&chunk[t]);
      Packed<scalar_t, VEC> out;
#pragma unroll
      for (int q = 0; q < VEC; ++q) out.set(q, sums.v[q]);
      out.store(dst + t);
    }
    __syncthreads();  // the chunk is reused by the next item
  }
}

// flag = 1 when any element of B is NaN or infinite. Every writer stores the same value, so the
// race is benign. B as one flat array of `count` VEC-wide groups (a contiguous B):
template <typename scalar_t, int VEC>
__global__ void __launch_bounds__(kThreads) flag_nonfinite_flat_kernel(const scalar_t* b, int64_t count, int* flag) {
  using acc_t = at::opmath_type<scalar_t>;
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    Packed<scalar_t, VEC> v;
    v.load(b + i * VEC);
#pragma unroll
    for (int q = 0; q < VEC; ++q) bad |= !isfinite(static_cast<acc_t>(v.get(q)));
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

// ... and any other B: batches x k rows of n, row stride ld, batch stride bstride.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) flag_nonfinite_rows_kernel(const scalar_t* b, int64_t rows, int64_t n,
                                                                       int64_t ld, int64_t k, int64_t bstride,
                                                                       int* flag) {
  using acc_t = at::opmath_type<scalar_t>;
  bool bad = false;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const scalar_t* src = b + (row / k) * bstride + (row % k) * ld;
    for (int64_t c = threadIdx.x; c < n; c += kThreads) bad |= !isfinite(static_cast<acc_t>(src[c]));
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

int64_t grid_for(int64_t items, int64_t blocks_per_sm) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return std::max<int64_t>(1, std::min(items, sms * blocks_per_sm));
}

// dense_a (batches, m, k) from a CSR whose pattern / values advance by the given batch strides (0: shared).
void densify_into(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense_a,
                  int64_t m, int64_t k, int64_t L, int64_t crow_bstride, int64_t col_bstride, int64_t val_bstride) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "spmm_densify", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "spmm_densify", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      DensifyArgs<scalar_t, index_t> a{crow.data_ptr<index_t>(), col.data_ptr<index_t>(),
                                       values.data_ptr<scalar_t>(), dense_a.data_ptr<scalar_t>(),
                                       dense_a.size(0), m, k, L, crow_bstride, col_bstride, val_bstride};
      const int64_t items = a.batches * m * ceil_div(k, kChunkBytes / sizeof(acc_t));
      const auto blocks = static_cast<unsigned>(grid_for(items, 16));
      const auto stream = at::cuda::getCurrentCUDAStream();
      constexpr int kVec = 16 / sizeof(acc_t);  // 16-byte shared accesses; 8-byte stores for half types
      if (k % kVec == 0) {  // every row (and chunk) starts on a kVec-element boundary
        densify_kernel<scalar_t, index_t, kVec><<<blocks, kDensifyThreads, 0, stream>>>(a);
      } else {
        densify_kernel<scalar_t, index_t, 1><<<blocks, kDensifyThreads, 0, stream>>>(a);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void densify(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
             const at::Tensor& dense_a) {
  densify_into(crow, col, values, dense_a, p.m, p.k, p.nnz_stride, p.crow_bstride(), p.col_bstride(),
               p.val_bstride());
}

// out (batch, m, n) = alpha * A (a_batches, m, k) @ B + beta * out, all row-major, as the
// column-major product out^T = B^T A^T. a_batches == 1 or B unbatched: batch stride 0 (broadcast).
void gemm(const SpmmProblem& p, const at::Tensor& dense_a, const at::Tensor& dense, const at::Tensor& out,
          double alpha, double beta) {
  const at::ScalarType dtype = out.scalar_type();
  const cudaDataType dt = cuda_dtype(dtype);
  const bool fp64 = dtype == at::kDouble;
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* alpha_p = fp64 ? static_cast<const void*>(&alpha) : static_cast<const void*>(&alpha_f);
  const void* beta_p = fp64 ? static_cast<const void*>(&beta) : static_cast<const void*>(&beta_f);
  const int64_t stride_a = dense_a.size(0) > 1 ? p.m * p.k : 0;
  const int64_t stride_b = p.dense_batched ? dense.stride(0) : 0;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // ATen sets the current stream on it
  // The handle's math mode follows torch's TF32 and reduced-precision flags; this route must match
  // the sparse kernels (fp32 products and sums), so it runs with both off and restores the mode.
  cublasMath_t saved_mode;
  SPARSETORCH_CUBLAS_CHECK(cublasGetMathMode(handle, &saved_mode));
  SPARSETORCH_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  const cublasStatus_t status = cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k), alpha_p,
      dense.data_ptr(), dt, static_cast<int>(dense.stride(-2)), stride_b, dense_a.data_ptr(), dt,
      static_cast<int>(p.k), stride_a, beta_p, out.data_ptr(), dt, static_cast<int>(p.n), p.m * p.n,
      static_cast<int>(p.batch), fp64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  cublasSetMathMode(handle, saved_mode);
  SPARSETORCH_CUBLAS_CHECK(status);
}

}  // namespace

at::Tensor nonfinite_flag(const at::Tensor& dense, int64_t batches, int64_t k, int64_t n) {
  at::Tensor flag = at::zeros({1}, dense.options().dtype(at::kInt));
  const int64_t rows = batches * k;
  const int64_t bstride = batches > 1 ? dense.stride(0) : 0;
  const bool flat = dense.stride(-2) == n && (batches == 1 || bstride == k * n);
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dense.scalar_type(), "spmm_densify_check", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const int64_t total = rows * n;
    if (flat && total % kVec == 0 && is_aligned(dense.data_ptr(), 16)) {
      flag_nonfinite_flat_kernel<scalar_t, kVec>
          <<<static_cast<unsigned>(grid_for(ceil_div(total / kVec, kThreads), 4)), kThreads, 0, stream>>>(
              dense.data_ptr<scalar_t>(), total / kVec, flag.data_ptr<int>());
    } else {
      flag_nonfinite_rows_kernel<scalar_t><<<static_cast<unsigned>(grid_for(rows, 16)), kThreads, 0, stream>>>(
          dense.data_ptr<scalar_t>(), rows, n, dense.stride(-2), k, bstride, flag.data_ptr<int>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return flag;
}

void spmm_densify(const SpmmProblem& p, const at::Tensor& crow_in, const at::Tensor& col_in,
                  const at::Tensor& values_in, const at::Tensor& dense_in, const at::Tensor& out,
                  const SpmmEpilogue& epi) {
  if (out.numel() == 0) return;
  if (p.nnz_stride == 0 || p.k == 0) {  // a zero A: the epilogue alone
    spmm_native(p, crow_in, col_in, values_in, dense_in, out, epi);
    return;
  }
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  TORCH_CHECK_VALUE(p.m <= kIntMax && p.k <= kIntMax && p.n <= kIntMax && p.batch <= kIntMax,
                    "backend 'densify': cuBLAS takes dimensions below 2^31; got batch ", p.batch, ", m ", p.m,
                    ", k ", p.k, ", n ", p.n, ". Use backend 'native'");
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
  // cuBLAS needs unit column stride and a row stride in [n, 2^31) (a fresh copy otherwise; see
  // dense_for_cusparse for the odd strides torch allows on size-1 dims).
  const bool usable = dense_in.stride(-1) == 1 && dense_in.stride(-2) >= p.n && dense_in.stride(-2) <= kIntMax;
  const at::Tensor dense = usable ? dense_in : at::empty(dense_in.sizes(), dense_in.options()).copy_(dense_in);

  const at::Tensor dense_a = at::empty({p.a_batches(), p.m, p.k}, values.options());
  densify(p, crow, col, values, dense_a);

  // beta * accumulate rides on cuBLAS's beta; the fallback below needs the caller's accumulate, so
  // when it is `out` itself (spmm_out) it is kept aside first.
  SpmmEpilogue fallback = epi;
  double beta = 0.0;
  if (epi.accumulate.defined() && epi.beta != 0.0) {
    if (epi.accumulate.is_same(out)) {
      fallback.accumulate = out.clone();
    } else {
      out.copy_(epi.accumulate);
    }
    beta = epi.beta;
  }
  gemm(p, dense_a, dense, out, epi.alpha, beta);
  apply_bias_act(out, epi);
  const at::Tensor flag = nonfinite_flag(dense, p.dense_batched ? p.batch : 1, p.k, p.n);
  spmm_native_if(p, crow, col, values, dense, out, fallback, flag);
}

namespace {

// csr_to_dense (schema in ops.cpp): the densify kernel alone. crow (m + 1) or (P, m + 1), col (L) or (P, L),
// values (L) or (B, L), P 1 or B. H100, 14336 x 4096 bf16 at 50%: ~0.1 ms against 2.9 ms for the torch ops
// of sparsetorch.csr.to_dense (an estimate from the kernel's measured rate above; see the serving profile).
at::Tensor csr_to_dense_cuda(const at::Tensor& crow_in, const at::Tensor& col_in, const at::Tensor& values_in,
                             int64_t m, int64_t k) {
  TORCH_CHECK_TYPE(crow_in.scalar_type() == at::kInt || crow_in.scalar_type() == at::kLong,
                   "crow_indices: expected int32 or int64, got ", crow_in.scalar_type());
  TORCH_CHECK_TYPE(col_in.scalar_type() == crow_in.scalar_type(), "col_indices: expected ", crow_in.scalar_type(),
                   " (crow_indices' dtype), got ", col_in.scalar_type());
  const at::ScalarType vt = values_in.scalar_type();
  TORCH_CHECK_TYPE(vt == at::kHalf || vt == at::kBFloat16 || vt == at::kFloat || vt == at::kDouble,
                   "values: expected float16, bfloat16, float32 or float64, got ", values_in.scalar_type());
  check_same_device(values_in, "values", crow_in, "crow_indices");
  check_same_device(values_in, "values", col_in, "col_indices");
  TORCH_CHECK_VALUE(m >= 0 && k >= 0, "m, k: expected non-negative sizes, got ", m, " and ", k);
  TORCH_CHECK_VALUE((crow_in.dim() == 1 || crow_in.dim() == 2) && crow_in.size(-1) == m + 1,
                    "crow_indices: expected shape (m + 1,) or (patterns, m + 1) with m + 1 = ", m + 1, ", got ",
                    crow_in.sizes());
  TORCH_CHECK_VALUE(col_in.dim() == crow_in.dim() && (col_in.dim() == 1 || col_in.size(0) == crow_in.size(0)),
                    "col_indices: expected one row per pattern of crow_indices ", crow_in.sizes(), ", got ",
                    col_in.sizes());
  TORCH_CHECK_VALUE((values_in.dim() == 1 || values_in.dim() == 2) && values_in.size(-1) == col_in.size(-1),
                    "values: expected shape (L,) or (batch, L) with L = ", col_in.size(-1), " (col_indices'), got ",
                    values_in.sizes());
  const int64_t patterns = crow_in.dim() == 2 ? crow_in.size(0) : 1;
  const int64_t batches = values_in.dim() == 2 ? values_in.size(0) : 1;
  TORCH_CHECK_VALUE(patterns == 1 || patterns == batches, "crow_indices: expected 1 pattern or one per batch (",
                    batches, "), got ", patterns);
  const c10::cuda::CUDAGuard guard(values_in.device());
  const int64_t L = col_in.size(-1);
  at::Tensor dense = at::empty({batches, m, k}, values_in.options());
  if (dense.numel() > 0) {
    if (L == 0) {
      dense.zero_();
    } else {
      const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
      densify_into(crow, col, values, dense, m, k, L, patterns > 1 ? m + 1 : 0, patterns > 1 ? L : 0,
                   batches > 1 ? L : 0);
    }
  }
  return values_in.dim() == 2 ? dense : dense.view({m, k});
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("csr_to_dense", SPARSETORCH_CUDA_OP(csr_to_dense_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
