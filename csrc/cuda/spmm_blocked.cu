// SpMM with A in the 4-row blocked layout (common/blocked_layout.h), float32, for SpmmPlan's
// "blocked" route: pruned weights of 10-30% density, where every other sparse route loses to dense
// SGEMM.
//
// Why a layout of its own: a CSR kernel multiplies each B element it loads into one output row, so
// it is bound by shared-memory bandwidth (32 floats per clock per SM against 128 FMAs: 25% of the FP32
// peak on Hopper). A block of four rows x one column lets each B element loaded feed four FMAs, at
// the price of the zeros in the block: at 25% density a block holds 1.46 entries, so 37% of the
// FMAs are useful, but the kernel is no longer capped at 25% of the peak.
//
// The kernel: a thread block owns one tile (32 groups = 128 rows) x 256 columns of the output; its
// 16 warps own two groups each and keep 2 x 4 rows x 8 columns of sums in registers (a lane holds
// columns 4*lane.. and 128 + 4*lane..). For each 64-row chunk of B, the 64 x 256 tile of B and the
// tile's blocks of that chunk (contiguous in the layout) are copied to shared memory with cp.async,
// double-buffered, one __syncthreads per chunk. Per block a warp reads the column and four values
// (broadcast) and two float4 of the B row, then issues 32 FMAs.
// Measured on the H200 (benchmarks/results/h200/spmm_blocked_cuda.txt, NOTES.md "The blocked route"):
// 4096 x 4096 @ 4096 x 1024 at 25% density 0.72-0.75 ms against 0.68 ms for cuBLAS SGEMM, 1.03x SGEMM
// at 20%, 1.56x at 10%; ncu (prototype): 69% of issue slots busy, L1/shared 76% busy (10 shared
// wavefronts per block against 8 cycles of FMAs), ~9% lost to uneven work at the per-chunk barrier.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/activation.h"
#include "common/blocked_layout.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kWarps = 16;
constexpr int kGroupsPerWarp = kTileGroups / kWarps;  // 2
constexpr int kThreads = kWarps * 32;
constexpr int kTileCols = 256;                         // output columns per thread block
constexpr int kF4PerRow = kTileCols / 4;               // float4 per staged B row
constexpr int kF4PerLane = kTileCols / 128;            // float4 of a B row per lane (2)
constexpr int kBStage = kChunkCols * kF4PerRow;        // float4s of B per stage
constexpr int kEStage = kTileGroups * kChunkCols;      // blocks per stage (at most)
constexpr int kStages = 2;
// B tiles, then block values (float4), then block columns (int), then the 33 span starts; per stage.
constexpr size_t kSharedBytes = kStages * (kBStage * sizeof(float4) + kEStage * (sizeof(float4) + sizeof(int)) +
                                           (kTileGroups + 1) * sizeof(int));

static_assert(kBlockRows == 4, "one float4 of values per block");
static_assert(kTileGroups % kWarps == 0, "whole groups per warp");

struct BlockedArgs {
  const int* tile_ptr;
  const int* block_col;
  const float4* block_values;
  const float* b;  // (k, n) row-major, n % 4 == 0, 16-byte aligned
  float* out;      // (m, n) row-major
  int64_t m, k, n, chunks;
  float alpha;
};

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src));
}

