// Entry-split CSR x dense kernel for skewed rows (power-law graphs): the work is cut by stored
// entries over the whole matrix (a global merge-path split), not by rows, so a row of 60,000
// entries is spread over hundreds of groups of lanes instead of holding up one block.
//
// Units. The entries [e_lo, e_hi) of each batch are cut into units of E entries (E chosen on the
// host from the problem size); one group of GROUP lanes (4, 8, 16, 32) runs one unit for one column
// tile of GROUP * VEC columns. A unit boundary is moved back to the start of the row it falls in
// when that row is short (at most E entries): short rows are never cut and a unit holds 1 .. 2E-1
// entries. A long row is cut at the nominal boundaries e_lo + u*E; each piece's sum goes to a
// scratch slot (partial[unit][0]: the unit's first row, begun in an earlier unit; [1]: its last
// row, continued in a later one), and a second kernel adds a cut row's pieces in unit order
// (deterministic, no atomics: the same bits on every run), writes the empty rows, and applies the
// epilogue to both. Every other row is finished and written by its unit, epilogue fused.
//
// Three launches. A plan kernel finds where each unit starts (one 33-ary search over crow per unit,
// by a warp) and the row holding that entry. The main kernel's group loads a window of GROUP row
// pointers there, one per lane, and streams the unit's entries across its rows: kPerLane entries
// per lane per chunk (one aligned load each for columns and values), the next chunk loaded while
// this one's B rows are gathered kInFlight at a time; a row change is a flush and a shuffle, a new
// window one coalesced load per GROUP - 1 rows. The fix-up kernel then finishes cut and empty rows.
// A version that searched inside the main kernel and walked row by row, loading a row's (column,
// value) pairs after the previous row's gathers, was 1.2-1.6x slower at n <= 64 on the H100.
//
// Lanes and vectors as in the row-group kernel: a group of GROUP lanes covers GROUP * VEC columns
// (16-byte loads when aligned), the fewest lanes covering B's width; wider B is cut into column
// tiles, the slowest-varying index of the work items (per batch), so the groups in flight share one
// tile of B. (Narrower tiles, so that k rows of a tile fit in L2, were slower on the H100: the
// per-entry work is repeated per tile and the hub columns of power-law graphs hit L2 anyway.)
//
// Any input is memory-safe: row pointers are clamped to [0, L], entries outside [0, k) are
// skipped, a unit never reads outside [0, L) nor writes outside its batch's rows and its own slots
// (validate=True reports a malformed matrix; without it the result is unspecified, never a fault).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/spmm_kernel_args.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 4;      // B rows loaded before their FMAs, per group
constexpr int kPerLane = 4;       // entries each lane loads per chunk (a chunk is GROUP * kPerLane entries)
constexpr int kFixupLanes = 32;   // the fix-up kernel's group size (any works: slots are per column)
constexpr int kSmallPieces = 16;  // cut rows of up to this many pieces are summed by one group, longer by a block

template <typename acc_t>
struct SplitArgs {
  int64_t unit;   // E: nominal entries per unit; rows of at most E entries are never cut
  int64_t units;  // units per batch: ceil(L / E)
  int64_t tiles;  // column tiles of GROUP * VEC columns
  acc_t* partial; // (batch, units, 2, n): sums of the pieces of cut rows
  const int64_t* plan;  // (batch, units + 1, 2): each unit's first entry and its row
  bool quads_aligned;  // every batch's col and values start on a kPerLane-entry boundary
};

