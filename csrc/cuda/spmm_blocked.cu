// SpMM with A in the strip layout (common/blocked_layout.h), float32, for SpmmPlan's "blocked"
// route: pruned weights of ~5-35% density, where the CSR routes lose to dense SGEMM.
//
// Why a layout of its own: a CSR kernel multiplies each B element it loads into one output row, so
// it is bound by shared-memory bandwidth (32 floats per clock per SM against 128 FMAs: 25% of the FP32
// peak on Hopper). Here a B element loaded feeds every pair of rows of an 8-row strip with an entry
// in its column (3.9 FMAs at 25% density); a pair with one entry multiplies one zero (57% of the FMAs
// useful at 25%).
//
// The kernel: a thread block owns one tile (16 strips = 128 rows) x 256 columns of the output; each
// of its 16 warps owns one strip and keeps 8 rows x 8 columns of sums per lane in registers (a lane
// holds columns 4*lane.. and 128 + 4*lane..). For each 64-row chunk of B, the 64 x 256 tile of B and
// the tile's blocks and pairs of that chunk (contiguous in the layout) are copied to shared memory
// with cp.async, double-buffered, one __syncthreads per chunk. A warp then walks its strip's 15 runs
// (one per pattern) with code specialised to the pattern: per block it reads the column (broadcast)
// and two float4 of the B row, then per stored pair one float2 (broadcast) and 16 FMAs. When the
// output has fewer thread blocks than the GPU has SMs (B narrow, A short), the chunks are split
// among up to 8 thread blocks per output tile and their partial products summed after.
// Measured on the H200 (docs/history.md, SpMM routes):
// 4096 x 4096 @ 4096 x 1024 at 25% density 591 us per call = 1.16x cuBLAS SGEMM, 70% of its
// shared-memory bound (9 wavefronts per block + 1 per pair per 256 columns); n = 256 (4 splits)
// 1.09x. What limits it: ~10% waiting at the per-chunk barrier for the busiest strip.
#include <ATen/cuda/CUDAContext.h>
#include <algorithm>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/activation.h"
#include "common/blocked_layout.h"
#include "common/csr_analysis.h"
#include "cuda/cp_async.cuh"
#include "cuda/spmm_cuda.h"
#include "cuda/spmm_plans.h"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

// Sizes and the split plan: cuda/spmm_plans.h.
using namespace blocked;
// Blocks of one run are unrolled by this much (2 was 3-4% faster than 1 on the H200 prototype).
constexpr int kUnroll = 2;

static_assert(kStripRows == 8 && kF4PerLane == 2, "a lane keeps 8 rows x 8 columns");
static_assert(kThreads % kF4PerRow == 0 && kChunk % (kThreads / kF4PerRow) == 0, "whole B rows per copy pass");

struct BlockedArgs {
  const int* block_ptr;  // run_ptr row 0
  const int* pair_ptr;   // run_ptr row 1
  const int* block_col;
  const float2* pair_values;
  const float* b;  // (k, n) row-major, n % 4 == 0, 16-byte aligned
  float* out;      // (m, n) row-major; with splits, (splits, m, n): one partial product per split
  int64_t m, k, n;
  int chunks, blocks, pairs;
  float alpha;
  int chunks_per_split;  // thread blocks (.., .., z) multiply chunks [z * chunks_per_split, ..)
};

