// y = act(x @ W^T + bias) for a 2:4-pruned bf16/fp16 weight W (M x K) and few tokens x (N x K, N <= 64),
// on the 2:4 sparse tensor cores (mma.sp m16n8k32, fp32 sums), for LLM decode. Torch-free: the standalone
// probe that tuned it (docs/history.md, pruned-weight kernels) and the op include it. The packed format is made by
// sparsetorch/pruned/sparse24_decode.py (pack_sparse24_decode), which also emulates this file's register
// mapping on the CPU (unpack_sparse24_decode).
//
// Why: at N <= 16 the product is bound by the weight's bytes. cuSPARSELt runs these shapes at ~1.0x dense;
// here the weight is streamed as 1.125 bytes per position (dense: 2), already in the exact per-lane
// register order of the mma.sp A operand and metadata operand, so a warp's k-step costs one coalesced
// 16-byte load per lane per 16 x 32 tile (plus 4 bytes of metadata per lane per two tiles), no shared
// memory for W and no decoding.
//
// The mma.sp operands (PTX ISA, "Matrix multiply-accumulate operation using mma.sp instruction with sparse
// matrix A", §9.7.14.6 in PTX 8.x/9.x; "Sparse matrix storage" and "Matrix fragments for sparse
// mma.m16n8k32 with .f16/.bf16"). lane = 4 g + t (g = groupID, t = threadID_in_group):
//  - A, a 16 x 32 tile of W stored as 16 x 16 (each 4-column chunk c of a row keeps 2 values, at compressed
//    columns 2c, 2c + 1): four .b32 registers laid out as the dense m16n8k16 A fragment over the compressed
//    columns: reg0 = row g, compressed cols 2t, 2t+1 (chunk t); reg1 = row g+8, chunk t; reg2 = row g, chunk
//    t+4; reg3 = row g+8, chunk t+4.
//  - metadata: per chunk a nibble, bits 1:0 = position (0..3) of the value at compressed col 2c, bits 3:2
//    = position of the value at 2c+1, increasing (mma.sp::ordered_metadata requires idx0 < idx1; 0b0000,
//    0b0101, 0b1010, 0b1111 are invalid). For m16n8k32 f16/bf16 two threads of each quad hold a tile's
//    metadata, chosen by the sparsity selector (0: threads 0, 1 of the quad; 1: threads 2, 3). The thread
//    of role r (0 or 1) holds bits 15:0 = row g, chunks 4r .. 4r+3 (nibble j at bits 4j+3:4j) and bits
//    31:16 = row g+8, the same chunks. This kernel runs k-tiles in pairs: the even tile with selector 0
//    (threads t = 0, 1 hold its metadata), the odd tile with selector 1 (t = 2, 3), so every lane holds one
//    useful metadata word per pair of tiles.
//  - B (x^T, 32 x 8 tokens): four .b32 registers, b_i = the two k rows 2t + 8i, 2t + 8i + 1 of token column
//    g: exactly what ldmatrix.x4 returns for four 8 x 8 matrices of x (8 token rows, k offsets 0/8/16/24).
//  - C/D: c0, c1 = row g, tokens 2t, 2t+1; c2, c3 = row g+8, the same tokens.
//
// Packed format (per weight; M % 16 == 0, K % 32 == 0; KTP = K / 32 rounded up to a multiple of 8, tiles
// past K hold zeros and the valid metadata 0x4 per chunk):
//   values (M/16, KTP, 32 lanes, 8 elements): lane's A registers of that 16 x 32 tile, 16 bytes
//   meta   (M/16, KTP/8, 32 lanes, 4 words): word w of a lane in block b is its metadata word for the tile
//          pair p = 4 b + w (tile 2p + (t >> 1), role t & 1)
// A warp's tiles of one row tile are consecutive 512-byte pieces: its stream is contiguous.
//
// Work split: a block of `warps` warps takes warps * RT row tiles (16 rows each) over one K-split
// of steps_per_split steps of U k-tiles, and stages its slice of x (NT * 8 tokens, zero-padded, x's columns
// [k0, k0 + slice)) in shared memory once (rows padded by 16 bytes: ldmatrix's 8 rows fall in 8 different bank
// groups), with cp.async in two chunks of steps while its first weight loads are in flight; a chunk's steps
// start when it has arrived. Splits among blocks (blockIdx.y) keep all SMs streaming
// when M is small (the down projection, 4096 rows = 256 row tiles) and bound the x slice in shared memory;
// on sm_90 the splits of a row group (at most 8) form one thread-block cluster and add their fp32 sums through
// distributed shared memory in split order (finish_cluster; no workspace). Elsewhere their partial sums go to a
// workspace and are added in split order 0, 1, .. (deterministic) either by the block that finishes last for
// its row group (a counter per row group, reset by that block) or by a second kernel. Bias and activation are
// applied in the final write.
//
// The loop: A double-buffered in registers, one step (RT * U 16-byte loads per lane,
// ld.global.nc.L1::no_allocate) issued before the mma of the previous one. A second design (the weight through
// a per-warp cp.async ring in shared memory, x fragments reused over 4 row tiles) was slower at every N on the
// H100 (41.5 against 32.7 us at N = 1; docs/history.md keeps it).
//
// Bounds: row tiles past M/16 are clamped for loading and never written; tokens >= N read zeros from the
// staged x and are never written; x columns >= K are staged as zeros. The packed arrays must be exactly
// the packer's shapes (values (M/16) * KTP * 512 bytes, meta (M/16) * KTP/8 * 512 bytes).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/cp_async.cuh"
#include "cuda/sparse24_decode_plan.h"

