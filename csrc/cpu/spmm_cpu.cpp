// CSR x dense on the CPU: argument checks, output allocation and layouts here; the kernel
// (sparse_kernels.h: vectorised over B's columns, work split by rows and entries, one build per ISA)
// computes act(alpha * A @ B + beta * C + bias). Unsorted and duplicate columns are summed; every
// row span and column index is bounds-checked as it is read (IndexError, never an out-of-bounds read).
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include "common/activation.h"
#include "common/checks.h"
#include "common/csr_analysis.h"
#include "cpu/kernels.h"

namespace sparsetorch {
namespace {

// Computes into `out` (contiguous, output shape). `accumulate` is undefined or a contiguous
// tensor of the output shape (it may be `out` itself: each element is read before it is written).
void run_spmm_cpu(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                  const at::Tensor& dense, const at::Tensor& out, const at::Tensor& accumulate,
                  const std::optional<at::Tensor>& bias, const cpu::Epilogue& epi) {
  if (out.numel() == 0) return;
  // Rows of B are read as contiguous runs; any other layout (e.g. a transposed B) is copied.
  cpu::kernels().spmm(p, crow.contiguous(), col.contiguous(), values.contiguous(),
                      dense.stride(-1) == 1 ? dense : dense.contiguous(), out, accumulate,
                      bias.has_value() ? bias->contiguous() : at::Tensor(), epi);
}

at::Tensor spmm_cpu(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                    double alpha, const std::optional<at::Tensor>& accumulate, double beta,
                    const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope,
                    c10::string_view backend, bool validate) {
  parse_spmm_backend(std::string(backend));  // validated; the CPU has a single kernel
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, accumulate, bias);
  checked_csr(crow, col, p.k, validate, "spmm");
  const cpu::Epilogue epi{alpha, beta, parse_activation(std::string(activation)), negative_slope};
  at::Tensor out = cpu::empty_output(p.out_shape(), values.options());
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
  const cpu::Epilogue epi{alpha, beta, parse_activation(std::string(activation)), negative_slope};
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
