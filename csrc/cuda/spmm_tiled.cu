// Tiled CSR x dense kernel for long rows (pruned weights, matrices above ~1% density).
//
// The row-group kernel (spmm_native.cu) gathers one B row from L2 per stored entry; on a pruned
// 4096 x 4096 weight with n = 1024 that is ~8 TB/s of L2 traffic and caps it near 4 TFLOP/s. Here a
// block of 16 warps owns 32 rows of A (2 per warp) and kTileN columns of the output, and streams B
// through shared memory in tiles of 32 rows (cp.async, two stages): each B element comes from L2
// once per block instead of once per entry that uses it. Each lane owns kCols output columns of
// each of its warp's rows and reads a B tile row as 16-byte shared-memory accesses.
//
// A row's entries are consumed in storage order from a 32-entry chunk cached in registers (one
// entry per lane, broadcast by shuffles), up to the first entry beyond the current tile, so any
// input is handled: entries of an earlier tile (unsorted columns) are multiplied with B read from
// global memory on the spot, repeated columns simply add, and columns outside [0, k) are skipped as
// in the row-group kernel. Sorted rows (to_sparse_csr, SparseLinear) take only the shared-memory path.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <limits>

#include "cuda/cp_async.cuh"
#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/spmm_kernel_args.cuh"
#include "cuda/spmm_plans.h"

namespace sparsetorch {
namespace cuda {
namespace {

// Sizes (warps, rows per block, the column tile and the stages): cuda/spmm_plans.h.
using namespace tiled;
template <typename scalar_t>
using TileShape = Shape<static_cast<int>(sizeof(scalar_t))>;

// Column of lane's chunk q within the block's column tile.
template <typename scalar_t>
__device__ __forceinline__ int lane_column(int lane, int q) {
  using S = TileShape<scalar_t>;
  return q * 32 * S::kVec + lane * S::kVec;
}

// B rows [k0, k0 + kTileK) x columns [n0, n0 + kTileN) into `stage`; zeros outside B.
template <typename scalar_t, typename index_t, bool ALIGNED>
__device__ __forceinline__ void load_tile(const NativeArgs<scalar_t, index_t>& a, const scalar_t* dense_b,
                                          int64_t k0, int64_t n0, scalar_t* stage) {
  using S = TileShape<scalar_t>;
  if constexpr (ALIGNED) {
    constexpr int kPerRow = S::kTileN / S::kVec;
    for (int i = threadIdx.x; i < kTileK * kPerRow; i += kThreads) {
      const int kk = i / kPerRow, cc = (i % kPerRow) * S::kVec;
      const bool inside = k0 + kk < a.k && n0 + cc < a.n;
      const scalar_t* src = inside ? dense_b + (k0 + kk) * a.ldb + n0 + cc : dense_b;
      cp_async_16(stage + kk * S::kTileN + cc, src, inside);
    }
  } else {
    for (int i = threadIdx.x; i < S::kStage; i += kThreads) {
      const int kk = i / S::kTileN, cc = i % S::kTileN;
      const bool inside = k0 + kk < a.k && n0 + cc < a.n;
      stage[i] = inside ? dense_b[(k0 + kk) * a.ldb + n0 + cc] : scalar_t(0);
    }
  }
}

// acc += v * B[c, lane's columns], B read from global memory (entries out of column order).
template <typename scalar_t, typename index_t, bool ALIGNED>
__device__ __forceinline__ void fma_global_row(const NativeArgs<scalar_t, index_t>& a, const scalar_t* dense_b,
                                               int64_t c, int64_t n0, int lane, at::opmath_type<scalar_t> v,
                                               at::opmath_type<scalar_t>* acc) {
  using S = TileShape<scalar_t>;
  const scalar_t* brow = dense_b + c * a.ldb + n0;
#pragma unroll
  for (int q = 0; q < S::kChunks; ++q) {
    const int col = lane_column<scalar_t>(lane, q);
    if constexpr (ALIGNED) {
      if (n0 + col < a.n) {
        Packed<scalar_t, S::kVec> b;
        b.load(brow + col);
#pragma unroll
        for (int e = 0; e < S::kVec; ++e) acc[q * S::kVec + e] += v * b.get(e);
      }
    } else {
#pragma unroll
      for (int e = 0; e < S::kVec; ++e) {
        if (n0 + col + e < a.n) acc[q * S::kVec + e] += v * static_cast<at::opmath_type<scalar_t>>(brow[col + e]);
      }
    }
  }
}

// Refills a row's cached chunk: lane l holds stored entry base + l (column, value), or nothing past
// the row's end.
template <typename scalar_t, typename index_t>
__device__ __forceinline__ void load_chunk(const index_t* col_b, const scalar_t* val_b, int64_t base, int64_t stop,
                                           int lane, int64_t& col, at::opmath_type<scalar_t>& val) {
  const int64_t j = base + lane;
  col = j < stop ? static_cast<int64_t>(col_b[j]) : int64_t(-1);
  val = j < stop ? static_cast<at::opmath_type<scalar_t>>(val_b[j]) : at::opmath_type<scalar_t>(0);
}

template <typename scalar_t, typename index_t, bool ALIGNED>
__global__ void __launch_bounds__(kThreads, 2) spmm_tiled_kernel(const NativeArgs<scalar_t, index_t> a, int64_t row_blocks) {
  using acc_t = at::opmath_type<scalar_t>;
  using S = TileShape<scalar_t>;
  constexpr unsigned kAll = 0xffffffffu;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* stages = reinterpret_cast<scalar_t*>(smem);  // [2][kTileK][kTileN]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x / row_blocks;
  const int64_t first_row = (blockIdx.x - b * row_blocks) * kRowsPerBlock + warp * kRowsPerWarp;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * S::kTileN;
  const index_t* crow_b = a.crow + b * a.crow_bstride;
  const index_t* col_b = a.col + b * a.col_bstride;
  const scalar_t* val_b = a.values + b * a.val_bstride;
  const scalar_t* dense_b = a.dense + b * a.dense_bstride;

  // Per row: a chunk of 32 stored entries cached in registers (lane l: entry base + l), the first
  // unconsumed lane `pos` (32 = chunk used up) and the row's end.
  int64_t base[kRowsPerWarp], stop[kRowsPerWarp], chunk_col[kRowsPerWarp];
  acc_t chunk_val[kRowsPerWarp];
  int pos[kRowsPerWarp];
  acc_t acc[kRowsPerWarp][S::kCols];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    base[i] = stop[i] = 0;
    if (first_row + i < a.m) {
      const auto span = clamped_row_span(crow_b, first_row + i, a.L);
      base[i] = span.start - 32;  // the first refill moves it to the row's start
      stop[i] = span.stop;
    }
    pos[i] = 32;
    chunk_col[i] = -1;
    chunk_val[i] = acc_t(0);
#pragma unroll
    for (int c = 0; c < S::kCols; ++c) acc[i][c] = acc_t(0);
  }

