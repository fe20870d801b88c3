// Vectorized building blocks of the CPU kernels: loads and stores of any float dtype as vectors of
// its accumulate type (float for float16/bfloat16), and the activations and their derivatives on
// those vectors (common/activation.h's functions, on at::vec::Vectorized; the GELUs in forms that
// keep their accuracy for negative inputs).
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
  // store2 past the caches (non-temporal: no read-for-ownership of the lines written), for outputs
  // too large to stay in them; p aligned to 32 bytes. The portable build stores normally. After a
  // run of these, fence() before the data is handed to another thread.
  static C10_ALWAYS_INLINE void stream2(T* p, const V& lo, const V& hi) {
#if SPARSETORCH_ISA_AVX2
    if constexpr (std::is_same_v<T, float>) {
      _mm256_stream_ps(p, lo);
      _mm256_stream_ps(p + kWidth, hi);
    } else if constexpr (std::is_same_v<T, double>) {
      _mm256_stream_pd(p, lo);
      _mm256_stream_pd(p + kWidth, hi);
    } else {
      const __m256i v = at::vec::convert_from_float<T>(lo, hi);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
    }
#else
    store2(p, lo, hi);
#endif
  }
  static C10_ALWAYS_INLINE void fence() {
#if SPARSETORCH_ISA_AVX2
    _mm_sfence();
#endif
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

// out[0:n] = f(x[0:n]), f2(a, b) applying f in place to two vectors of the accumulate type (the tail
// through partial loads).
template <typename T, typename F2>
inline void map1(const T* x, T* out, int64_t n, const F2& f2) {
  using IO = VecIO<T>;
  typename IO::V a, b;
  int64_t i = 0;
  for (; i + IO::kStep <= n; i += IO::kStep) {
    IO::load2(x + i, a, b);
    f2(a, b);
    IO::store2(out + i, a, b);
  }
  if (i < n) {
    IO::load2(x + i, n - i, a, b);
    f2(a, b);
    IO::store2(out + i, n - i, a, b);
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

// map2 with the output streamed past the caches (VecIO::stream2) from its first 32-byte boundary on.
template <typename T, typename F>
inline void map2_stream(const T* x, const T* y, T* out, int64_t n, const F& f) {
  using IO = VecIO<T>;
  const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out) % 32);
  const int64_t head = std::min<int64_t>(n, misaligned == 0 ? 0 : (32 - misaligned) / int64_t(sizeof(T)));
  map2(x, y, out, head, f);
  typename IO::V a, b, c, d;
  int64_t i = head;
  for (; i + IO::kStep <= n; i += IO::kStep) {
    IO::load2(x + i, a, b);
    IO::load2(y + i, c, d);
    IO::stream2(out + i, f(a, c), f(b, d));
  }
  map2(x + i, y + i, out + i, n - i, f);
  IO::fence();
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

// GELU's float math. Phi(x) = 0.5 erfc(-x / sqrt 2) keeps its relative accuracy for negative x, where
// 0.5 (1 + erf(x / sqrt 2)) cancels (at::vec's float erf has an absolute error of 1.5e-7, so GELU(-4)
// comes out with 4 correct digits, in torch too; so does oneDNN's GELU, which eager torch runs on
// float32 CPU tensors). With h = Phi(-|x|): Phi(x) = h for negative x, 1 - h else, and
// x Phi(x) = relu(x) - |x| h.
// h = 0.5 erfc(z) = t P(t) exp(-z^2), t = 1 / (1 + c z), z = |x| / sqrt 2, with P fitted for relative
// error, in two fits: over all x (P of degree 8, 2e-8 in exact arithmetic) and over the near range
// |x| <= kGeluNear (degree 6, 4e-8 with its float coefficients), which the AVX2 build takes for pairs
// of vectors whose lanes all lie there (randn data: all but one pair in 10^5).
// exp(-x^2 / 2) is computed from x^2 split into two floats (hi + lo), so that it stays accurate where
// x^2 is large: 2^n exp(r), the reduction r = -(hi + lo) / 2 - n ln 2 with ln 2 in two parts, exp(r)
// a degree-6 polynomial (relative error 2e-9), 2^n added to the exponent bits.
// Everything runs on N vectors in lock-step (each step for all N before the next): GCC keeps the
// source order on x86 (no scheduling before register allocation), and two interleaved dependency
// chains keep the out-of-order window busy where one leaves it waiting on the division and Horner's
// chain.
// Measured on the 2-core Zen 3 machine (in-cache loop, medians, ns per 8 floats): 8.0 with at::vec's
// exp_u20 and a correction for x^2's low part; 6.1 with the exp here (the full path); 5.1 with the near
// path and the relu form; 4.7 in lock-step pairs. Eager torch (oneDNN's JIT) ~7 at 2^22 elements.
// What did not help: 1 / d as a reciprocal estimate plus a Newton step (+1%); P in Estrin or split
// form (7-16% slower: more operations); a degree-5 exp (as fast, less accurate); a degree-3 exp after
// an 8-entry table of 2^(j/8) (_mm256_permutevar8x32_ps): 4% slower than the degree 6; the full
// path's clamp and underflow mask as integer instructions (5% slower); a near range of 9 with P of
// degree 7 (9% slower on randn data); checking the range once per block of 256 floats in a first pass
// instead of per pair (as fast, more code); streaming the output past the caches at 2^22 floats (no
// gain: input and output together fit the 32 MiB L3).
// Double: at::vec's erfc (Sleef, 1.5 ulp).
using FloatV = Vectorized<float>;

// exp(-xa^2 / 2) for xa = |x| <= 16, hi = xa * xa. Garbage where 2^n leaves the normal floats
// (|x| > 13.19): callers mask it there or never get there.
template <int N>
C10_ALWAYS_INLINE void gauss_from_square(const FloatV (&xa)[N], const FloatV (&hi)[N], FloatV (&gauss)[N]) {
  using V = FloatV;
  using I = Vectorized<int32_t>;
  const V magic(12582912.f);
  V nm[N], u[N], q[N];
  for (int j = 0; j < N; ++j) {
    // n = round(-hi / (2 ln 2)) by adding 1.5 * 2^23: n lands in the low bits of nm.
    nm[j] = at::vec::fmadd(hi[j], V(-0.72134751081466674805f), magic);
  }
  for (int j = 0; j < N; ++j) {
    // u = hi + lo + 2 n ln 2 = -2 r (|u| <= ln 2), lo = x^2 - hi exactly (a fused multiply-subtract);
    // 2 ln 2 in two parts, the first of 9 bits: n times it is exact with or without a fused multiply-add.
    const V n = nm[j] - magic;
    u[j] = at::vec::fmadd(n, V(1.38671875f), hi[j]);
    u[j] = at::vec::fmadd(n, V(-4.243888801094e-04f), u[j]) + at::vec::fmsub(xa[j], xa[j], hi[j]);
  }
  // exp(r) = Q(u), the -1/2 folded into Q's coefficients.
  for (int j = 0; j < N; ++j) q[j] = V(2.1620066e-05f);
  for (const float c : {-0.000261712994f, 0.00260426407f, -0.0208330248f, 0.124999978f, -0.5f, 1.f}) {
    for (int j = 0; j < N; ++j) q[j] = at::vec::fmadd(q[j], u[j], V(c));
  }
  for (int j = 0; j < N; ++j) {
    gauss[j] = at::vec::cast<float>(at::vec::cast<int32_t>(q[j]) + (at::vec::cast<int32_t>(nm[j]) << I(23)));
  }
}

// poly = the polynomial with coefficients coef (highest degree first) at t, for N vectors in lock-step.
template <int N, size_t K>
C10_ALWAYS_INLINE void horner(const float (&coef)[K], const FloatV (&t)[N], FloatV (&poly)[N]) {
  for (int j = 0; j < N; ++j) poly[j] = FloatV(coef[0]);
  for (size_t k = 1; k < K; ++k) {
    for (int j = 0; j < N; ++j) poly[j] = at::vec::fmadd(poly[j], t[j], FloatV(coef[k]));
  }
}

// h = Phi(-xa) and gauss = exp(-xa^2 / 2) for xa = |x|: NEAR, xa <= kGeluNear; else xa <= 16 (clamped
// by the caller: beyond, Phi is 0 or 1 and exp(-x^2 / 2) 0 in float; NaN stays NaN).
constexpr float kGeluNear = 5.f;
template <bool NEAR, int N>
C10_ALWAYS_INLINE void half_erfc(const FloatV (&xa)[N], FloatV (&h)[N], FloatV (&gauss)[N]) {
  using V = FloatV;
  // 0.5 P(t), highest degree first (the 0.5 of 0.5 erfc folded in).
  static constexpr float kNear[] = {-9.558405071e-02f, 3.589431534e-01f, -3.001880871e-01f, 3.145083832e-01f,
                                    6.488311774e-03f,  1.175481634e-01f, 9.828410768e-02f};
  static constexpr float kFull[] = {-0.064627572894096375f, 0.24215547740459442f, -0.2548956274986267f,
                                    0.2724941670894623f,    -0.046420343220233917f, 0.10709381103515625f,
                                    0.074259839951992035f,  0.085345573723316193f, 0.084594666957855225f};
  const V c(NEAR ? 0.25019699335098267f : 0.2121320343559642f);
  V t[N], hi[N], poly[N];
  for (int j = 0; j < N; ++j) t[j] = V(1.f) / at::vec::fmadd(c, xa[j], V(1.f));
  for (int j = 0; j < N; ++j) hi[j] = xa[j] * xa[j];
  gauss_from_square(xa, hi, gauss);
  if constexpr (NEAR) {
    horner(kNear, t, poly);
  } else {
    horner(kFull, t, poly);
  }
  for (int j = 0; j < N; ++j) {
    if (!NEAR) gauss[j] = gauss[j] & (hi[j] < V(173.9f));  // 0 where 2^n would leave the normal floats
    h[j] = t[j] * poly[j] * gauss[j];
  }
}

// Phi(x) and gauss = exp(-x^2 / 2) on one vector, any x. GELU's relative error in float: 4.6e-7 at most
// over |x| <= 13 (dense sweep against float64), 7.8e-7 down to where x Phi(x) leaves the normal floats
// (x = -13.2).
template <typename V>
C10_ALWAYS_INLINE V normal_cdf(const V& x, V& gauss) {
  using A = typename V::value_type;
  if constexpr (std::is_same_v<A, float>) {
    const V xa[1] = {at::vec::clamp_max(x.abs(), V(16.f))};
    V h[1], g[1];
    half_erfc<false>(xa, h, g);
    gauss = g[0];
    return V::blendv(V(1.f) - h[0], h[0], x < V(0.f));
  } else {
    gauss = (V(A(-0.5)) * x * x).exp();
    return V(A(0.5)) * (x * V(A(-0.70710678118654752440))).erfc();
  }
}

#if SPARSETORCH_ISA_AVX2
// Whether every lane of xa[0] and xa[1] (|x|) is at most kGeluNear (NaN and infinities are not): the
// bits of non-negative floats compare as integers.
C10_ALWAYS_INLINE bool gelu_near(const FloatV (&xa)[2]) {
  const __m256i m = _mm256_max_epu32(_mm256_castps_si256(xa[0]), _mm256_castps_si256(xa[1]));
  const __m256 d = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_set1_epi32(c10::bit_cast<int32_t>(kGeluNear) + 1), m));
  return _mm256_testz_ps(d, d);  // no lane's sign set: none above the limit
}

