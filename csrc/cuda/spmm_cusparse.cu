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

#include <limits>

#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {
namespace {

// One cusparseSpMM call: C (row-major, ldc = n) = alpha * A @ B + beta * C, B row- or column-major.
void cusparse_spmm_call(const SpMatDescriptor& A, const at::Tensor& dense, int64_t k, int64_t n, int64_t batch,
                        int64_t dense_bstride, const at::Tensor& out, int64_t m, int64_t out_bstride,
                        double alpha, double beta) {
  const at::ScalarType dtype = out.scalar_type();
  cusparseHandle_t handle = at::cuda::getCurrentCUDASparseHandle();
  SPARSETORCH_CUSPARSE_CHECK(cusparseSetStream(handle, at::cuda::getCurrentCUDAStream()));
  // B as cuSPARSE sees it: row-major (k x n, ld = stride(-2)) or column-major (ld = stride(-1)).
  const bool row_major = dense.stride(-1) == 1;
  DnMatDescriptor B, C;
  B.create(k, n, row_major ? dense.stride(-2) : dense.stride(-1), dense.data_ptr(), dtype,
           row_major ? CUSPARSE_ORDER_ROW : CUSPARSE_ORDER_COL);
  C.create(m, n, n, out.data_ptr(), dtype, CUSPARSE_ORDER_ROW);
  if (batch > 1) {
    SPARSETORCH_CUSPARSE_CHECK(cusparseDnMatSetStridedBatch(B.get(), static_cast<int>(batch), dense_bstride));
    SPARSETORCH_CUSPARSE_CHECK(cusparseDnMatSetStridedBatch(C.get(), static_cast<int>(batch), out_bstride));
  }
  const Scalar a(alpha, dtype), b(beta, dtype);
  const cudaDataType compute = compute_dtype(dtype);
  const auto op = CUSPARSE_OPERATION_NON_TRANSPOSE;
  size_t bytes = 0;
  SPARSETORCH_CUSPARSE_CHECK(cusparseSpMM_bufferSize(handle, op, op, a.ptr(), A.get(), B.get(), b.ptr(), C.get(),
                                                     compute, CUSPARSE_SPMM_ALG_DEFAULT, &bytes));
  at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, out.options().dtype(at::kByte));
  SPARSETORCH_CUSPARSE_CHECK(cusparseSpMM(handle, op, op, a.ptr(), A.get(), B.get(), b.ptr(), C.get(), compute,
                                          CUSPARSE_SPMM_ALG_DEFAULT, workspace.data_ptr()));
}

// cuSPARSE takes B row-major or column-major; anything else (e.g. a sliced B) is copied.
at::Tensor dense_for_cusparse(const at::Tensor& dense) {
  const bool row_major = dense.stride(-1) == 1 && dense.stride(-2) >= std::max<int64_t>(1, dense.size(-1));
  const bool col_major = dense.stride(-2) == 1 && dense.stride(-1) >= std::max<int64_t>(1, dense.size(-2));
  return (row_major || col_major) ? dense : dense.contiguous();
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
  double beta = 0.0;
  if (epi.accumulate.defined() && epi.beta != 0.0) {
    if (!epi.accumulate.is_same(out)) out.copy_(epi.accumulate);
    beta = epi.beta;
  }
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
  at::Tensor dense = dense_for_cusparse(dense_in);

  if (!p.batched) {
    SpMatDescriptor A;
    A.create_csr(p.m, p.k, p.nnz_stride, crow, col, values);
    cusparse_spmm_call(A, dense, p.k, p.n, 1, 0, out, p.m, 0, epi.alpha, beta);
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
    SpMatDescriptor A;
    A.create_csr(p.m, p.k, p.nnz_stride, crow, col_b, values);
    SPARSETORCH_CUSPARSE_CHECK(cusparseCsrSetStridedBatch(A.get(), static_cast<int>(p.batch), 0, colval_stride));
    cusparse_spmm_call(A, dense, p.k, p.n, p.batch, dense.stride(0), out, p.m, p.m * p.n, epi.alpha, beta);
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
    SpMatDescriptor A;
    A.create_csr(rows, cols, total, big_crow, big_col, big_values);
    cusparse_spmm_call(A, stacked, cols, p.n, 1, 0, out, rows, 0, epi.alpha, beta);
  }
  if (epi.bias.defined() || epi.act != Activation::None) {
    bias_act_inplace_cuda(out, epi.bias, epi.act, epi.negative_slope);
  }
}

}  // namespace cuda
}  // namespace sparsetorch