  const int64_t tiles = ceil_div(a.k, kTileK);
  load_tile<scalar_t, index_t, ALIGNED>(a, dense_b, 0, n0, stages);
  cp_async_commit();
  for (int64_t t = 0; t < tiles; ++t) {
    const scalar_t* stage = stages + (t & 1) * S::kStage;
    if (t + 1 < tiles) {
      load_tile<scalar_t, index_t, ALIGNED>(a, dense_b, (t + 1) * kTileK, n0, stages + ((t + 1) & 1) * S::kStage);
    }
    cp_async_commit();
    const int64_t k0 = t * kTileK, k_end = k0 + kTileK;

    // Used-up chunks are refilled before waiting for the tile, all rows' loads in flight together.
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (pos[i] == 32 && base[i] + 32 < stop[i]) {
        base[i] += 32;
        pos[i] = 0;
        load_chunk<scalar_t, index_t>(col_b, val_b, base[i], stop[i], lane, chunk_col[i], chunk_val[i]);
      }
    }
    cp_async_wait_one();  // this tile's stage has landed (the next one may still be in flight)
    __syncthreads();

#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      // Consume the row's entries in storage order up to its first one beyond this tile.
      while (base[i] + pos[i] < stop[i]) {  // warp-uniform
        if (pos[i] == 32) {  // more than a chunk falls in this tile
          base[i] += 32;
          pos[i] = 0;
          load_chunk<scalar_t, index_t>(col_b, val_b, base[i], stop[i], lane, chunk_col[i], chunk_val[i]);
        }
        const int64_t c = chunk_col[i];
        const bool have = base[i] + lane < stop[i];
        const bool valid = have && c >= 0 && c < a.k;
        const unsigned consumable = __ballot_sync(kAll, lane < pos[i] || (have && (!valid || c < k_end)));
        const int end = consumable == kAll ? 32 : __ffs(~consumable) - 1;
        const bool mine = lane >= pos[i] && lane < end;
        // Shared-memory offset of the entry's B row, or -1 (invalid column, or an earlier tile's).
        const int offset = mine && valid && c >= k0 ? static_cast<int>(c - k0) * S::kTileN : -1;
#pragma unroll 4
        for (int e = pos[i]; e < end; ++e) {
          const int off = __shfl_sync(kAll, offset, e);
          const acc_t v = __shfl_sync(kAll, chunk_val[i], e);
          if (off < 0) continue;
#pragma unroll
          for (int q = 0; q < S::kChunks; ++q) {
            Packed<scalar_t, S::kVec> bv;
            bv.load(stage + off + lane_column<scalar_t>(lane, q));
#pragma unroll
            for (int x = 0; x < S::kVec; ++x) acc[i][q * S::kVec + x] += v * bv.get(x);
          }
        }
        // Entries whose column belongs to an earlier tile (unsorted rows): B from global memory.
        for (unsigned late = __ballot_sync(kAll, mine && valid && c < k0); late; late &= late - 1) {
          const int src = __ffs(late) - 1;
          const int64_t cl = __shfl_sync(kAll, c, src);
          const acc_t vl = __shfl_sync(kAll, chunk_val[i], src);
          fma_global_row<scalar_t, index_t, ALIGNED>(a, dense_b, cl, n0, lane, vl, acc[i]);
        }
        pos[i] = end;
        if (end < 32) break;  // lane `end` holds an entry beyond this tile, or the row ended
      }
    }
    __syncthreads();  // the next iteration refills this stage
  }
  cp_async_wait_all();  // k == 0: the first tile's copy was never waited for

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t r = first_row + i;
    if (r >= a.m) break;
    const int64_t out_row = (b * a.m + r) * a.n;
#pragma unroll
    for (int q = 0; q < S::kChunks; ++q) {
      const int64_t c0 = n0 + lane_column<scalar_t>(lane, q);
      if constexpr (ALIGNED) {
        if (c0 < a.n) store_outputs<scalar_t, index_t, S::kVec>(a, out_row + c0, c0, acc[i] + q * S::kVec);
      } else {
#pragma unroll
        for (int e = 0; e < S::kVec; ++e) {
          if (c0 + e < a.n) store_outputs<scalar_t, index_t, 1>(a, out_row + c0 + e, c0 + e, acc[i] + q * S::kVec + e);
        }
      }
    }
  }
}

