// The CUDA kernel of bitmap_linear: y = act(x @ W^T + bias) with W in the bitmap-tile layout
// (common/bitmap_layout.h), bf16 or fp16, fp32 accumulation on tensor cores (mma.sync m16n8k16).
// Torch-free, so that a standalone benchmark can include it (cuda/bitmap_linear.cu is the op).
//
// A warp owns one strip (16 rows of W, the mma's M) and a range of chunks (64 columns each: its K),
// and multiplies them with up to 8 * NT tokens of x (the mma's N, NT tiles of 8). Per chunk it streams
// the group's 16 bitmaps and packed values into a shared-memory stage with cp.async (kStages deep,
// each warp its own pipeline: no block barrier in the main loop), then per mma step decodes the four
// A registers straight from the bitmaps (two popcounts and at most two 16-bit shared loads per lane
// and quadrant) and reads its x fragments from global memory (32 contiguous bytes per lane and chunk,
// L1/L2-resident: x is small next to W). The eight warps of a thread block split the work ws x wk:
// ws strips, each strip's chunks split among wk warps; their partial sums are added in shared memory in
// warp order, and the block writes act(sum + bias) for 16 * ws rows x 8 * NT tokens. When the grid
// would still be too small to fill the GPU (few rows, few tokens), the chunks are also split among
// thread blocks (blockIdx.z): each writes fp32 partial sums to a workspace that a second kernel adds in
// split order. Every reduction has a fixed order: the result does not depend on timing.
//
// Decode, two paths chosen per group (Params::scatter_max): gather (work ~ positions: per quadrant a
// lane's rank is its word's first value, from a warp scan of the 32 words' popcounts, plus one popcount;
// two 16-bit loads and a PRMT) for dense groups, scatter (work ~ values: each lane writes its word's
// values into a zeroed fragment-order tile, then reads its 16 registers back) for sparse ones.
//
// Measured (H100, benchmarks/results/nvidia-h100-80gb-hbm3/bitmap_cuda.md, 11008 x 4096, N = 1, L2
// flushed clean): 39 us at 50% sparsity, 31 us at 90%, 29 us at 95%, against dense F.linear's 37 us and
// floors of 17 / 5.0 / 3.5 us: the time follows the bytes only weakly. What limits it is not settled:
// the first decode (three popcounts per quadrant) was 39-45 us at every sparsity, integer-bound by
// count; the cheaper decode gained 10-25% at 90-95%; an L2 bulk prefetch 8 groups ahead lost 7-16%.
// Per group a warp takes ~2-4k cycles, so latency per group (cp.async wait, x and offsets loads, the
// decode's dependent chain) with ~24 warps per SM is the next suspect; ncu was not run.
//
// Bounds: whatever the bitmaps and offsets hold, a group's copy is clamped to the values array and to
// at most 1024 values, and a lane's read index is the count of set bits before its own in a 1024-bit
// group, so every shared-memory read stays inside its stage; a corrupt layout gives a wrong product,
// never an out-of-bounds access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "common/activation.h"
#include "common/bitmap_layout.h"
#include "cuda/cp_async.cuh"