// One run: the blocks [b0, b1) of pattern P of a warp's strip, their pairs from p0 on (all staged).
template <int P>
__device__ __forceinline__ void multiply_run(float (&acc)[kStripRows][kF4PerLane * 4], const float4* b_tile,
                                             const int* cols, const float2* pairs, int b0, int b1, int p0,
                                             int staged_pairs, int lane) {
  constexpr int kPairs = pattern_pairs(P);
  b1 = min(b1, b0 + (staged_pairs - p0) / kPairs);  // a bad layout cannot read past the staged pairs (p0 <= staged)
  const float2* pv = pairs + p0;
#pragma unroll kUnroll
  for (int e = b0; e < b1; ++e) {
    const float4* b_row = b_tile + (cols[e] & (kChunk - 1)) * kF4PerRow + lane;  // stays in the stage
    const float4 bv[kF4PerLane] = {b_row[0], b_row[32]};
    int stored = 0;
#pragma unroll
    for (int j = 0; j < kStripPairs; ++j) {
      if (P >> j & 1) {  // resolved at compile time
        const float2 a = pv[stored++];
#pragma unroll
        for (int h = 0; h < kF4PerLane; ++h) {
          float* top = acc[2 * j] + 4 * h;
          float* bottom = acc[2 * j + 1] + 4 * h;
          top[0] = fmaf(a.x, bv[h].x, top[0]);
          top[1] = fmaf(a.x, bv[h].y, top[1]);
          top[2] = fmaf(a.x, bv[h].z, top[2]);
          top[3] = fmaf(a.x, bv[h].w, top[3]);
          bottom[0] = fmaf(a.y, bv[h].x, bottom[0]);
          bottom[1] = fmaf(a.y, bv[h].y, bottom[1]);
          bottom[2] = fmaf(a.y, bv[h].z, bottom[2]);
          bottom[3] = fmaf(a.y, bv[h].w, bottom[3]);
        }
      }
    }
    pv += kPairs;
  }
}

// The 15 runs of a strip, patterns 1..15 (pattern 0 stores nothing).
template <int P = 1>
__device__ __forceinline__ void multiply_strip(float (&acc)[kStripRows][kF4PerLane * 4], const float4* b_tile,
                                               const int* cols, const float2* pairs, const int* block_start,
                                               const int* pair_start, int staged_pairs, int lane) {
  if constexpr (P < kPatterns) {
    multiply_run<P>(acc, b_tile, cols, pairs, block_start[P], block_start[P + 1], pair_start[P], staged_pairs, lane);
    multiply_strip<P + 1>(acc, b_tile, cols, pairs, block_start, pair_start, staged_pairs, lane);
  }
}

