// Vectorized building blocks of the CPU kernels: loads and stores of any float dtype as vectors of
// its accumulate type (float for float16/bfloat16), and the activations and their derivatives on
// those vectors (the same formulas as common/activation.h, on at::vec::Vectorized).
// Included inside a kernel build (between isa_begin.h and isa_end.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "common/activation.h"
#include "common/elementwise.h"

namespace sparsetorch::cpu {
inline namespace CPU_CAPABILITY {

using at::vec::Vectorized;

template <typename T>
using acc_type = at::opmath_type<T>;

// T elements as vectors of its accumulate type A: one vector is V::size() elements (8 floats in
// AVX2), a step two vectors (one Vectorized<T> of 16 half-type elements).
template <typename T>
struct VecIO {
  using A = acc_type<T>;
  using V = Vectorized<A>;
  static constexpr bool kSame = std::is_same_v<T, A>;
  static constexpr int64_t kWidth = V::size();
  static constexpr int64_t kStep = 2 * kWidth;

  static C10_ALWAYS_INLINE V load(const T* p) {
    if constexpr (kSame) {
      return V::loadu(p);
    } else {
      V v;
      at::vec::load_to_float(p, v);
      return v;
    }
  }
  static C10_ALWAYS_INLINE void load2(const T* p, V& lo, V& hi) {
    if constexpr (kSame) {
      lo = V::loadu(p);
      hi = V::loadu(p + kWidth);
    } else {
      std::tie(lo, hi) = at::vec::convert_to_float<T>(Vectorized<T>::loadu(p));
    }
  }
  // count < kStep elements; the rest of the lanes are zero.
  static inline void load2(const T* p, int64_t count, V& lo, V& hi) {
    if constexpr (kSame) {
      lo = V::loadu(p, std::min(count, kWidth));
      hi = count > kWidth ? V::loadu(p + kWidth, count - kWidth) : V(A(0));
    } else {
      std::tie(lo, hi) = at::vec::convert_to_float<T>(Vectorized<T>::loadu(p, count));
    }
  }
  static C10_ALWAYS_INLINE void store(T* p, const V& v) {
    if constexpr (kSame) {
      v.store(p);
    } else {
      at::vec::convert_from_float<T>(v, v).store(p, kWidth);
    }
  }
  static C10_ALWAYS_INLINE void store2(T* p, const V& lo, const V& hi) {
    if constexpr (kSame) {
      lo.store(p);
      hi.store(p + kWidth);
    } else {
      at::vec::convert_from_float<T>(lo, hi).store(p);
    }
  }
  static inline void store2(T* p, int64_t count, const V& lo, const V& hi) {
    if constexpr (kSame) {
      lo.store(p, std::min(count, kWidth));
      if (count > kWidth) hi.store(p + kWidth, count - kWidth);
    } else {
      at::vec::convert_from_float<T>(lo, hi).store(p, count);
    }
  }
};

// out[0:n] = f(x[0:n]) (f on vectors of the accumulate type; the tail through partial loads).
template <typename T, typename F>
inline void map1(const T* x, T* out, int64_t n, const F& f) {
  using IO = VecIO<T>;
  typename IO::V a, b;
  int64_t i = 0;
  for (; i + IO::kStep <= n; i += IO::kStep) {
    IO::load2(x + i, a, b);
    IO::store2(out + i, f(a), f(b));
  }
  if (i < n) {
    IO::load2(x + i, n - i, a, b);
    IO::store2(out + i, n - i, f(a), f(b));
  }
}

// out[0:n] = f(x[0:n], y[0:n]).
template <typename T, typename F>
inline void map2(const T* x, const T* y, T* out, int64_t n, const F& f) {
  using IO = VecIO<T>;
  typename IO::V a, b, c, d;
  int64_t i = 0;
  for (; i + IO::kStep <= n; i += IO::kStep) {
    IO::load2(x + i, a, b);
    IO::load2(y + i, c, d);
    IO::store2(out + i, f(a, c), f(b, d));
  }
  if (i < n) {
    IO::load2(x + i, n - i, a, b);
    IO::load2(y + i, n - i, c, d);
    IO::store2(out + i, n - i, f(a, c), f(b, d));
  }
}

// x op y in the accumulate type; alpha pre-scales y for add and sub (one fused multiply-add, as
// torch.add does).
template <BinaryOp OP, typename V>
C10_ALWAYS_INLINE V binary_vec(const V& x, const V& y, const V& alpha) {
  if constexpr (OP == BinaryOp::Add) {
    return at::vec::fmadd(y, alpha, x);
  } else if constexpr (OP == BinaryOp::Sub) {
    return at::vec::fmadd(y, V(0) - alpha, x);
  } else if constexpr (OP == BinaryOp::Mul) {
    return x * y;
  } else if constexpr (OP == BinaryOp::Div) {
    return x / y;
  } else {
    return y - x;  // RSub
  }
}

template <typename F>
decltype(auto) dispatch_binary(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::Add:
      return f(std::integral_constant<BinaryOp, BinaryOp::Add>{});
    case BinaryOp::Sub:
      return f(std::integral_constant<BinaryOp, BinaryOp::Sub>{});
    case BinaryOp::Mul:
      return f(std::integral_constant<BinaryOp, BinaryOp::Mul>{});
    case BinaryOp::Div:
      return f(std::integral_constant<BinaryOp, BinaryOp::Div>{});
    case BinaryOp::RSub:
    default:
      return f(std::integral_constant<BinaryOp, BinaryOp::RSub>{});
  }
}

template <typename V>
C10_ALWAYS_INLINE V sigmoid_vec(const V& x) {
  const V one(1);
  return one / (one + x.neg().exp());
}

// act(x) on a vector; NaN propagates through every activation (relu included, as in torch).
template <Activation ACT, typename V>
C10_ALWAYS_INLINE V activation_vec(const V& x, const V& slope) {
  using A = typename V::value_type;
  if constexpr (ACT == Activation::None) {
    return x;
  } else if constexpr (ACT == Activation::Relu) {
    return at::vec::clamp_min(x, V(A(0)));  // max(0, x) with x's NaN kept
  } else if constexpr (ACT == Activation::LeakyRelu) {
    return V::blendv(x, x * slope, x < V(A(0)));
  } else if constexpr (ACT == Activation::Gelu) {
    return x * V(A(0.5)) * (V(A(1)) + (x * V(A(0.70710678118654752440))).erf());
  } else if constexpr (ACT == Activation::GeluTanh) {
    const V inner = V(A(0.79788456080286535588)) * (x + V(A(0.044715)) * x * x * x);
    return V(A(0.5)) * x * (V(A(1)) + inner.tanh());
  } else if constexpr (ACT == Activation::Silu) {
    return x / (V(A(1)) + x.neg().exp());
  } else if constexpr (ACT == Activation::Sigmoid) {
    return sigmoid_vec(x);
  } else {
    return x.tanh();
  }
}

// d act(x) / dx on a vector.
template <Activation ACT, typename V>
C10_ALWAYS_INLINE V activation_derivative_vec(const V& x, const V& slope) {
  using A = typename V::value_type;
  const V one(A(1)), zero(A(0));
  if constexpr (ACT == Activation::None) {
    return one;
  } else if constexpr (ACT == Activation::Relu) {
    return V::blendv(zero, one, x > zero);
  } else if constexpr (ACT == Activation::LeakyRelu) {
    return V::blendv(slope, one, x > zero);
  } else if constexpr (ACT == Activation::Gelu) {
    const V cdf = V(A(0.5)) * (one + (x * V(A(0.70710678118654752440))).erf());
    const V pdf = V(A(0.39894228040143267794)) * (V(A(-0.5)) * x * x).exp();
    return cdf + x * pdf;
  } else if constexpr (ACT == Activation::GeluTanh) {
    constexpr A kBeta = A(0.79788456080286535588), kKappa = A(0.044715);
    const V t = (V(kBeta) * (x + V(kKappa) * x * x * x)).tanh();
    const V dinner = V(kBeta) * (one + V(A(3) * kKappa) * x * x);
    return V(A(0.5)) * (one + t) + V(A(0.5)) * x * (one - t * t) * dinner;
  } else if constexpr (ACT == Activation::Silu) {
    const V s = sigmoid_vec(x);
    return s * (one + x * (one - s));
  } else if constexpr (ACT == Activation::Sigmoid) {
    const V s = sigmoid_vec(x);
    return s * (one - s);
  } else {
    const V t = x.tanh();
    return one - t * t;
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace sparsetorch::cpu