namespace sparsetorch {
namespace cuda {
namespace bitmap {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int kBitmapBytes = 16 * 8;
constexpr int kHeaderBytes = 16;                          // the stage's lead (first value's offset in it)
constexpr int kStageValues = kBitmapGroupElems + 16;      // 1024 values, up to 7 before them (16-byte copies)
constexpr int kStageBytes = kBitmapBytes + kHeaderBytes + kStageValues * 2;  // 2224
constexpr int kTileBytes = kBitmapGroupElems * 2;         // a group's A fragments, fragment order (scatter path)
constexpr int kTableBytes = 32 * 8;                       // (bitmap word, first value) of the group's 32 words
constexpr int kWarpSmem = kStages * kStageBytes + kTileBytes + kTableBytes;
constexpr int kBlockSmem = kWarps * kWarpSmem;            // 71808 bytes: 3 blocks per H100 SM
constexpr int kRedStride = 20;                            // floats per token row of the reduction buffer
// Groups a warp may ask L2 for ahead of its cp.async stages (Launch::prefetch, a bulk L2 prefetch per
// group). Off: measured on the H100 (11008 x 4096, 50% / 90%, N = 1 .. 512) every case ran 7-16%
// slower with 8 (benchmarks/results/nvidia-h100-80gb-hbm3/bitmap_prefetch_ab.txt); kept as a launch
// parameter for the standalone harness's A/B.
constexpr int kPrefetchGroups = 8;
constexpr int kMaxNT = 8;
static_assert(kStageBytes % 16 == 0 && kWarpSmem % 16 == 0, "stages must stay 16-byte aligned");
static_assert(kWarps * 8 * kMaxNT * kRedStride * 4 <= kBlockSmem, "the reduction buffer reuses the stages");

struct Params {
  const uint64_t* bitmaps;  // (strips, chunks, 16)
  const int* offsets;       // (strips * chunks + 1)
  const uint16_t* values;   // (nvalues,): the raw 16-bit values; 16-byte aligned
  int64_t nvalues;
  const uint16_t* x;        // (n, ldx) row-major, 16-byte aligned, ldx % 8 == 0; columns >= kx read as zero
  int64_t ldx;
  int kx;                   // columns of x that may be read: a multiple of 8, zeros past k
  int n, m, strips, chunks;
  void* out;                // T (n, m) when gridDim.z == 1; float (gridDim.z, n, m) otherwise
  const uint16_t* bias;     // (m,) T, or null (only read when gridDim.z == 1)
  Activation act;
  float slope;
  int ws, wk;               // warps per block along strips and along chunks; ws * wk == kWarps
  int chunks_per_split;     // chunks of one blockIdx.z
  int scatter_max;          // groups with at most this many values take the scatter path
  int prefetch;             // groups prefetched into L2 ahead of the stages (0: none)
};

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_float(uint16_t v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_float(uint16_t v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

// Hint: bring `bytes` (a multiple of 16) at p (16-byte aligned) into L2 (sm_90 bulk copy engine).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes));
}

// PRMT selectors that turn (v0 = value at the lane's first index, v1 = the next value), both
// zero-extended, into the A register for the lane's two bits b: 0 -> 0, 1 -> (v0, 0), 2 -> (0, v0),
// 3 -> (v0, v1) (low half first). Four 16-bit selectors, picked by a PRMT on b * 0x22 + 0x10.
constexpr uint32_t kSelect01 = 0x32103232u, kSelect23 = 0x54101032u;

template <typename T, int NT>
__global__ void __launch_bounds__(kThreads, NT <= 4 ? 3 : 2) bitmap_linear_kernel(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ks = warp % p.wk, ss = warp / p.wk;
  const int strip = blockIdx.y * p.ws + ss;
  const int n0 = blockIdx.x * (8 * NT);
  // This warp's chunks: the split's range, cut in wk contiguous pieces.
  const int split_begin = blockIdx.z * p.chunks_per_split;
  const int split_end = min(p.chunks, split_begin + p.chunks_per_split);
  const int per_warp = (max(split_end - split_begin, 0) + p.wk - 1) / p.wk;
  const int c_begin = min(split_end, split_begin + ks * per_warp);
  const int count = strip < p.strips ? min(split_end, c_begin + per_warp) - c_begin : 0;
  unsigned char* my = smem + warp * kWarpSmem;
  uint16_t* tile = reinterpret_cast<uint16_t*>(my + kStages * kStageBytes);
  uint2* table = reinterpret_cast<uint2*>(my + kStages * kStageBytes + kTileBytes);
  const int64_t group0 = static_cast<int64_t>(strip) * p.chunks + c_begin;

  // Copies group i of this warp into stage i % kStages: 16-byte pieces, the last one (past the end of
  // the values array) value by value.
  auto issue = [&](int i) {
    unsigned char* st = my + (i % kStages) * kStageBytes;
    const int64_t g = group0 + i;
    if (lane < 8) cp_async_16(st + 16 * lane, p.bitmaps + g * 16 + 2 * lane);
    const int64_t start = min(max(static_cast<int64_t>(__ldg(p.offsets + g)), int64_t{0}), p.nvalues);
    const int64_t end = min(max(static_cast<int64_t>(__ldg(p.offsets + g + 1)), start),
                            min(p.nvalues, start + kBitmapGroupElems));
    const int64_t first = start & ~int64_t{7};
    const int pieces = static_cast<int>((end - first + 7) >> 3);
    uint16_t* dst = reinterpret_cast<uint16_t*>(st + kBitmapBytes + kHeaderBytes);
    for (int c = lane; c < pieces; c += 32) {
      const int64_t e = first + 8 * c;
      if (e + 8 <= p.nvalues) {
        cp_async_16(dst + 8 * c, p.values + e);
      } else {
        for (int j = 0; j < p.nvalues - e; ++j) dst[8 * c + j] = __ldg(p.values + e + j);
      }
    }
    if (lane == 0) *reinterpret_cast<int*>(st + kBitmapBytes) = static_cast<int>(start - first);
  };

  // L2 prefetch of group i (its bitmaps and the whole 16-byte pieces of its values), by one lane.
  auto prefetch = [&](int i) {
    if (lane != 0 || i >= count || p.prefetch == 0) return;
    const int64_t g = group0 + i;
    prefetch_l2(p.bitmaps + g * 16, kBitmapBytes);
    const int64_t start = min(max(static_cast<int64_t>(__ldg(p.offsets + g)), int64_t{0}), p.nvalues);
    const int64_t end = min(max(static_cast<int64_t>(__ldg(p.offsets + g + 1)), start),
                            min(p.nvalues, start + kBitmapGroupElems));
    const int64_t first = start & ~int64_t{7}, last = end & ~int64_t{7};
    if (last > first) prefetch_l2(p.values + first, static_cast<uint32_t>(2 * (last - first)));
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int g = lane >> 2, t = lane & 3;
  const int high = lane >> 4, shift = 2 * (lane & 15);
  const uint32_t below = (1u << shift) - 1u;  // the bits of the lane's word below its two

  for (int i = kStages - 1; i < kStages - 1 + p.prefetch; ++i) prefetch(i);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < count) issue(i);
    cp_async_commit();
  }
  for (int i = 0; i < count; ++i) {
    cp_async_wait<kStages - 2>();
    __syncwarp();  // group i is in its stage for every lane; every lane is done with stage i - 1
    if (i + kStages - 1 < count) issue(i + kStages - 1);
    cp_async_commit();
    prefetch(i + kStages - 1 + p.prefetch);
    const unsigned char* st = my + (i % kStages) * kStageBytes;
    const int lead = *reinterpret_cast<const int*>(st + kBitmapBytes);
    const uint16_t* vals = reinterpret_cast<const uint16_t*>(st + kBitmapBytes + kHeaderBytes);
    const int col = (c_begin + i) * static_cast<int>(kBitmapGroupCols) + 16 * t;

    // x for the whole chunk first (NT <= 2): its latency hides behind the decode.
    uint4 xq[NT <= 2 ? NT : 1][2];
    if (NT <= 2) {
#pragma unroll
      for (int j = 0; j < (NT <= 2 ? NT : 1); ++j) {
        const int token = n0 + 8 * j + g;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          xq[j][h] = make_uint4(0u, 0u, 0u, 0u);
          if (token < p.n && col + 8 * h + 8 <= p.kx) {
            xq[j][h] = __ldg(reinterpret_cast<const uint4*>(p.x + token * p.ldx + col + 8 * h));
          }
        }
      }
    }

    // The group's 32 bitmap words (word l: quadrant l / 2, bits 32 (l % 2) ..), each word's first
    // value by a warp scan of their popcounts (values follow each other in word order).
    const uint32_t word = reinterpret_cast<const uint32_t*>(st)[lane];
    const int cnt = __popc(word);
    int incl = cnt;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += o;
    }
    const int first_value = lead + incl - cnt;
    const int group_values = __shfl_sync(0xffffffffu, incl, 31);

