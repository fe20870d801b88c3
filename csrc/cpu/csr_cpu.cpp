// CSR structure ops on the CPU: row/column scaling of the values (kernel in sparse_kernels.h; the
// validation is csr_analysis_cpu.cpp).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"
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

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) {
  m.impl("csr_scale", &csr_scale_cpu);
}

}  // namespace sparsetorch
