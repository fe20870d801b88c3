// CSR kernels on the CPU: SpMM (out = act(alpha * A @ B + beta * C + bias)), SDDMM and the row and
// column scaling of the values. Included once per ISA build (sparse_kernels_*.cpp).
//
// SpMM: the columns of B are cut into blocks of up to 8 vectors (64 floats); a block of an output row
// is accumulated in registers over the row's entries (duplicates and unsorted columns simply add
// up), in the accumulate type (float for half types), then finished by the epilogue and stored
// once. Blocks are the outer loop of a thread's rows, so the slice of B it gathers from stays in
// cache; rows and entries are split among threads along the merge path (csr_rows.h), and a row
// shared by several threads is summed from their partial blocks in a fix-up pass, in a fixed order.
// Every column index is checked as it is read (IndexError naming the entry); only the rows of B
// named by stored entries are read, so a NaN in B under a structural zero does not leak.
#pragma once

#include <ATen/Dispatch.h>

#include <algorithm>
#include <vector>

#include "cpu/csr_rows.h"
#include "cpu/kernels.h"
#include "cpu/vec_math.h"

namespace sparsetorch::cpu {
inline namespace CPU_CAPABILITY {

// Entries ahead whose B rows are prefetched (random gathers from B otherwise wait on memory).
constexpr int64_t kPrefetchAhead = 8;
// Multiply-adds below which a part is not worth a thread.
constexpr double kMinPartWork = 65536;

template <typename T>
C10_ALWAYS_INLINE void prefetch_bytes(const T* p, int64_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
#endif
}

// A column block of the output: `nv` vectors from column q0, or (nv == 0) `width` < one vector of
// columns done one at a time.
struct ColumnBlock {
  int64_t q0, nv, width;
};

template <typename T, typename I>
class SpmmKernel {
  using A = acc_type<T>;
  using IO = VecIO<T>;
  using V = typename IO::V;
  static constexpr int64_t W = IO::kWidth;
  static constexpr int kMaxVectors = 8;

 public:
  SpmmKernel(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
             const at::Tensor& dense, const at::Tensor& out, const at::Tensor& accumulate, const at::Tensor& bias,
             const Epilogue& epi)
      : rows_(crow.const_data_ptr<I>(), p.crow_bstride(), p.m, p.batch, p.nnz_stride),
        col_(col.const_data_ptr<I>()),
        val_(values.const_data_ptr<T>()),
        dense_(dense.const_data_ptr<T>()),
        out_(out.mutable_data_ptr<T>()),
        cin_(accumulate.defined() ? accumulate.const_data_ptr<T>() : nullptr),
        bias_(bias.defined() ? bias.const_data_ptr<T>() : nullptr),
        n_(p.n),
        k_(p.k),
        ldb_(dense.stride(-2)),
        col_bstride_(p.col_bstride()),
        val_bstride_(p.val_bstride()),
        dense_bstride_(p.dense_batched ? dense.stride(0) : 0),
        alpha_(static_cast<A>(epi.alpha)),
        beta_(static_cast<A>(epi.beta)),
        slope_(static_cast<A>(epi.negative_slope)),
        act_(epi.act) {
    // Column blocks: the whole vectors in (nearly) equal blocks of at most kMaxVectors, the
    // remaining columns as one scalar block.
    const int64_t vectors = n_ / W, blocks = (vectors + kMaxVectors - 1) / kMaxVectors;
    int64_t q0 = 0;
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t nv = vectors / blocks + (i < vectors % blocks ? 1 : 0);
      blocks_.push_back({q0, nv, nv * W});
      q0 += nv * W;
    }
    if (q0 < n_) blocks_.push_back({q0, 0, n_ - q0});
  }

  void run() {
    const int64_t parts = parts_for(static_cast<double>(rows_.nnz() + rows_.rows()) * std::max<int64_t>(n_, 4),
                                    kMinPartWork);
    const std::vector<PathPoint> cut = split_path(rows_, parts);
    // Partial rows: each part's first row when an earlier part began it (head), and its last row
    // when a later part finishes it (tail).
    head_.assign(parts * n_, A(0));
    tail_.assign(parts * n_, A(0));
    head_row_.assign(parts, -1);
    tail_row_.assign(parts, -1);
    at::parallel_for(0, parts, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        for (const ColumnBlock& blk : blocks_) run_block(t, cut[t], cut[t + 1], blk);
      }
    });
    // Rows shared by several parts: the head of the part that finished the row plus the tails of
    // the parts before it, in part order (deterministic), then the epilogue.
    std::vector<A> sum(n_);
    for (int64_t t = 0; t < parts; ++t) {
      const int64_t g = head_row_[t];
      if (g < 0) continue;
      std::copy(head_.begin() + t * n_, head_.begin() + (t + 1) * n_, sum.begin());
      for (int64_t s = 0; s < t; ++s) {
        if (tail_row_[s] != g) continue;
        for (int64_t q = 0; q < n_; ++q) sum[q] += tail_[s * n_ + q];
      }
      finish_row(g, sum.data());
    }
  }

 private:
  void run_block(int64_t t, PathPoint from, PathPoint to, const ColumnBlock& blk) {
    switch (blk.nv) {
      case 0:
        return run_scalar_block(t, from, to, blk);
      case 1:
        return run_vector_block<1>(t, from, to, blk);
      case 2:
        return run_vector_block<2>(t, from, to, blk);
      case 3:
        return run_vector_block<3>(t, from, to, blk);
      case 4:
        return run_vector_block<4>(t, from, to, blk);
      case 5:
        return run_vector_block<5>(t, from, to, blk);
      case 6:
        return run_vector_block<6>(t, from, to, blk);
      case 7:
        return run_vector_block<7>(t, from, to, blk);
      default:
        return run_vector_block<8>(t, from, to, blk);
    }
  }

  // Where a piece's partial sums go when the row is not whole here (nullptr: the row is whole).
  A* partial_slot(int64_t t, const RowPiece& piece) {
    if (piece.begins && piece.ends) return nullptr;
    if (piece.ends) {
      head_row_[t] = piece.g;
      return head_.data() + t * n_;
    }
    tail_row_[t] = piece.g;
    return tail_.data() + t * n_;
  }

  // Accumulates NV vectors of columns [q0, q0 + NV * W) over a piece's entries. Narrow blocks
  // alternate between two sets of accumulators, so that consecutive multiply-adds do not wait on
  // each other.
  template <int NV>
  void run_vector_block(int64_t t, PathPoint from, PathPoint to, const ColumnBlock& blk) {
    constexpr int U = NV <= 2 ? 2 : 1;
    const int64_t q0 = blk.q0;
    walk_path(rows_, from, to, [&](const RowPiece& piece) {
      const I* col = col_ + piece.b * col_bstride_;
      const T* val = val_ + piece.b * val_bstride_;
      const T* dense = dense_ + piece.b * dense_bstride_ + q0;
      const int64_t prefetch_end = rows_.crow(piece.b)[rows_.m()];
      V acc[U][NV];
      for (int u = 0; u < U; ++u) {
        for (int v = 0; v < NV; ++v) acc[u][v] = V(A(0));
      }
      int64_t j = piece.lo;
      auto step = [&](int u, int64_t jj) {
        const int64_t c = col[jj];
        check_column(c, k_, jj, piece.b);
        if (jj + kPrefetchAhead < prefetch_end) {
          const int64_t cp = col[jj + kPrefetchAhead];
          if (0 <= cp && cp < k_) prefetch_bytes(dense + cp * ldb_, NV * W * int64_t(sizeof(T)));
        }
        const V a(static_cast<A>(val[jj]));
        const T* brow = dense + c * ldb_;
        for (int v = 0; v < NV; ++v) acc[u][v] = at::vec::fmadd(a, IO::load(brow + v * W), acc[u][v]);
      };
      for (; j + U <= piece.hi; j += U) {
        for (int u = 0; u < U; ++u) step(u, j + u);
      }
      for (; j < piece.hi; ++j) step(0, j);
      for (int u = 1; u < U; ++u) {
        for (int v = 0; v < NV; ++v) acc[0][v] = acc[0][v] + acc[u][v];
      }
      if (A* slot = partial_slot(t, piece)) {
        for (int v = 0; v < NV; ++v) acc[0][v].store(slot + q0 + v * W);
      } else {
        finish_vectors(piece.g, q0, acc[0], NV);
      }
    });
  }

  // Columns [q0, q0 + width), width < W, one at a time (all of B when it has fewer columns than a
  // vector, as in SpMV).
  void run_scalar_block(int64_t t, PathPoint from, PathPoint to, const ColumnBlock& blk) {
    const int64_t q0 = blk.q0, width = blk.width;
    walk_path(rows_, from, to, [&](const RowPiece& piece) {
      const I* col = col_ + piece.b * col_bstride_;
      const T* val = val_ + piece.b * val_bstride_;
      const T* dense = dense_ + piece.b * dense_bstride_ + q0;
      A acc[W] = {};
      if (width == 1) {
        A s[4] = {};  // four independent sums
        int64_t j = piece.lo;
        for (; j + 4 <= piece.hi; j += 4) {
          for (int u = 0; u < 4; ++u) {
            const int64_t c = col[j + u];
            check_column(c, k_, j + u, piece.b);
            s[u] += static_cast<A>(val[j + u]) * static_cast<A>(dense[c * ldb_]);
          }
        }
        for (; j < piece.hi; ++j) {
          const int64_t c = col[j];
          check_column(c, k_, j, piece.b);
          s[0] += static_cast<A>(val[j]) * static_cast<A>(dense[c * ldb_]);
        }
        acc[0] = (s[0] + s[1]) + (s[2] + s[3]);
      } else {
        for (int64_t j = piece.lo; j < piece.hi; ++j) {
          const int64_t c = col[j];
          check_column(c, k_, j, piece.b);
          const A a = static_cast<A>(val[j]);
          const T* brow = dense + c * ldb_;
          for (int64_t q = 0; q < width; ++q) acc[q] += a * static_cast<A>(brow[q]);
        }
      }
      if (A* slot = partial_slot(t, piece)) {
        std::copy(acc, acc + width, slot + q0);
      } else {
        finish_scalars(piece.g, q0, width, acc);
      }
    });
  }

  // Epilogue of nv vectors of row g from column q0: act(alpha * acc + beta * C + bias), stored.
  void finish_vectors(int64_t g, int64_t q0, const V* acc, int64_t nv) const {
    const T* cin = cin_ ? cin_ + g * n_ + q0 : nullptr;
    const T* bias = bias_ ? bias_ + q0 : nullptr;
    T* out = out_ + g * n_ + q0;
    const V alpha(alpha_), beta(beta_), slope(slope_);
    dispatch_activation(act_, [&](auto ACT) {
      for (int64_t v = 0; v < nv; ++v) {
        V x = acc[v] * alpha;
        if (cin) x = at::vec::fmadd(beta, IO::load(cin + v * W), x);
        if (bias) x = x + IO::load(bias + v * W);
        IO::store(out + v * W, activation_vec<decltype(ACT)::value>(x, slope));
      }
    });
  }

  void finish_scalars(int64_t g, int64_t q0, int64_t width, const A* acc) const {
    const T* cin = cin_ ? cin_ + g * n_ + q0 : nullptr;
    const T* bias = bias_ ? bias_ + q0 : nullptr;
    T* out = out_ + g * n_ + q0;
    for (int64_t q = 0; q < width; ++q) {
      A x = alpha_ * acc[q];
      if (cin) x += beta_ * static_cast<A>(cin[q]);
      if (bias) x += static_cast<A>(bias[q]);
      out[q] = static_cast<T>(apply_activation<A>(act_, x, slope_));
    }
  }

  // Epilogue of a whole row from its summed partials.
  void finish_row(int64_t g, const A* sum) const {
    for (const ColumnBlock& blk : blocks_) {
      if (blk.nv == 0) {
        finish_scalars(g, blk.q0, blk.width, sum + blk.q0);
        continue;
      }
      V acc[kMaxVectors];
      for (int64_t v = 0; v < blk.nv; ++v) acc[v] = V::loadu(sum + blk.q0 + v * W);
      finish_vectors(g, blk.q0, acc, blk.nv);
    }
  }

  CsrRows<I> rows_;
  const I* col_;
  const T* val_;
  const T* dense_;
  T* out_;
  const T* cin_;
  const T* bias_;
  int64_t n_, k_, ldb_, col_bstride_, val_bstride_, dense_bstride_;
  A alpha_, beta_, slope_;
  Activation act_;
  std::vector<ColumnBlock> blocks_;
  std::vector<A> head_, tail_;
  std::vector<int64_t> head_row_, tail_row_;
};

