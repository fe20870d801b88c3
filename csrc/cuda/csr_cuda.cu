// CSR structure ops on CUDA: row/column scaling of the values (the validation is csr_analysis_cuda.cu).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/checks.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int64_t blocks_for(int64_t work) {
  const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return std::max<int64_t>(1, std::min(ceil_div(work, kThreads), max_blocks));
}

// --- csr_scale ---------------------------------------------------------------------------------

// One warp per (batch, row): lanes stride over the row's entries.
template <typename scalar_t, typename index_t>
__global__ void csr_scale_kernel(const index_t* crow, const index_t* col, scalar_t* values, const scalar_t* rs,
                                 int64_t rs_bstride, const scalar_t* cs, int64_t cs_bstride, int64_t cs_len,
                                 int64_t rows, int64_t m, int64_t L, int64_t pattern_bstride, int64_t col_bstride,
                                 int* bad_column) {
  using acc_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows; row += warps) {
    const int64_t b = row / m, r = row - b * m;
    const index_t* crow_b = crow + b * pattern_bstride;
    const index_t* col_b = col + b * col_bstride;
    scalar_t* v_b = values + b * L;
    const int64_t start = min(max(static_cast<int64_t>(crow_b[r]), int64_t(0)), L);
    const int64_t stop = min(max(static_cast<int64_t>(crow_b[r + 1]), start), L);
    const acc_t row_factor = rs ? static_cast<acc_t>(rs[b * rs_bstride + r]) : acc_t(1);
    for (int64_t j = start + lane; j < stop; j += 32) {
      acc_t f = row_factor;
      if (cs) {
        const int64_t c = col_b[j];
        if (c < 0 || c >= cs_len) {
          atomicExch(bad_column, 1);
          continue;
        }
        f *= static_cast<acc_t>(cs[b * cs_bstride + c]);
      }
      v_b[j] = static_cast<scalar_t>(static_cast<acc_t>(v_b[j]) * f);
    }
  }
}

at::Tensor csr_scale_cuda(const at::Tensor& crow_in, const at::Tensor& col_in, const at::Tensor& values_in,
                          const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& col_scale) {
  const CsrScaleArgs args = check_csr_scale_args(crow_in, col_in, values_in, row_scale, col_scale);
  const CsrShape& s = args.shape;
  const ScaleVector &rs = args.rows, &cs = args.cols;
  const c10::cuda::CUDAGuard guard(values_in.device());
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  at::Tensor out = values_in.contiguous().clone();
  if (out.numel() == 0 || s.m == 0 || !args.scales()) return out;
  at::Tensor bad = at::zeros({1}, crow.options().dtype(at::kInt));
  const int64_t rows = args.batch * s.m;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "csr_scale_cuda", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_scale_cuda", [&] {
      csr_scale_kernel<scalar_t, index_t><<<blocks_for(rows * 32), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
          crow.data_ptr<index_t>(), col.data_ptr<index_t>(), out.data_ptr<scalar_t>(),
          rs.t.defined() ? rs.t.data_ptr<scalar_t>() : nullptr, rs.batch_stride,
          cs.t.defined() ? cs.t.data_ptr<scalar_t>() : nullptr, cs.batch_stride, cs.len, rows, s.m, s.nnz_stride,
          s.batched ? s.m + 1 : 0, s.batched ? s.nnz_stride : 0, bad.data_ptr<int>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  // Column factors gather by column index: an out-of-range column is an error, not a silent skip.
  // Reading the flag costs one synchronisation, only when col_scale is given.
  if (cs.t.defined()) {
    TORCH_CHECK_INDEX(bad.item<int>() == 0, "col_indices: a stored column is out of range for col_scale of length ",
                      cs.len, " (run sparsetorch.validate_csr for its position)");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) {
  m.impl("csr_scale", SPARSETORCH_CUDA_OP(csr_scale_cuda));
}

}  // namespace cuda
}  // namespace sparsetorch
