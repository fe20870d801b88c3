// Activation functions shared by the CPU and CUDA kernels (and the SpMM epilogue).
// Math is done in the accumulate type (float for half/bfloat16 inputs, double for double).
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <string>
#include <type_traits>

namespace sparsetorch {

enum class Activation : int {
  None = 0,
  Relu,
  LeakyRelu,
  Gelu,      // exact: x * Phi(x), Phi the normal CDF (erf form)
  GeluTanh,  // tanh approximation, as torch.nn.functional.gelu(approximate="tanh")
  Silu,
  Sigmoid,
  Tanh,
};

// Parses "none", "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh";
// raises ValueError naming the accepted values otherwise.
Activation parse_activation(const std::string& name);

namespace math {
// Overloads spelled out so host and device code pick the single/double function explicitly.
C10_HOST_DEVICE inline float exp_(float x) { return ::expf(x); }
C10_HOST_DEVICE inline double exp_(double x) { return ::exp(x); }
C10_HOST_DEVICE inline float tanh_(float x) { return ::tanhf(x); }
C10_HOST_DEVICE inline double tanh_(double x) { return ::tanh(x); }
C10_HOST_DEVICE inline float erf_(float x) { return ::erff(x); }
C10_HOST_DEVICE inline double erf_(double x) { return ::erf(x); }
}  // namespace math

template <typename T>
C10_HOST_DEVICE inline T sigmoid_(T x) {
  return T(1) / (T(1) + math::exp_(-x));
}

// y = act(x). NaN propagates through every activation (relu included, as in torch).
template <typename T>
C10_HOST_DEVICE inline T apply_activation(Activation act, T x, T negative_slope) {
  constexpr T kSqrt1_2 = T(0.70710678118654752440);
  constexpr T kSqrt2OverPi = T(0.79788456080286535588);
  constexpr T kGeluCoeff = T(0.044715);
  switch (act) {
    case Activation::None:
      return x;
    case Activation::Relu:
      return x < T(0) ? T(0) : x;
    case Activation::LeakyRelu:
      return x < T(0) ? x * negative_slope : x;
    case Activation::Gelu:
      return T(0.5) * x * (T(1) + math::erf_(x * kSqrt1_2));
    case Activation::GeluTanh:
      return T(0.5) * x * (T(1) + math::tanh_(kSqrt2OverPi * (x + kGeluCoeff * x * x * x)));
    case Activation::Silu:
      return x * sigmoid_(x);
    case Activation::Sigmoid:
      return sigmoid_(x);
    case Activation::Tanh:
      return math::tanh_(x);
  }
  return x;
}

// d act(x) / dx, evaluated at the pre-activation x.
template <typename T>
C10_HOST_DEVICE inline T activation_derivative(Activation act, T x, T negative_slope) {
  constexpr T kSqrt1_2 = T(0.70710678118654752440);
  constexpr T kInvSqrt2Pi = T(0.39894228040143267794);
  constexpr T kSqrt2OverPi = T(0.79788456080286535588);
  constexpr T kGeluCoeff = T(0.044715);
  switch (act) {
    case Activation::None:
      return T(1);
    case Activation::Relu:
      return x > T(0) ? T(1) : T(0);
    case Activation::LeakyRelu:
      return x > T(0) ? T(1) : negative_slope;
    case Activation::Gelu: {
      T cdf = T(0.5) * (T(1) + math::erf_(x * kSqrt1_2));
      T pdf = kInvSqrt2Pi * math::exp_(T(-0.5) * x * x);
      return cdf + x * pdf;
    }
    case Activation::GeluTanh: {
      T inner = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
      T t = math::tanh_(inner);
      T dinner = kSqrt2OverPi * (T(1) + T(3) * kGeluCoeff * x * x);
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner;
    }
    case Activation::Silu: {
      T s = sigmoid_(x);
      return s * (T(1) + x * (T(1) - s));
    }
    case Activation::Sigmoid: {
      T s = sigmoid_(x);
      return s * (T(1) - s);
    }
    case Activation::Tanh: {
      T t = math::tanh_(x);
      return T(1) - t * t;
    }
  }
  return T(1);
}

// Calls f(std::integral_constant<Activation, A>{}) for the runtime value `act`, so kernels can take
// the activation as a template parameter: the per-element switch then folds away at compile time.
template <typename F>
decltype(auto) dispatch_activation(Activation act, F&& f) {
  switch (act) {
    case Activation::Relu:
      return f(std::integral_constant<Activation, Activation::Relu>{});
    case Activation::LeakyRelu:
      return f(std::integral_constant<Activation, Activation::LeakyRelu>{});
    case Activation::Gelu:
      return f(std::integral_constant<Activation, Activation::Gelu>{});
    case Activation::GeluTanh:
      return f(std::integral_constant<Activation, Activation::GeluTanh>{});
    case Activation::Silu:
      return f(std::integral_constant<Activation, Activation::Silu>{});
    case Activation::Sigmoid:
      return f(std::integral_constant<Activation, Activation::Sigmoid>{});
    case Activation::Tanh:
      return f(std::integral_constant<Activation, Activation::Tanh>{});
    case Activation::None:
    default:
      return f(std::integral_constant<Activation, Activation::None>{});
  }
}

}  // namespace sparsetorch