__global__ void __launch_bounds__(kThreads) spmm_blocked_kernel(const BlockedArgs a) {
  extern __shared__ float4 smem[];
  float4* b_stage = smem;                                                   // [kStages][kBStage]
  float2* p_stage = reinterpret_cast<float2*>(b_stage + kStages * kBStage);  // [kStages][kMaxPairs]
  int* c_stage = reinterpret_cast<int*>(p_stage + kStages * kMaxPairs);      // [kStages][kMaxBlocks]
  int* rb_stage = c_stage + kStages * kMaxBlocks;                           // [kStages][kRuns + 1]
  int* rp_stage = rb_stage + kStages * (kRuns + 1);                         // [kStages][kRuns + 1]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tile = blockIdx.y;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileCols;
  // A thread copies the same float4 column of B in every chunk, rows b_row0, b_row0 + 8, ...: its
  // source pointer advances by 8 rows per copy (32-bit index math per copy instead of 64-bit made
  // the prototype 4% faster at 25% density).
  constexpr int kRowsPerPass = kThreads / kF4PerRow;  // 8
  const int b_row0 = threadIdx.x / kF4PerRow, b_col4 = threadIdx.x % kF4PerRow;
  const bool b_col_in = n0 + 4 * b_col4 < a.n;
  const float* b_thread = a.b + b_row0 * a.n + n0 + 4 * b_col4;

  // Copies chunk `chunk` of B (zeros past row k or column n) and the tile's blocks and pairs of it.
  auto stage = [&](int chunk, int s) {
    const int64_t run0 = (static_cast<int64_t>(tile) * a.chunks + chunk) * kRuns;
    // Spans clamped to the arrays: a layout built from a CSR never needs it.
    const int first_b = min(max(__ldg(a.block_ptr + run0), 0), a.blocks);
    const int first_p = min(max(__ldg(a.pair_ptr + run0), 0), a.pairs);
    const int nb = min(max(min(__ldg(a.block_ptr + run0 + kRuns), a.blocks) - first_b, 0), kMaxBlocks);
    const int np = min(max(min(__ldg(a.pair_ptr + run0 + kRuns), a.pairs) - first_p, 0), kMaxPairs);
    const int64_t rows_left = a.k - static_cast<int64_t>(chunk) * kChunk;
    const int rows_in = rows_left < kChunk ? static_cast<int>(rows_left) : kChunk;
    const float* src = b_thread + static_cast<int64_t>(chunk) * kChunk * a.n;
    float4* dst = b_stage + s * kBStage + threadIdx.x;
#pragma unroll
    for (int pass = 0; pass < kChunk / kRowsPerPass; ++pass) {
      cp_async_16(dst, src, b_col_in && b_row0 + pass * kRowsPerPass < rows_in);  // else zeros
      src += kRowsPerPass * a.n;
      dst += kThreads;
    }
    for (int i = threadIdx.x; i < nb; i += kThreads) cp_async_4(c_stage + s * kMaxBlocks + i, a.block_col + first_b + i);
    for (int i = threadIdx.x; i < np; i += kThreads) cp_async_8(p_stage + s * kMaxPairs + i, a.pair_values + first_p + i);
    if (threadIdx.x <= kRuns) {
      rb_stage[s * (kRuns + 1) + threadIdx.x] = min(max(__ldg(a.block_ptr + run0 + threadIdx.x) - first_b, 0), nb);
      rp_stage[s * (kRuns + 1) + threadIdx.x] = min(max(__ldg(a.pair_ptr + run0 + threadIdx.x) - first_p, 0), np);
    }
    cp_async_commit();
  };

  float acc[kStripRows][kF4PerLane * 4];
#pragma unroll
  for (int r = 0; r < kStripRows; ++r)
#pragma unroll
    for (int q = 0; q < kF4PerLane * 4; ++q) acc[r][q] = 0.f;

  const int first_chunk = blockIdx.z * a.chunks_per_split;
  const int end_chunk = min(a.chunks, first_chunk + a.chunks_per_split);
  if (first_chunk < end_chunk) stage(first_chunk, 0);
  for (int chunk = first_chunk; chunk < end_chunk; ++chunk) {
    cp_async_wait_all();
    __syncthreads();  // chunk's stage is complete, and every warp is done with the other stage
    const int s = (chunk - first_chunk) & 1;
    if (chunk + 1 < end_chunk) stage(chunk + 1, s ^ 1);
    const int* pair_start = rp_stage + s * (kRuns + 1);  // its last entry is the count of staged pairs
    multiply_strip(acc, b_stage + s * kBStage, c_stage + s * kMaxBlocks, p_stage + s * kMaxPairs,
                   rb_stage + s * (kRuns + 1) + warp * kPatterns, pair_start + warp * kPatterns, pair_start[kRuns],
                   lane);
  }
  float* out = a.out + blockIdx.z * a.m * a.n;
#pragma unroll
  for (int r = 0; r < kStripRows; ++r) {
    const int64_t row = (static_cast<int64_t>(tile) * kTileStrips + warp) * kStripRows + r;
    if (row >= a.m) break;
#pragma unroll
    for (int h = 0; h < kF4PerLane; ++h) {
      const int64_t col = n0 + (h * 32 + lane) * 4;
      if (col < a.n) {
        const float* x = acc[r] + h * 4;
        *reinterpret_cast<float4*>(out + row * a.n + col) =
            make_float4(a.alpha * x[0], a.alpha * x[1], a.alpha * x[2], a.alpha * x[3]);
      }
    }
  }
}

