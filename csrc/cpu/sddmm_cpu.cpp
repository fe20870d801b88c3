// Sampled dense-dense product on the CPU: out[j] = alpha * dot(a[row(j), :], b[col[j], :]) for every
// stored entry j (the gradient of spmm with respect to A's values). Checks and layouts here; the
// kernel (sparse_kernels.h) splits the entries evenly among threads, computes the dot products in
// the accumulate type (float for half types) on vectors, and bounds-checks row spans and columns
// as it reads them (IndexError, never an out-of-bounds read).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/csr_analysis.h"
#include "cpu/kernels.h"

namespace sparsetorch {
namespace {

at::Tensor sddmm_cpu(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b,
                     double alpha, c10::string_view backend, bool validate) {
  parse_spmm_backend(std::string(backend));  // validated; the CPU has a single kernel
  const SddmmProblem p = check_sddmm_args(crow, col, a, b);
  checked_csr(crow, col, p.k, validate, "sddmm");
  // Padding slots (after crow[i, m]) are never visited: they stay 0.
  at::Tensor out = at::zeros(p.out_shape(), a.options());
  if (p.nnz_stride == 0 || p.m == 0) return out;
  cpu::kernels().sddmm(p, crow.contiguous(), col.contiguous(), a.contiguous(), b.contiguous(), alpha, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("sddmm", &sddmm_cpu); }

}  // namespace sparsetorch