__global__ void __launch_bounds__(kThreads) spmm_blocked_kernel(const BlockedArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ float4 smem[];
  float4* b_stage = smem;                                  // [kStages][kBStage]
  float4* v_stage = b_stage + kStages * kBStage;           // [kStages][kEStage]
  int* c_stage = reinterpret_cast<int*>(v_stage + kStages * kEStage);  // [kStages][kEStage]
  int* p_stage = c_stage + kStages * kEStage;              // [kStages][kTileGroups + 1]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = blockIdx.y;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileCols;

  // Copies chunk `chunk` of B (zeros past row k or column n) and the tile's blocks of that chunk.
  auto stage = [&](int64_t chunk, int s) {
    const int* span = a.tile_ptr + (tile * a.chunks + chunk) * kTileGroups;
    const int first = __ldg(span), last = __ldg(span + kTileGroups);
    for (int i = threadIdx.x; i < kBStage; i += kThreads) {
      const int64_t kk = chunk * kChunkCols + i / kF4PerRow, col = n0 + (i % kF4PerRow) * 4;
      float4* dst = b_stage + s * kBStage + i;
      if (kk < a.k && col < a.n) {
        cp_async16(dst, a.b + kk * a.n + col);
      } else {
        *dst = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    const int count = min(max(last - first, 0), kEStage);  // a layout built from a CSR never exceeds it
    for (int i = threadIdx.x; i < count; i += kThreads) {
      cp_async16(v_stage + s * kEStage + i, a.block_values + first + i);
      cp_async4(c_stage + s * kEStage + i, a.block_col + first + i);
    }
    if (threadIdx.x <= kTileGroups) {
      p_stage[s * (kTileGroups + 1) + threadIdx.x] = min(max(__ldg(span + threadIdx.x) - first, 0), count);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  float acc[kGroupsPerWarp][kBlockRows][kF4PerLane * 4];
#pragma unroll
  for (int g = 0; g < kGroupsPerWarp; ++g)
#pragma unroll
    for (int r = 0; r < kBlockRows; ++r)
#pragma unroll
      for (int q = 0; q < kF4PerLane * 4; ++q) acc[g][r][q] = 0.f;

  if (a.chunks > 0) stage(0, 0);
  for (int64_t chunk = 0; chunk < a.chunks; ++chunk) {
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();  // chunk's stage is complete, and every warp is done with the other stage
    if (chunk + 1 < a.chunks) stage(chunk + 1, (chunk + 1) & 1);
    const int s = chunk & 1;
    const float4* b_tile = b_stage + s * kBStage;
    const float4* vals = v_stage + s * kEStage;
    const int* cols = c_stage + s * kEStage;
    const int* spans = p_stage + s * (kTileGroups + 1);
#pragma unroll
    for (int g = 0; g < kGroupsPerWarp; ++g) {
      const int group = warp * kGroupsPerWarp + g;
      const int begin = spans[group], end = spans[group + 1];
#pragma unroll 4
      for (int e = begin; e < end; ++e) {
        const float4 v = vals[e];
        const float av[kBlockRows] = {v.x, v.y, v.z, v.w};
        const float4* b_row = b_tile + (cols[e] & (kChunkCols - 1)) * kF4PerRow + lane;  // stays in the stage
#pragma unroll
        for (int h = 0; h < kF4PerLane; ++h) {
          const float4 bv = b_row[h * 32];
#pragma unroll
          for (int r = 0; r < kBlockRows; ++r) {
            acc[g][r][h * 4 + 0] = fmaf(av[r], bv.x, acc[g][r][h * 4 + 0]);
            acc[g][r][h * 4 + 1] = fmaf(av[r], bv.y, acc[g][r][h * 4 + 1]);
            acc[g][r][h * 4 + 2] = fmaf(av[r], bv.z, acc[g][r][h * 4 + 2]);
            acc[g][r][h * 4 + 3] = fmaf(av[r], bv.w, acc[g][r][h * 4 + 3]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kGroupsPerWarp; ++g) {
    const int64_t group = tile * kTileGroups + warp * kGroupsPerWarp + g;
#pragma unroll
    for (int r = 0; r < kBlockRows; ++r) {
      const int64_t row = group * kBlockRows + r;
      if (row >= a.m) break;
#pragma unroll
      for (int h = 0; h < kF4PerLane; ++h) {
        const int64_t col = n0 + (h * 32 + lane) * 4;
        if (col < a.n) {
          const float* x = acc[g][r] + h * 4;
          *reinterpret_cast<float4*>(a.out + row * a.n + col) =
              make_float4(a.alpha * x[0], a.alpha * x[1], a.alpha * x[2], a.alpha * x[3]);
        }
      }
    }
  }
#endif
}

at::Tensor spmm_blocked_cuda(const at::Tensor& crow, const at::Tensor& col_indices, const at::Tensor& values,
                             const at::Tensor& tile_ptr, const at::Tensor& block_col, const at::Tensor& block_values,
                             const at::Tensor& dense, double alpha, const std::optional<at::Tensor>& accumulate,
                             double beta, const std::optional<at::Tensor>& bias, c10::string_view activation,
                             double negative_slope) {
  const SpmmProblem p = check_blocked_args(crow, col_indices, values, tile_ptr, block_col, block_values, dense,
                                           accumulate, bias);
  const SpmmEpilogue epi = make_epilogue(alpha, beta, accumulate.has_value() ? accumulate->contiguous() : at::Tensor(),
                                         bias, activation, negative_slope);
  const c10::cuda::CUDAGuard guard(dense.device());
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(prop->major >= 8 && prop->sharedMemPerBlockOptin >= kSharedBytes, "spmm_blocked: needs ",
              kSharedBytes, " bytes of shared memory per block (Hopper); this GPU offers ",
              prop->sharedMemPerBlockOptin);
  // The kernel reads B and writes out as float4: rows of a multiple of 4 floats, 16-byte aligned.
  const int64_t n4 = (p.n + 3) / 4 * 4;
  at::Tensor b = dense;
  if (n4 != p.n || !dense.is_contiguous() || reinterpret_cast<uintptr_t>(dense.data_ptr()) % 16 != 0) {
    b = at::zeros({p.k, n4}, dense.options());
    b.narrow(1, 0, p.n).copy_(dense);
  }
  at::Tensor out = at::empty({p.m, n4}, dense.options());
  const at::Tensor ptr_c = tile_ptr.contiguous(), col_c = block_col.contiguous(), val_c = block_values.contiguous();
  const int64_t tiles = blocked_tiles(p.m), column_tiles = (n4 + kTileCols - 1) / kTileCols;
  if (p.m > 0 && n4 > 0) {
    TORCH_CHECK_VALUE(tiles < 65536, "spmm_blocked: at most ", 65535 * kTileGroups * kBlockRows, " rows, got ", p.m);
    BlockedArgs args{ptr_c.data_ptr<int>(), col_c.data_ptr<int>(), reinterpret_cast<const float4*>(val_c.data_ptr<float>()),
                     b.data_ptr<float>(), out.data_ptr<float>(), p.m, p.k, n4, blocked_chunks(p.k),
                     static_cast<float>(alpha)};
    C10_CUDA_CHECK(cudaFuncSetAttribute(spmm_blocked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSharedBytes)));
    spmm_blocked_kernel<<<dim3(static_cast<unsigned>(column_tiles), static_cast<unsigned>(tiles)), kThreads,
                          kSharedBytes, at::cuda::getCurrentCUDAStream()>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (n4 != p.n) out = out.narrow(1, 0, p.n).contiguous();
  if (epi.accumulate.defined()) out.add_(epi.accumulate, beta);
  if (epi.bias.defined() || epi.act != Activation::None) {
    bias_act_inplace_cuda(out, epi.bias, epi.act, epi.negative_slope);
  }
  // A block multiplies its zeros too (0 * inf = NaN where the sparse routes skip the position): the
  // row-group kernel recomputes the output on the device when B holds a NaN or an infinity.
  if (p.m > 0 && p.n > 0 && p.k > 0) {
    spmm_native_if(p, crow.contiguous(), col_indices.contiguous(), values.contiguous(), dense, out, epi,
                   nonfinite_flag(dense, 1, p.k, p.n));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("spmm_blocked", &spmm_blocked_cuda); }

}  // namespace cuda
}  // namespace sparsetorch
