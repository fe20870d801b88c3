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

// Entries ahead whose B rows are prefetched (random gathers from B otherwise wait on memory), the
// size of the slice of B above which that is done, and the bytes of a block's part of a B row up to
// which it is not: one cache line or less per entry leaves the core enough loads in flight on its
// own, and the prefetch's extra instructions only cost (measured on the 2-core machine, random
// 100k graph, 20/row, n = 2 / 4 / 8: 0.96-1.06 / 1.02-1.15 / 1.34-1.41x MKL with it, 1.15-1.24 /
// 1.28-1.38 / 1.48-1.66x without; n = 64 still gains from it: 2.8-3.2x without, 4.0-4.3x with).
constexpr int64_t kPrefetchAhead = 8;
constexpr int64_t kPrefetchAboveBytes = 512 * 1024;
constexpr int64_t kPrefetchRowBytes = 64;
// Multiply-adds below which a part is not worth a thread (~30-60 us of work: waking a second thread
// costs microseconds on an idle machine, milliseconds on a busy one).
constexpr double kMinPartWork = 131072;
// SpMM's own: (entries + rows) * max(n, 4) below which a part is not worth a thread, lower than
// kMinPartWork since its row walk got cheaper (the whole-row loop). 16384 (~2.5 us of work per part),
// measured on the 2-core machine against 131072: Cora (2708 rows, 10556 entries) at n = 1: 19 -> 16 us per call in a loop and 0.78-0.92x ->
// 0.91-0.97x MKL timed between MKL and SciPy calls; at n = 16 1.0x -> 1.25x MKL. (MKL's own SpMM
// runs that n = 1 product on both threads.)
constexpr double kMinSpmmPartWork = 16384;

template <typename T>
C10_ALWAYS_INLINE void prefetch_bytes(const T* p, int64_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
#endif
}

// Fewer columns than one vector (n < W, or the last n % W columns): acc[0:WC] = sum over entries
// [lo, hi) of val[j] * dense[col[j], 0:WC]. GCC's loop vectoriser turns the scalar form of this loop
// into emulated gathers that run at half the speed (measured here: SpMV 1.1 against 0.53 ns per
// entry), so it is compiled without it, and float/double columns go through the compiler's own
// vectors instead (at::vec has none narrower than the ISA's): 16-byte ones (SSE2 on any x86-64,
// NEON on ARM), the last 2-3 floats as one partly loaded; in the AVX2 build, more than 16 bytes of
// columns as one 32-byte vector with a masked load (one load per entry instead of two or three:
// n = 6 and 7 went from 0.76-1.12x to 1.24-2.04x MKL on the pruned matrices). Never a read past a
// row's n values. Inlined only into functions
// compiled the same way (run_scalar_columns).
#if defined(__GNUC__) && !defined(__clang__)
#define SPARSETORCH_NO_AUTOVECTORIZE(...) __attribute__((__VA_ARGS__, optimize("no-tree-vectorize")))
#else
#define SPARSETORCH_NO_AUTOVECTORIZE(...) __attribute__((__VA_ARGS__))
#endif
#if defined(__GNUC__) || defined(__clang__)
#define SPARSETORCH_INLINE_LAMBDA __attribute__((always_inline))
#else
#define SPARSETORCH_INLINE_LAMBDA
#endif

template <typename A, int BYTES>
struct NarrowVec {
  typedef A type __attribute__((vector_size(BYTES)));
};
template <typename A, int BYTES>
using narrow_vec = typename NarrowVec<A, BYTES>::type;

// How WC columns of T (accumulated in A) are read: NVEC whole vectors of BYTES, then (PART) the
// next REST columns as one vector's low lanes, or (!PART) REST columns one at a time (half types).
template <int WC, typename T, typename A>
struct NarrowShape {
  static constexpr bool kSame = std::is_same_v<T, A>;
  static constexpr int BYTES = SPARSETORCH_ISA_AVX2 && kSame && WC * sizeof(A) > 16 ? 32 : 16;
  static constexpr int kLanes = BYTES / sizeof(A);
  static constexpr int NVEC = kSame ? WC / kLanes : 0;
  static constexpr int REST = WC - NVEC * kLanes;
  static constexpr bool PART = kSame && REST >= 2;
  static constexpr int VECS = NVEC + (PART ? 1 : 0);
  static constexpr int SCALARS = PART ? 0 : REST;
  using vec = narrow_vec<A, BYTES>;
};