#ifndef SPARSE24_DECODE_ORDERED_METADATA
// mma.sp::ordered_metadata (PTX 8.5+): the ISA's recommended form (the unordered one "may have substantially
// reduced performance on some targets"); the packer always writes idx0 < idx1, valid for both.
#define SPARSE24_DECODE_ORDERED_METADATA 1
#endif

namespace sparsetorch {
namespace cuda {
namespace sp24d {

// Sizes and the launch plan (Config, Plan, plan, library_config): cuda/sparse24_decode_plan.h.

// Activation codes: the values of sparsetorch::Activation (common/activation.h), same semantics.
enum ActCode : int { kNone = 0, kRelu, kLeakyRelu, kGelu, kGeluTanh, kSilu, kSigmoid, kTanh };

__device__ __forceinline__ float activate(int act, float x, float slope) {
  switch (act) {
    case kRelu: return x < 0.f ? 0.f : x;  // NaN stays NaN
    case kLeakyRelu: return x < 0.f ? x * slope : x;
    case kGelu: return 0.5f * x * (1.f + erff(x * 0.70710678118654752440f));
    case kGeluTanh: return 0.5f * x * (1.f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
    case kSilu: return x / (1.f + expf(-x));
    case kSigmoid: return 1.f / (1.f + expf(-x));
    case kTanh: return tanhf(x);
    default: return x;
  }
}

template <typename T>
struct Type;
template <>
struct Type<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <>
struct Type<__half> {
  static __device__ __forceinline__ float to_float(uint16_t b) { return __half2float(__ushort_as_half(b)); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

// acc += A (sparse 16 x 32, compressed in a, metadata e) * B (32 x 8 in b); SEL: the sparsity selector.
template <typename T, int SEL>
__device__ __forceinline__ void mma_sp(float (&acc)[4], const uint4& a, const uint32_t (&b)[4], uint32_t e) {
#if SPARSE24_DECODE_ORDERED_METADATA
#define SP24D_MMA_SP "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32."
#else
#define SP24D_MMA_SP "mma.sp.sync.aligned.m16n8k32.row.col.f32."
#endif
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(SP24D_MMA_SP "bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, %13;\n"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e), "n"(SEL));
  } else {
    asm volatile(SP24D_MMA_SP "f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, %13;\n"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e), "n"(SEL));
  }
#undef SP24D_MMA_SP
}

// Where an mma accumulator value lands (the m16n8 fp32 C fragment): value c of n-tile j in lane `lane` is
// token 8 j + 2 (lane & 3) + (c & 1) of row (lane >> 2) + 8 (c >> 1) of its 16-row tile. One place for finish
// (direct stores and split partials) and finish_cluster.
__device__ __forceinline__ int acc_token(int lane, int j, int c) { return 8 * j + 2 * (lane & 3) + (c & 1); }
__device__ __forceinline__ int acc_row(int tile, int lane, int c) { return tile * 16 + (lane >> 2) + 8 * (c >> 1); }

// A streamed weight piece: read once, so it does not displace x's lines in L1.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 load_stream(const uint2* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t load_stream(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

struct Params {
  const uint4* values;     // (M/16, ktp, 32) 16-byte A fragments
  const uint32_t* meta;    // (M/16, ktp/8, 32, 4) metadata words
  const uint16_t* x;       // (n, ldx), 16-byte aligned, ldx % 8 == 0
  int64_t ldx;
  uint16_t* out;           // (n, ldo)
  int64_t ldo;
  const uint16_t* bias;    // (m,) or null
  float* partials;         // (splits, n, m) fp32, when splits > 1
  int* counters;           // (row groups,), zero on entry (and left zero) with last-block reduction
  int m, k, n, ktp;
  int steps_per_split;     // steps of U k-tiles per split (blockIdx.y)
  int last_block_reduces;  // 1: the last block of a row group sums the splits; 0: a second kernel does
  int cluster_reduces;     // 1: the splits of a row group are one thread-block cluster and sum in shared memory
  int act;
  float slope;
};


template <typename T>
__device__ __forceinline__ void store_out(const Params& p, int n, int row, float z) {
  if (p.bias != nullptr) z += Type<T>::to_float(p.bias[row]);
  p.out[static_cast<int64_t>(n) * p.ldo + row] = Type<T>::from_float(activate(p.act, z, p.slope));
}

// Sums the splits of rows [r0, r0 + rows) for all tokens, in split order, and writes out.
template <typename T>
__device__ __forceinline__ void reduce_rows(const Params& p, int splits, int r0, int rows, int tid, int threads) {
  const int64_t plane = static_cast<int64_t>(p.n) * p.m;
  for (int idx = tid; idx < p.n * rows; idx += threads) {
    const int n = idx / rows, row = r0 + idx % rows;
    const float* src = p.partials + static_cast<int64_t>(n) * p.m + row;
    float z = 0.f;
    int s = 0;
    for (; s + 4 <= splits; s += 4) {  // four loads in flight, added in order
      const float v0 = __ldcg(src + s * plane), v1 = __ldcg(src + (s + 1) * plane);
      const float v2 = __ldcg(src + (s + 2) * plane), v3 = __ldcg(src + (s + 3) * plane);
      z += v0; z += v1; z += v2; z += v3;
    }
    for (; s < splits; ++s) z += __ldcg(src + s * plane);
    store_out<T>(p, n, row, z);
  }
}

// x's slice: rows 0 .. NT*8-1 (tokens >= n zero), columns k0 .. k0 + cols - 1 (>= k zero), rows cols + 8
// apart, copied with cp.async in kXChunks chunks of chunk_steps steps each, one commit group per chunk: the
// products of a chunk's steps start once that chunk has arrived, not the whole slice (at N = 16 a block's slice
// is ~64 KB, several L2 round trips). H100, clean L2, 2026-11-28: 14336 x 4096 at N = 16 33.6 -> 32.9 us with
// 4 chunks against the slice loaded whole before the loop; 1, 2 and 4 chunks within 1-3% of each other, 8 up
// to 4% slower (a block barrier per chunk).
constexpr int kXChunks = 2;
template <int NT>
__device__ __forceinline__ void stage_x(const Params& p, uint16_t* xs, int cols, int64_t k0, int chunk_cols) {
  const int xstride = cols + 8;
  for (int c = 0; c < kXChunks; ++c) {
    const int c0 = min(c * chunk_cols, cols), per_row = (min(c0 + chunk_cols, cols) - c0) / 8;
    for (int i = threadIdx.x; i < per_row * NT * 8; i += blockDim.x) {
      const int row = i / per_row, col = c0 + (i % per_row) * 8;
      const bool copy = row < p.n && k0 + col < p.k;
      cp_async_16(xs + row * xstride + col, copy ? p.x + row * p.ldx + k0 + col : p.x, copy);
    }
    cp_async_commit();
  }
}
// This thread's copies of chunks 0 .. c have landed (the caller then synchronizes the block).
__device__ __forceinline__ void wait_x_chunk(int c) {
  static_assert(kXChunks == 2, "one wait_group per chunk");
  if (c == 0) {
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// The end of a block: its warp's sums acc (row tiles tile0 .. tile0 + RT - 1, NT * 8 tokens) go to out (one
// split) or to this split's partials; with last-block reduction, the block that arrives last for its row
// group (rows_per_block rows from blockIdx.x * rows_per_block) adds all splits in split order and writes out.
template <typename T, int NT, int RT>
__device__ __forceinline__ void finish(const Params& p, const float (&acc)[RT][NT][4], int tile0, bool active,
                                       int rows_per_block) {
  __shared__ int last_flag;
  const int lane = threadIdx.x & 31;
  const int row_tiles = p.m >> 4;
  const int splits = gridDim.y;
  // f(token, row, sum) for each of this warp's sums inside the output.
  auto each_sum = [&](auto&& f) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      if (tile0 + r >= row_tiles) continue;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int n = acc_token(lane, j, c);
          if (n < p.n) f(n, acc_row(tile0 + r, lane, c), acc[r][j][c]);
        }
      }
    }
  };
  if (splits == 1) {
    if (active) each_sum([&](int n, int row, float z) { store_out<T>(p, n, row, z); });
    return;
  }

