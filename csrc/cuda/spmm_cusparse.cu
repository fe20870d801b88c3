// SpMM through cuSPARSE's generic API (cusparseSpMM), with pooled handles, the current stream,
// workspaces from the caching allocator and RAII descriptors.
//
// Batches: cuSPARSE's strided batch (cusparseCsrSetStridedBatch) is only correct when every batch
// has the same sparsity pattern (measured on the H100, see DESIGN.md), so it is used only for a
// shared 1-D pattern. Different patterns per batch become one block-diagonal CSR (batch i's
// columns shifted by i*k when B is batched) multiplied by the stacked B in a single call.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <limits>
#include <list>

#include "common/native_caches.h"
#include "common/spmm_routing.h"
#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {
namespace {

// What one cusparseSpMM call is set up for. Descriptors hold only pointers, sizes and types (no
// data), so a call whose key matches a cached entry can reuse its descriptors and buffer size,
// swapping in the new B and C pointers. The key includes A's pointers, so new values for A (a
// new tensor) make a new entry; the cache never runs cusparseSpMM_preprocess, whose analysis
// would depend on the data.
struct CallKey {
  int device;
  const void *crow, *col, *values;
  int64_t rows, cols, nnz, batch, colval_stride;
  int index_type, dtype, b_dtype;
  int64_t n, ldb, b_stride;
  bool b_row_major;
  bool operator==(const CallKey& o) const {
    return device == o.device && crow == o.crow && col == o.col && values == o.values && rows == o.rows &&
           cols == o.cols && nnz == o.nnz && batch == o.batch && colval_stride == o.colval_stride &&
           index_type == o.index_type && dtype == o.dtype && b_dtype == o.b_dtype && n == o.n && ldb == o.ldb &&
           b_stride == o.b_stride &&
           b_row_major == o.b_row_major;
  }
};

struct CallSetup {
  CallKey key;
  SpMatDescriptor A;
  DnMatDescriptor B, C;
  size_t buffer_bytes = 0;
};

// Per thread (descriptors are host objects; no locking needed), most recent first. Listed with the native
// caches (common/native_caches.h): a reset empties the calling thread's list now, the others' at their next call.
constexpr size_t kCacheEntries = 16;
thread_local std::list<CallSetup> thread_calls;
thread_local uint64_t thread_calls_generation = 0;
native_caches::Generation calls_generation;

std::list<CallSetup>& calls_of_this_thread() {
  if (calls_generation.stale(thread_calls_generation)) thread_calls.clear();
  return thread_calls;
}

const bool kCacheListed = native_caches::add(
    "cusparse_descriptors",
    [] {
      thread_calls.clear();
      calls_generation.bump();
    },
    [] { return static_cast<int64_t>(calls_of_this_thread().size()); });

// C (row-major, ldc = n, batch stride m*n) = alpha * A @ B + beta * C.
// A: CSR rows x cols with nnz entries (strided batch when batch > 1); B row-major (dense_for_cusparse copies any other layout).
// C's dtype is the compute type's: float32 C with half A and B is cuSPARSE's mixed precision.
void cusparse_spmm(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, int64_t rows,
                   int64_t cols, int64_t nnz, int64_t batch, int64_t colval_stride, const at::Tensor& dense,
                   int64_t n, int64_t dense_bstride, const at::Tensor& out, double alpha, double beta) {
  std::list<CallSetup>& call_cache = calls_of_this_thread();
  const at::ScalarType dtype = out.scalar_type(), b_dtype = dense.scalar_type();
  const bool row_major = dense.stride(-1) == 1;
  const CallKey key{out.get_device(), crow.data_ptr(), col.data_ptr(), values.data_ptr(), rows, cols, nnz, batch,
                    colval_stride, static_cast<int>(crow.scalar_type()), static_cast<int>(dtype),
                    static_cast<int>(b_dtype), n, row_major ? dense.stride(-2) : dense.stride(-1), dense_bstride,
                    row_major};
  auto it = std::find_if(call_cache.begin(), call_cache.end(), [&](const CallSetup& c) { return c.key == key; });
  const Scalar a(alpha, dtype), b(beta, dtype);
  const cudaDataType compute = compute_dtype(dtype);
  const auto op = CUSPARSE_OPERATION_NON_TRANSPOSE;
  cusparseHandle_t handle = at::cuda::getCurrentCUDASparseHandle();
  SPARSETORCH_CUSPARSE_CHECK(cusparseSetStream(handle, at::cuda::getCurrentCUDAStream()));
  if (it != call_cache.end()) {
    call_cache.splice(call_cache.begin(), call_cache, it);  // most recent first
    SPARSETORCH_CUSPARSE_CHECK(cusparseDnMatSetValues(call_cache.front().B.get(), dense.data_ptr()));
    SPARSETORCH_CUSPARSE_CHECK(cusparseDnMatSetValues(call_cache.front().C.get(), out.data_ptr()));
  } else {
    call_cache.emplace_front();
    CallSetup& setup = call_cache.front();
    try {
      setup.A.create_csr(rows, cols, nnz, crow, col, values);
      if (batch > 1) {
        SPARSETORCH_CUSPARSE_CHECK(
            cusparseCsrSetStridedBatch(setup.A.get(), static_cast<int>(batch), 0, colval_stride));
      }
      setup.B.create(cols, n, key.ldb, dense.data_ptr(), b_dtype, row_major ? CUSPARSE_ORDER_ROW : CUSPARSE_ORDER_COL);
      setup.C.create(rows, n, n, out.data_ptr(), dtype, CUSPARSE_ORDER_ROW);
      if (batch > 1) {
        SPARSETORCH_CUSPARSE_CHECK(
            cusparseDnMatSetStridedBatch(setup.B.get(), static_cast<int>(batch), dense_bstride));
        SPARSETORCH_CUSPARSE_CHECK(cusparseDnMatSetStridedBatch(setup.C.get(), static_cast<int>(batch), rows * n));
      }
      SPARSETORCH_CUSPARSE_CHECK(cusparseSpMM_bufferSize(handle, op, op, a.ptr(), setup.A.get(), setup.B.get(),
                                                         b.ptr(), setup.C.get(), compute, CUSPARSE_SPMM_ALG_DEFAULT,
                                                         &setup.buffer_bytes));
    } catch (...) {
      // A refused matrix (repeated columns) or a failed call must not leave a half-built entry: a later
      // call whose tensors reuse these addresses would find it and hand cuSPARSE null descriptors (found
      // by the hypothesis test on the H100).
      call_cache.pop_front();
      throw;
    }
    setup.key = key;  // only a complete entry can be found
    if (call_cache.size() > kCacheEntries) call_cache.pop_back();
  }
  CallSetup& setup = call_cache.front();
  // The workspace comes from the caching allocator on every call (stream-ordered reuse is safe).
  at::Tensor workspace = at::empty({static_cast<int64_t>(setup.buffer_bytes)}, out.options().dtype(at::kByte));
  SPARSETORCH_CUSPARSE_CHECK(cusparseSpMM(handle, op, op, a.ptr(), setup.A.get(), setup.B.get(), b.ptr(),
                                          setup.C.get(), compute, CUSPARSE_SPMM_ALG_DEFAULT, workspace.data_ptr()));
}

// B goes to cuSPARSE row-major (C is row-major); anything else is copied first. A column-major B
// (e.g. x.t() in a pruned linear layer) is accepted by cuSPARSE but was ~40x slower on the H100:
// 4096 x 4096 at 50% density, n = 1024, fp32: 110 ms, against ~3 ms expected from row-major runs.
// The copy is made with fresh strides: contiguous() keeps a tensor whose odd strides sit on size-1
// dims (a k x 1 B with strides (1, 2) "is contiguous"), and cuSPARSE then rejected ld = 2 < k
// (found by the hypothesis test on the H200).
at::Tensor dense_for_cusparse(const at::Tensor& dense) {
  const bool row_major = dense.stride(-1) == 1 && dense.stride(-2) >= std::max<int64_t>(1, dense.size(-1));
  return row_major ? dense : at::empty(dense.sizes(), dense.options()).copy_(dense);
}

int64_t index_limit(at::ScalarType t) {
  return t == at::kInt ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
}

}  // namespace