// r[0:R] in a vector's low lanes, the rest 0. (A partial memcpy into the vector goes through the
// stack and stalls ~20 cycles per entry.)
template <int R, typename A, int BYTES>
SPARSETORCH_NO_AUTOVECTORIZE(always_inline)
inline narrow_vec<A, BYTES> load_low(const A* r) {
#if SPARSETORCH_ISA_AVX2
  if constexpr (BYTES == 32) {
    if constexpr (std::is_same_v<A, float>) {
      const __m256i mask = _mm256_setr_epi32(-1, -1, -1, -1, R > 4 ? -1 : 0, R > 5 ? -1 : 0, R > 6 ? -1 : 0, 0);
      return reinterpret_cast<narrow_vec<A, BYTES>>(_mm256_maskload_ps(r, mask));
    } else {
      const __m256i mask = _mm256_setr_epi64x(-1, -1, R > 2 ? -1 : 0, 0);
      return reinterpret_cast<narrow_vec<A, BYTES>>(_mm256_maskload_pd(r, mask));
    }
  }
#endif
  if constexpr (BYTES == 16 && std::is_same_v<A, float>) {  // an 8-byte load (plus one float)
    typedef long long pair_vec __attribute__((vector_size(16)));
    long long bits;
    __builtin_memcpy(&bits, r, 8);
    narrow_vec<A, BYTES> x = reinterpret_cast<narrow_vec<A, BYTES>>(pair_vec{bits, 0});
    if constexpr (R == 3) x[2] = r[2];
    return x;
  }
  static_assert(BYTES == 32 || std::is_same_v<A, float>, "a partial vector of doubles is only read masked");
  return narrow_vec<A, BYTES>{};
}

// One entry into sums set u: the vectors of columns, then the scalars.
template <typename SH, typename T, typename A>
SPARSETORCH_NO_AUTOVECTORIZE(always_inline)
inline void narrow_add(const T* r, A a, typename SH::vec* v, A* s) {
  for (int i = 0; i < SH::NVEC; ++i) {
    typename SH::vec x;
    __builtin_memcpy(&x, r + i * SH::kLanes, sizeof(x));
    v[i] += a * x;
  }
  if constexpr (SH::PART) v[SH::NVEC] += a * load_low<SH::REST, A, SH::BYTES>(r + SH::NVEC * SH::kLanes);
  for (int q = 0; q < SH::SCALARS; ++q) s[q] += a * static_cast<A>(r[SH::NVEC * SH::kLanes + q]);
}