// kPerLane consecutive entries (columns and values) of one lane, loaded as one aligned access each
// where they are all readable and the arrays allow it, else one by one (column -1 where unreadable).
template <typename scalar_t, typename index_t>
struct LaneEntries {
  using acc_t = at::opmath_type<scalar_t>;
  struct alignas(kPerLane * sizeof(index_t)) Columns {
    index_t v[kPerLane];
  };
  struct alignas(kPerLane * sizeof(scalar_t)) Values {
    scalar_t v[kPerLane];
  };
  Columns col;
  Values val;
  // Entries e .. e + kPerLane - 1 of col and val, of which the first `avail` may be read.
  __device__ __forceinline__ void load(const index_t* cols, const scalar_t* vals, int e, int avail, bool aligned) {
    if (aligned && e + kPerLane <= avail) {
      col = *reinterpret_cast<const Columns*>(cols + e);
      val = *reinterpret_cast<const Values*>(vals + e);
    } else {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const bool in = e + i < avail;
        col.v[i] = in ? cols[e + i] : index_t(-1);
        val.v[i] = in ? vals[e + i] : scalar_t(0);
      }
    }
  }
  // Entry i (0 .. kPerLane-1; a runtime index, so selects rather than an indexed local array).
  __device__ __forceinline__ index_t column(int i) const {
    index_t c = col.v[0];
#pragma unroll
    for (int j = 1; j < kPerLane; ++j) c = i == j ? col.v[j] : c;
    return c;
  }
  __device__ __forceinline__ acc_t value(int i) const {
    scalar_t x = val.v[0];
#pragma unroll
    for (int j = 1; j < kPerLane; ++j) x = i == j ? val.v[j] : x;
    return static_cast<acc_t>(x);
  }
};

__device__ __forceinline__ int64_t clamp_entry(int64_t v, int64_t lo, int64_t hi) { return min(max(v, lo), hi); }

// The last row r in [lo, hi) with crow[r] <= p, given crow[lo] <= p (for a valid crow: the row that
// holds entry p, empty rows skipped). The group's lanes probe GROUP points at once and keep the
// interval between the last probe <= p and the next. On a malformed crow it still ends, in [lo, hi).
template <int GROUP, typename index_t>
__device__ __forceinline__ int64_t row_containing(const index_t* crow, int64_t lo, int64_t hi, int64_t p, int lane,
                                                  unsigned mask) {
  while (hi - lo > 1) {
    const int64_t span = hi - lo - 1;  // candidates lo+1 .. hi-1
    auto probe = [&](int l) { return lo + 1 + span * l / GROUP; };
    const bool le = static_cast<int64_t>(crow[probe(lane)]) <= p;
    const int c = __popc(__ballot_sync(mask, le) & mask);
    if (c == 0) {
      hi = lo + 1;
    } else {
      const int64_t next_hi = c < GROUP ? probe(c) : hi;
      lo = probe(c - 1);
      hi = next_hi;
    }
  }
  return lo;
}

// GROUP row pointers, one per lane: lane l holds crow[base + l] clamped to [0, L] (crow[m] past the
// last row). Row r (base <= r < base + GROUP - 1) spans [at(r - base), at(r - base + 1)).
template <int GROUP, typename index_t>
struct RowWindow {
  int64_t base = 0, v = 0;
  __device__ __forceinline__ void load(const index_t* crow, int64_t first_row, int64_t m, int64_t L, int lane) {
    base = first_row;
    v = clamp_entry(static_cast<int64_t>(crow[min(first_row + lane, m)]), 0, L);
  }
  __device__ __forceinline__ int64_t at(int i, unsigned mask) const { return __shfl_sync(mask, v, i, GROUP); }
};

