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
// No preprocessing: a unit finds the row of its first entry by a GROUP-ary search over crow
// (log_{GROUP+1}(m) rounds of one load per lane; the first rounds probe the same places for every
// unit and hit L1), and of its last from a window of GROUP row pointers held one per lane, which
// it then walks row by row: a row change is a shuffle, a new window one coalesced load per
// GROUP - 1 rows. Within a row a group keeps kInFlight B rows in flight (GatheredRows).
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
constexpr int kFixupLanes = 32;   // the fix-up kernel's group size (any works: slots are per column)
constexpr int kSmallPieces = 16;  // cut rows of up to this many pieces are summed by one group, longer by a block

template <typename acc_t>
struct SplitArgs {
  int64_t unit;   // E: nominal entries per unit; rows of at most E entries are never cut
  int64_t units;  // units per batch: ceil(L / E)
  int64_t tiles;  // column tiles of GROUP * VEC columns
  acc_t* partial; // (batch, units, 2, n): sums of the pieces of cut rows
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

// At least 3 blocks of 256 per SM (<= 85 registers): bf16 took 94-110 registers, 2 blocks.
template <typename scalar_t, typename index_t, int VEC, int GROUP>
__global__ void __launch_bounds__(kThreads, 3)
    spmm_split_kernel(const NativeArgs<scalar_t, index_t> a, const SplitArgs<at::opmath_type<scalar_t>> s) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kGroups = kThreads / GROUP;
  constexpr int kWidth = GROUP * VEC;
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
    const int64_t e_lo = clamp_entry(static_cast<int64_t>(crow_b[0]), 0, a.L);
    const int64_t e_hi = clamp_entry(static_cast<int64_t>(crow_b[a.m]), e_lo, a.L);
    const int64_t nom0 = e_lo + u * s.unit, nom1 = nom0 + s.unit;
    if (nom0 >= e_hi) continue;  // past this batch's entries

    // [start, stop): the unit's entries, boundaries moved back to the start of short rows.
    RowWindow<GROUP, index_t> win;
    win.load(crow_b, row_containing<GROUP>(crow_b, 0, a.m, nom0, lane, mask), a.m, a.L, lane);
    int64_t row = win.base, row_start = win.at(0, mask), row_end = win.at(1, mask);
    const int64_t start = row_end - row_start <= s.unit ? row_start : nom0;
    int64_t stop = e_hi;
    if (nom1 < e_hi) {
      int64_t rs, re;  // the row holding entry nom1
      if (win.at(GROUP - 1, mask) > nom1) {
        const int c = min(max(__popc(__ballot_sync(mask, win.v <= nom1) & mask), 1), GROUP - 1);
        rs = win.at(c - 1, mask);
        re = win.at(c, mask);
      } else {
        const int64_t r = row_containing<GROUP>(crow_b, min(win.base + GROUP - 1, a.m - 1), a.m, nom1, lane, mask);
        rs = clamp_entry(static_cast<int64_t>(crow_b[r]), 0, a.L);
        re = clamp_entry(static_cast<int64_t>(crow_b[r + 1]), rs, a.L);
      }
      stop = re - rs <= s.unit ? rs : nom1;
    }
    if (start >= stop) continue;  // only on a malformed crow

    const index_t* col_b = a.col + b * a.col_bstride;
    const scalar_t* val_b = a.values + b * a.val_bstride;
    const scalar_t* dense_b = a.dense + b * a.dense_bstride;
    const int64_t c0 = tile * kWidth + lane * VEC;
    const bool active = c0 < a.n;
    // Row by row: the row's entries in [start, stop) as in the row-group kernel (GROUP entries per
    // chunk, kInFlight B rows in flight), then its one store. A first version walked the unit's
    // entries as one stream with the store (epilogue) inside the kInFlight-unrolled loop, at <= 2
    // blocks per SM in bf16: on the H100 bf16 was 2.0-2.5x slower than now on the power-law
    // graphs, fp32 at n = 32 up to 1.27x faster (power-law 1M); how much of that is the loop
    // structure and how much the occupancy was not separated
    // (benchmarks/results/h100/spmm_skew_cuda_v1.txt and spmm_skew_cuda.txt).
    while (true) {
      acc_t acc[VEC];
#pragma unroll
      for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
      const int64_t seg_stop = min(row_end, stop);
      for (int64_t chunk = max(row_start, start); chunk < seg_stop; chunk += GROUP) {
        const EntryChunk<GROUP, scalar_t, index_t> entries(col_b, val_b, chunk, seg_stop, lane);
        for (int t = 0; t < entries.count; t += kInFlight) {
          GatheredRows<scalar_t, VEC, kInFlight> g;
          g.template load<GROUP>(a, dense_b, mask, entries.col, entries.val, t, entries.count, c0, active);
#pragma unroll
          for (int j = 0; j < kInFlight; ++j) g.fma(j, acc);  // entries past count add zero
        }
      }
      // A whole row goes out through the epilogue, a piece of a cut row to its slot; empty rows are
      // the fix-up kernel's.
      if (active && row_start < row_end) {
        if (row_start >= start && row_end <= stop) {
          store_outputs<scalar_t, index_t, VEC>(a, (b * a.m + row) * a.n + c0, c0, acc);
        } else {
          const int slot = row_start < start ? 0 : 1;
          Vec<acc_t, VEC> piece;
#pragma unroll
          for (int q = 0; q < VEC; ++q) piece.v[q] = acc[q];
          *reinterpret_cast<Vec<acc_t, VEC>*>(s.partial + ((b * s.units + u) * 2 + slot) * a.n + c0) = piece;
        }
      }
      if (row_end >= stop || row + 1 >= a.m) break;
      ++row;
      if (row + 1 - win.base >= GROUP) win.load(crow_b, row, a.m, a.L, lane);
      row_start = row_end;
      row_end = win.at(static_cast<int>(row + 1 - win.base), mask);
    }
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
  const SplitArgs<acc_t> s{unit, units, ceil_div(args.n, GROUP * VEC), partial.data_ptr<acc_t>()};
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int64_t items = batch * s.tiles * units;
  if (items > 0) {
    const int64_t blocks = std::min(ceil_div(items, kThreads / GROUP), sms * 64);
    spmm_split_kernel<scalar_t, index_t, VEC, GROUP><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args, s);
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
