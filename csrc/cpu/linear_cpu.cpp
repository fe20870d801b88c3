// Dense path on the CPU: ATen's matmul (MKL / OpenBLAS), then the bias + activation in place on the
// product (the vectorised bias_act kernel; no second output).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "common/activation.h"
#include "common/checks.h"
#include "cpu/kernels.h"

namespace sparsetorch {
namespace {

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      c10::string_view activation, double negative_slope) {
  check_linear_args(x, weight, bias);
  const Activation act = parse_activation(std::string(activation));
  at::Tensor y = at::matmul(x, weight.t());
  if (!bias.has_value() && act == Activation::None) return y;
  if (!y.is_contiguous()) y = y.contiguous();
  if (y.numel() == 0) return y;
  // y is this call's own tensor: the kernel reads each element before it writes it.
  cpu::kernels().bias_act(y, at::Tensor(), bias.has_value() ? bias->contiguous() : at::Tensor(), y, act,
                          negative_slope);
  return y;
}

at::Tensor dense_bmm_cpu(const at::Tensor& a, const at::Tensor& b) {
  const int64_t batch = check_dense_bmm_args(a, b);
  const at::Tensor a3 = a.dim() == 3 ? a : a.unsqueeze(0).expand({batch, a.size(0), a.size(1)});
  const at::Tensor b3 = b.dim() == 3 ? b : b.unsqueeze(0).expand({batch, b.size(0), b.size(1)});
  return at::bmm(a3, b3);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) {
  m.impl("linear", &linear_cpu);
  m.impl("dense_bmm", &dense_bmm_cpu);
}

}  // namespace sparsetorch