// The plan: where each unit starts, once per call before the main kernel (one 33-ary search per
// unit by a warp, so the main kernel's groups begin gathering at once). For unit u of batch b
// (u = units: the end), plan[2 * (b * (units + 1) + u)] is its first entry (the nominal e_lo + u * E,
// moved back to the start of its row when that row is short) and [+ 1] the row holding it. Units
// past the batch's entries start at its end. Every value lies in [0, L] and [0, m).
template <typename index_t>
__global__ void __launch_bounds__(kThreads)
    spmm_split_plan_kernel(const index_t* crow, int64_t crow_bstride, int64_t m, int64_t L, int64_t batch,
                           int64_t unit, int64_t units, int64_t* plan) {
  constexpr int GROUP = 32;
  const int lane = threadIdx.x % GROUP;
  const int64_t items = batch * (units + 1);
  for (int64_t item = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / GROUP; item < items;
       item += static_cast<int64_t>(gridDim.x) * (kThreads / GROUP)) {
    const int64_t b = item / (units + 1), u = item - b * (units + 1);
    const index_t* crow_b = crow + b * crow_bstride;
    const int64_t e_lo = clamp_entry(static_cast<int64_t>(crow_b[0]), 0, L);
    const int64_t e_hi = clamp_entry(static_cast<int64_t>(crow_b[m]), e_lo, L);
    const int64_t nominal = e_lo + u * unit;
    int64_t start = e_hi, row = m - 1;
    if (nominal < e_hi) {
      row = row_containing<GROUP>(crow_b, 0, m, nominal, lane, 0xffffffffu);
      const auto [rs, re] = clamped_row_span(crow_b, row, L);
      start = re - rs <= unit ? rs : nominal;
    }
    if (lane == 0) {
      plan[2 * item] = start;
      plan[2 * item + 1] = row;
    }
  }
}

// PLAIN: out = A @ B (no scale, accumulate, bias or activation): the small store lets 4 blocks of 256
// fit per SM (64 registers); the general epilogue takes 80 (3 blocks).
template <typename scalar_t, typename index_t, int VEC, int GROUP, bool PLAIN>
__global__ void __launch_bounds__(kThreads, PLAIN ? 4 : 3)
    spmm_split_kernel(const NativeArgs<scalar_t, index_t> a, const SplitArgs<at::opmath_type<scalar_t>> s) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kGroups = kThreads / GROUP;
  constexpr int kWidth = GROUP * VEC;
  constexpr int kChunk = GROUP * kPerLane;
  const int lane = threadIdx.x % GROUP;
  const unsigned mask = group_lane_mask<GROUP>();
  const int64_t per_batch = s.tiles * s.units;
  const int64_t items = (a.rows / a.m) * per_batch;

  // Items (batch, tile, unit), unit fastest: the groups in flight share a batch and a tile of B.
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kGroups + threadIdx.x / GROUP; item < items;
       item += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t b = item / per_batch, rest = item - b * per_batch;
    const int64_t tile = rest / s.units, u = rest - tile * s.units;
    const index_t* crow_b = a.crow + b * a.crow_bstride;
    // [start, stop): the unit's entries, from the plan (spmm_split_plan_kernel); row holds start.
    const int64_t* bounds = s.plan + 2 * (b * (s.units + 1) + u);
    const int64_t start = bounds[0], row = bounds[1], stop = bounds[2];
    if (start >= stop) continue;  // past the batch's entries, or a malformed crow
    RowWindow<GROUP, index_t> win;
    win.load(crow_b, row, a.m, a.L, lane);
    const int64_t row_start = win.at(0, mask), row_end = win.at(1, mask);

    const index_t* col_b = a.col + b * a.col_bstride;
    const scalar_t* val_b = a.values + b * a.val_bstride;
    const scalar_t* dense_b = a.dense + b * a.dense_bstride;
    const int64_t c0 = tile * kWidth + lane * VEC;
    const bool active = c0 < a.n;
    // The walk works in 32-bit offsets from first_chunk (a unit spans fewer than 2E + kPerLane
    // entries). Row pointers become offsets clamped to [-1, p_stop + 1]: whether a row began before
    // the unit (< p_start) or ends after it (> p_stop) is all the walk needs to know of them.
    const int64_t first_chunk = start & ~int64_t(kPerLane - 1);
    const index_t* col_u = col_b + first_chunk;
    const scalar_t* val_u = val_b + first_chunk;
    const int p_start = static_cast<int>(start - first_chunk), p_stop = static_cast<int>(stop - first_chunk);
    const int p_avail = static_cast<int>(min(a.L - first_chunk, static_cast<int64_t>(p_stop) + kChunk));
    auto offset = [&](int64_t ptr) {
      return static_cast<int>(min(max(ptr - first_chunk, int64_t(-1)), static_cast<int64_t>(p_stop) + 1));
    };
    int64_t wbase = win.base;  // the window holds the offsets of row pointers wbase .. wbase + GROUP - 1
    int wv = offset(win.v), r = 0;  // the current row is wbase + r
    int rs = offset(row_start), re = offset(row_end);

    acc_t acc[VEC];
