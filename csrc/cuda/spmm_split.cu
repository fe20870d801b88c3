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
// (deterministic, no atomics: the same bits on every run) and writes the empty rows. Every other
// row is finished and written by its unit. Scale, accumulate, bias and activation are a pass after
// the product (spmm_split).
//
// Two launches per call, and a plan. The plan (where each unit starts, and the row holding that
// entry) depends on crow and E alone: one pass over the rows, kept with the matrix's analysis and
// reused by later calls (unit_plan). The main kernel's group loads a window of GROUP row pointers
// at its unit's start, one per lane, and streams the unit's entries across its rows: kPerLane
// entries per lane per chunk (one aligned load each for columns and values), the next chunk loaded
// while this one's B rows are gathered kInFlight at a time; a row change is a flush and a shuffle, a
// new window one coalesced load per GROUP - 1 rows. The fix-up kernel then finishes cut and empty
// rows. A version that searched inside the main kernel and walked row by row, loading a row's
// (column, value) pairs after the previous row's gathers, was 1.2-1.6x slower at n <= 64 on the H100.
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
#include <ATen/cuda/CUDAGraphsUtils.cuh>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "common/csr_analysis.h"
#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/spmm_kernel_args.cuh"
#include "cuda/spmm_plans.h"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 4;      // B rows loaded before their FMAs, per group
// Entries each lane loads per chunk (a chunk is GROUP * kPerLane entries). 2 rather than 4: the
// prefetched chunk then fits in registers beside the gathers (4 spilled it at 64 registers); on the
// H100 fp32 was 3-7% faster, bf16 within 1.5% (docs/history.md, SpMM routes: split).
constexpr int kPerLane = 2;
constexpr int kSmallPieces = 16;  // cut rows of up to this many pieces are summed by one group, longer by a block

template <typename acc_t>
struct SplitArgs {
  int64_t unit;   // E: nominal entries per unit; rows of at most E entries are never cut
  int64_t units;  // units per batch: ceil(L / E)
  int64_t tiles;  // column tiles of GROUP * VEC columns
  acc_t* partial; // (batch, units, 2, n): sums of the pieces of cut rows
  const int64_t* plan;  // (batch, units + 1, 2): each unit's first entry and its row
  bool entries_aligned;  // every batch's col and values start on a kPerLane-entry boundary
};

// kPerLane consecutive entries (columns and values) of one lane, loaded as one aligned access each
// where they are all readable and the arrays allow it, else one by one (column -1 where unreadable).
// Half-type values stay packed in pairs (Packed): unpacked, each took a register of its own and the
// prefetched chunk spilled.
template <typename scalar_t, typename index_t>
struct LaneEntries {
  using acc_t = at::opmath_type<scalar_t>;
  Vec<index_t, kPerLane> col;
  Packed<scalar_t, kPerLane> val;
  // Entries e .. e + kPerLane - 1 of col and val, of which the first `avail` may be read.
  __device__ __forceinline__ void load(const index_t* cols, const scalar_t* vals, int e, int avail, bool aligned) {
    if (aligned && e + kPerLane <= avail) {
      col = *reinterpret_cast<const Vec<index_t, kPerLane>*>(cols + e);
      val.load(vals + e);
    } else {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const bool in = e + i < avail;
        col.v[i] = in ? cols[e + i] : index_t(-1);
        val.set(i, in ? static_cast<acc_t>(vals[e + i]) : acc_t(0));
      }
    }
  }
  // Entry i: a compile-time index (an unrolled loop's), so no local-memory array.
  __device__ __forceinline__ index_t column(int i) const { return col.v[i]; }
  __device__ __forceinline__ acc_t value(int i) const { return val.get(i); }
};

// out[0 .. VEC) = acc, one 16-byte store when VEC > 1.
template <typename scalar_t, int VEC>
__device__ __forceinline__ void store_packed(scalar_t* out, const at::opmath_type<scalar_t>* acc) {
  Packed<scalar_t, VEC> res;
#pragma unroll
  for (int q = 0; q < VEC; ++q) res.set(q, acc[q]);
  res.store(out);
}