    uint32_t a[4][4];
    if (group_values <= p.scatter_max) {
      // Scatter: each lane writes its word's values into their fragment slots of a zeroed tile
      // (work ~ values, not positions: the sparse groups), then reads its 16 registers back.
#pragma unroll
      for (int r = 0; r < 4; ++r) reinterpret_cast<uint4*>(tile)[lane + 32 * r] = make_uint4(0u, 0u, 0u, 0u);
      __syncwarp();
      const int q = lane >> 1, half = lane & 1;
      // Slot of bit b of this word: fragment lane 16 half + b / 2, register q % 4 of step q / 4.
      const int base = 256 * (q >> 2) + 128 * half + 2 * (q & 3);
      uint32_t rest = word;
      int src = first_value;
      while (rest != 0u) {
        const int b = __ffs(rest) - 1;
        rest &= rest - 1u;
        tile[base + 8 * (b >> 1) + (b & 1)] = vals[src++];
      }
      __syncwarp();
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4 v = reinterpret_cast<const uint4*>(tile)[s * 32 + lane];
        a[s][0] = v.x;
        a[s][1] = v.y;
        a[s][2] = v.z;
        a[s][3] = v.w;
      }
      __syncwarp();  // every lane has read the tile before the next group zeroes it
    } else {
      // Gather: each lane reads its two values of each quadrant from its word's first value plus
      // the set bits below its own. table[16 half + q] = (word 2q + half, its first value).
      table[16 * (lane & 1) + (lane >> 1)] = make_uint2(word, static_cast<uint32_t>(first_value));
      __syncwarp();
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4 e01 = reinterpret_cast<const uint4*>(table)[8 * high + 2 * s];
        const uint4 e23 = reinterpret_cast<const uint4*>(table)[8 * high + 2 * s + 1];
        const uint32_t ew[4] = {e01.x, e01.z, e23.x, e23.z}, ev[4] = {e01.y, e01.w, e23.y, e23.w};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          // at <= first value + popcount(word) <= lead + 1024: inside the stage for any bitmap.
          const int at = static_cast<int>(ev[r]) + __popc(ew[r] & below);
          const uint32_t v0 = vals[at], v1 = vals[at + 1];
          const uint32_t b = (ew[r] >> shift) & 3u;
          a[s][r] = __byte_perm(v0, v1, __byte_perm(kSelect01, kSelect23, b * 0x22u + 0x10u));
        }
      }
      __syncwarp();  // every lane has read the table before the next group rewrites it
    }

    // B fragments of step s: x[token][col + 4 s .. + 3] (b0 the first two, b1 the last two); 16 bytes
    // (two steps) per lane and tile at a time.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 xv[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (NT <= 2) {
          xv[j] = xq[NT <= 2 ? j : 0][h];
        } else {
          const int token = n0 + 8 * j + g;
          xv[j] = make_uint4(0u, 0u, 0u, 0u);
          if (token < p.n && col + 8 * h + 8 <= p.kx) {
            xv[j] = __ldg(reinterpret_cast<const uint4*>(p.x + token * p.ldx + col + 8 * h));
          }
        }
      }
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          Mma<T>::run(acc[j], a[2 * h + s2], s2 ? xv[j].z : xv[j].x, s2 ? xv[j].w : xv[j].y);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its stages: they become the reduction buffer

  // acc[j]: (row g, token 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1).
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = 8 * j + 2 * t + (e & 1), row = g + 8 * (e >> 1);
      red[(warp * 8 * NT + token) * kRedStride + row] = acc[j][e];
    }
  }
  __syncthreads();
  // Thread e of the block writes rows (strip of ss, row) x token, rows fastest: for each token the
  // block's 16 * ws rows are contiguous in out.
  const int cells = p.ws * 16 * 8 * NT;
  for (int e = threadIdx.x; e < cells; e += kThreads) {
    const int row = e & 15, ws_i = (e >> 4) % p.ws, token = (e >> 4) / p.ws;
    const int64_t m = (static_cast<int64_t>(blockIdx.y) * p.ws + ws_i) * 16 + row;
    const int n = n0 + token;
    if (m >= p.m || n >= p.n) continue;
    float z = 0.f;
    for (int k = 0; k < p.wk; ++k) z += red[((ws_i * p.wk + k) * 8 * NT + token) * kRedStride + row];
    if (gridDim.z == 1) {
      if (p.bias != nullptr) z += Mma<T>::to_float(p.bias[m]);
      reinterpret_cast<uint16_t*>(p.out)[static_cast<int64_t>(n) * p.m + m] =
          Mma<T>::from_float(apply_activation(p.act, z, p.slope));
    } else {
      reinterpret_cast<float*>(p.out)[(static_cast<int64_t>(blockIdx.z) * p.n + n) * p.m + m] = z;
    }
  }
}