  // Split-k: this split's partial sums, then (last-block mode) the row group's last block adds all splits.
  if (active) {
    float* part = p.partials + static_cast<int64_t>(blockIdx.y) * p.n * p.m;
    each_sum([&](int n, int row, float z) { part[static_cast<int64_t>(n) * p.m + row] = z; });
  }
  if (!p.last_block_reduces) return;
  __threadfence();  // this block's partials are visible device-wide before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) last_flag = atomicAdd(p.counters + blockIdx.x, 1) == splits - 1;
  __syncthreads();
  if (!last_flag) return;
  __threadfence();
  const int r0 = blockIdx.x * rows_per_block;
  reduce_rows<T>(p, splits, r0, min(p.m - r0, rows_per_block), threadIdx.x, blockDim.x);
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;  // ready for the next call
}

// The end of a block in cluster mode (sm_90): the gridDim.y splits of a row group form one cluster. Each
// block leaves its sums in its shared memory (red, over the x slice), and after a cluster barrier every block
// adds a 1/splits share of the row group's sums across the cluster's blocks in rank (= split) order, read
// through distributed shared memory, and writes it out; a second barrier keeps each block's shared memory
// alive until the others have read it. No global partials, counters or fences.
template <typename T, int NT, int RT>
__device__ __forceinline__ void finish_cluster(const Params& p, const float (&acc)[RT][NT][4], float* red) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kValues = RT * NT * 4;
  const int threads = blockDim.x, tid = threadIdx.x, warps = threads >> 5;
  const int row_tiles = p.m >> 4;
  __syncthreads();  // every warp is done with the x slice that red overlays
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[((r * NT + j) * 4 + c) * threads + tid] = acc[r][j][c];
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int splits = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int total = kValues * threads, share = (total + splits - 1) / splits;
  const int e1 = min(total, (rank + 1) * share);
  for (int e = rank * share + tid; e < e1; e += threads) {
    float z = 0.f;
    for (int q = 0; q < splits; ++q) z += *cluster.map_shared_rank(red + e, q);
    const int v = e / threads, src = e - v * threads;  // value v of thread src
    const int r = v / (NT * 4), j = (v >> 2) % NT, c = v & 3;
    const int lane = src & 31, tile = (static_cast<int>(blockIdx.x) * warps + (src >> 5)) * RT + r;
    const int n = acc_token(lane, j, c);
    if (tile < row_tiles && n < p.n) store_out<T>(p, n, acc_row(tile, lane, c), z);
  }
  cluster.sync();
#else
  (void)p, (void)acc, (void)red;
  __trap();  // the host launches cluster mode only where this kernel was compiled for sm_90 (kernel_arch)
#endif
}

