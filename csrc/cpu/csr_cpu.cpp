// CSR structure ops on the CPU: row/column scaling of the values (the validation is csr_analysis_cpu.cpp).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"

namespace sparsetorch {
namespace {

at::Tensor csr_scale_cpu(const at::Tensor& crow_in, const at::Tensor& col_in, const at::Tensor& values_in,
                         const std::optional<at::Tensor>& row_scale, const std::optional<at::Tensor>& col_scale) {
  const CsrShape s = check_csr_components(crow_in, col_in, &values_in);
  check_float_dtype(values_in, "values");
  // With a 1-D pattern, 2-D values are a batch sharing the pattern.
  const bool values_batched = values_in.dim() == 2;
  const int64_t batch = values_batched ? values_in.size(0) : 1;
  const ScaleVector rs = check_scale_vector(row_scale, values_in, batch, values_batched, "row_scale", s.m);
  const ScaleVector cs = check_scale_vector(col_scale, values_in, batch, values_batched, "col_scale", -1);
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  at::Tensor out = values_in.contiguous().clone();
  if (out.numel() == 0 || s.m == 0 || (!rs.t.defined() && !cs.t.defined())) return out;
  const int64_t m = s.m, L = s.nnz_stride;
  const int64_t pattern_bstride = s.batched ? m + 1 : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "csr_scale_cpu", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_scale_cpu", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const index_t* crow_p = crow.data_ptr<index_t>();
      const index_t* col_p = col.data_ptr<index_t>();
      const scalar_t* rs_p = rs.t.defined() ? rs.t.data_ptr<scalar_t>() : nullptr;
      const scalar_t* cs_p = cs.t.defined() ? cs.t.data_ptr<scalar_t>() : nullptr;
      scalar_t* v = out.data_ptr<scalar_t>();
      at::parallel_for(0, batch * m, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, L / m)),
                       [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const int64_t b = row / m, r = row % m;
          const index_t* crow_b = crow_p + b * pattern_bstride;
          const index_t* col_b = col_p + b * (s.batched ? L : 0);
          scalar_t* v_b = v + b * L;
          const int64_t start = crow_b[r], stop = crow_b[r + 1];
          TORCH_CHECK_INDEX(0 <= start && start <= stop && stop <= L, "crow_indices: row ", r, " of batch ", b,
                            " spans entries [", start, ", ", stop, ") outside the ", L, " stored entries");
          const acc_t row_factor = rs_p ? static_cast<acc_t>(rs_p[b * rs.batch_stride + r]) : acc_t(1);
          for (int64_t j = start; j < stop; ++j) {
            acc_t f = row_factor;
            if (cs_p) {
              const int64_t c = col_b[j];
              TORCH_CHECK_INDEX(0 <= c && c < cs.len, "col_indices: entry ", j, " of batch ", b, " is column ", c,
                                ", out of range for col_scale of length ", cs.len);
              f *= static_cast<acc_t>(cs_p[b * cs.batch_stride + c]);
            }
            v_b[j] = static_cast<scalar_t>(static_cast<acc_t>(v_b[j]) * f);
          }
        }
      });
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) {
  m.impl("csr_scale", &csr_scale_cpu);
}

}  // namespace sparsetorch
