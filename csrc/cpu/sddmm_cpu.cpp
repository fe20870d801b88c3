// Sampled dense-dense product on the CPU: out[j] = alpha * dot(a[row(j), :], b[col[j], :]) for every
// stored entry j (the gradient of spmm with respect to A's values). One output row of the pattern
// per task; the dot products run in the accumulate type (float for half types). Row spans and
// columns are bounds-checked as they are read, like the CPU SpMM (IndexError, never an OOB read).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "common/checks.h"
#include "common/csr_analysis.h"

namespace sparsetorch {
namespace {

template <typename scalar_t, typename index_t>
void sddmm_cpu_kernel(const SddmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                      const at::Tensor& b, double alpha_in, const at::Tensor& out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t m = p.m, k = p.k, n = p.n, L = p.nnz_stride;
  const int64_t crow_bstride = p.crow_bstride(), col_bstride = p.col_bstride();
  const int64_t a_bstride = p.a_batched ? m * n : 0;
  const int64_t b_bstride = p.b_batched ? k * n : 0;
  const index_t* crow_ptr = crow.data_ptr<index_t>();
  const index_t* col_ptr = col.data_ptr<index_t>();
  const scalar_t* a_ptr = a.data_ptr<scalar_t>();
  const scalar_t* b_ptr = b.data_ptr<scalar_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const int64_t out_bstride = p.batched ? L : 0;
  const acc_t alpha = static_cast<acc_t>(alpha_in);
  const int64_t work_per_row = std::max<int64_t>(1, n * std::max<int64_t>(1, L / std::max<int64_t>(1, m)));
  const int64_t grain = std::max<int64_t>(1, 16384 / work_per_row);

  at::parallel_for(0, p.batch * m, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t bi = row / m, r = row % m;
      const index_t* crow_b = crow_ptr + bi * crow_bstride;
      const index_t* col_b = col_ptr + bi * col_bstride;
      const int64_t start = crow_b[r], stop = crow_b[r + 1];
      check_row_span(start, stop, L, r, bi);
      const scalar_t* __restrict__ arow = a_ptr + bi * a_bstride + r * n;
      const scalar_t* b_batch = b_ptr + bi * b_bstride;
      scalar_t* out_b = out_ptr + bi * out_bstride;
      for (int64_t j = start; j < stop; ++j) {
        const int64_t c = col_b[j];
        check_column(c, k, j, bi);
        const scalar_t* __restrict__ brow = b_batch + c * n;
        acc_t dot = 0;
        for (int64_t q = 0; q < n; ++q) dot += static_cast<acc_t>(arow[q]) * static_cast<acc_t>(brow[q]);
        out_b[j] = static_cast<scalar_t>(alpha * dot);
      }
    }
  });
}

at::Tensor sddmm_cpu(const at::Tensor& crow_in, const at::Tensor& col_in, const at::Tensor& a_in,
                     const at::Tensor& b_in, double alpha, c10::string_view backend, bool validate) {
  parse_spmm_backend(std::string(backend));  // validated; the CPU has a single kernel
  const SddmmProblem p = check_sddmm_args(crow_in, col_in, a_in, b_in);
  checked_csr(crow_in, col_in, p.k, validate, "sddmm");
  // Padding slots (after crow[i, m]) are never visited: they stay 0.
  at::Tensor out = at::zeros(p.out_shape(), a_in.options());
  if (p.nnz_stride == 0 || p.m == 0) return out;
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "sddmm_cpu", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "sddmm_cpu", [&] {
      sddmm_cpu_kernel<scalar_t, index_t>(p, crow, col, a, b, alpha, out);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("sddmm", &sddmm_cpu); }

}  // namespace sparsetorch
