// Tiled CSR x dense kernel for long rows (pruned weights, matrices above ~1% density).
//
// The row-group kernel (spmm_native.cu) gathers one B row from L2 per stored entry; on a pruned
// 4096 x 4096 weight with n = 1024 that is ~8 TB/s of L2 traffic and caps it near 4 TFLOP/s. Here a
// block of 8 warps owns kRowsPerWarp * 8 rows of A and kTileN columns of the output and streams B
// through shared memory in tiles of 32 rows (cp.async, two stages), so each B element comes from L2
// once per block instead of once per entry that uses it.
//
// Per tile, each warp scatters the entries of its rows that fall in the tile into a small table
// (value per (row, tile row), a 32-bit mask per row) and then walks the union of the masks: one
// read of a B tile row from shared memory serves every one of the warp's rows with an entry there.
// Each lane owns kCols output columns of each row, so a B tile row is read as 16-byte accesses.
//
// Entries are consumed in storage order, so any input is handled: a row's pointer stops at its
// first entry beyond the current tile; entries of an earlier tile (unsorted columns) are multiplied
// with B read from global memory on the spot; repeated columns are summed; columns outside [0, k)
// are skipped as in the row-group kernel. Sorted, duplicate-free rows (what to_sparse_csr and
// SparseLinear produce) take only the shared-memory path.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <cstdlib>
#include <limits>

#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/spmm_kernel_args.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileK = 32;  // B rows per tile: one bit each in a 32-bit mask

template <typename scalar_t>
struct TileShape {
  static constexpr int kVec = 16 / sizeof(scalar_t);            // elements per 16-byte access
  static constexpr int kChunks = sizeof(scalar_t) == 2 ? 1 : 2;  // 16-byte accesses per lane per B row
  static constexpr int kCols = kVec * kChunks;                   // output columns per lane
  static constexpr int kTileN = 32 * kCols;                      // output columns per block
  static constexpr int kStage = kTileK * kTileN;                 // elements per shared-memory stage
};

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool copy) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = copy ? 16 : 0;  // 0: fill the 16 bytes with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

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

template <typename scalar_t, typename index_t, int ROWS, bool ALIGNED>
__global__ void __launch_bounds__(kThreads, ROWS <= 4 ? 2 : 1)
    spmm_tiled_kernel(const NativeArgs<scalar_t, index_t> a, int64_t row_blocks) {
  using acc_t = at::opmath_type<scalar_t>;
  using S = TileShape<scalar_t>;
  extern __shared__ __align__(16) unsigned char smem[];
  scalar_t* stages = reinterpret_cast<scalar_t*>(smem);                          // [2][kTileK][kTileN]
  acc_t* table = reinterpret_cast<acc_t*>(stages + 2 * S::kStage);               // [kWarps][ROWS][kTileK]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x / row_blocks;
  const int64_t first_row = (blockIdx.x - b * row_blocks) * (kWarps * ROWS) + warp * ROWS;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * S::kTileN;
  const index_t* crow_b = a.crow + b * a.crow_bstride;
  const index_t* col_b = a.col + b * a.col_bstride;
  const scalar_t* val_b = a.values + b * a.val_bstride;
  const scalar_t* dense_b = a.dense + b * a.dense_bstride;
  acc_t* my_table = table + warp * ROWS * kTileK;

  // Per row: next entry to consume, end of the row, and the column of the next entry (a hint that
  // lets a row with nothing in the current tile skip its loads; -1 = load and look).
  int64_t next[ROWS], stop[ROWS], next_col[ROWS];
  acc_t acc[ROWS][S::kCols];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    next[i] = stop[i] = 0;
    next_col[i] = -1;
    if (first_row + i < a.m) {
      const auto span = clamped_row_span(crow_b, first_row + i, a.L);
      next[i] = span.start;
      stop[i] = span.stop;
    }
#pragma unroll
    for (int c = 0; c < S::kCols; ++c) acc[i][c] = acc_t(0);
  }

  const int64_t tiles = ceil_div(a.k, kTileK);
  load_tile<scalar_t, index_t, ALIGNED>(a, dense_b, 0, n0, stages);
  cp_async_commit();
  for (int64_t t = 0; t < tiles; ++t) {
    scalar_t* stage = stages + (t & 1) * S::kStage;
    if (t + 1 < tiles) load_tile<scalar_t, index_t, ALIGNED>(a, dense_b, (t + 1) * kTileK, n0, stages + ((t + 1) & 1) * S::kStage);
    cp_async_commit();
    const int64_t k0 = t * kTileK, k_end = k0 + kTileK;

    // 1. Consume each row's entries up to its first one beyond this tile.
    unsigned row_bits[ROWS];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      row_bits[i] = 0;
      while (next[i] < stop[i] && next_col[i] < k_end) {  // warp-uniform
        const int64_t j = next[i] + lane;
        const bool have = j < stop[i];
        int64_t c = -1;
        acc_t v = acc_t(0);
        if (have) {
          c = static_cast<int64_t>(col_b[j]);
          v = static_cast<acc_t>(val_b[j]);
        }
        const bool valid = have && c >= 0 && c < a.k;
        const unsigned consumable = __ballot_sync(0xffffffffu, have && (!valid || c < k_end));
        const int run = consumable == 0xffffffffu ? 32 : __ffs(~consumable) - 1;  // leading consumable lanes
        const bool in_tile = lane < run && valid && c >= k0;
        const bool late = lane < run && valid && c < k0;
        const int slot = in_tile ? static_cast<int>(c - k0) : 0;
        const unsigned bit = in_tile ? 1u << slot : 0u;
        const unsigned bits = __reduce_or_sync(0xffffffffu, bit);
        const int count = __popc(__ballot_sync(0xffffffffu, in_tile));
        if (count == __popc(bits) && (bits & row_bits[i]) == 0) {
          if (in_tile) my_table[i * kTileK + slot] = v;
        } else {  // a column repeated in the row: sum its values
          if (in_tile && !(row_bits[i] & bit)) my_table[i * kTileK + slot] = acc_t(0);
          __syncwarp();
          if (in_tile) atomicAdd(&my_table[i * kTileK + slot], v);
        }
        row_bits[i] |= bits;
        for (unsigned pending = __ballot_sync(0xffffffffu, late); pending; pending &= pending - 1) {
          const int src = __ffs(pending) - 1;
          const int64_t cl = __shfl_sync(0xffffffffu, c, src);
          const acc_t vl = __shfl_sync(0xffffffffu, v, src);
          fma_global_row<scalar_t, index_t, ALIGNED>(a, dense_b, cl, n0, lane, vl, acc[i]);
        }
        next[i] += run;
        if (run < 32) {  // lane `run` holds the row's first entry beyond this tile, or the row ended
          next_col[i] = __shfl_sync(0xffffffffu, c, run);
          break;
        }
        next_col[i] = -1;
      }
    }

    cp_async_wait_one();  // this tile's stage has landed (the next one may still be in flight)
    __syncthreads();

    // 2. One pass over the tile rows any of the warp's rows uses.
    unsigned used = 0;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) used |= row_bits[i];
    while (used) {
      const int kk = __ffs(used) - 1;
      used &= used - 1;
      acc_t bv[S::kCols];
#pragma unroll
      for (int q = 0; q < S::kChunks; ++q) {
        Packed<scalar_t, S::kVec> p;
        p.load(stage + kk * S::kTileN + lane_column<scalar_t>(lane, q));
#pragma unroll
        for (int e = 0; e < S::kVec; ++e) bv[q * S::kVec + e] = p.get(e);
      }
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        if (row_bits[i] >> kk & 1u) {
          const acc_t v = my_table[i * kTileK + kk];
#pragma unroll
          for (int c = 0; c < S::kCols; ++c) acc[i][c] += v * bv[c];
        }
      }
    }
    __syncthreads();  // the stage is refilled and the table rewritten by the next iteration
  }
  cp_async_wait_all();  // k == 0: the first tile's copy was never waited for

