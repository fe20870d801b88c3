// Binary elementwise operators shared by the CPU and CUDA kernels.
#pragma once

#include <c10/macros/Macros.h>

#include <string>

namespace sparsetorch {

enum class BinaryOp : int { Add = 0, Sub, Mul, Div, RSub };

// Tensor-tensor ops accept add, sub, mul, div; tensor-scalar ops also rsub (s - x).
BinaryOp parse_binary_op(const std::string& name, bool allow_rsub);

// x op y; for add/sub the second operand is pre-scaled by alpha (x + alpha * y).
template <typename T>
C10_HOST_DEVICE inline T apply_binary(BinaryOp op, T x, T y, T alpha) {
  switch (op) {
    case BinaryOp::Add:
      return x + alpha * y;
    case BinaryOp::Sub:
      return x - alpha * y;
    case BinaryOp::Mul:
      return x * y;
    case BinaryOp::Div:
      return x / y;
    case BinaryOp::RSub:
      return y - x;
  }
  return x;
}

}  // namespace sparsetorch