// Four entries per step into independent sums: a multiply-add waits ~4 cycles on the one before it
// in the same sum, which with two sums limited the loop (pruned 2048 x 2048 at 1-30%, n = 4, two
// threads, timed interleaved with torch.sparse.mm on the quiet 2-core machine: 1.05-1.09x ->
// 1.09-1.31x MKL). Past that, streaming the matrix's columns and values (~0.6 ns per entry per core
// here) is most of the time.
template <int WC, typename T, typename I>
SPARSETORCH_NO_AUTOVECTORIZE(always_inline)
inline void gather_narrow(const I* col, const T* val, const T* dense, int64_t ldb, int64_t lo, int64_t hi,
                          acc_type<T>* acc) {
  using A = acc_type<T>;
  using SH = NarrowShape<WC, T, A>;
  constexpr int S = 4;
  typename SH::vec v[S][SH::VECS + 1] = {};
  A s[S][SH::SCALARS + 1] = {};
  auto add = [&](int64_t j, int u) SPARSETORCH_INLINE_LAMBDA {
    narrow_add<SH>(dense + static_cast<int64_t>(col[j]) * ldb, static_cast<A>(val[j]), v[u], s[u]);
  };
  int64_t j = lo;
  for (; j + S <= hi; j += S) {
    for (int u = 0; u < S; ++u) add(j + u, u);
  }
  // The last < S entries into different sets too (short rows are common).
  for (int u = 0; u < S - 1; ++u) {
    if (j + u < hi) add(j + u, u);
  }
  for (int i = 0; i < SH::VECS; ++i) {
    const typename SH::vec x = (v[0][i] + v[1][i]) + (v[2][i] + v[3][i]);
    for (int q = 0; q < std::min<int>(SH::kLanes, WC - i * SH::kLanes); ++q) acc[i * SH::kLanes + q] = x[q];
  }
  for (int q = 0; q < SH::SCALARS; ++q) acc[SH::NVEC * SH::kLanes + q] = (s[0][q] + s[1][q]) + (s[2][q] + s[3][q]);
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
        act_(epi.act),
        identity_(epi.alpha == 1.0 && !cin_ && !bias_ && epi.act == Activation::None) {
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
                                    kMinSpmmPartWork);
    const PathCuts cut = split_path(rows_, parts);
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
    if (parts == 1) return;  // one part holds every row whole
    // Rows shared by several parts: the head of the part that finished the row plus the tails of
    // the parts before it, in part order (deterministic), then the epilogue.
    c10::SmallVector<A, 128> sum(n_);
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
    // Software prefetch of the B rows ahead only pays where a block reads more than a cache line
    // of each B row, and the cache lines it gathers from (B's rows, or the block's part of them)
    // do not fit in a core's L2.
    const int64_t row_bytes = std::min(ldb_, blk.width) * int64_t(sizeof(T));
    const bool far = row_bytes > kPrefetchRowBytes && k_ * row_bytes > kPrefetchAboveBytes;
    if (blk.nv == 0) return run_scalar_block(t, from, to, blk);  // under a vector: never prefetched
    return far ? dispatch_vectors<true>(t, from, to, blk) : dispatch_vectors<false>(t, from, to, blk);
  }

  template <bool PF>
  void dispatch_vectors(int64_t t, PathPoint from, PathPoint to, const ColumnBlock& blk) {
    switch (blk.nv) {
      case 1:
        return run_vector_block<1, PF>(t, from, to, blk);
      case 2:
        return run_vector_block<2, PF>(t, from, to, blk);
      case 3:
        return run_vector_block<3, PF>(t, from, to, blk);
      case 4:
        return run_vector_block<4, PF>(t, from, to, blk);
      case 5:
        return run_vector_block<5, PF>(t, from, to, blk);
      case 6:
        return run_vector_block<6, PF>(t, from, to, blk);
      case 7:
        return run_vector_block<7, PF>(t, from, to, blk);
      default:
        return run_vector_block<8, PF>(t, from, to, blk);
    }
  }

  // Where the partial sums of a piece of a row shared with other parts go (walk_path_runs gives whole
  // rows separately: a piece never both begins and ends its row).
  C10_ALWAYS_INLINE A* partial_slot(int64_t t, const RowPiece& piece) {
    if (piece.ends) {
      head_row_[t] = piece.g;
      return head_.data() + t * n_;
    }
    tail_row_[t] = piece.g;
    return tail_.data() + t * n_;
  }

  // IndexError for an out-of-range column at or ahead of the piece (before any is used).
  C10_ALWAYS_INLINE void check(ColumnCheck<I>& guard, int64_t b, int64_t lo, int64_t hi) const {
    const auto bad = guard.check(b, lo, hi);
    if (C10_UNLIKELY(bad.first >= 0)) raise_bad_column(bad);
  }
  C10_NOINLINE void raise_bad_column(std::pair<int64_t, int64_t> bad) const {
    check_column(col_[bad.first * col_bstride_ + bad.second], k_, bad.second, bad.first);
  }

  // Prefetches the B row of entry j (clamped to the batch's entries and to B's rows: a hint, never
  // a read).
  C10_ALWAYS_INLINE void prefetch_row(const I* col, const T* dense, int64_t j, int64_t end, int64_t bytes) const {
    const int64_t c = col[std::min(j, end - 1)];
    const uint64_t row = std::min(static_cast<uint64_t>(c), static_cast<uint64_t>(k_ - 1));
    prefetch_bytes(dense + static_cast<int64_t>(row) * ldb_, bytes);
  }

  // Accumulates NV vectors of columns [q0, q0 + NV * W) of one row over entries [lo, hi) into
  // acc. Narrow blocks spread consecutive entries over S sets of accumulators (as gather_narrow),
  // so that a multiply-add does not wait on the one before it; every set stays in registers.
  template <int NV, bool PF>
  C10_ALWAYS_INLINE void gather_vectors(const I* col, const T* val, const T* dense, int64_t lo, int64_t hi,
                                        int64_t end, V* acc) const {
    constexpr int64_t kBytes = NV * W * int64_t(sizeof(T));
    constexpr int S = NV <= 2 ? 4 : NV <= 4 ? 2 : 1;
    V a[S][NV];
#pragma GCC unroll 8
    for (int u = 0; u < S; ++u) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) a[u][v] = V(A(0));
    }
    auto add = [&](int64_t j, int u) SPARSETORCH_INLINE_LAMBDA {
      if constexpr (PF) prefetch_row(col, dense, j + kPrefetchAhead, end, kBytes);
      const T* r = dense + static_cast<int64_t>(col[j]) * ldb_;
      const V x(static_cast<A>(val[j]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) a[u][v] = at::vec::fmadd(x, IO::load(r + v * W), a[u][v]);
    };
    int64_t j = lo;
    for (; j + S <= hi; j += S) {
#pragma GCC unroll 4
      for (int u = 0; u < S; ++u) add(j + u, u);
    }
#pragma GCC unroll 4
    for (int u = 0; u < S - 1; ++u) {
      if (j + u < hi) add(j + u, u);
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      if constexpr (S == 4) {
        acc[v] = (a[0][v] + a[1][v]) + (a[2][v] + a[3][v]);
      } else if constexpr (S == 2) {
        acc[v] = a[0][v] + a[1][v];
      } else {
        acc[v] = a[0][v];
      }
    }
  }

  template <int NV, bool PF>
  void run_vector_block(int64_t t, PathPoint from, PathPoint to, const ColumnBlock& blk) {
    const int64_t q0 = blk.q0;
    ColumnCheck<I> guard(rows_, col_, col_bstride_, k_);
    T* out = out_ + q0;
    const int64_t n = n_, m = rows_.m();
    walk_path_runs(
        rows_, from, to,
        [&](const RowPiece& piece) {
          if (q0 == 0) check(guard, piece.b, piece.lo, piece.hi);  // the first block of a part sees every row first
          V acc[NV];
          gather_vectors<NV, PF>(col_ + piece.b * col_bstride_, val_ + piece.b * val_bstride_,
                                 dense_ + piece.b * dense_bstride_ + q0, piece.lo, piece.hi, rows_.crow(piece.b)[m],
                                 acc);
          A* slot = partial_slot(t, piece);
          for (int v = 0; v < NV; ++v) acc[v].store(slot + q0 + v * W);
        },
        [&](int64_t b, int64_t r0, int64_t r1, int64_t g0) {
          // Whole rows: a loop reading only crow per row; the identity epilogue stores the sums as they are.
          const I* crow = rows_.crow(b);
          const I* col = col_ + b * col_bstride_;
          const T* val = val_ + b * val_bstride_;
          const T* dense = dense_ + b * dense_bstride_ + q0;
          const int64_t end = crow[m];
          auto rows = [&](auto identity) SPARSETORCH_INLINE_LAMBDA {
            T* o = out + g0 * n;
            for (int64_t r = r0; r < r1; ++r, o += n) {
              const int64_t lo = crow[r], hi = crow[r + 1];
              if (q0 == 0) check(guard, b, lo, hi);
              V acc[NV];
              gather_vectors<NV, PF>(col, val, dense, lo, hi, end, acc);
              if constexpr (decltype(identity)::value) {
                for (int v = 0; v < NV; ++v) IO::store(o + v * W, acc[v]);
              } else {
                finish_vectors(g0 + (r - r0), q0, acc, NV);
              }
            }
          };
          identity_ ? rows(std::true_type{}) : rows(std::false_type{});
        });
  }

  // A part's rows for WC < W columns, in one function compiled without the loop vectoriser (see
  // gather_narrow): the walk, the gathers and the epilogue are all inlined into it, so a short row
  // costs no calls.
  template <int WC>
  SPARSETORCH_NO_AUTOVECTORIZE(noinline)
  void run_scalar_columns(int64_t t, PathPoint from, PathPoint to, int64_t q0) {
    ColumnCheck<I> guard(rows_, col_, col_bstride_, k_);
    // Locals, not members, in the row loop: the output stores could alias members of the same type
    // and force their reload every row.
    const I* col_base = col_;
    const T *val_base = val_, *dense_base = dense_ + q0;
    T* out = out_ + q0;
    const int64_t col_bstride = col_bstride_, val_bstride = val_bstride_, dense_bstride = dense_bstride_;
    const int64_t ldb = ldb_, n = n_;
    walk_path_runs(
        rows_, from, to,
        [&](const RowPiece& piece) SPARSETORCH_INLINE_LAMBDA {
          if (q0 == 0) check(guard, piece.b, piece.lo, piece.hi);
          A acc[WC];
          gather_narrow<WC>(col_base + piece.b * col_bstride, val_base + piece.b * val_bstride,
                            dense_base + piece.b * dense_bstride, ldb, piece.lo, piece.hi, acc);
          std::copy(acc, acc + WC, partial_slot(t, piece) + q0);
        },
        [&](int64_t b, int64_t r0, int64_t r1, int64_t g0) SPARSETORCH_INLINE_LAMBDA {
          // Whole rows: a loop reading only crow per row (a short row's bookkeeping is most of its
          // cost); the identity epilogue stores the sums as they are.
          const I* crow = rows_.crow(b);
          const I* col = col_base + b * col_bstride;
          const T* val = val_base + b * val_bstride;
          const T* dense = dense_base + b * dense_bstride;
          auto rows = [&](auto identity) SPARSETORCH_INLINE_LAMBDA {
            T* o = out + g0 * n;
            for (int64_t r = r0; r < r1; ++r, o += n) {
              const int64_t lo = crow[r], hi = crow[r + 1];
              if (q0 == 0) check(guard, b, lo, hi);
              A acc[WC];
              gather_narrow<WC>(col, val, dense, ldb, lo, hi, acc);
              if constexpr (decltype(identity)::value) {
                for (int q = 0; q < WC; ++q) o[q] = static_cast<T>(acc[q]);
              } else {
                finish_scalars(g0 + (r - r0), q0, WC, acc);
              }
            }
          };
          identity_ ? rows(std::true_type{}) : rows(std::false_type{});
        });
  }

  void run_scalar_block(int64_t t, PathPoint from, PathPoint to, const ColumnBlock& blk) {
    static_assert(W <= 16, "scalar blocks have fewer columns than a vector");
    switch (blk.width) {
      case 1:
        return run_scalar_columns<1>(t, from, to, blk.q0);
      case 2:
        return run_scalar_columns<2>(t, from, to, blk.q0);
      case 3:
        return run_scalar_columns<3>(t, from, to, blk.q0);
      case 4:
        return run_scalar_columns<4>(t, from, to, blk.q0);
      case 5:
        return run_scalar_columns<5>(t, from, to, blk.q0);
      case 6:
        return run_scalar_columns<6>(t, from, to, blk.q0);
      case 7:
        return run_scalar_columns<7>(t, from, to, blk.q0);
      default:  // wider vectors than AVX2's: the rest one column at a time
        for (int64_t q = 0; q < blk.width; ++q) run_scalar_columns<1>(t, from, to, blk.q0 + q);
    }
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

  C10_ALWAYS_INLINE void finish_scalars(int64_t g, int64_t q0, int64_t width, const A* acc) const {
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
  bool identity_;  // the epilogue changes nothing: out = A @ B
  c10::SmallVector<ColumnBlock, 4> blocks_;
  c10::SmallVector<A, 256> head_, tail_;  // inline up to n = 128 on 2 threads
  c10::SmallVector<int64_t, 16> head_row_, tail_row_;
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
  const PathCuts cut = split_path(rows, parts);
  at::parallel_for(0, parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      ColumnCheck<I> guard(rows, col, col_bstride, k);
      walk_path(rows, cut[t], cut[t + 1], [&](const RowPiece& piece) {
        const auto bad = guard.check(piece);
        if (C10_UNLIKELY(bad.first >= 0)) check_column(col[bad.first * col_bstride + bad.second], k, bad.second, bad.first);
        const I* col_b = col + piece.b * col_bstride;
        const T* arow = a + piece.b * a_bstride + piece.r * n;
        const T* b_b = b + piece.b * b_bstride;
        T* out_b = out + piece.b * out_bstride;
        for (int64_t j = piece.lo; j < piece.hi; ++j) {
          const int64_t c = col_b[j];
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
  const PathCuts cut = split_path(rows, parts);
  at::parallel_for(0, parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      ColumnCheck<I> guard(rows, col, col_bstride, cs.len);
      walk_path(rows, cut[t], cut[t + 1], [&](const RowPiece& piece) {
        if (cs_p) {
          const auto bad = guard.check(piece);
          TORCH_CHECK_INDEX(bad.first < 0, "col_indices: entry ", bad.second, " of batch ", bad.first, " is column ",
                            bad.first < 0 ? 0 : static_cast<int64_t>(col[bad.first * col_bstride + bad.second]),
                            ", out of range for col_scale of length ", cs.len);
        }
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
          out_b[j] = static_cast<T>(static_cast<A>(v_b[j]) * (row_factor * static_cast<A>(cs_b[col_b[j]])));
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
