// Elementwise kernels on the CPU: binary ops, activations, and the fused bias + activation (forward
// and backward), one templated body each, on at::vec::Vectorized in the accumulate type and split
// over threads with at::parallel_for (the forward kernels through parallel_pieces). Included once
// per ISA build (elementwise_kernels_*.cpp).
#pragma once

#include <ATen/Dispatch.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/vec_math.h"

namespace sparsetorch::cpu {
inline namespace CPU_CAPABILITY {

// Elements per task: below this a loop is not worth a thread (ATen's GRAIN_SIZE, also used by its
// own elementwise kernels).
constexpr int64_t kGrain = at::internal::GRAIN_SIZE;
// bias_act runs its rows in groups of at least this many elements, so short rows still fill vectors.
constexpr int64_t kMinRun = 256;

// f(begin, end) over [0, n) in pieces of `chunk` (the last one shorter), handed out one at a time to
// the threads of one at::parallel_for as each finishes its previous piece, instead of one fixed half
// per thread: on a machine whose cores other processes also use, a thread that shares its core
// gets fewer pieces rather than holding everyone up with half the work at half the speed. Each
// element is computed the same whichever thread takes its piece.
template <typename F>
inline void parallel_pieces(int64_t n, int64_t chunk, const F& f) {
  const int64_t pieces = (n + chunk - 1) / chunk;
  if (pieces <= 1 || at::get_num_threads() == 1 || at::in_parallel_region()) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(pieces, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    for (int64_t p = next.fetch_add(1, std::memory_order_relaxed); p < pieces;
         p = next.fetch_add(1, std::memory_order_relaxed)) {
      f(p * chunk, std::min(n, (p + 1) * chunk));
    }
  });
}

#define SPARSETORCH_DISPATCH_FLOATS(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

// Outputs of at least this many bytes are written past the caches (map2_stream): x, y and the output
// then exceed the last-level cache (32 MiB on the machine measured), so the output's lines would only
// be read from memory to be overwritten and evicted again. Measured there, add on 2^22 float32
// interleaved with torch.add (which stores normally, as this kernel did): 1.13-1.25 ms against
// torch.add's 1.43-1.55 ms (medians of 400).
constexpr int64_t kStreamBytes = int64_t(8) << 20;

inline void binary_kernel(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out, BinaryOp op,
                          double alpha) {
  const int64_t numel = x.numel(), period = y.numel();
  if (numel == 0) return;
  const bool stream = out.nbytes() >= static_cast<size_t>(kStreamBytes);
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "binary_cpu", [&] {
    using V = Vectorized<acc_type<scalar_t>>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
    dispatch_binary(op, [&](auto OP) {
      parallel_pieces(numel, kGrain, [&](int64_t begin, int64_t end) {
        const V a(static_cast<acc_type<scalar_t>>(alpha));
        const auto f = [&](const V& u, const V& v) { return binary_vec<decltype(OP)::value>(u, v, a); };
        // y repeats every `period` elements: run the chunk in pieces that each read y contiguously.
        for (int64_t i = begin, j = begin % period; i < end; j = 0) {
          const int64_t len = std::min(end - i, period - j);
          if (stream) {
            map2_stream(xp + i, yp + j, op_ + i, len, f);
          } else {
            map2(xp + i, yp + j, op_ + i, len, f);
          }
          i += len;
        }
      });
    });
  });
}

inline void binary_scalar_kernel(const at::Tensor& x, double s, const at::Tensor& out, BinaryOp op) {
  const int64_t numel = x.numel();
  if (numel == 0) return;
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "binary_scalar_cpu", [&] {
    using V = Vectorized<acc_type<scalar_t>>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
    dispatch_binary(op, [&](auto OP) {
      parallel_pieces(numel, kGrain, [&](int64_t begin, int64_t end) {
        const V sv(static_cast<acc_type<scalar_t>>(s)), one(1);
        map1(xp + begin, op_ + begin, end - begin, [&](V& u, V& v) C10_ALWAYS_INLINE_ATTRIBUTE {
          u = binary_vec<decltype(OP)::value>(u, sv, one);
          v = binary_vec<decltype(OP)::value>(v, sv, one);
        });
      });
    });
  });
}

inline void activation_kernel(const at::Tensor& x, const at::Tensor& out, Activation act, double negative_slope) {
  const int64_t numel = x.numel();
  if (numel == 0) return;
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "activation_cpu", [&] {
    using V = Vectorized<acc_type<scalar_t>>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
    dispatch_activation(act, [&](auto ACT) {
      parallel_pieces(numel, kGrain, [&](int64_t begin, int64_t end) {
        const V slope(static_cast<acc_type<scalar_t>>(negative_slope));
        map1(xp + begin, op_ + begin, end - begin,
             [&](V& u, V& v) C10_ALWAYS_INLINE_ATTRIBUTE { activation_pair<decltype(ACT)::value>(u, v, slope); });
      });
    });
  });
}

