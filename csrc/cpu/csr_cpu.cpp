// CSR structure ops on the CPU: row/column scaling of the values (kernel in sparse_kernels.h), and
// the O(nnz) validation.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/csr_check_codes.h"
#include "cpu/kernels.h"

namespace sparsetorch {
namespace {

at::Tensor csr_scale_cpu(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                         const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& col_scale) {
  const CsrShape s = check_csr_components(crow, col, &values);
  check_float_dtype(values, "values");
  // With a 1-D pattern, 2-D values are a batch sharing the pattern.
  const bool values_batched = values.dim() == 2;
  const int64_t batch = values_batched ? values.size(0) : 1;
  const ScaleVector rs = check_scale_vector(row_scale, values, batch, values_batched, "row_scale", s.m);
  const ScaleVector cs = check_scale_vector(col_scale, values, batch, values_batched, "col_scale", -1);
  if (values.numel() == 0 || s.m == 0 || (!rs.t.defined() && !cs.t.defined())) return values.contiguous().clone();
  // The kernel (sparse_kernels.h) writes every slot: scaled in the rows' spans, copied elsewhere.
  at::Tensor out = cpu::empty_output_like(values.contiguous());
  cpu::kernels().csr_scale(s, crow.contiguous(), col.contiguous(), values.contiguous(), rs, cs, out);
  return out;
}

template <typename index_t>
void csr_check_one(const index_t* crow, const index_t* col, int64_t b, int64_t m, int64_t L, bool exact_nnz,
                   int64_t ncols, int64_t* result) {
  auto fail = [&](int64_t code, int64_t pos, int64_t value) {
    result[0] = code;
    result[1] = b;
    result[2] = pos;
    result[3] = value;
  };
  if (crow[0] != 0) return fail(kCrowFirstNotZero, 0, crow[0]);
  for (int64_t r = 0; r < m; ++r) {
    if (crow[r + 1] < crow[r]) return fail(kCrowDecreasing, r + 1, crow[r + 1]);
  }
  const int64_t last = crow[m];
  if (exact_nnz ? last != L : last > L) return fail(kCrowLastMismatch, m, last);
  for (int64_t j = 0; j < last; ++j) {
    if (col[j] < 0 || col[j] >= ncols) return fail(kColOutOfRange, j, col[j]);
  }
}

at::Tensor csr_check_cpu(const at::Tensor& crow_in, const at::Tensor& col_in, int64_t ncols) {
  const CsrShape s = check_csr_components(crow_in, col_in, nullptr);
  TORCH_CHECK_VALUE(ncols >= 0, "ncols: expected a non-negative number of columns, got ", ncols);
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  at::Tensor result = at::zeros({4}, crow.options().dtype(at::kLong));
  int64_t* res = result.data_ptr<int64_t>();
  AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_check_cpu", [&] {
    const index_t* crow_p = crow.data_ptr<index_t>();
    const index_t* col_p = col.data_ptr<index_t>();
    for (int64_t b = 0; b < s.batch && res[0] == kCsrOk; ++b) {
      csr_check_one<index_t>(crow_p + b * (s.m + 1), col_p + b * s.nnz_stride, b, s.m, s.nnz_stride,
                             /*exact_nnz=*/!s.batched, ncols, res);
    }
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) {
  m.impl("csr_scale", &csr_scale_cpu);
  m.impl("csr_check", &csr_check_cpu);
}

}  // namespace sparsetorch