#pragma unroll
    for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
    // A whole row goes out through the epilogue, a piece of a cut row to its slot; empty rows are
    // the fix-up kernel's.
    auto flush = [&] {
      if (active && rs < re) {
        if (rs >= p_start && re <= p_stop) {
          const int64_t at = (b * a.m + wbase + r) * a.n + c0;
          if constexpr (PLAIN) {
            Packed<scalar_t, VEC> res;
#pragma unroll
            for (int q = 0; q < VEC; ++q) res.set(q, acc[q]);
            res.store(a.out + at);
          } else {
            store_outputs<scalar_t, index_t, VEC>(a, at, c0, acc);
          }
        } else {
          const int slot = rs < p_start ? 0 : 1;
          Vec<acc_t, VEC> piece;
#pragma unroll
          for (int q = 0; q < VEC; ++q) piece.v[q] = acc[q];
          *reinterpret_cast<Vec<acc_t, VEC>*>(s.partial + ((b * s.units + u) * 2 + slot) * a.n + c0) = piece;
        }
      }
#pragma unroll
      for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
    };
    // The unit's entries as one stream across its rows, in chunks of kChunk (kPerLane per lane, one
    // aligned load each for columns and values), the next chunk loaded while this one's B rows are
    // gathered, kInFlight at a time. A row change inside the stream is a flush and a shuffle of the
    // row window. On the H100 this was 1.6-3x faster than walking row by row with a (column, value)
    // load per row after the row's gathers (benchmarks/NOTES.md, "Entry-split SpMM, streamed").
    LaneEntries<scalar_t, index_t> next;
    next.load(col_u, val_u, kPerLane * lane, p_avail, s.quads_aligned);
    bool walking = true;  // false once a malformed crow leaves entries after the last row
    for (int p0 = 0; p0 < p_stop && walking; p0 += kChunk) {
      const LaneEntries<scalar_t, index_t> cur = next;
      if (p0 + kChunk < p_stop) next.load(col_u, val_u, p0 + kChunk + kPerLane * lane, p_avail, s.quads_aligned);
      const int lo_chunk = max(p_start - p0, 0), hi_chunk = min(kChunk, p_stop - p0);
#pragma unroll 1
      for (int j0 = lo_chunk & ~(kInFlight - 1); j0 < hi_chunk && walking; j0 += kInFlight) {
        Packed<scalar_t, VEC> rows[kInFlight];  // half types stay packed in pairs until their FMAs
        acc_t v[kInFlight];
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) {
          const int e = j0 + j;
          const int64_t c = __shfl_sync(mask, cur.column(e % kPerLane), e / kPerLane, GROUP);
          if (e >= lo_chunk && e < hi_chunk && active && c >= 0 && c < a.k) {
            rows[j].load(dense_b + c * a.ldb + c0);
          } else {
            rows[j] = Packed<scalar_t, VEC>{};
          }
        }
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) {
          const int e = j0 + j;
          v[j] = __shfl_sync(mask, cur.value(e % kPerLane), e / kPerLane, GROUP);
        }
        // The batch's entries [lo, hi) in runs of one row each; a row change between runs is the one
        // flush in the loop (inlined once: the epilogue is large).
        int lo = max(j0, lo_chunk) - j0;
        const int hi = min(j0 + kInFlight, hi_chunk) - j0;
        while (lo < hi) {
          while (p0 + j0 + lo >= re) {
            flush();
            if (wbase + r + 1 >= a.m) {
              walking = false;
              break;
            }
            if (++r + 1 >= GROUP) {
              wbase += r;
              r = 0;
              wv = offset(clamp_entry(static_cast<int64_t>(crow_b[min(wbase + lane, a.m)]), 0, a.L));
            }
            rs = re;
            re = __shfl_sync(mask, wv, r + 1, GROUP);
          }
          if (!walking) break;
          const int run_end = min(hi, re - p0 - j0);
#pragma unroll
          for (int j = 0; j < kInFlight; ++j) {
            if (j >= lo && j < run_end) {
#pragma unroll
              for (int q = 0; q < VEC; ++q) acc[q] += v[j] * rows[j].get(q);
            }
          }
          lo = run_end;
        }
      }
    }
    if (walking) flush();
  }
}