__device__ __forceinline__ int64_t clamp_entry(int64_t v, int64_t lo, int64_t hi) { return min(max(v, lo), hi); }

// The plan: where each unit starts. For unit u of batch b (u = units: the end),
// plan[2 * (b * (units + 1) + u)] is its first entry -- the nominal e_lo + u * E, moved back to the
// start of its row when that row is short -- and [+ 1] the row holding it; units past the batch's
// entries start at its end (e_hi, row m - 1). One pass over the rows: a thread per row writes the
// units whose nominal start falls in it (a long row several: the longest of the 1M-node test graphs
// about 1,400), then a thread per unit those past the entries. (A 33-ary search per unit by a warp
// took 66-128 us on 1M-node graphs on the H100, 10-20% of the SpMM.) The buffer starts zeroed: for a
// malformed crow a unit no row claims starts at (0, 0) and one claimed twice takes either; every
// value stays in [0, L] and [0, m), all the main kernel needs to stay in bounds.
template <typename index_t>
__global__ void __launch_bounds__(kThreads)
    spmm_split_plan_kernel(const index_t* crow, int64_t crow_bstride, int64_t m, int64_t L, int64_t batch,
                           int64_t unit, int64_t units, int64_t* plan) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  auto batch_span = [&](int64_t b) {
    const index_t* crow_b = crow + b * crow_bstride;
    const int64_t e_lo = clamp_entry(crow_b[0], 0, L);
    return RowSpan{e_lo, clamp_entry(crow_b[m], e_lo, L)};  // the batch's entries
  };
  for (int64_t item = first; item < batch * m; item += stride) {
    const int64_t b = item / m, r = item - b * m;
    const auto [e_lo, e_hi] = batch_span(b);
    const auto [rs, re] = clamped_row_span(crow + b * crow_bstride, r, L);
    const int64_t stop = min(re, e_hi);
    int64_t* plan_b = plan + 2 * b * (units + 1);
    for (int64_t u = rs <= e_lo ? 0 : ceil_div(rs - e_lo, unit); u < units && e_lo + u * unit < stop; ++u) {
      plan_b[2 * u] = re - rs <= unit ? rs : e_lo + u * unit;
      plan_b[2 * u + 1] = r;
    }
  }
  for (int64_t item = first; item < batch * (units + 1); item += stride) {
    const int64_t b = item / (units + 1), u = item - b * (units + 1);
    const auto [e_lo, e_hi] = batch_span(b);
    if (e_lo + u * unit >= e_hi) {
      plan[2 * item] = e_hi;
      plan[2 * item + 1] = m - 1;
    }
  }
}