template <typename T, int NT, int RT, int U>
__global__ void __launch_bounds__(kMaxThreads) sparse24_decode_kernel(const Params p) {
#if SPARSETORCH_SM80_DEVICE_CODE
  static_assert(U == 2 || U == 4 || U == 8, "U: k-tiles per step, a divisor of the 8-tile metadata block");
  constexpr int MW = U / 2;  // metadata words per lane per step and row tile
  extern __shared__ __align__(16) uint16_t xs[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int row_tiles = p.m >> 4;
  const int tile0 = (blockIdx.x * warps + warp) * RT;
  const bool active = tile0 < row_tiles;  // warp-uniform
  const int total_steps = p.ktp / U;
  const int step0 = blockIdx.y * p.steps_per_split;
  const int nsteps = min(p.steps_per_split, total_steps - step0);

  // Per-lane streams. A row tile past the end (RT > 1, odd tail) re-reads the last one and is not written.
  const uint4* vp[RT];
  const uint32_t* mp[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const int64_t tile = min(tile0 + r, row_tiles - 1);
    vp[r] = p.values + (tile * p.ktp + static_cast<int64_t>(step0) * U) * 32 + lane;
    mp[r] = p.meta + tile * (p.ktp / 8) * 128 + lane * 4;
  }
  uint4 a[RT][U];
  uint32_t e[RT][MW];
  auto load_step = [&](int s, uint4 (&av)[RT][U], uint32_t (&ev)[RT][MW]) {
    const int pair0 = ((step0 + s) * U) >> 1;  // first tile pair of the step (absolute)
#pragma unroll
    for (int r = 0; r < RT; ++r) {
#pragma unroll
      for (int u = 0; u < U; ++u) av[r][u] = load_stream(vp[r] + (s * U + u) * 32);
      const uint32_t* mq = mp[r] + (pair0 >> 2) * 128 + (pair0 & 3);
      if constexpr (MW == 4) {
        const uint4 w = load_stream(reinterpret_cast<const uint4*>(mq));
        ev[r][0] = w.x, ev[r][1] = w.y, ev[r][2] = w.z, ev[r][3] = w.w;
      } else if constexpr (MW == 2) {
        const uint2 w = load_stream(reinterpret_cast<const uint2*>(mq));
        ev[r][0] = w.x, ev[r][1] = w.y;
      } else {
        ev[r][0] = load_stream(mq);
      }
    }
  };
  if (active && nsteps > 0) load_step(0, a, e);  // in flight while x is staged

  const int cols = static_cast<int>(slice_cols(p.steps_per_split, U));
  const int xstride = cols + 8;
  const int chunk_steps = max(1, (p.steps_per_split + kXChunks - 1) / kXChunks);
  stage_x<NT>(p, xs, cols, static_cast<int64_t>(step0) * U * kTileK, chunk_steps * U * kTileK);

  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.f;

  // ldmatrix.x4 addresses: lane l gives row (l & 7) of matrix l >> 3 (k offset 8 (l >> 3)) of n-tile j.
  const uint32_t xs_base = static_cast<uint32_t>(__cvta_generic_to_shared(xs));
  const uint32_t lane_off = static_cast<uint32_t>(((lane & 7) * xstride + 8 * (lane >> 3)) * 2);
  for (int c = 0; c < kXChunks; ++c) {  // every thread passes each chunk's barrier
    wait_x_chunk(c);
    __syncthreads();  // chunk c of x is in shared memory
    const int s_end = active ? min(nsteps, (c + 1) * chunk_steps) : 0;
    for (int s = c * chunk_steps; s < s_end; ++s) {
      uint4 an[RT][U];
      uint32_t en[RT][MW];
      if (s + 1 < nsteps) load_step(s + 1, an, en);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kt = s * U + u;  // k-tile within the slice
        uint32_t b[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          ldmatrix_x4(b[j], xs_base + lane_off + static_cast<uint32_t>((8 * j * xstride + kt * kTileK) * 2));
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            if (u & 1) {
              mma_sp<T, 1>(acc[r][j], a[r][u], b[j], e[r][u >> 1]);
            } else {
              mma_sp<T, 0>(acc[r][j], a[r][u], b[j], e[r][u >> 1]);
            }
          }
        }
      }
      if (s + 1 < nsteps) {
#pragma unroll
        for (int r = 0; r < RT; ++r) {
#pragma unroll
          for (int u = 0; u < U; ++u) a[r][u] = an[r][u];
#pragma unroll
          for (int w = 0; w < MW; ++w) e[r][w] = en[r][w];
        }
      }
    }
  }

  if (p.cluster_reduces) {
    finish_cluster<T, NT, RT>(p, acc, reinterpret_cast<float*>(xs));
  } else {
    finish<T, NT, RT>(p, acc, tile0, active, warps * RT * 16);
  }