// GELU (DERIVATIVE: its derivative Phi(x) + x phi(x)) on two float vectors in place.
template <bool DERIVATIVE>
C10_ALWAYS_INLINE void gelu_pair(FloatV& a, FloatV& b) {
  using V = FloatV;
  V xa[2] = {a.abs(), b.abs()}, h[2], gauss[2];
  const bool near = gelu_near(xa);
  if (C10_LIKELY(near)) {
    half_erfc<true>(xa, h, gauss);
  } else {
    for (auto& v : xa) v = at::vec::clamp_max(v, V(16.f));
    half_erfc<false>(xa, h, gauss);
  }
  V* x[2] = {&a, &b};
  for (int j = 0; j < 2; ++j) {
    V& v = *x[j];
    if (DERIVATIVE) {
      // Phi(x) by x's sign bit, + x phi(x).
      const V cdf = _mm256_blendv_ps(V(1.f) - h[j], h[j], v);
      v = at::vec::fmadd(v * V(0.39894228040143267794f), gauss[j], cdf);
    } else if (C10_LIKELY(near)) {
      v = at::vec::fnmadd(xa[j], h[j], at::vec::clamp_min(v, V(0.f)));  // one rounding for x >= 0
    } else {
      v = v * V(_mm256_blendv_ps(V(1.f) - h[j], h[j], v));  // x Phi(x): -inf gives NaN, as in torch
    }
  }
}
#endif