inline void spmm_kernel(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                        const at::Tensor& dense, const at::Tensor& out, const at::Tensor& accumulate,
                        const at::Tensor& bias, const Epilogue& epi) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "spmm_cpu", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "spmm_cpu", [&] {
      SpmmKernel<scalar_t, index_t>(p, crow, col, values, dense, out, accumulate, bias, epi).run();
    });
  });
}

// dot(a[0:n], b[0:n]) in the accumulate type.
template <typename T>
C10_ALWAYS_INLINE acc_type<T> dot(const T* a, const T* b, int64_t n) {
  using A = acc_type<T>;
  using IO = VecIO<T>;
  using V = typename IO::V;
  if (n < IO::kStep) {
    A s0 = 0, s1 = 0;
    int64_t q = 0;
    for (; q + 2 <= n; q += 2) {
      s0 += static_cast<A>(a[q]) * static_cast<A>(b[q]);
      s1 += static_cast<A>(a[q + 1]) * static_cast<A>(b[q + 1]);
    }
    if (q < n) s0 += static_cast<A>(a[q]) * static_cast<A>(b[q]);
    return s0 + s1;
  }
  V s0(A(0)), s1(A(0)), x0, x1, y0, y1;
  int64_t q = 0;
  for (; q + IO::kStep <= n; q += IO::kStep) {
    IO::load2(a + q, x0, x1);
    IO::load2(b + q, y0, y1);
    s0 = at::vec::fmadd(x0, y0, s0);
    s1 = at::vec::fmadd(x1, y1, s1);
  }
  if (q < n) {
    IO::load2(a + q, n - q, x0, x1);
    IO::load2(b + q, n - q, y0, y1);
    s0 = at::vec::fmadd(x0, y0, s0);
    s1 = at::vec::fmadd(x1, y1, s1);
  }
  return at::vec::vec_reduce_all<A>([](const V& x, const V& y) { return x + y; }, s0 + s1);
}