#else
  __trap();  // mma.sp needs sm_80: sparse24_decode_linear.cu refuses this build
#endif
}

// The second kernel of the two-kernel mode: all rows.
template <typename T>
__global__ void __launch_bounds__(256) sparse24_decode_reduce_kernel(const Params p, int splits) {
  const int rows_per_block = 256;
  const int r0 = blockIdx.x * rows_per_block;
  reduce_rows<T>(p, splits, r0, min(p.m - r0, rows_per_block), threadIdx.x, blockDim.x);
}

// ---------------------------------------------------------------------------------------------------
// ---------------------------------------------------------------------------------------------------
// Host side: the launch of a plan (cuda/sparse24_decode_plan.h).


// Launches kernel on the plan's grid; above 48 KB of dynamic shared memory a kernel must opt in, once per
// kernel, device and size bound (host cost). Kernel: one instantiation per call site (the static below).
template <typename T, typename Kernel>
inline cudaError_t launch_grid(Kernel kernel, int64_t (&allowed)[kMaxDevices], const Plan& pl, const Params& prm,
                               cudaStream_t stream) {
  if (pl.smem > 48 * 1024) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    if (device < 0 || device >= kMaxDevices || pl.smem > allowed[device]) {
      err = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(pl.smem));
      if (err != cudaSuccess) return err;
      if (device >= 0 && device < kMaxDevices) allowed[device] = pl.smem;
    }
  }
  const dim3 grid(static_cast<unsigned>(pl.row_groups), static_cast<unsigned>(pl.splits));
  if (pl.cluster) {  // the splits of a row group: one cluster along y
    cudaLaunchConfig_t lc = {};
    lc.gridDim = grid;
    lc.blockDim = dim3(static_cast<unsigned>(pl.warps * 32));
    lc.dynamicSmemBytes = static_cast<size_t>(pl.smem);
    lc.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = static_cast<unsigned>(pl.splits);
    attr[0].val.clusterDim.z = 1;
    lc.attrs = attr;
    lc.numAttrs = 1;
    return cudaLaunchKernelEx(&lc, kernel, prm);
  }
  kernel<<<grid, pl.warps * 32, static_cast<size_t>(pl.smem), stream>>>(prm);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || pl.splits == 1 || prm.last_block_reduces) return err;
  sparse24_decode_reduce_kernel<T><<<static_cast<unsigned>((prm.m + 255) / 256), 256, 0, stream>>>(prm, pl.splits);
  return cudaGetLastError();
}