// Rows the split kernel left: empty rows (the epilogue of zero) and rows cut into pieces (their
// slots added in unit order). A block checks 256 rows, one per thread, lists those with work in
// row order (warp ballots), then its groups take the empty rows and rows of few pieces; rows of
// more than kSmallPieces pieces are summed by the whole block (each group a contiguous range of
// pieces, the groups' sums then added in group order), so the longest row is not one serial chain.
template <typename scalar_t, typename index_t, int VEC>
__global__ void __launch_bounds__(kThreads)
    spmm_split_fixup_kernel(const NativeArgs<scalar_t, index_t> a, const SplitArgs<at::opmath_type<scalar_t>> s) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int GROUP = kFixupLanes;
  constexpr int kGroups = kThreads / GROUP;
  constexpr int kWidth = GROUP * VEC;
  constexpr int kWarps = kThreads / 32;
  __shared__ int64_t s_row[kThreads], s_first[kThreads], s_pieces[kThreads];
  __shared__ int s_warp[kWarps];
  __shared__ acc_t s_part[kGroups][kWidth];
  const int group = threadIdx.x / GROUP, lane = threadIdx.x % GROUP;
  const int64_t col_tiles = ceil_div(a.n, kWidth);

  // acc = the sum of pieces [j0, j1) of a cut row whose first piece is unit u0's slot 1 and the
  // others slot 0 of the units after it, in that order (4 loads in flight).
  auto add_pieces = [&](int64_t b, int64_t u0, int64_t j0, int64_t j1, int64_t c0, acc_t* acc) {
    const acc_t* base = s.partial + (b * s.units + u0) * 2 * a.n + c0;
    auto slot = [&](int64_t j) { return base + (2 * j + (j == 0 ? 1 : 0)) * a.n; };
    for (int64_t j = j0; j < j1; j += 4) {
      Vec<acc_t, VEC> p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (j + i < j1) p[i] = *reinterpret_cast<const Vec<acc_t, VEC>*>(slot(j + i));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (j + i < j1) {
#pragma unroll
          for (int q = 0; q < VEC; ++q) acc[q] += p[i].v[q];
        }
      }
    }
  };

  for (int64_t blk = blockIdx.x; blk * kThreads < a.rows; blk += gridDim.x) {
    const int64_t grow = blk * kThreads + threadIdx.x;  // batch * m + row
    bool needs = false;
    int64_t first = 0, pieces = 0;  // pieces 0: an empty row
    if (grow < a.rows) {
      const int64_t b = grow / a.m, r = grow - b * a.m;
      const index_t* crow_b = a.crow + b * a.crow_bstride;
      const int64_t e_lo = clamp_entry(static_cast<int64_t>(crow_b[0]), 0, a.L);
      const auto [rs, re] = clamped_row_span(crow_b, r, a.L);
      if (rs == re) {
        needs = true;
      } else if (re - rs > s.unit) {
        first = clamp_entry((rs - e_lo) / s.unit, 0, s.units - 1);
        const int64_t last = clamp_entry((re - 1 - e_lo) / s.unit, 0, s.units - 1);
        needs = last > first;
        pieces = last - first + 1;
      }
    }
    __syncthreads();  // the previous rows' readers of the lists are done
    const unsigned ballot = __ballot_sync(0xffffffffu, needs);
    const int warp = threadIdx.x / 32, lane32 = threadIdx.x % 32;
    if (lane32 == 0) s_warp[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      offset += w < warp ? s_warp[w] : 0;
      total += s_warp[w];
    }
    if (needs) {
      const int pos = offset + __popc(ballot & ((1u << lane32) - 1u));
      s_row[pos] = grow;
      s_first[pos] = first;
      s_pieces[pos] = pieces;
    }
    __syncthreads();

    for (int i = group; i < total; i += kGroups) {  // empty rows and rows of few pieces: a group each
      if (s_pieces[i] > kSmallPieces) continue;
      const int64_t grow_i = s_row[i], b = grow_i / a.m;
      for (int64_t tile = 0; tile < col_tiles; ++tile) {
        const int64_t c0 = tile * kWidth + lane * VEC;
        if (c0 >= a.n) break;
        acc_t acc[VEC];
#pragma unroll
        for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
        add_pieces(b, s_first[i], 0, s_pieces[i], c0, acc);
        store_outputs<scalar_t, index_t, VEC>(a, grow_i * a.n + c0, c0, acc);
      }
    }
    for (int i = 0; i < total; ++i) {  // rows of many pieces: the whole block (uniform branch)
      const int64_t pieces_i = s_pieces[i];
      if (pieces_i <= kSmallPieces) continue;
      const int64_t grow_i = s_row[i], b = grow_i / a.m;
      const int64_t per_group = ceil_div(pieces_i, kGroups);
      const int64_t j0 = min(group * per_group, pieces_i), j1 = min(j0 + per_group, pieces_i);
      for (int64_t tile = 0; tile < col_tiles; ++tile) {
        const int64_t c0 = tile * kWidth + lane * VEC;
        const bool active = c0 < a.n;
        acc_t acc[VEC];
#pragma unroll
        for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
        if (active) add_pieces(b, s_first[i], j0, j1, c0, acc);
#pragma unroll
        for (int q = 0; q < VEC; ++q) s_part[group][lane * VEC + q] = acc[q];
        __syncthreads();
        if (group == 0 && active) {
#pragma unroll
          for (int q = 0; q < VEC; ++q) acc[q] = s_part[0][lane * VEC + q];
          for (int g = 1; g < kGroups; ++g) {
#pragma unroll
            for (int q = 0; q < VEC; ++q) acc[q] += s_part[g][lane * VEC + q];
          }
          store_outputs<scalar_t, index_t, VEC>(a, grow_i * a.n + c0, c0, acc);
        }
        __syncthreads();
      }
    }
  }
}