template <typename T, typename I>
void sddmm_typed(const SddmmProblem& p, const at::Tensor& crow, const at::Tensor& col_t, const at::Tensor& a_t,
                 const at::Tensor& b_t, double alpha_in, const at::Tensor& out_t) {
  using A = acc_type<T>;
  const int64_t m = p.m, k = p.k, n = p.n, L = p.nnz_stride;
  const CsrRows<I> rows(crow.const_data_ptr<I>(), p.crow_bstride(), m, p.batch, L);
  const I* col = col_t.const_data_ptr<I>();
  const T* a = a_t.const_data_ptr<T>();
  const T* b = b_t.const_data_ptr<T>();
  T* out = out_t.mutable_data_ptr<T>();
  const int64_t col_bstride = p.col_bstride(), a_bstride = p.a_batched ? m * n : 0, b_bstride = p.b_batched ? k * n : 0;
  const int64_t out_bstride = p.batched ? L : 0;
  const A alpha = static_cast<A>(alpha_in);
  const int64_t parts = parts_for(static_cast<double>(rows.nnz()) * std::max<int64_t>(n, 4), kMinPartWork);
  const std::vector<PathPoint> cut = split_path(rows, parts);
  at::parallel_for(0, parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      walk_path(rows, cut[t], cut[t + 1], [&](const RowPiece& piece) {
        const I* col_b = col + piece.b * col_bstride;
        const T* arow = a + piece.b * a_bstride + piece.r * n;
        const T* b_b = b + piece.b * b_bstride;
        T* out_b = out + piece.b * out_bstride;
        for (int64_t j = piece.lo; j < piece.hi; ++j) {
          const int64_t c = col_b[j];
          check_column(c, k, j, piece.b);
          if (j + kPrefetchAhead < piece.hi) {
            const int64_t cp = col_b[j + kPrefetchAhead];
            if (0 <= cp && cp < k) prefetch_bytes(b_b + cp * n, n * int64_t(sizeof(T)));
          }
          out_b[j] = static_cast<T>(alpha * dot(arow, b_b + c * n, n));
        }
      });
    }
  });
}