// tanh in float, for N vectors in lock-step. at::vec's tanh (Sleef's 1-ulp tanhf, or a scalar loop in the
// portable build) took ~2.6 ns per float per core on the 2-core AMD EPYC machine: 0.88-0.93x eager torch in
// bfloat16, where one float ulp is 2^-16 of the result's precision. Here (Cephes' tanhf split):
//  - |x| < 0.625: x + x^3 P(x^2), P of degree 4 (Cephes: 1.3e-7 relative error);
//  - else 1 - 2 / (e^(2|x|) + 1) with x's sign, |x| clamped to 9.5 (from 9.01 on, tanh rounds to 1 in float);
//    e^(2|x|) = 2^n exp(r), r = 2|x| - n ln 2 with ln 2 in two parts (n ln 2's first part exact),
//    exp(r) Cephes' degree-6 polynomial, 2^n added to the exponent bits (n <= 26).
// Both branches on |x|, x's sign bit put back at the end. NaN takes the first branch (the comparison is
// false) and stays NaN; +-Inf gives +-1; -0 stays -0.
template <int N>
C10_ALWAYS_INLINE void tanh_float(FloatV (&x)[N]) {
  using V = FloatV;
  using I = Vectorized<int32_t>;
  const V magic(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits
  V a[N], big[N], nm[N], r[N], p[N], z[N], small[N];
  for (int j = 0; j < N; ++j) a[j] = x[j].abs();
  for (int j = 0; j < N; ++j) {
    const V t = at::vec::minimum(a[j], V(9.5f));
    nm[j] = at::vec::fmadd(t, V(2.f * 1.44269504088896341f), magic);  // n = round(2t / ln 2)
    r[j] = t + t;
  }
  for (int j = 0; j < N; ++j) {
    const V n = nm[j] - magic;
    r[j] = at::vec::fmadd(n, V(-0.693359375f), r[j]);
    r[j] = at::vec::fmadd(n, V(2.12194440e-4f), r[j]);
  }
  for (int j = 0; j < N; ++j) p[j] = V(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    for (int j = 0; j < N; ++j) p[j] = at::vec::fmadd(p[j], r[j], V(c));
  }
  for (int j = 0; j < N; ++j) {
    p[j] = at::vec::fmadd(p[j], r[j] * r[j], r[j]) + V(1.f);  // exp(r)
    const V e = at::vec::cast<float>(at::vec::cast<int32_t>(p[j]) + (at::vec::cast<int32_t>(nm[j]) << I(23)));
    big[j] = V(1.f) - V(2.f) / (e + V(1.f));
  }
  for (int j = 0; j < N; ++j) {
    z[j] = a[j] * a[j];
    V q(-5.70498872745e-3f);
    for (const float c : {2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f, -3.33332819422e-1f}) {
      q = at::vec::fmadd(q, z[j], V(c));
    }
    small[j] = at::vec::fmadd(a[j] * z[j], q, a[j]);
  }
  // tanh(|x|), then x's sign bit (tanh is odd): -0 stays -0.
  for (int j = 0; j < N; ++j) x[j] = V::blendv(small[j], big[j], a[j] >= V(0.625f)) | (x[j] & V(-0.f));
}

template <typename V>
C10_ALWAYS_INLINE V tanh_vec(const V& x) {
  if constexpr (std::is_same_v<V, FloatV>) {
    FloatV v[1] = {x};
    tanh_float(v);
    return v[0];
  } else {
    return x.tanh();  // double: Sleef's
  }
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
    V gauss;
    return x * normal_cdf(x, gauss);
  } else if constexpr (ACT == Activation::GeluTanh) {
    // 0.5 (1 + tanh u) = sigmoid(2 u): the same function, accurate for negative u.
    const V u2 = V(A(2 * 0.79788456080286535588)) * (x + V(A(0.044715)) * x * x * x);
    return x / (V(A(1)) + u2.neg().exp());
  } else if constexpr (ACT == Activation::Silu) {
    return x / (V(A(1)) + x.neg().exp());
  } else if constexpr (ACT == Activation::Sigmoid) {
    return sigmoid_vec(x);
  } else {
    return tanh_vec(x);
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
    V gauss;
    const V cdf = normal_cdf(x, gauss);
    return at::vec::fmadd(x * V(A(0.39894228040143267794)), gauss, cdf);  // cdf + x * pdf
  } else if constexpr (ACT == Activation::GeluTanh) {
    // With s = sigmoid(2u) = 0.5 (1 + tanh u): 1 - tanh^2 u = 4 s (1 - s).
    constexpr A kBeta = A(0.79788456080286535588), kKappa = A(0.044715);
    const V s = sigmoid_vec(V(A(2) * kBeta) * (x + V(kKappa) * x * x * x));
    const V dinner = V(kBeta) * (one + V(A(3) * kKappa) * x * x);
    return s + V(A(2)) * x * s * (one - s) * dinner;
  } else if constexpr (ACT == Activation::Silu) {
    const V s = sigmoid_vec(x);
    return s * (one + x * (one - s));
  } else if constexpr (ACT == Activation::Sigmoid) {
    const V s = sigmoid_vec(x);
    return s * (one - s);
  } else {
    const V t = tanh_vec(x);
    return one - t * t;
  }
}

