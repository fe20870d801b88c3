// Dense path on the CPU: ATen's matmul (MKL / OpenBLAS) and the fused bias + activation.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "common/checks.h"

namespace sparsetorch {
namespace {

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      c10::string_view activation, double negative_slope) {
  check_linear_args(x, weight, bias);
  const at::Tensor y = at::matmul(x, weight.t());
  static const auto bias_act = c10::Dispatcher::singleton().findSchemaOrThrow("sparsetorch::bias_act", "")
                                   .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&,
                                                     const std::optional<at::Tensor>&, c10::string_view, double)>();
  if (!bias.has_value() && activation == "none") return y;
  return bias_act.call(y, std::nullopt, bias, activation, negative_slope);
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
