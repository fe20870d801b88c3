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
  const CsrScaleArgs a = check_csr_scale_args(crow, col, values, row_scale, col_scale);
  if (values.numel() == 0 || a.shape.m == 0 || !a.scales()) return values.contiguous().clone();
  // The kernel (sparse_kernels.h) writes every slot: scaled in the rows' spans, copied elsewhere.
  at::Tensor out = cpu::empty_output_like(values.contiguous());
  cpu::kernels().csr_scale(a.shape, crow.contiguous(), col.contiguous(), values.contiguous(), a.rows, a.cols, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) {
  m.impl("csr_scale", &csr_scale_cpu);
}

}  // namespace sparsetorch