template <bool ALIGNED, typename scalar_t, typename index_t>
void launch(const NativeArgs<scalar_t, index_t>& args) {
  using S = TileShape<scalar_t>;
  const int64_t batch = args.rows / args.m;
  const int64_t row_blocks = ceil_div(args.m, kRowsPerBlock);
  const int64_t col_blocks = ceil_div(args.n, S::kTileN);
  TORCH_CHECK(batch * row_blocks <= std::numeric_limits<int32_t>::max() && col_blocks <= 65535,
              "spmm (tiled): problem too large for one launch (", batch, " x ", args.m, " rows, n = ", args.n,
              "); use backend=\"native\"");
  const size_t smem = static_cast<size_t>(S::kSmem);
  auto kernel = spmm_tiled_kernel<scalar_t, index_t, ALIGNED>;
  // Above 48 KB of dynamic shared memory must be asked for (per device, so on every launch; cheap).
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(batch * row_blocks), static_cast<unsigned>(col_blocks));
  kernel<<<grid, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(args, row_blocks);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void spmm_tiled(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi) {
  // cp.async moves 16 bytes: unaligned B rows take the scalar tile loader.
  run_native_kernel(p, crow, col, values, dense, out, epi, [](const auto& args, bool aligned) {
    aligned ? launch<true>(args) : launch<false>(args);
  });
}

}  // namespace cuda
}  // namespace sparsetorch
