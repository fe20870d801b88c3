// Load-balanced CSR x dense kernel for skewed rows (power-law graphs, citation graphs).
//
// The row-group kernel (spmm_native.cu) gives each row to one group of lanes, so a block's time is
// its longest row: on a power-law graph one 13,503-entry row takes ~13,500 dependent gathers.
// Here a block owns kRowsPerBlock consecutive rows and splits their stored entries *evenly* among
// its groups of lanes (a merge-path split inside the block: 8 to 32 groups of 32 to 8 lanes):
// group g walks entries [s0, s1) across row boundaries. A row that lies inside one group's slice
// is finished by that group (epilogue fused); a row cut by a slice boundary leaves one partial per
// group in shared memory, and after a barrier the block adds those partials in group order
// (deterministic, no atomics) and applies the epilogue. Empty rows are written in the same step.
// Within a slice each group keeps kInFlight B rows in flight (loads issued before their FMAs), so
// long slices are not one gather latency per entry.
//
// Lanes and vectors as in the row-group kernel: a group of GROUP lanes covers GROUP * VEC output
// columns (16-byte loads when aligned); wider B gets more blocks (one column tile each), so a long
// row's work at n = 512 is spread over 4 blocks instead of 4 passes of one. Any input is handled:
// entries in any order, repeated columns add, columns outside [0, k) are skipped, row pointers are
// clamped to [0, L] and made non-decreasing, so a malformed matrix cannot fault. Batches of
// per-batch patterns are folded into the block index (blocks never straddle a batch).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <limits>
#include <type_traits>

#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/spmm_kernel_args.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 32;
constexpr int kInFlight = 4;  // B rows loaded before their FMAs, per group

// Row pointers of the block's rows into shared memory: s_crow[i] = crow[r0 + i] clamped to [0, L],
// made non-decreasing by a running maximum (a no-op on a valid matrix). Warp 0 does it: lane l
// holds entry l + 1, the start s_crow[0] is the base of the running maximum.
template <typename index_t>
__device__ __forceinline__ void load_row_pointers(const index_t* crow_b, int64_t r0, int nrows, int64_t L,
                                                  int64_t* s_crow) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  const int64_t base = min(max(static_cast<int64_t>(crow_b[r0]), int64_t(0)), L);
  int64_t v = base;
  if (lane < nrows) v = min(max(static_cast<int64_t>(crow_b[r0 + lane + 1]), base), L);
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int64_t up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v = max(v, up);
  }
  if (lane == 0) s_crow[0] = base;
  if (lane < nrows) s_crow[lane + 1] = v;
}