void spmm_cusparse(const SpmmProblem& p, const at::Tensor& crow_in, const at::Tensor& col_in,
                   const at::Tensor& values_in, const at::Tensor& dense_in, const at::Tensor& out,
                   const SpmmEpilogue& epi) {
  if (out.numel() == 0) return;
  // cuSPARSE misbehaves on empty operands; a zero A (or k = 0) is the epilogue alone.
  if (p.nnz_stride == 0 || p.k == 0 || p.m == 0) {
    spmm_native(p, crow_in, col_in, values_in, dense_in, out, epi);
    return;
  }
  const bool accumulates = epi.accumulate.defined() && epi.beta != 0.0;
  const double beta = accumulates ? epi.beta : 0.0;
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
  at::Tensor dense = dense_for_cusparse(dense_in);
  // Half types on long rows: cuSPARSE keeps its partial sums in C's type, so C is float32 there
  // (cuSPARSE's mixed precision: half A and B, float C and compute), rounded to the output once
  // (common/spmm_routing.cpp has the measurements). The rule reads the cached analysis (no device
  // work); other dtypes and narrow B never sum in float, so they skip the lookup (a cache probe per call).
  const bool float_sums =
      cusparse_sums_in_float(p, out.scalar_type(), nullptr) &&
      cusparse_sums_in_float(p, out.scalar_type(), analyze_csr(crow_in, col_in, p.k, AnalysisMode::kLookup).get());
  at::Tensor c = out;
  if (float_sums) {
    c = accumulates ? epi.accumulate.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                    : at::empty(out.sizes(), out.options().dtype(at::kFloat));
  } else if (accumulates && !epi.accumulate.is_same(out)) {
    out.copy_(epi.accumulate);
  }

  if (!p.batched) {
    cusparse_spmm(crow, col, values, p.m, p.k, p.nnz_stride, 1, 0, dense, p.n, 0, c, epi.alpha, beta);
  } else if (!p.pattern_batched) {
    // One pattern for every batch: the strided batch's precondition holds. cuSPARSE takes one
    // batch stride for columns and values, so per-batch values need the columns repeated.
    at::Tensor col_b = col;
    int64_t colval_stride = 0;
    if (p.values_batched) {
      col_b = col.unsqueeze(0).expand({p.batch, p.nnz_stride}).contiguous();
      colval_stride = p.nnz_stride;
    }
    if (!p.dense_batched) dense = dense.unsqueeze(0).expand({p.batch, p.k, p.n});
    if (dense.stride(0) == 0 && p.batch > 1) dense = dense.contiguous();
    cusparse_spmm(crow, col_b, values, p.m, p.k, p.nnz_stride, p.batch, colval_stride, dense, p.n, dense.stride(0),
                  c, epi.alpha, beta);
  } else {
    // Different pattern per batch: one block-diagonal CSR. Padding after crow[i, -1] is dropped.
    const at::Tensor crow64 = crow.to(at::kLong);
    const at::Tensor nnz = crow64.select(1, p.m);                     // (b,)
    const at::Tensor first = at::cumsum(nnz, 0) - nnz;                // exclusive prefix sum
    const int64_t total = (first[-1] + nnz[-1]).item<int64_t>();      // one sync
    const int64_t rows = p.batch * p.m;
    const int64_t cols = p.dense_batched ? p.batch * p.k : p.k;
    const bool fits32 = rows < index_limit(at::kInt) && cols < index_limit(at::kInt) &&
                        total < index_limit(at::kInt);
    const at::ScalarType idx = fits32 ? at::kInt : at::kLong;
    at::Tensor big_crow = at::cat({(crow64.narrow(1, 0, p.m) + first.unsqueeze(1)).reshape({-1}),
                                   at::full({1}, total, crow64.options())})
                              .to(idx);
    const at::Tensor keep = at::arange(p.nnz_stride, crow64.options()).unsqueeze(0) < nnz.unsqueeze(1);
    at::Tensor big_col = col.to(at::kLong);
    if (p.dense_batched) big_col = big_col + (at::arange(p.batch, crow64.options()) * p.k).unsqueeze(1);
    big_col = big_col.masked_select(keep).to(idx);
    const at::Tensor big_values = values.masked_select(keep);
    if (total == 0) {
      spmm_native(p, crow_in, col_in, values_in, dense_in, out, epi);
      return;
    }
    // Stacked B: (b*k, n) when batched (needs batch stride k * row stride), else B itself.
    if (p.dense_batched && dense.stride(0) != p.k * dense.stride(1)) dense = dense.contiguous();
    if (p.dense_batched && dense.stride(-1) != 1) dense = dense.contiguous();
    const at::Tensor stacked = p.dense_batched ? dense.view({p.batch * p.k, p.n}) : dense;
    cusparse_spmm(big_crow, big_col, big_values, rows, cols, total, 1, 0, stacked, p.n, 0, c, epi.alpha, beta);
  }
  if (float_sums) out.copy_(c);
  apply_bias_act(out, epi);
}

}  // namespace cuda
}  // namespace sparsetorch