inline void sddmm_kernel(const SddmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                         const at::Tensor& b, double alpha, const at::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "sddmm_cpu", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "sddmm_cpu",
                            [&] { sddmm_typed<scalar_t, index_t>(p, crow, col, a, b, alpha, out); });
  });
}

template <typename T, typename I>
void csr_scale_typed(const CsrShape& s, const at::Tensor& crow, const at::Tensor& col_t, const at::Tensor& values,
                     const ScaleVector& rs, const ScaleVector& cs, const at::Tensor& out_t) {
  using A = acc_type<T>;
  // With a 1-D pattern, 2-D values are a batch sharing the pattern.
  const int64_t batch = values.dim() == 2 ? values.size(0) : 1, m = s.m, L = s.nnz_stride;
  const CsrRows<I> rows(crow.const_data_ptr<I>(), s.batched ? m + 1 : 0, m, batch, L);
  const I* col = col_t.const_data_ptr<I>();
  const T* v = values.const_data_ptr<T>();
  const T* rs_p = rs.t.defined() ? rs.t.const_data_ptr<T>() : nullptr;
  const T* cs_p = cs.t.defined() ? cs.t.const_data_ptr<T>() : nullptr;
  T* out = out_t.mutable_data_ptr<T>();
  const int64_t col_bstride = s.batched ? L : 0;
  // Slots outside the rows' spans keep their values.
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t first = m > 0 ? rows.crow(b)[0] : L, last = m > 0 ? rows.crow(b)[m] : L;
    std::copy(v + b * L, v + b * L + first, out + b * L);
    std::copy(v + b * L + last, v + (b + 1) * L, out + b * L + last);
  }
  const int64_t parts = parts_for(static_cast<double>(rows.nnz()) * 4, kMinPartWork);
  const std::vector<PathPoint> cut = split_path(rows, parts);
  at::parallel_for(0, parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      walk_path(rows, cut[t], cut[t + 1], [&](const RowPiece& piece) {
        const I* col_b = col + piece.b * col_bstride;
        const T* v_b = v + piece.b * L;
        T* out_b = out + piece.b * L;
        const A row_factor = rs_p ? static_cast<A>(rs_p[piece.b * rs.batch_stride + piece.r]) : A(1);
        if (!cs_p) {
          for (int64_t j = piece.lo; j < piece.hi; ++j) out_b[j] = static_cast<T>(static_cast<A>(v_b[j]) * row_factor);
          return;
        }
        const T* cs_b = cs_p + piece.b * cs.batch_stride;
        for (int64_t j = piece.lo; j < piece.hi; ++j) {
          const int64_t c = col_b[j];
          TORCH_CHECK_INDEX(0 <= c && c < cs.len, "col_indices: entry ", j, " of batch ", piece.b, " is column ", c,
                            ", out of range for col_scale of length ", cs.len);
          out_b[j] = static_cast<T>(static_cast<A>(v_b[j]) * (row_factor * static_cast<A>(cs_b[c])));
        }
      });
    }
  });
}

inline void csr_scale_kernel(const CsrShape& s, const at::Tensor& crow, const at::Tensor& col,
                             const at::Tensor& values, const ScaleVector& rs, const ScaleVector& cs,
                             const at::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "csr_scale_cpu", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_scale_cpu",
                            [&] { csr_scale_typed<scalar_t, index_t>(s, crow, col, values, rs, cs, out); });
  });
}

inline void fill_sparse_kernels(Kernels& k) {
  k.spmm = &spmm_kernel;
  k.sddmm = &sddmm_kernel;
  k.csr_scale = &csr_scale_kernel;
}

}  // namespace CPU_CAPABILITY
}  // namespace sparsetorch::cpu