// activation_vec and activation_derivative_vec on two vectors in place; GELU in float through gelu_pair
// in the AVX2 build.
template <Activation ACT, typename V>
C10_ALWAYS_INLINE void activation_pair(V& a, V& b, const V& slope) {
#if SPARSETORCH_ISA_AVX2
  if constexpr (ACT == Activation::Gelu && std::is_same_v<V, FloatV>) {
    gelu_pair<false>(a, b);
    return;
  }
#endif
  if constexpr (ACT == Activation::Tanh && std::is_same_v<V, FloatV>) {
    FloatV v[2] = {a, b};
    tanh_float(v);
    a = v[0];
    b = v[1];
    return;
  }
  a = activation_vec<ACT>(a, slope);
  b = activation_vec<ACT>(b, slope);
}

template <Activation ACT, typename V>
C10_ALWAYS_INLINE void activation_derivative_pair(V& a, V& b, const V& slope) {
#if SPARSETORCH_ISA_AVX2
  if constexpr (ACT == Activation::Gelu && std::is_same_v<V, FloatV>) {
    gelu_pair<true>(a, b);
    return;
  }
#endif
  a = activation_derivative_vec<ACT>(a, slope);
  b = activation_derivative_vec<ACT>(b, slope);
}

}  // namespace CPU_CAPABILITY
}  // namespace sparsetorch::cpu
