#include "common/activation.h"

#include <c10/util/Exception.h>

namespace sparsetorch {

Activation parse_activation(const std::string& name) {
  if (name == "none" || name.empty()) return Activation::None;
  if (name == "relu") return Activation::Relu;
  if (name == "leaky_relu") return Activation::LeakyRelu;
  if (name == "gelu") return Activation::Gelu;
  if (name == "gelu_tanh") return Activation::GeluTanh;
  if (name == "silu") return Activation::Silu;
  if (name == "sigmoid") return Activation::Sigmoid;
  if (name == "tanh") return Activation::Tanh;
  TORCH_CHECK_VALUE(false, "activation: unknown activation '", name,
                    "'; expected one of none, relu, leaky_relu, gelu, gelu_tanh, silu, sigmoid, tanh");
}

}  // namespace sparsetorch

#include "common/elementwise.h"

namespace sparsetorch {

BinaryOp parse_binary_op(const std::string& name, bool allow_rsub) {
  if (name == "add") return BinaryOp::Add;
  if (name == "sub") return BinaryOp::Sub;
  if (name == "mul") return BinaryOp::Mul;
  if (name == "div") return BinaryOp::Div;
  if (allow_rsub && name == "rsub") return BinaryOp::RSub;
  TORCH_CHECK_VALUE(false, "op: unknown elementwise operator '", name, "'; expected one of add, sub, mul, div",
                    allow_rsub ? ", rsub" : "");
}

}  // namespace sparsetorch