// out = A @ B alone (spmm_split runs any other epilogue as a second pass): the 16-byte store of a
// finished row lets 4 blocks of 256 threads fit per SM (64 registers).
// offset_t: int32_t when every offset of the call fits (offsets_fit_int32; the usual case), else
// int64_t. 32-bit offsets from the argument pointers instead of 64-bit pointers per unit free the
// registers the stream's gathers need: at 64 registers the 64-bit version spilled 150-400 bytes.
template <typename scalar_t, typename index_t, typename offset_t, int VEC, int GROUP>
__global__ void __launch_bounds__(kThreads, 4)
    spmm_split_kernel(const NativeArgs<scalar_t, index_t> a, const SplitArgs<at::opmath_type<scalar_t>> s) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kGroups = kThreads / GROUP;
  constexpr int kWidth = GROUP * VEC;
  constexpr int kChunk = GROUP * kPerLane;
  const int lane = threadIdx.x % GROUP;
  const unsigned mask = group_lane_mask<GROUP>();
  const offset_t m = a.m, n = a.n, units = s.units;
  const offset_t per_batch = s.tiles * units;
  const offset_t items = (a.rows / a.m) * per_batch;

  // Items (batch, tile, unit), unit fastest: the groups in flight share a batch and a tile of B.
  for (offset_t item = static_cast<offset_t>(blockIdx.x) * kGroups + threadIdx.x / GROUP; item < items;
       item += static_cast<offset_t>(gridDim.x) * kGroups) {
    const offset_t b = item / per_batch, rest = item - b * per_batch;
    const offset_t tile = rest / units, u = rest - tile * units;
    // [start, stop): the unit's entries, from the plan (spmm_split_plan_kernel); row holds start.
    const int64_t* bounds = s.plan + 2 * (static_cast<int64_t>(b) * (units + 1) + u);
    const offset_t start = bounds[0], row = bounds[1], stop = bounds[2];
    if (start >= stop) continue;  // past the batch's entries, or a malformed crow
    const offset_t c0 = tile * kWidth + lane * VEC;
    const bool active = c0 < n;
    // The walk works in 32-bit offsets from first_chunk (a unit of a valid crow spans fewer than
    // 2E + kPerLane entries; a malformed plan can only make the int wrap and the walk shorter, every
    // read stays below p_avail). Row pointers become offsets clamped to [-1, p_stop + 1]: whether a
    // row began before the unit (< p_start) or ends after it (> p_stop) is all the walk needs.
    const offset_t first_chunk = start & ~offset_t(kPerLane - 1);
    const int p_start = static_cast<int>(start - first_chunk), p_stop = static_cast<int>(stop - first_chunk);
    const int p_avail = static_cast<int>(min(a.L - first_chunk, static_cast<int64_t>(p_stop) + kChunk));
    auto offset = [&](index_t ptr) {
      return static_cast<int>(min(max(static_cast<int64_t>(ptr) - first_chunk, int64_t(-1)),
                                  static_cast<int64_t>(p_stop) + 1));
    };
    // Element offsets from the argument pointers: the unit's entries, B's rows at column c0 (row c at
    // dense_at + c * ldb), the current row's outputs (one row on at each row change), its two slots
    // (slot 1 at + n), the batch's row pointers.
    const offset_t col_at = b * a.col_bstride + first_chunk, val_at = b * a.val_bstride + first_chunk;
    const offset_t dense_at = b * a.dense_bstride + c0, ldb = a.ldb;
    offset_t out_at = (b * m + row) * n + c0;
    const offset_t slots_at = (b * units + u) * 2 * n + c0;
    const offset_t crow_at = b * a.crow_bstride;
    // The window: lane l holds the offset of row pointer wbase + l; the current row is wbase + r,
    // spanning [rs, re).
    offset_t wbase = row;
    int wv = offset(a.crow[crow_at + min(wbase + lane, m)]), r = 0;
    int rs = __shfl_sync(mask, wv, 0, GROUP), re = __shfl_sync(mask, wv, 1, GROUP);

    acc_t acc[VEC];
#pragma unroll
    for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
    // A whole row goes to out, a piece of a cut row to its slot; empty rows are the fix-up kernel's.
    auto flush = [&] {
      if (active && rs < re) {
        if (rs >= p_start && re <= p_stop) {
          store_packed<scalar_t, VEC>(a.out + out_at, acc);
        } else {
          Vec<acc_t, VEC> piece;
#pragma unroll
          for (int q = 0; q < VEC; ++q) piece.v[q] = acc[q];
          *reinterpret_cast<Vec<acc_t, VEC>*>(s.partial + slots_at + (rs < p_start ? 0 : n)) = piece;
        }
      }
#pragma unroll
      for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
    };
    // The unit's entries as one stream across its rows, in chunks of kChunk (kPerLane per lane, one
    // aligned load each for columns and values), the next chunk loaded while this one's B rows are
    // gathered, kInFlight at a time. A row change inside the stream is a flush and a shuffle of the
    // row window. On the H100 this was 1.6-3x faster than walking row by row with a (column, value)
    // load per row after the row's gathers (docs/history.md, SpMM routes: split).
    LaneEntries<scalar_t, index_t> next;
    next.load(a.col + col_at, a.values + val_at, kPerLane * lane, p_avail, s.entries_aligned);
    for (int p0 = 0; p0 < p_stop; p0 += kChunk) {
      const LaneEntries<scalar_t, index_t> cur = next;
      if (p0 + kChunk < p_stop) {
        next.load(a.col + col_at, a.values + val_at, p0 + kChunk + kPerLane * lane, p_avail, s.entries_aligned);
      }
#pragma unroll 1
      for (int jb = 0; jb < kChunk && p0 + jb < p_stop; jb += kInFlight) {
        Packed<scalar_t, VEC> rows[kInFlight];  // half types stay packed in pairs until their FMAs
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) {
          const int e = p0 + jb + j;
          const index_t c = __shfl_sync(mask, cur.column(j % kPerLane), (jb + j) / kPerLane, GROUP);
          if (e >= p_start && e < p_stop && active && c >= 0 && c < a.k) {
            rows[j].load(a.dense + (dense_at + static_cast<offset_t>(c) * ldb));
          } else {
            rows[j] = Packed<scalar_t, VEC>{};
          }
        }
        // Entry by entry; a row change is a flush and a step of the window. The last row takes
        // entries past it (a malformed crow).
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) {
          const int e = p0 + jb + j;
          const acc_t v = __shfl_sync(mask, cur.value(j % kPerLane), (jb + j) / kPerLane, GROUP);
          if (e < p_start || e >= p_stop) continue;
          while (e >= re) {
            flush();
            if (wbase + r + 1 >= m) {
              re = p_stop + 1;
              break;
            }
            out_at += n;
            if (++r + 1 >= GROUP) {
              wbase += r;
              r = 0;
              wv = offset(a.crow[crow_at + min(wbase + lane, m)]);
            }
            rs = re;
            re = __shfl_sync(mask, wv, r + 1, GROUP);
          }
#pragma unroll
          for (int q = 0; q < VEC; ++q) acc[q] += v * rows[j].get(q);
        }
      }
    }
    flush();
  }
}

