// Elementwise ops on the CPU: binary (tensor-tensor, tensor-scalar), activation, and the fused
// bias + activation y = act(x * scale + bias). Inputs of any layout are read through a
// contiguous view (copied if needed; the caller's tensors are never written); math in the
// accumulate type (float for half types).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/activation.h"
#include "common/checks.h"
#include "common/elementwise.h"

namespace sparsetorch {
namespace {

constexpr int64_t kGrain = 32768;

#define SPARSETORCH_DISPATCH_FLOATS(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

at::Tensor binary_cpu(const at::Tensor& x_in, const at::Tensor& y_in, c10::string_view op_name, double alpha) {
  check_binary_args(x_in, y_in);
  const BinaryOp op = parse_binary_op(std::string(op_name), /*allow_rsub=*/false);
  const at::Tensor x = x_in.contiguous(), y = y_in.contiguous();
  at::Tensor out = at::empty_like(x);
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "binary_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    const acc_t a = static_cast<acc_t>(alpha);
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        op_[i] = static_cast<scalar_t>(
            apply_binary<acc_t>(op, static_cast<acc_t>(xp[i]), static_cast<acc_t>(yp[i]), a));
      }
    });
  });
  return out;
}

at::Tensor binary_scalar_cpu(const at::Tensor& x_in, double other, c10::string_view op_name) {
  check_float_dtype(x_in, "x");
  const BinaryOp op = parse_binary_op(std::string(op_name), /*allow_rsub=*/true);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "binary_scalar_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    const acc_t s = static_cast<acc_t>(other);
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        op_[i] = static_cast<scalar_t>(apply_binary<acc_t>(op, static_cast<acc_t>(xp[i]), s, acc_t(1)));
      }
    });
  });
  return out;
}

at::Tensor activation_cpu(const at::Tensor& x_in, c10::string_view activation, double negative_slope) {
  check_float_dtype(x_in, "x");
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "activation_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    const acc_t slope = static_cast<acc_t>(negative_slope);
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        op_[i] = static_cast<scalar_t>(apply_activation<acc_t>(act, static_cast<acc_t>(xp[i]), slope));
      }
    });
  });
  return out;
}

at::Tensor bias_act_cpu(const at::Tensor& x_in, const std::optional<at::Tensor>& scale_in,
                        const std::optional<at::Tensor>& bias_in, c10::string_view activation,
                        double negative_slope) {
  check_bias_act_args(x_in, scale_in, bias_in);
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.size(-1);
  if (x.numel() == 0) return out;
  const int64_t rows = x.numel() / n;
  const at::Tensor scale = scale_in.has_value() ? scale_in->contiguous() : at::Tensor();
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "bias_act_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* sp = scale.defined() ? scale.data_ptr<scalar_t>() : nullptr;
    const scalar_t* bp = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
    scalar_t* op_ = out.data_ptr<scalar_t>();
    const acc_t slope = static_cast<acc_t>(negative_slope);
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* xr = xp + r * n;
        scalar_t* orow = op_ + r * n;
        for (int64_t q = 0; q < n; ++q) {
          acc_t v = static_cast<acc_t>(xr[q]);
          if (sp) v *= static_cast<acc_t>(sp[q]);
          if (bp) v += static_cast<acc_t>(bp[q]);
          orow[q] = static_cast<scalar_t>(apply_activation<acc_t>(act, v, slope));
        }
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bias_act_backward_cpu(
    const at::Tensor& grad_in, const at::Tensor& x_in, const std::optional<at::Tensor>& scale_in,
    const std::optional<at::Tensor>& bias_in, c10::string_view activation, double negative_slope,
    std::array<bool, 3> output_mask) {
  check_bias_act_backward_args(grad_in, x_in, scale_in, bias_in);
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor x = x_in.contiguous(), grad = grad_in.contiguous();
  const int64_t n = x.size(-1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const at::Tensor scale = scale_in.has_value() ? scale_in->contiguous() : at::Tensor();
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  const at::ScalarType acc_type = at::toOpMathType(x.scalar_type());
  // d = grad * act'(z) in the accumulate type; the column sums reduce it.
  at::Tensor d = at::empty({rows, n}, x.options().dtype(acc_type));
  at::Tensor grad_x = output_mask[0] ? at::empty_like(x) : at::empty({0}, x.options());
  if (rows > 0) {
    SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "bias_act_backward_cpu", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* gp = grad.data_ptr<scalar_t>();
      const scalar_t* sp = scale.defined() ? scale.data_ptr<scalar_t>() : nullptr;
      const scalar_t* bp = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
      acc_t* dp = d.data_ptr<acc_t>();
      scalar_t* gx = output_mask[0] ? grad_x.data_ptr<scalar_t>() : nullptr;
      const acc_t slope = static_cast<acc_t>(negative_slope);
      at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / n), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          for (int64_t q = 0; q < n; ++q) {
            const int64_t i = r * n + q;
            acc_t z = static_cast<acc_t>(xp[i]);
            if (sp) z *= static_cast<acc_t>(sp[q]);
            if (bp) z += static_cast<acc_t>(bp[q]);
            const acc_t di = static_cast<acc_t>(gp[i]) * activation_derivative<acc_t>(act, z, slope);
            dp[i] = di;
            if (gx) gx[i] = static_cast<scalar_t>(sp ? di * static_cast<acc_t>(sp[q]) : di);
          }
        }
      });
    });
  }
  at::Tensor grad_scale = at::empty({0}, x.options()), grad_bias = at::empty({0}, x.options());
  if (output_mask[1]) grad_scale = (d * x.reshape({rows, n}).to(acc_type)).sum(0).to(x.scalar_type());
  if (output_mask[2]) grad_bias = d.sum(0).to(x.scalar_type());
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
