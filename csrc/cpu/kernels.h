// The CPU kernels, built once per instruction set from one templated body each: the bodies are in
// elementwise_kernels.h and sparse_kernels.h (at::vec::Vectorized + at::parallel_for), and each
// is compiled by a *_default.cpp (portable) and an *_avx2.cpp (AVX2 + FMA + F16C) translation unit,
// as ATen compiles its own CPU kernels once per CPU_CAPABILITY. kernels() returns the build for the
// CPU this process runs on; ATEN_CPU_CAPABILITY=default forces the portable one, as it does for ATen.
//
// The op files (elementwise_cpu.cpp, spmm_cpu.cpp, ...) check arguments and allocate outputs; the
// kernels take contiguous tensors (unless noted) and never allocate their outputs.
#pragma once

#include <ATen/ATen.h>

#include "common/activation.h"
#include "common/checks.h"
#include "common/elementwise.h"

// The AVX2 build exists on x86-64 with GCC or clang (function-level target pragmas).
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define SPARSETORCH_CPU_AVX2_BUILD 1
#else
#define SPARSETORCH_CPU_AVX2_BUILD 0
#endif

namespace sparsetorch::cpu {

// out = act(alpha * A @ dense + beta * accumulate + bias).
struct Epilogue {
  double alpha;
  double beta;
  Activation act;
  double negative_slope;
};

struct Kernels {
  const char* isa;  // "avx2" or "default"
  // out = x op y (y: alpha-scaled for add/sub). y holds y.numel() elements repeated along x
  // (x.numel() is a multiple of it: a y broadcast over x's leading dimensions).
  void (*binary)(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out, BinaryOp op, double alpha);
  // out = x op s (rsub: s - x).
  void (*binary_scalar)(const at::Tensor& x, double s, const at::Tensor& out, BinaryOp op);
  void (*activation)(const at::Tensor& x, const at::Tensor& out, Activation act, double negative_slope);
  // out = act(x * scale + bias) over x's last dimension; scale, bias (n,) or undefined.
  void (*bias_act)(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias, const at::Tensor& out,
                   Activation act, double negative_slope);
  // d = grad * act'(x * scale + bias); grad_x = d * scale, grad_scale = sum_rows(d * x), grad_bias =
  // sum_rows(d), each written where defined (grad_scale, grad_bias: (n,) in x's dtype).
  void (*bias_act_backward)(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& bias, Activation act, double negative_slope, const at::Tensor& grad_x,
                            const at::Tensor& grad_scale, const at::Tensor& grad_bias);
  // out = values * row_scale[row] * col_scale[col] for every stored entry (out: values' shape; slots
  // outside the rows' spans are copied). Spans and columns are checked (IndexError).
  void (*csr_scale)(const CsrShape& s, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                    const ScaleVector& row_scale, const ScaleVector& col_scale, const at::Tensor& out);
  // SpMM into `out` (contiguous, the output shape). accumulate: undefined, or contiguous of the
  // output shape (it may be `out`). dense: last stride 1. Spans and columns are checked (IndexError).
  void (*spmm)(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
               const at::Tensor& dense, const at::Tensor& out, const at::Tensor& accumulate, const at::Tensor& bias,
               const Epilogue& epi);
  // SDDMM into `out` (zero-filled, p.out_shape()); a and b contiguous.
  void (*sddmm)(const SddmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                const at::Tensor& b, double alpha, const at::Tensor& out);
};

const Kernels& kernels();

// Filled by the per-ISA translation units (elementwise_kernels_*.cpp fill the elementwise entries,
// sparse_kernels_*.cpp the sparse ones).
namespace default_isa {
void fill_elementwise(Kernels& k);
void fill_sparse(Kernels& k);
}  // namespace default_isa
#if SPARSETORCH_CPU_AVX2_BUILD
namespace avx2_isa {
void fill_elementwise(Kernels& k);
void fill_sparse(Kernels& k);
}  // namespace avx2_isa
#endif

// A new output tensor for a CPU kernel; large ones are backed by transparent huge pages (see
// kernels.cpp), which spares the page faults of first touch. SPARSETORCH_CPU_HUGEPAGES=0 turns it off.
at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options);
inline at::Tensor empty_output_like(const at::Tensor& t) { return empty_output(t.sizes(), t.options()); }

}  // namespace sparsetorch::cpu