// Rows the split kernel left: empty rows (zeros) and rows cut into pieces (their
// slots added in unit order). A block checks 256 rows, one per thread, lists those with work in
// row order (warp ballots), then its groups take the empty rows and rows of few pieces; rows of
// more than kSmallPieces pieces are summed by the whole block (each group a contiguous range of
// pieces, the groups' sums then added in group order), so the longest row is not one serial chain.
// Groups of the main kernel's GROUP lanes: the fewest covering n (with 32, a bf16 fix-up at n = 32
// left 28 of 32 lanes idle and took 57 us of an 830 us SpMM on a 1M-node graph on the H100).
template <typename scalar_t, typename index_t, int VEC, int GROUP>
__global__ void __launch_bounds__(kThreads)
    spmm_split_fixup_kernel(const NativeArgs<scalar_t, index_t> a, const SplitArgs<at::opmath_type<scalar_t>> s) {
  using acc_t = at::opmath_type<scalar_t>;
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
        store_packed<scalar_t, VEC>(a.out + grow_i * a.n + c0, acc);
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
          store_packed<scalar_t, VEC>(a.out + grow_i * a.n + c0, acc);
        }
        __syncthreads();
      }
    }
  }
}

// Benchmark knobs (a sweep sets them, docs/history.md; 0 or unset: the rules below):
// SPARSETORCH_SPLIT_LANES forces the lanes per group (8, 16 or 32, i.e. the column tile),
// SPARSETORCH_SPLIT_UNIT the entries per unit; SPARSETORCH_SPLIT_OFFSETS=64 the 64-bit offsets (the tests'
// way to run the path of problems over 2^31 elements).
int64_t env_knob(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::max<int64_t>(0, std::atoll(v)) : 0;
}

