// CSR x dense on the CPU: one row of the output per task (at::parallel_for / OpenMP), the row
// accumulated in the accumulate type (float for half types) and finished by the epilogue
// alpha * acc + beta * C + bias -> activation. Unsorted and duplicate columns are simply summed.
// Every row span and column index is bounds-checked as it is read (one compare per entry), so a
// malformed CSR raises IndexError instead of reading out of bounds.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/activation.h"
#include "common/checks.h"

namespace sparsetorch {
namespace {

struct Epilogue {
  double alpha;
  double beta;
  Activation act;
  double negative_slope;
};

template <typename scalar_t, typename index_t>
void spmm_cpu_kernel(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                     const at::Tensor& dense, const at::Tensor& out, const at::Tensor& accumulate,
                     const at::Tensor& bias, const Epilogue& epi) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t m = p.m, k = p.k, n = p.n, L = p.nnz_stride;
  const int64_t crow_bstride = p.pattern_batched ? m + 1 : 0;
  const int64_t col_bstride = p.pattern_batched ? L : 0;
  const int64_t val_bstride = p.values_batched ? L : 0;
  const int64_t dense_bstride = p.dense_batched ? dense.stride(0) : 0;
  const int64_t ldb = dense.stride(-2);

  const index_t* crow_ptr = crow.data_ptr<index_t>();
  const index_t* col_ptr = col.data_ptr<index_t>();
  const scalar_t* val_ptr = values.data_ptr<scalar_t>();
  const scalar_t* dense_ptr = dense.data_ptr<scalar_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const scalar_t* acc_in = accumulate.defined() ? accumulate.data_ptr<scalar_t>() : nullptr;
  const scalar_t* bias_ptr = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;

  const acc_t alpha = static_cast<acc_t>(epi.alpha);
  const acc_t beta = static_cast<acc_t>(epi.beta);
  const acc_t slope = static_cast<acc_t>(epi.negative_slope);
  const int64_t rows = p.batch * m;
  // Aim for tasks of roughly 16k multiply-adds so small problems do not pay for threads.
  const int64_t work_per_row = std::max<int64_t>(1, n * std::max<int64_t>(1, L / std::max<int64_t>(1, m)));
  const int64_t grain = std::max<int64_t>(1, 16384 / work_per_row);

  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(static_cast<size_t>(n));
    acc_t* __restrict__ a = acc.data();
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / m, r = row % m;
      const index_t* crow_b = crow_ptr + b * crow_bstride;
      const index_t* col_b = col_ptr + b * col_bstride;
      const scalar_t* val_b = val_ptr + b * val_bstride;
      const scalar_t* dense_b = dense_ptr + b * dense_bstride;
      const int64_t start = crow_b[r], stop = crow_b[r + 1];
      TORCH_CHECK_INDEX(0 <= start && start <= stop && stop <= L, "crow_indices: row ", r, " of batch ", b,
                        " spans entries [", start, ", ", stop, ") outside the ", L,
                        " stored entries (crow_indices must be non-decreasing, within [0, nnz])");
      std::fill(a, a + n, acc_t(0));
      for (int64_t j = start; j < stop; ++j) {
        const int64_t c = col_b[j];
        TORCH_CHECK_INDEX(0 <= c && c < k, "col_indices: entry ", j, " of batch ", b, " is column ", c,
                          ", out of range for k = ", k, " columns");
        const acc_t v = static_cast<acc_t>(val_b[j]);
        const scalar_t* __restrict__ brow = dense_b + c * ldb;
        for (int64_t q = 0; q < n; ++q) a[q] += v * static_cast<acc_t>(brow[q]);
      }
      scalar_t* __restrict__ orow = out_ptr + row * n;
      const scalar_t* crow_in = acc_in ? acc_in + row * n : nullptr;
      for (int64_t q = 0; q < n; ++q) {
        acc_t x = alpha * a[q];
        if (crow_in) x += beta * static_cast<acc_t>(crow_in[q]);
        if (bias_ptr) x += static_cast<acc_t>(bias_ptr[q]);
        orow[q] = static_cast<scalar_t>(apply_activation<acc_t>(epi.act, x, slope));
      }
    }
  });
}

// Computes into `out` (contiguous, output shape). `accumulate` is undefined or a contiguous
// tensor of the output shape (it may be `out` itself: each element is read before it is written).
void run_spmm_cpu(const SpmmProblem& p, const at::Tensor& crow_in, const at::Tensor& col_in,
                  const at::Tensor& values_in, const at::Tensor& dense_in, const at::Tensor& out,
                  const at::Tensor& accumulate, const std::optional<at::Tensor>& bias_in, const Epilogue& epi) {
  if (out.numel() == 0) return;
  const at::Tensor crow = crow_in.contiguous();
  const at::Tensor col = col_in.contiguous();
  const at::Tensor values = values_in.contiguous();
  // Rows of B are read as contiguous runs; any other layout (e.g. a transposed B) is copied.
  const at::Tensor dense = dense_in.stride(-1) == 1 ? dense_in : dense_in.contiguous();
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "spmm_cpu", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "spmm_cpu", [&] {
      spmm_cpu_kernel<scalar_t, index_t>(p, crow, col, values, dense, out, accumulate, bias, epi);
    });
  });
}

at::Tensor spmm_cpu(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                    double alpha, const std::optional<at::Tensor>& accumulate, double beta,
                    const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope,
                    c10::string_view backend) {
  parse_spmm_backend(std::string(backend));  // validated; the CPU has a single kernel
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, accumulate, bias);
  const Epilogue epi{alpha, beta, parse_activation(std::string(activation)), negative_slope};
  at::Tensor out = at::empty(p.out_shape(), values.options());
  const at::Tensor acc = (accumulate.has_value() && beta != 0.0) ? accumulate->contiguous() : at::Tensor();
  run_spmm_cpu(p, crow, col, values, dense, out, acc, bias, epi);
  return out;
}

void spmm_out_cpu(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                  const at::Tensor& out, double alpha, double beta, const std::optional<at::Tensor>& bias,
                  c10::string_view activation, double negative_slope, c10::string_view backend) {
  parse_spmm_backend(std::string(backend));  // validated; the CPU has a single kernel
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, bias);
  check_spmm_out(p, values, out);
  for (const at::Tensor* input : {&crow, &col, &values, &dense}) at::assert_no_overlap(out, *input);
  if (bias.has_value()) at::assert_no_overlap(out, *bias);
  const Epilogue epi{alpha, beta, parse_activation(std::string(activation)), negative_slope};
  const bool direct = out.is_contiguous();
  at::Tensor target = direct ? out : out.contiguous();
  run_spmm_cpu(p, crow, col, values, dense, target, beta != 0.0 ? target : at::Tensor(), bias, epi);
  if (!direct) out.copy_(target);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) {
  m.impl("spmm", &spmm_cpu);
  m.impl("spmm_out", &spmm_out_cpu);
}

}  // namespace sparsetorch