template <typename T, int NT, int RT, int U>
inline cudaError_t launch_planned(const Plan& pl, const Params& prm, cudaStream_t stream) {
  static int64_t allowed[kMaxDevices] = {};
  return launch_grid<T>(sparse24_decode_kernel<T, NT, RT, U>, allowed, pl, prm, stream);
}

#ifndef SPARSE24_DECODE_ALL_CONFIGS
// The library build compiles what plan() and library_config() can pick: RT 1/2 x U 4/8. The probe (docs/history.md)
// defines SPARSE24_DECODE_ALL_CONFIGS to also compile U = 2 and RT = 4.
#define SPARSE24_DECODE_ALL_CONFIGS 0
#endif


template <typename T, int RT, int U>
inline cudaError_t launch_first_nt(const Plan& pl, const Params& prm, cudaStream_t stream) {
  switch (pl.nt) {
    case 1: return launch_planned<T, 1, RT, U>(pl, prm, stream);
    case 2: return launch_planned<T, 2, RT, U>(pl, prm, stream);
    case 4: return launch_planned<T, 4, RT, U>(pl, prm, stream);
    default: return launch_planned<T, 8, RT, U>(pl, prm, stream);
  }
}

template <typename T>
inline cudaError_t launch_typed(const Plan& pl, const Params& prm, cudaStream_t stream) {
#if SPARSE24_DECODE_ALL_CONFIGS
  // RT = 4: each x fragment serves 4 row tiles (half the x traffic of RT = 2 from N = 9 on; untested on a GPU)
  if (pl.rt == 4 && pl.u == 2) return launch_first_nt<T, 4, 2>(pl, prm, stream);
  if (pl.rt == 4 && pl.u == 4) return launch_first_nt<T, 4, 4>(pl, prm, stream);
#endif
  if (pl.rt == 1 || pl.rt == 2) {
#if SPARSE24_DECODE_ALL_CONFIGS
    if (pl.u == 2) return pl.rt == 1 ? launch_first_nt<T, 1, 2>(pl, prm, stream) : launch_first_nt<T, 2, 2>(pl, prm, stream);
#endif
    if (pl.u == 4) return pl.rt == 1 ? launch_first_nt<T, 1, 4>(pl, prm, stream) : launch_first_nt<T, 2, 4>(pl, prm, stream);
    if (pl.u == 8) return pl.rt == 1 ? launch_first_nt<T, 1, 8>(pl, prm, stream) : launch_first_nt<T, 2, 8>(pl, prm, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace sp24d

// y (n, ldo) = act(x (n, ldx) @ W^T + bias) for W (m x k) packed by pack_sparse24_decode (values, meta), cut
// as pl = sp24d::plan(m, n, k, sms, cfg) says (the caller plans once and sizes the workspace from it).
// Requires m % 16 == 0, k % 32 == 0, 1 <= n <= 64, x 16-byte aligned with ldx % 8 == 0, values / meta
// 16-byte aligned. workspace: at least pl.workspace_bytes bytes (none in cluster mode), 16-byte aligned; in
// last-block mode its first counters_bytes must be zero on entry (the kernel leaves them zero), or pass
// counters_zeroed = false and the launcher clears them (one memset on the stream). Returns the first CUDA error
// (cudaErrorInvalidValue for arguments out of the kernel's range or a plan made for another n or k).
inline cudaError_t launch_sparse24_decode(const sp24d::Plan& pl, const sp24d::Config& cfg, bool bf16, const void* values,
                                          const void* meta, const void* x, int64_t ldx, const void* bias, void* out,
                                          int64_t ldo, int m, int n, int k, int act, float slope, void* workspace,
                                          int64_t workspace_bytes, bool counters_zeroed, cudaStream_t stream) {
  if (m <= 0 || m % 16 != 0 || k <= 0 || k % sp24d::kTileK != 0 || n < 1 || n > sp24d::kMaxTokens || ldx % 8 != 0 ||
      ldx < k || ldo < m || pl.nt != sp24d::tokens_tiles(n) || pl.ktp != sp24d::packed_ktiles(k)) {
    return cudaErrorInvalidValue;
  }
  if (pl.workspace_bytes > 0 && (workspace == nullptr || workspace_bytes < pl.workspace_bytes)) return cudaErrorInvalidValue;
  sp24d::Params prm{};
  prm.values = static_cast<const uint4*>(values);
  prm.meta = static_cast<const uint32_t*>(meta);
  prm.x = static_cast<const uint16_t*>(x);
  prm.ldx = ldx;
  prm.out = static_cast<uint16_t*>(out);
  prm.ldo = ldo;
  prm.bias = static_cast<const uint16_t*>(bias);
  prm.m = m, prm.n = n, prm.k = k, prm.ktp = pl.ktp;
  prm.steps_per_split = pl.steps_per_split;
  prm.last_block_reduces = cfg.last_block_reduces;
  prm.cluster_reduces = pl.cluster ? 1 : 0;
  prm.act = act;
  prm.slope = slope;
  if (pl.splits > 1 && !pl.cluster) {
    prm.counters = static_cast<int*>(workspace);
    prm.partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + pl.counters_bytes);
    if (cfg.last_block_reduces && !counters_zeroed) {
      const cudaError_t err = cudaMemsetAsync(workspace, 0, static_cast<size_t>(pl.counters_bytes), stream);
      if (err != cudaSuccess) return err;
    }
  }
  return bf16 ? sp24d::launch_typed<__nv_bfloat16>(pl, prm, stream) : sp24d::launch_typed<__half>(pl, prm, stream);
}

}  // namespace cuda
}  // namespace sparsetorch