// Lanes per group: the fewest (4, 8, 16, 32) covering B's width in 16-byte vectors. Measured on the
// H100 (the split route's sweep, docs/history.md; power-law 100k and 1M): narrower
// groups, more column tiles, were 1.09-2.44x slower at n = 128 and 256; wider ones (idle lanes)
// 1.26-1.96x slower at n = 32. Groups of 4 (n <= 16 in fp32, <= 32 in bf16/fp16) put twice as many
// units in flight per warp as groups of 8 with half their lanes idle.
int lanes_per_group(int64_t n_vectors) {
  const int forced = static_cast<int>(env_knob("SPARSETORCH_SPLIT_LANES"));
  if (forced == 4 || forced == 8 || forced == 16 || forced == 32) return forced;
  return n_vectors <= 4 ? 4 : row_group_size(n_vectors);
}

// Entries per unit: split::unit_entries (cuda/spmm_plans.h), from this device's SMs and threads per SM.
int64_t unit_entries(int64_t entries, int64_t rows, int64_t n, int lanes) {
  const int64_t forced = env_knob("SPARSETORCH_SPLIT_UNIT");
  if (forced > 0) return forced;
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  return split::unit_entries(entries, rows, n, lanes, prop->multiProcessorCount, prop->maxThreadsPerMultiProcessor);
}

// Whether every element offset the main kernel forms (work items and the grid-stride step past the
// last, entries, row pointers, B, out, slots; column tiles may overhang n by a tile) fits in int32.
template <typename scalar_t, typename index_t, typename acc_t>
bool offsets_fit_int32(const NativeArgs<scalar_t, index_t>& a, const SplitArgs<acc_t>& s, int64_t batch,
                       int64_t grid_groups, int64_t width) {
  const int64_t slack = width + a.n;
  const int64_t largest[] = {
      batch * s.tiles * s.units + grid_groups,
      (batch - 1) * std::max(a.col_bstride, a.val_bstride) + a.L + kPerLane,
      (batch - 1) * a.crow_bstride + a.m + 1,
      (batch - 1) * a.dense_bstride + a.k * a.ldb + slack,
      a.rows * a.n + slack,
      batch * s.units * 2 * a.n + slack,
  };
  return std::all_of(std::begin(largest), std::end(largest),
                     [](int64_t v) { return v < std::numeric_limits<int32_t>::max(); });
}

// The unit plan (spmm_split_plan_kernel) for this call. It depends on crow and E alone, so it is kept
// with the matrix's analysis (common/csr_analysis.h) and made once per unit size, batch count and
// stream (a plan is only read on the stream that wrote it); without an analysis (validate=False on
// a matrix never checked, inference tensors) or under CUDA graph capture (whose memory pool is not
// the cache's) it is made for this call.
template <typename index_t>
at::Tensor unit_plan(const CsrAnalysis* analysis, const index_t* crow, int64_t crow_bstride, int64_t m, int64_t L,
                     int64_t batch, int64_t unit, int64_t units, const at::TensorOptions& options) {
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto make = [&] {
    const at::Tensor plan = at::zeros({batch * (units + 1) * 2}, options.dtype(at::kLong));
    const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t threads_needed = std::max(batch * m, batch * (units + 1));
    const int64_t blocks = std::clamp<int64_t>(ceil_div(threads_needed, kThreads), 1, sms * 16);
    spmm_split_plan_kernel<index_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        crow, crow_bstride, m, L, batch, unit, units, plan.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return plan;
  };
  if (!analysis || at::cuda::currentStreamCaptureStatus() != at::cuda::CaptureStatus::None) return make();
  constexpr int64_t kSplitPlan = 1;  // the key's first element: which route's buffer
  const std::vector<int64_t> key{kSplitPlan, unit, batch, static_cast<int64_t>(stream.id())};
  CsrAnalysis::Derived& derived = *analysis->derived;
  const std::lock_guard<std::mutex> lock(derived.mutex);
  at::Tensor& plan = derived.buffers[key];
  if (!plan.defined()) plan = make();
  return plan;
}

