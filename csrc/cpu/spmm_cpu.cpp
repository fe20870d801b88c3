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
#include "common/csr_analysis.h"

namespace sparsetorch {
namespace {

// acc[0:n] += sum_t v[t] * rows[t][0:n] for `count` (1..4) rows of B. Four rows per pass over acc
// quarter the accumulator traffic. GCC builds AVX-512, AVX2+FMA and baseline clones of the float
// and double versions and picks one at load time for the CPU it runs on.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SPARSETORCH_CPU_CLONES __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define SPARSETORCH_CPU_CLONES
#endif

template <typename acc_t, typename scalar_t>
inline void accumulate_rows(acc_t* __restrict__ acc, const scalar_t* const* rows, const acc_t* v, int count,
                            int64_t n) {
  for (int t = 0; t < count; ++t) {
    const scalar_t* __restrict__ r = rows[t];
    for (int64_t q = 0; q < n; ++q) acc[q] += v[t] * static_cast<acc_t>(r[q]);
  }
}

#define SPARSETORCH_DEFINE_ACCUMULATE(T)                                                                  \
  SPARSETORCH_CPU_CLONES void accumulate_rows_##T(T* __restrict__ acc, const T* const* rows, const T* v,  \
                                                  int count, int64_t n) {                                 \
    if (count == 4) {                                                                                    \
      const T *__restrict__ r0 = rows[0], *__restrict__ r1 = rows[1], *__restrict__ r2 = rows[2],          \
                              *__restrict__ r3 = rows[3];                                                \
      const T v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];                                                \
      for (int64_t q = 0; q < n; ++q) acc[q] += v0 * r0[q] + v1 * r1[q] + v2 * r2[q] + v3 * r3[q];         \
      return;                                                                                            \
    }                                                                                                    \
    for (int t = 0; t < count; ++t) {                                                                    \
      const T* __restrict__ r = rows[t];                                                                 \
      const T vt = v[t];                                                                                 \
      for (int64_t q = 0; q < n; ++q) acc[q] += vt * r[q];                                               \
    }                                                                                                    \
  }
SPARSETORCH_DEFINE_ACCUMULATE(float)
SPARSETORCH_DEFINE_ACCUMULATE(double)
#undef SPARSETORCH_DEFINE_ACCUMULATE

template <>
inline void accumulate_rows<float, float>(float* __restrict__ acc, const float* const* rows, const float* v,
                                          int count, int64_t n) {
  accumulate_rows_float(acc, rows, v, count, n);
}
template <>
inline void accumulate_rows<double, double>(double* __restrict__ acc, const double* const* rows, const double* v,
                                            int count, int64_t n) {
  accumulate_rows_double(acc, rows, v, count, n);
}

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
  const int64_t crow_bstride = p.crow_bstride(), col_bstride = p.col_bstride(), val_bstride = p.val_bstride();
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
      check_row_span(start, stop, L, r, b);
      std::fill(a, a + n, acc_t(0));
      for (int64_t j0 = start; j0 < stop; j0 += 4) {
        const int count = static_cast<int>(std::min<int64_t>(4, stop - j0));
        // The B rows are gathered in random order: prefetch the rows of the next group of entries
        // (one cache line at a time, bounds-checked like the reads) while this group is summed.
        for (int64_t j = j0 + 4; j < std::min<int64_t>(j0 + 8, stop); ++j) {
          const int64_t c = col_b[j];
          if (0 <= c && c < k) {
            const char* row_bytes = reinterpret_cast<const char*>(dense_b + c * ldb);
            for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(scalar_t)); off += 64) {
              __builtin_prefetch(row_bytes + off);
            }
          }
        }
        const scalar_t* brows[4];
        acc_t v[4];
        for (int t = 0; t < count; ++t) {
          const int64_t j = j0 + t, c = col_b[j];
          check_column(c, k, j, b);
          v[t] = static_cast<acc_t>(val_b[j]);
          brows[t] = dense_b + c * ldb;
        }
        accumulate_rows<acc_t, scalar_t>(a, brows, v, count, n);
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
                    c10::string_view backend, bool validate) {
  parse_spmm_backend(std::string(backend));  // validated; the CPU has a single kernel
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, accumulate, bias);
  checked_csr(crow, col, p.k, validate, "spmm");
  const Epilogue epi{alpha, beta, parse_activation(std::string(activation)), negative_slope};
  at::Tensor out = at::empty(p.out_shape(), values.options());
  const at::Tensor acc = (accumulate.has_value() && beta != 0.0) ? accumulate->contiguous() : at::Tensor();
  run_spmm_cpu(p, crow, col, values, dense, out, acc, bias, epi);
  return out;
}

void spmm_out_cpu(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                  const at::Tensor& out, double alpha, double beta, const std::optional<at::Tensor>& bias,
                  c10::string_view activation, double negative_slope, c10::string_view backend, bool validate) {
  parse_spmm_backend(std::string(backend));  // validated; the CPU has a single kernel
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, bias);
  checked_csr(crow, col, p.k, validate, "spmm");
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