// Benchmark knobs (benchmarks/spmm_skew_cuda.py sweeps them; 0 or unset: the rules below):
// SPARSETORCH_SPLIT_LANES forces the lanes per group (8, 16 or 32, i.e. the column tile),
// SPARSETORCH_SPLIT_UNIT the entries per unit.
int64_t env_knob(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::max<int64_t>(0, std::atoll(v)) : 0;
}

// Lanes per group: the fewest (4, 8, 16, 32) covering B's width in 16-byte vectors. Measured on the
// H100 (benchmarks/results/h100/spmm_skew_cuda_v1.txt, sweep, power-law 100k and 1M): narrower
// groups, more column tiles, were 1.09-2.44x slower at n = 128 and 256; wider ones (idle lanes)
// 1.26-1.96x slower at n = 32. Groups of 4 (n <= 16 in fp32, <= 32 in bf16/fp16) put twice as many
// units in flight per warp as groups of 8 with half their lanes idle.
int lanes_per_group(int64_t n_vectors) {
  const int forced = static_cast<int>(env_knob("SPARSETORCH_SPLIT_LANES"));
  if (forced == 4 || forced == 8 || forced == 16 || forced == 32) return forced;
  return n_vectors <= 4 ? 4 : row_group_size(n_vectors);
}

// Entries per unit: about 4 units per group the GPU holds at once (load balance), at least 64 (the
// search and window per unit) and twice the mean row length (a short-row unit then holds a few
// rows, and the scratch stays within C's size), at most 4096.
int64_t unit_entries(int64_t entries, int64_t rows, int lanes) {
  const int64_t forced = env_knob("SPARSETORCH_SPLIT_UNIT");
  if (forced > 0) return forced;
  const int64_t resident = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) *
                           (2048 / lanes);
  const int64_t mean_row = rows > 0 ? entries / rows : 0;
  return std::clamp<int64_t>(std::max(ceil_div(entries, 4 * resident), 2 * mean_row), 64, 4096);
}