template <typename scalar_t, typename index_t, int VEC, int GROUP>
void launch(const NativeArgs<scalar_t, index_t>& args, const at::Tensor& out, const CsrAnalysis* analysis) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t batch = args.rows / args.m;
  const int64_t unit = unit_entries(batch * args.L, args.rows, args.n, GROUP);
  const int64_t units = ceil_div(args.L, unit);
  const at::Tensor partial =
      at::empty({batch * units * 2 * args.n}, out.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
  const bool entries_aligned = is_aligned(args.col, kPerLane * sizeof(index_t)) &&
                               is_aligned(args.values, kPerLane * sizeof(scalar_t)) &&
                               args.col_bstride % kPerLane == 0 && args.val_bstride % kPerLane == 0;
  const at::Tensor plan =
      unit_plan(analysis, args.crow, args.crow_bstride, args.m, args.L, batch, unit, units, out.options());
  const SplitArgs<acc_t> s{unit, units, ceil_div(args.n, GROUP * VEC), partial.data_ptr<acc_t>(),
                           plan.data_ptr<int64_t>(), entries_aligned};
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int64_t items = batch * s.tiles * units;
  if (items > 0) {
    const int64_t blocks = std::min(ceil_div(items, kThreads / GROUP), sms * 64);
    const auto run = [&](auto offset) {
      spmm_split_kernel<scalar_t, index_t, decltype(offset), VEC, GROUP>
          <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args, s);
    };
    const bool narrow = env_knob("SPARSETORCH_SPLIT_OFFSETS") != 64 &&
                        offsets_fit_int32(args, s, batch, blocks * (kThreads / GROUP), GROUP * VEC);
    narrow ? run(int32_t{}) : run(int64_t{});
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int64_t fix_blocks = std::min(ceil_div(args.rows, kThreads), sms * 32);
  spmm_split_fixup_kernel<scalar_t, index_t, VEC, GROUP>
      <<<static_cast<unsigned>(fix_blocks), kThreads, 0, stream>>>(args, s);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The widest 16-byte path when B and out allow it (lanes per group from lanes_per_group), else
// one element per lane in groups of 32.
template <typename scalar_t, typename index_t>
void dispatch(const NativeArgs<scalar_t, index_t>& args, bool aligned, const at::Tensor& out,
              const CsrAnalysis* analysis) {
  constexpr int kVec = 16 / sizeof(scalar_t);
  if (!aligned) return launch<scalar_t, index_t, 1, 32>(args, out, analysis);
  switch (lanes_per_group(ceil_div(args.n, kVec))) {
    case 4:
      return launch<scalar_t, index_t, kVec, 4>(args, out, analysis);
    case 8:
      return launch<scalar_t, index_t, kVec, 8>(args, out, analysis);
    case 16:
      return launch<scalar_t, index_t, kVec, 16>(args, out, analysis);
    default:
      return launch<scalar_t, index_t, kVec, 32>(args, out, analysis);
  }
}

}  // namespace

void spmm_split(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi) {
  const auto analysis = analyze_csr(crow, col, p.k, AnalysisMode::kLookup);
  auto product_into = [&](const at::Tensor& target) {
    run_native_kernel(p, crow, col, values, dense, target, SpmmEpilogue{},
                      [&](const auto& args, bool aligned) { dispatch(args, aligned, target, analysis.get()); });
  };
  if (epi.is_identity()) return product_into(out);
  // Any other epilogue is a second pass over out, as on the cuSPARSE route. Fused into the stream,
  // where a row can end at any entry, its code made the kernel 1.7x (fp32) to 4.4x (bf16) slower than
  // the product alone on the H100 (docs/history.md, SpMM routes: split), many times
  // the pass's cost. With an accumulate (which may be out itself) the product goes to a scratch of
  // our own, scaled in place, then out = product + beta * accumulate in one pass (no other temporary).
  const bool accumulates = epi.accumulate.defined();
  const at::Tensor product = accumulates ? at::empty_like(out) : out;
  product_into(product);
  if (epi.alpha != 1.0) product.mul_(epi.alpha);
  if (accumulates) {
    at::Tensor target = out;
    at::add_out(target, product, epi.accumulate, epi.beta);
  }
  apply_bias_act(out, epi);
}

}  // namespace cuda
}  // namespace sparsetorch