// The row (0 .. nrows-1) holding entry e, for s_crow[0] <= e < s_crow[nrows]: the last row whose
// start is <= e (empty rows before it are skipped because their start equals the next one's).
__device__ __forceinline__ int row_of_entry(const int64_t* s_crow, int nrows, int64_t e) {
  int lo = 0, hi = nrows;  // invariant: s_crow[lo] <= e < s_crow[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (s_crow[mid] <= e) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <typename scalar_t, typename index_t, int VEC, int GROUP>
__global__ void __launch_bounds__(kThreads) spmm_balanced_kernel(const NativeArgs<scalar_t, index_t> a,
                                                                  int64_t row_blocks, int64_t col_tiles,
                                                                  int64_t total_blocks) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kGroups = kThreads / GROUP;
  constexpr int kWidth = GROUP * VEC;  // output columns per block
  // Partials of rows cut by slice boundaries: [group][0] the group's first row when it started in
  // an earlier slice, [group][1] its last row when that continues into a later slice.
  __shared__ acc_t s_part[kGroups][2][kWidth];
  __shared__ int64_t s_crow[kRowsPerBlock + 1];

  const int group = threadIdx.x / GROUP, lane = threadIdx.x % GROUP;
  const unsigned mask = group_lane_mask<GROUP>();

  // Block index -> (batch, row block, column tile); the column tiles of one row block are adjacent
  // so they find its indices and values in L2.
  for (int64_t blk = blockIdx.x; blk < total_blocks; blk += gridDim.x) {
    const int64_t row_blk = blk / col_tiles;
    const int64_t b = row_blk / row_blocks;
    const int64_t r0 = (row_blk - b * row_blocks) * kRowsPerBlock;
    const int64_t c0 = (blk - row_blk * col_tiles) * kWidth + lane * VEC;
    const bool active = c0 < a.n;
    const int nrows = static_cast<int>(min(static_cast<int64_t>(kRowsPerBlock), a.m - r0));
    const index_t* col_b = a.col + b * a.col_bstride;
    const scalar_t* val_b = a.values + b * a.val_bstride;
    const scalar_t* dense_b = a.dense + b * a.dense_bstride;
    const int64_t out_row0 = b * a.m + r0;

    __syncthreads();  // the previous block's readers of s_crow and s_part are done
    load_row_pointers(a.crow + b * a.crow_bstride, r0, nrows, a.L, s_crow);
    __syncthreads();

    const int64_t e0 = s_crow[0], e1 = s_crow[nrows];
    const int64_t per_group = ceil_div(e1 - e0, kGroups);
    const int64_t s0 = min(e0 + group * per_group, e1), s1 = min(s0 + per_group, e1);

    acc_t acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = acc_t(0);

    // A finished piece of `row`: the whole row goes out through the epilogue; a piece of a row cut
    // by a slice boundary goes to this group's partial slot.
    auto flush = [&](int row) {
      const int64_t rs = s_crow[row], re = s_crow[row + 1];
      if (rs == re || !active) return;  // empty rows: written after the barrier
      if (rs >= s0 && re <= s1) {
        store_outputs<scalar_t, index_t, VEC>(a, (out_row0 + row) * a.n + c0, c0, acc);
      } else {
        acc_t* slot = s_part[group][rs < s0 ? 0 : 1] + lane * VEC;
#pragma unroll
        for (int v = 0; v < VEC; ++v) slot[v] = acc[v];
      }
    };

    if (s0 < s1) {
      int row = row_of_entry(s_crow, nrows, s0);
      int64_t row_end = s_crow[row + 1];
      for (int64_t chunk = s0; chunk < s1; chunk += GROUP) {
        const EntryChunk<GROUP, scalar_t, index_t> entries(col_b, val_b, chunk, s1, lane);
        const int count = entries.count;
        for (int t = 0; t < count; t += kInFlight) {
          GatheredRows<scalar_t, VEC, kInFlight> g;
          g.template load<GROUP>(a, dense_b, mask, entries.col, entries.val, t, count, c0, active);
#pragma unroll
          for (int u = 0; u < kInFlight; ++u) {
            if (t + u >= count) break;
            const int64_t e = chunk + t + u;
            while (e >= row_end) {  // entry e starts a later row: finish the current one
              flush(row);
              ++row;
              row_end = s_crow[row + 1];
#pragma unroll
              for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
            }
            g.fma(u, acc);
          }
        }
      }
      flush(row);
    }
    __syncthreads();

    // Rows cut by slice boundaries (their partials, in group order) and empty rows.
    if (active) {
      for (int row = group; row < nrows; row += kGroups) {
        const int64_t rs = s_crow[row], re = s_crow[row + 1];
#pragma unroll
        for (int q = 0; q < VEC; ++q) acc[q] = acc_t(0);
        if (rs < re) {
          const int64_t g_first = (rs - e0) / per_group, g_last = (re - 1 - e0) / per_group;
          if (g_first == g_last) continue;  // finished by its group
          for (int64_t g = g_first; g <= g_last; ++g) {
            const acc_t* slot = s_part[g][g == g_first ? 1 : 0] + lane * VEC;
#pragma unroll
            for (int q = 0; q < VEC; ++q) acc[q] += slot[q];
          }
        }
        store_outputs<scalar_t, index_t, VEC>(a, (out_row0 + row) * a.n + c0, c0, acc);
      }
    }
  }
}

template <typename scalar_t, typename index_t, int VEC, int GROUP>
void launch(const NativeArgs<scalar_t, index_t>& args, std::integral_constant<int, VEC>,
            std::integral_constant<int, GROUP>) {
  const int64_t row_blocks = ceil_div(args.m, kRowsPerBlock);
  const int64_t col_tiles = ceil_div(args.n, GROUP * VEC);
  const int64_t total_blocks = (args.rows / args.m) * row_blocks * col_tiles;
  const int64_t grid = std::min<int64_t>(total_blocks, std::numeric_limits<int>::max());
  spmm_balanced_kernel<scalar_t, index_t, VEC, GROUP><<<static_cast<unsigned>(grid), kThreads, 0,
                                                        at::cuda::getCurrentCUDAStream()>>>(
      args, row_blocks, col_tiles, total_blocks);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void spmm_balanced(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                   const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi) {
  run_row_group_kernel(p, crow, col, values, dense, out, epi,
                       [](const auto& args, auto vec, auto group) { launch(args, vec, group); });
}

}  // namespace cuda
}  // namespace sparsetorch