at::Tensor spmm_blocked_cuda(const at::Tensor& crow, const at::Tensor& col_indices, const at::Tensor& values,
                             const at::Tensor& run_ptr, const at::Tensor& block_col, const at::Tensor& pair_values,
                             const at::Tensor& dense, double alpha, const std::optional<at::Tensor>& accumulate,
                             double beta, const std::optional<at::Tensor>& bias, c10::string_view activation,
                             double negative_slope) {
  const SpmmProblem p = check_blocked_args(crow, col_indices, values, run_ptr, block_col, pair_values, dense,
                                           accumulate, bias);
  checked_csr(crow, col_indices, p.k, /*validate=*/true, "spmm_blocked");  // SpmmPlan checked it: a cache hit
  const SpmmEpilogue epi = make_epilogue(alpha, beta, accumulate.has_value() ? accumulate->contiguous() : at::Tensor(),
                                         bias, activation, negative_slope);
  const c10::cuda::CUDAGuard guard(dense.device());
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  // The route's availability (spmm_route_available) says the same; SpmmPlan asks it before it builds the layout.
  TORCH_CHECK(static_cast<int64_t>(prop->sharedMemPerBlockOptin) >= kSharedBytes, "spmm_blocked: needs ", kSharedBytes,
              " bytes of shared memory per block (an H100 or H200 offers 227 KB); this GPU offers ",
              prop->sharedMemPerBlockOptin);
  // The kernel reads B and writes out as float4: rows of a multiple of 4 floats, 16-byte aligned.
  const int64_t n4 = (p.n + 3) / 4 * 4;
  at::Tensor b = dense;
  if (n4 != p.n || !dense.is_contiguous() || reinterpret_cast<uintptr_t>(dense.data_ptr()) % 16 != 0) {
    b = at::zeros({p.k, n4}, dense.options());
    b.narrow(1, 0, p.n).copy_(dense);
  }
  at::Tensor out = at::empty({p.m, n4}, dense.options());
  // Fewer thread blocks than SMs (narrow B, few rows): the chunks are split among thread blocks, each
  // writes its partial product to a workspace, summed after in split order (deterministic).
  const int64_t chunks = blocked_chunks(p.k);
  const int64_t tiles = blocked_tiles(p.m), column_tiles = (n4 + kTileCols - 1) / kTileCols;
  const int64_t splits = blocked::splits(p.m, n4, p.k, prop->multiProcessorCount);
  const int64_t chunks_per_split = (chunks + splits - 1) / splits;
  const at::Tensor ptr_c = run_ptr.contiguous(), col_c = block_col.contiguous();
  at::Tensor val_c = pair_values.contiguous();
  if (reinterpret_cast<uintptr_t>(val_c.data_ptr()) % 8 != 0) val_c = val_c.clone();  // pairs copied 8 bytes at a time
  if (p.m > 0 && n4 > 0) {
    TORCH_CHECK_VALUE(tiles < 65536, "spmm_blocked: at most ", 65535 * kTileStrips * kStripRows, " rows, got ", p.m);
    const at::Tensor partials = splits > 1 ? at::empty({splits, p.m, n4}, dense.options()) : out;
    BlockedArgs args{ptr_c.data_ptr<int>(),
                     ptr_c.data_ptr<int>() + ptr_c.size(1),
                     col_c.data_ptr<int>(),
                     reinterpret_cast<const float2*>(val_c.data_ptr<float>()),
                     b.data_ptr<float>(),
                     partials.data_ptr<float>(),
                     p.m, p.k, n4,
                     static_cast<int>(chunks),
                     static_cast<int>(col_c.size(0)),
                     static_cast<int>(val_c.size(0)),
                     static_cast<float>(alpha),
                     static_cast<int>(chunks_per_split)};
    C10_CUDA_CHECK(cudaFuncSetAttribute(spmm_blocked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSharedBytes)));
    spmm_blocked_kernel<<<dim3(static_cast<unsigned>(column_tiles), static_cast<unsigned>(tiles),
                               static_cast<unsigned>(splits)),
                          kThreads, kSharedBytes, at::cuda::getCurrentCUDAStream()>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (splits > 1) at::sum_out(out, partials, 0);
  }
  if (n4 != p.n) out = out.narrow(1, 0, p.n).contiguous();
  if (epi.accumulate.defined()) out.add_(epi.accumulate, beta);
  apply_bias_act(out, epi);
  // A pair multiplies its zero too (0 * inf = NaN where the sparse routes skip the position): the
  // row-group kernel recomputes the output on the device when B holds a NaN or an infinity.
  if (p.m > 0 && p.n > 0 && p.k > 0) {
    spmm_native_if(p, crow.contiguous(), col_indices.contiguous(), values.contiguous(), dense, out, epi,
                   nonfinite_flag(dense, 1, p.k, p.n));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("spmm_blocked", SPARSETORCH_CUDA_OP(spmm_blocked_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