// Rows of x (rows x n) in groups of R rows, each group one run of up to n * R elements with scale
// and bias tiled R times in the accumulate type (short rows still fill whole vectors).
template <typename A>
struct RowGroups {
  int64_t rows, n, per_group, len;
  std::vector<A> scale, bias;  // len each, or empty when absent

  template <typename T>
  RowGroups(int64_t rows_, int64_t n_, const T* s, const T* b) : rows(rows_), n(n_) {
    per_group = n >= kMinRun ? 1 : (kMinRun + n - 1) / n;
    len = per_group * n;
    if (s) scale.resize(len);
    if (b) bias.resize(len);
    for (int64_t i = 0; i < len; ++i) {
      if (s) scale[i] = static_cast<A>(s[i % n]);
      if (b) bias[i] = static_cast<A>(b[i % n]);
    }
  }
  int64_t count() const { return (rows + per_group - 1) / per_group; }
  int64_t first_row(int64_t g) const { return g * per_group; }
  int64_t size(int64_t g) const { return std::min(per_group, rows - g * per_group) * n; }
};

// z = x * scale + bias on two vectors at offset i of a group (count < kStep: partial).
template <typename T>
C10_ALWAYS_INLINE void load_preactivation(const T* x, const RowGroups<acc_type<T>>& grp, int64_t i, int64_t count,
                                          typename VecIO<T>::V& lo, typename VecIO<T>::V& hi) {
  using IO = VecIO<T>;
  using AIO = VecIO<acc_type<T>>;
  typename IO::V s0, s1;
  if (count == IO::kStep) {
    IO::load2(x + i, lo, hi);
  } else {
    IO::load2(x + i, count, lo, hi);
  }
  if (!grp.scale.empty()) {
    if (count == IO::kStep) {
      AIO::load2(grp.scale.data() + i, s0, s1);
    } else {
      AIO::load2(grp.scale.data() + i, count, s0, s1);
    }
    lo = lo * s0;
    hi = hi * s1;
  }
  if (!grp.bias.empty()) {
    if (count == IO::kStep) {
      AIO::load2(grp.bias.data() + i, s0, s1);
    } else {
      AIO::load2(grp.bias.data() + i, count, s0, s1);
    }
    lo = lo + s0;
    hi = hi + s1;
  }
}

inline void bias_act_kernel(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& bias,
                            const at::Tensor& out, Activation act, double negative_slope) {
  if (x.numel() == 0) return;
  const int64_t n = x.size(-1), rows = x.numel() / n;
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "bias_act_cpu", [&] {
    using A = acc_type<scalar_t>;
    using IO = VecIO<scalar_t>;
    using V = typename IO::V;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
    const RowGroups<A> grp(rows, n, scale.defined() ? scale.const_data_ptr<scalar_t>() : nullptr,
                           bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr);
    dispatch_activation(act, [&](auto ACT) {
      constexpr Activation kAct = decltype(ACT)::value;
      parallel_pieces(grp.count(), std::max<int64_t>(1, kGrain / grp.len), [&](int64_t begin, int64_t end) {
        const V slope(static_cast<A>(negative_slope));
        for (int64_t g = begin; g < end; ++g) {
          const int64_t offset = grp.first_row(g) * n, size = grp.size(g);
          const scalar_t* xg = xp + offset;
          scalar_t* og = op_ + offset;
          V lo, hi;
          for (int64_t i = 0; i < size; i += IO::kStep) {
            const int64_t count = std::min(IO::kStep, size - i);
            load_preactivation<scalar_t>(xg, grp, i, count, lo, hi);
            activation_pair<kAct>(lo, hi, slope);
            if (count == IO::kStep) {
              IO::store2(og + i, lo, hi);
            } else {
              IO::store2(og + i, count, lo, hi);
            }
          }
        }
      });
    });
  });
}

// Column sums over many rows in the accumulate type, in two levels (blocks of kBlockRows groups,
// then the block sums) so that the rounding error grows with rows / kBlockRows + kBlockRows, not rows.
template <typename A>
struct ColumnSums {
  static constexpr int64_t kBlockRows = 64;
  std::vector<A> block, total;
  int64_t pending = 0;
  explicit ColumnSums(int64_t len) : block(len, A(0)), total(len, A(0)) {}
  void end_group() {
    if (++pending == kBlockRows) flush();
  }
  void flush() {
    for (size_t i = 0; i < block.size(); ++i) {
      total[i] += block[i];
      block[i] = A(0);
    }
    pending = 0;
  }
};

