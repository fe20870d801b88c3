// Elementwise ops on the CPU: binary (tensor-tensor, tensor-scalar), activation, and the fused bias
// + activation y = act(x * scale + bias) with its backward. Arguments are checked here; the kernels
// (elementwise_kernels.h, vectorised, one build per ISA) read contiguous inputs: other layouts are
// copied first (the caller's tensors are never written), except a y broadcast over x's leading
// dimensions, which the kernel reads in place.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "common/activation.h"
#include "common/checks.h"
#include "common/elementwise.h"
#include "cpu/kernels.h"

namespace sparsetorch {
namespace {

// A y broadcast with a period shorter than this is expanded instead (the kernel reads y in
// pieces of one period; short pieces leave vectors idle).
constexpr int64_t kMinPeriod = 256;

// y as the contiguous block that repeats along x (x.numel() a multiple of its length): y itself
// when contiguous, its trailing block when y is that block expanded over leading dimensions (a bias
// of shape (n,) expanded to (m, n), say), else a contiguous copy.
at::Tensor repeating_block(const at::Tensor& y) {
  if (y.is_contiguous()) return y;
  int64_t d = 0;
  while (d < y.dim() && (y.stride(d) == 0 || y.size(d) == 1)) ++d;
  int64_t expected = 1, period = 1;
  for (int64_t i = y.dim() - 1; i >= d; --i) {
    if (y.size(i) != 1 && y.stride(i) != expected) return y.contiguous();
    expected *= y.size(i);
    period *= y.size(i);
  }
  if (period < kMinPeriod && period < y.numel()) return y.contiguous();
  return y.as_strided({period}, {1});
}

at::Tensor binary_cpu(const at::Tensor& x_in, const at::Tensor& y_in, c10::string_view op_name, double alpha) {
  check_binary_args(x_in, y_in);
  const BinaryOp op = parse_binary_op(std::string(op_name), /*allow_rsub=*/false);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = cpu::empty_output_like(x);
  if (x.numel() == 0) return out;
  cpu::kernels().binary(x, repeating_block(y_in), out, op, alpha);
  return out;
}

at::Tensor binary_scalar_cpu(const at::Tensor& x_in, double other, c10::string_view op_name) {
  check_float_dtype(x_in, "x");
  const BinaryOp op = parse_binary_op(std::string(op_name), /*allow_rsub=*/true);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = cpu::empty_output_like(x);
  cpu::kernels().binary_scalar(x, other, out, op);
  return out;
}

at::Tensor activation_cpu(const at::Tensor& x_in, c10::string_view activation, double negative_slope) {
  check_float_dtype(x_in, "x");
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = cpu::empty_output_like(x);
  cpu::kernels().activation(x, out, act, negative_slope);
  return out;
}

at::Tensor bias_act_cpu(const at::Tensor& x_in, const std::optional<at::Tensor>& scale,
                        const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope) {
  check_bias_act_args(x_in, scale, bias);
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = cpu::empty_output_like(x);
  cpu::kernels().bias_act(x, scale.has_value() ? scale->contiguous() : at::Tensor(),
                          bias.has_value() ? bias->contiguous() : at::Tensor(), out, act, negative_slope);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bias_act_backward_cpu(
    const at::Tensor& grad_in, const at::Tensor& x_in, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope,
    std::array<bool, 3> output_mask) {
  check_bias_act_backward_args(grad_in, x_in, scale, bias);
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor x = x_in.contiguous(), grad = grad_in.contiguous();
  const int64_t n = x.size(-1);
  at::Tensor grad_x = output_mask[0] ? cpu::empty_output_like(x) : at::empty({0}, x.options());
  at::Tensor grad_scale = output_mask[1] ? at::empty({n}, x.options()) : at::empty({0}, x.options());
  at::Tensor grad_bias = output_mask[2] ? at::empty({n}, x.options()) : at::empty({0}, x.options());
  if (!output_mask[0] && !output_mask[1] && !output_mask[2]) return {grad_x, grad_scale, grad_bias};
  cpu::kernels().bias_act_backward(grad, x, scale.has_value() ? scale->contiguous() : at::Tensor(),
                                   bias.has_value() ? bias->contiguous() : at::Tensor(), act, negative_slope,
                                   output_mask[0] ? grad_x : at::Tensor(), output_mask[1] ? grad_scale : at::Tensor(),
                                   output_mask[2] ? grad_bias : at::Tensor());
  return {grad_x, grad_scale, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) {
  m.impl("bias_act_backward", &bias_act_backward_cpu);
  m.impl("binary", &binary_cpu);
  m.impl("binary_scalar", &binary_scalar_cpu);
  m.impl("activation", &activation_cpu);
  m.impl("bias_act", &bias_act_cpu);
}

}  // namespace sparsetorch