#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
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

// Rows per warp: more rows share each B tile row read from shared memory (and halve the L2
// traffic for B), at the price of registers. SPARSETORCH_TILED_ROWS=4|8 overrides (benchmarks).
int rows_per_warp(int64_t mean_row_length) {
  const char* env = std::getenv("SPARSETORCH_TILED_ROWS");
  const int forced = env ? std::atoi(env) : 0;
  if (forced == 4 || forced == 8) return forced;
  return mean_row_length >= 256 ? 8 : 4;
}

template <typename scalar_t, typename index_t, int ROWS, bool ALIGNED>
void launch(const NativeArgs<scalar_t, index_t>& args) {
  using S = TileShape<scalar_t>;
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t batch = args.rows / args.m;
  const int64_t row_blocks = ceil_div(args.m, kWarps * ROWS);
  const int64_t col_blocks = ceil_div(args.n, S::kTileN);
  TORCH_CHECK(batch * row_blocks <= std::numeric_limits<int32_t>::max() && col_blocks <= 65535,
              "spmm (tiled): problem too large for one launch (", batch, " x ", args.m, " rows, n = ", args.n,
              "); use backend=\"native\"");
  const size_t smem = 2 * S::kStage * sizeof(scalar_t) + kWarps * ROWS * kTileK * sizeof(acc_t);
  auto kernel = spmm_tiled_kernel<scalar_t, index_t, ROWS, ALIGNED>;
  // Above 48 KB of dynamic shared memory must be asked for (per device, so on every launch; cheap).
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(batch * row_blocks), static_cast<unsigned>(col_blocks));
  kernel<<<grid, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(args, row_blocks);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void spmm_tiled(const SpmmProblem& p, const at::Tensor& crow_in, const at::Tensor& col_in,
                const at::Tensor& values_in, const at::Tensor& dense_in, const at::Tensor& out,
                const SpmmEpilogue& epi) {
  if (out.numel() == 0) return;
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
  const at::Tensor dense = dense_in.stride(-1) == 1 ? dense_in : dense_in.contiguous();
  const int rows = rows_per_warp(p.m > 0 ? p.nnz_stride / p.m : 0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "spmm_tiled", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "spmm_tiled", [&] {
      const auto args = make_native_args<scalar_t, index_t>(p, crow, col, values, dense, out, epi);
      if (args.rows == 0) return;
      // cp.async moves 16 bytes: B's rows must start on 16-byte boundaries.
      const bool aligned = vector_access_ok(args, TileShape<scalar_t>::kVec);
      if (rows == 8) {
        aligned ? launch<scalar_t, index_t, 8, true>(args) : launch<scalar_t, index_t, 8, false>(args);
      } else {
        aligned ? launch<scalar_t, index_t, 4, true>(args) : launch<scalar_t, index_t, 4, false>(args);
      }
    });
  });
}

}  // namespace cuda
}  // namespace sparsetorch