template <typename scalar_t, typename index_t, int VEC, int GROUP>
void launch(const NativeArgs<scalar_t, index_t>& args, const at::Tensor& out) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t batch = args.rows / args.m;
  const int64_t unit = unit_entries(batch * args.L, args.rows, GROUP);
  const int64_t units = ceil_div(args.L, unit);
  const at::Tensor partial =
      at::empty({batch * units * 2 * args.n}, out.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
  const bool quads_aligned = is_aligned(args.col, kPerLane * sizeof(index_t)) &&
                             is_aligned(args.values, kPerLane * sizeof(scalar_t)) &&
                             args.col_bstride % kPerLane == 0 && args.val_bstride % kPerLane == 0;
  const at::Tensor plan = at::empty({batch * (units + 1) * 2}, out.options().dtype(at::kLong));
  const SplitArgs<acc_t> s{unit, units, ceil_div(args.n, GROUP * VEC), partial.data_ptr<acc_t>(),
                           plan.data_ptr<int64_t>(), quads_aligned};
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int64_t plan_blocks = std::min(ceil_div(batch * (units + 1), kThreads / 32), sms * 64);
  spmm_split_plan_kernel<index_t><<<static_cast<unsigned>(plan_blocks), kThreads, 0, stream>>>(
      args.crow, args.crow_bstride, args.m, args.L, batch, unit, units, plan.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t items = batch * s.tiles * units;
  if (items > 0) {
    const int64_t blocks = std::min(ceil_div(items, kThreads / GROUP), sms * 64);
    const bool plain = args.alpha == 1.0 && (args.beta == 0.0 || !args.accumulate) && !args.bias &&
                       args.act == Activation::None;
    if (plain) {
      spmm_split_kernel<scalar_t, index_t, VEC, GROUP, true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args, s);
    } else {
      spmm_split_kernel<scalar_t, index_t, VEC, GROUP, false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args, s);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int64_t fix_blocks = std::min(ceil_div(args.rows, kThreads), sms * 32);
  spmm_split_fixup_kernel<scalar_t, index_t, VEC><<<static_cast<unsigned>(fix_blocks), kThreads, 0, stream>>>(args, s);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The widest 16-byte path when B and out allow it (lanes per group from lanes_per_group), else
// one element per lane in groups of 32.
template <typename scalar_t, typename index_t>
void dispatch(const NativeArgs<scalar_t, index_t>& args, bool aligned, const at::Tensor& out) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  if (!aligned) return launch<scalar_t, index_t, 1, 32>(args, out);
  switch (lanes_per_group(ceil_div(args.n, kVec))) {
    case 4:
      return launch<scalar_t, index_t, kVec, 4>(args, out);
    case 8:
      return launch<scalar_t, index_t, kVec, 8>(args, out);
    case 16:
      return launch<scalar_t, index_t, kVec, 16>(args, out);
    default:
      return launch<scalar_t, index_t, kVec, 32>(args, out);
  }
}

}  // namespace

void spmm_split(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi) {
  run_native_kernel(p, crow, col, values, dense, out, epi,
                    [&](const auto& args, bool aligned) { dispatch(args, aligned, out); });
}

}  // namespace cuda
}  // namespace sparsetorch