inline void bias_act_backward_kernel(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
                                     const at::Tensor& bias, Activation act, double negative_slope,
                                     const at::Tensor& grad_x, const at::Tensor& grad_scale,
                                     const at::Tensor& grad_bias) {
  const int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  SPARSETORCH_DISPATCH_FLOATS(x.scalar_type(), "bias_act_backward_cpu", [&] {
    using A = acc_type<scalar_t>;
    using IO = VecIO<scalar_t>;
    using AIO = VecIO<A>;
    using V = typename IO::V;
    const bool need_sum_d = grad_bias.defined(), need_sum_dx = grad_scale.defined();
    if (rows == 0) {
      if (need_sum_d) grad_bias.zero_();
      if (need_sum_dx) grad_scale.zero_();
      return;
    }
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = grad.const_data_ptr<scalar_t>();
    scalar_t* gx = grad_x.defined() ? grad_x.mutable_data_ptr<scalar_t>() : nullptr;
    const RowGroups<A> grp(rows, n, scale.defined() ? scale.const_data_ptr<scalar_t>() : nullptr,
                           bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr);
    // A fixed number of chunks (not threads), each with its own column sums: the result does not
    // depend on which thread ran which chunk.
    const int64_t groups = grp.count();
    const int64_t chunks =
        std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), groups * grp.len / kGrain));
    const bool sums = need_sum_d || need_sum_dx;
    std::vector<std::vector<A>> part_d(sums ? chunks : 0), part_dx(sums ? chunks : 0);
    dispatch_activation(act, [&](auto ACT) {
      constexpr Activation kAct = decltype(ACT)::value;
      at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t g_begin = groups * c / chunks, g_end = groups * (c + 1) / chunks;
          ColumnSums<A> sum_d(need_sum_d ? grp.len : 0), sum_dx(need_sum_dx ? grp.len : 0);
          const V slope(static_cast<A>(negative_slope));
          for (int64_t g = g_begin; g < g_end; ++g) {
            const int64_t offset = grp.first_row(g) * n, size = grp.size(g);
            V z0, z1, g0, g1, s0, s1, t0, t1;
            for (int64_t i = 0; i < size; i += IO::kStep) {
              const int64_t count = std::min(IO::kStep, size - i);
              const bool full = count == IO::kStep;
              load_preactivation<scalar_t>(xp + offset, grp, i, count, z0, z1);
              if (full) {
                IO::load2(gp + offset + i, g0, g1);
              } else {
                IO::load2(gp + offset + i, count, g0, g1);
              }
              activation_derivative_pair<kAct>(z0, z1, slope);
              const V d0 = g0 * z0, d1 = g1 * z1;
              if (gx) {
                V o0 = d0, o1 = d1;
                if (!grp.scale.empty()) {
                  AIO::load2(grp.scale.data() + i, count, s0, s1);
                  o0 = o0 * s0;
                  o1 = o1 * s1;
                }
                if (full) {
                  IO::store2(gx + offset + i, o0, o1);
                } else {
                  IO::store2(gx + offset + i, count, o0, o1);
                }
              }
              // Only `count` lanes are read and written back: the tail of a group adds nothing else.
              if (need_sum_d) {
                A* bd = sum_d.block.data() + i;
                AIO::load2(bd, count, t0, t1);
                AIO::store2(bd, count, t0 + d0, t1 + d1);
              }
              if (need_sum_dx) {
                if (full) {
                  IO::load2(xp + offset + i, s0, s1);
                } else {
                  IO::load2(xp + offset + i, count, s0, s1);
                }
                A* bdx = sum_dx.block.data() + i;
                AIO::load2(bdx, count, t0, t1);
                AIO::store2(bdx, count, at::vec::fmadd(d0, s0, t0), at::vec::fmadd(d1, s1, t1));
              }
            }
            if (need_sum_d) sum_d.end_group();
            if (need_sum_dx) sum_dx.end_group();
          }
          if (need_sum_d) {
            sum_d.flush();
            part_d[c] = std::move(sum_d.total);
          }
          if (need_sum_dx) {
            sum_dx.flush();
            part_dx[c] = std::move(sum_dx.total);
          }
        }
      });
    });
    // Chunks in order, then the tiles of each group: column q of tile t is element t * n + q.
    auto reduce = [&](const std::vector<std::vector<A>>& parts, const at::Tensor& result) {
      scalar_t* r = result.mutable_data_ptr<scalar_t>();
      for (int64_t q = 0; q < n; ++q) {
        A s = 0;
        for (const auto& p : parts) {
          for (int64_t t = 0; t < grp.per_group; ++t) s += p[t * n + q];
        }
        r[q] = static_cast<scalar_t>(s);
      }
    };
    if (need_sum_d) reduce(part_d, grad_bias);
    if (need_sum_dx) reduce(part_dx, grad_scale);
  });
}

inline void fill_elementwise_kernels(Kernels& k) {
  k.binary = &binary_kernel;
  k.binary_scalar = &binary_scalar_kernel;
  k.activation = &activation_kernel;
  k.bias_act = &bias_act_kernel;
  k.bias_act_backward = &bias_act_backward_kernel;
}

}  // namespace CPU_CAPABILITY
}  // namespace sparsetorch::cpu