// out[n, m] = act(sum over splits of ws[split, n, m] (in split order) + bias[m]).
template <typename T>
__global__ void bitmap_splitk_reduce_kernel(const float* ws, int splits, int64_t cells, int64_t m,
                                            const uint16_t* bias, Activation act, float slope, uint16_t* out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < cells;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float z = 0.f;
    for (int s = 0; s < splits; ++s) z += ws[s * cells + e];
    if (bias != nullptr) z += Mma<T>::to_float(bias[e % m]);
    out[e] = Mma<T>::from_float(apply_activation(act, z, slope));
  }
}

// How a call is cut: NT (tiles of 8 tokens per warp), warps per block along strips (ws) and along
// chunks (wk), and chunk splits among blocks. Small N: the product is memory-bound and the grid must
// keep enough bytes in flight, so the strips' chunks are split among the warps of a block, then among
// blocks, until there are about `blocks_wanted` blocks (3 per SM: what fits in shared memory); each warp
// keeps at least kMinChunks chunks so that its pipeline has something to overlap.
struct Launch {
  int nt = 1, ws = kWarps, wk = 1, splits = 1, chunks_per_split = 1, prefetch = 0;
  int64_t column_tiles = 1, row_blocks = 1;
};
constexpr int kMinChunks = 4;
inline Launch choose_launch(int64_t m, int64_t n, int64_t k, int sms) {
  Launch l;
  l.nt = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
  l.column_tiles = (n + 8 * l.nt - 1) / (8 * l.nt);
  const int64_t strips = bitmap_strips(m), chunks = bitmap_chunks(k);
  const int64_t wanted = 3 * static_cast<int64_t>(sms);
  l.wk = 1;
  while (l.wk < kWarps && chunks >= 2 * l.wk * kMinChunks &&
         ((strips + kWarps / l.wk - 1) / (kWarps / l.wk)) * l.column_tiles < wanted) {
    l.wk *= 2;
  }
  l.ws = kWarps / l.wk;
  l.row_blocks = (strips + l.ws - 1) / l.ws;
  const int64_t blocks = l.row_blocks * l.column_tiles;
  int64_t splits = 1;
  while (blocks * splits * 2 <= wanted && chunks >= 2 * splits * l.wk * kMinChunks) splits *= 2;
  l.chunks_per_split = static_cast<int>(std::max<int64_t>(1, (chunks + splits - 1) / splits));
  l.splits = static_cast<int>(std::max<int64_t>(1, (chunks + l.chunks_per_split - 1) / l.chunks_per_split));
  return l;
}

}  // namespace bitmap
}  // namespace cuda
}  // namespace sparsetorch
