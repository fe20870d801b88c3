// The CUDA kernel of csr16_linear: y = act(x @ W^T + bias) for a pruned bf16/fp16 weight W in "CSR16"
// (common/csr16_checks.h: CSR whose entries are 32-bit words, the value's 16 bits over a 16-bit column),
// on CUDA cores with fp32 accumulation, for few tokens (the layer times it against the bitmap tensor-core
// kernel and the dense weight). Torch-free, so a standalone harness can include it (docs/history.md keeps the
// one that measured it); cuda/csr16_linear.cu is the op.
//
// Why CUDA cores: at high sparsity and N <= 16 the tensor-core bitmap kernel spends its issue slots on
// decoding positions (a 16 x 64 group costs ~300-400 warp instructions whatever it holds; ncu, H100), while
// here every instruction serves a stored value: per entry a quarter of a coalesced 16-byte load, one
// shared-memory read of the column's NB tokens of x, and NB FMAs (at N = 1 about 7 instructions per entry,
// spread over a warp's 32 lanes without divergence). The weight moves 4 bytes per nonzero (bitmap layout: 2 + 1 /
// density / 8; dense: 2 / density): at 90% sparsity 18 MB for 11008 x 4096, against 90 MB dense.
//
// Work split: a block holds one tile of NB tokens of x in shared memory, transposed to (k, NB) so that an
// entry's NB values are one contiguous read; its 32 warps take rows round-robin (rows are short next to
// the GPU: 11008 rows over 132 x 32 warps), each row by one warp, lanes over its entries, then a
// transposing butterfly leaves token t's sum in lane t * (32 / NB). One warp per row, a fixed order: the
// result does not depend on timing. The grid is as many blocks as fit at once (each loads x once);
// token tiles beyond the first are more blocks (W is read once per tile).
//
// Measured (H100, standalone harness, bf16, L2 flushed; cuBLAS dense 36-37 us; floors at 3.0 TB/s):
// 11008 x 4096 at 90%: N = 1 12.3 us (2.97x cuBLAS; floor 6.0 us), N = 4 15.1 us, N = 8 20.1 us, N = 16
// 30.8 us (1.2x); 70%: N = 1 23.9 us (1.54x; floor 18 us); 50%: N = 1 36 us (1.0x). What limits it:
// at N = 1, ~30% of the elapsed cycles have SMs idle (a warp's rows are whole units: 11008 rows over 4224
// warps, 2 or 3 each) and DRAM runs at 47%; at N = 16, shared memory (L1/TEX 82% busy: random columns'
// 16-byte reads conflict in banks). Tried and dropped: rows cut among 2 or 4 warps with a block barrier
// per round (slower: 14.4 -> 20.8 us), 2..8 lanes per entry each taking 2..8 of the 16 tokens (slower);
// a "banked" entry order (each row's entries bucketed by column mod 8 so that every 8-lane group reads 8
// different banks, padding where a residue runs out: rows +22% entries at 90%): shared-load conflicts went
// from 57% of the wavefronts to none, N = 16 31.1 -> 27.3 us, but the kernel stays bound by its 13.5M
// instructions (~96 per entry at N = 16, issue 0.5-0.6 per scheduler cycle, short-scoreboard stalls);
// not adopted for 12% (a second layout and route; ncu_n16_plain_vs_banked.txt in the H100 results).
//
// Bounds: rows' entry ranges are clamped to [0, nnz], columns to the tile's zero column (columns >= k read
// zeros): whatever the layout holds, every read stays in bounds (a corrupt layout gives a wrong product).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/activation.h"

namespace sparsetorch {
namespace cuda {
namespace csr16 {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
// 16-byte loads (4 entries) per lane in flight (a trip covers 128 * unroll consecutive entries of a row):
// more where the accumulators leave registers for them.
template <int NB>
__host__ __device__ constexpr int unroll() { return NB <= 2 ? 4 : NB == 4 ? 2 : 1; }

struct Params {
  const int* crow;          // (m + 1,)
  const uint32_t* entries;  // (nnz,): value bits << 16 | column; 16-byte aligned
  int nnz;
  const uint16_t* x;        // (n, ldx), 16-byte aligned, ldx % 8 == 0, columns [k, kx) zero
  int64_t ldx;
  int n, m, k, kx;          // kx: k rounded up to 8 (x's readable columns)
  uint16_t* out;            // (n, m)
  const uint16_t* bias;     // (m,) or null
  Activation act;
  float slope;
};

template <typename T>
struct Bits;
template <>
struct Bits<__nv_bfloat16> {  // bf16 -> fp32 is a shift: one instruction per value
  static __device__ __forceinline__ float high(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
  static __device__ __forceinline__ float low(uint32_t w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <>
struct Bits<__half> {
  static __device__ __forceinline__ float high(uint32_t w) { return __half2float(__ushort_as_half(static_cast<uint16_t>(w >> 16))); }
  static __device__ __forceinline__ float low(uint32_t w) { return __half2float(__ushort_as_half(static_cast<uint16_t>(w))); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

// Where token t of column c sits in x's shared-memory tile (in 16-bit units): (c, t) in a (kx, NB) matrix,
// except that for NB = 16 a column's two 16-byte halves swap places when bit 2 of c is set. Lanes read
// random columns; unswizzled, the first halves of all columns (c * 32 bytes) fall in only four of the
// eight 16-byte bank groups, so a warp's 16-byte reads conflicted about 1.5x more.
template <int NB>
__device__ __forceinline__ int x_slot(int c, int t) {
  if constexpr (NB == 16) {
    return 16 * c + 8 * ((t >> 3) ^ ((c >> 2) & 1)) + (t & 7);
  } else {
    return NB * c + t;
  }
}

// acc[t] += v * x[t] for the NB tokens of column c of x's tile.
template <typename T, int NB>
__device__ __forceinline__ void fma_column(float (&acc)[NB], float v, const uint16_t* xs, int c) {
  if constexpr (NB == 1) {
    acc[0] += v * Bits<T>::low(xs[c]);
  } else {
    constexpr int kWords = NB / 2;
    uint32_t w[kWords];
    if constexpr (NB == 2) {
      w[0] = reinterpret_cast<const uint32_t*>(xs)[c];
    } else if constexpr (NB == 4) {
      const uint2 q = reinterpret_cast<const uint2*>(xs)[c];
      w[0] = q.x, w[1] = q.y;
    } else {
      const uint4* col = reinterpret_cast<const uint4*>(xs) + (NB / 8) * c;
      const int swap = NB == 16 ? (c >> 2) & 1 : 0;
#pragma unroll
      for (int h = 0; h < NB / 8; ++h) {
        const uint4 q = col[h ^ swap];
        w[4 * h] = q.x, w[4 * h + 1] = q.y, w[4 * h + 2] = q.z, w[4 * h + 3] = q.w;
      }
    }
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
      acc[2 * j] += v * Bits<T>::low(w[j]);
      acc[2 * j + 1] += v * Bits<T>::high(w[j]);
    }
  }
}

// Sums acc over the warp's lanes, NB sums at once: each round halves the values a lane holds (lanes with
// bit `o` keep the upper half and send the lower); afterwards lane L holds the total of token
// L >> (5 - log2 NB) (NB == 1: every lane holds it).
template <int NB>
__device__ __forceinline__ float warp_sum_tokens(float (&acc)[NB], int lane) {
  int count = NB;
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    if (count > 1) {
      count >>= 1;
      const bool upper = (lane & o) != 0;
#pragma unroll
      for (int j = 0; j < NB / 2; ++j) {
        if (j < count) {
          const float send = upper ? acc[j] : acc[j + count];
          const float keep = upper ? acc[j + count] : acc[j];
          acc[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
      }
    } else {
      acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
    }
  }
  return acc[0];
}

template <int NB>
__host__ __device__ constexpr int log2_tokens() {
  return NB == 1 ? 0 : NB == 2 ? 1 : NB == 4 ? 2 : NB == 8 ? 3 : 4;
}

// Shared memory of one block: x's tile, kx + 1 columns (the last one zero) x NB tokens of 16 bits.
__host__ __device__ inline int64_t block_smem(int kx, int nb) { return int64_t{2} * (kx + 1) * nb + 16; }

// An entry that adds nothing: value +0 at column 0xffff (clamped to the zero column).
constexpr uint32_t kFiller = 0x0000ffffu;

template <typename T, int NB>
__global__ void __launch_bounds__(kThreads, 1) csr16_linear_kernel(const Params p) {
  extern __shared__ __align__(16) uint16_t xs[];  // (kx, NB): token t of column c at xs[x_slot(c, t)]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n0 = blockIdx.y * NB;

  // x's tile, transposed: each thread reads 8 columns of one token (16 bytes) and scatters them; tokens
  // fastest across threads, so that a warp's stores fill contiguous slots (columns fastest: 32-way bank
  // conflicts, 8x slower at N = 16).
  // Four loads per thread are issued before their stores (one at a time, the tile took ~5 us at N = 16).
  const int pieces = p.kx / 8;
  constexpr int kLoads = 4;
  for (int e0 = threadIdx.x; e0 < NB * pieces; e0 += kLoads * kThreads) {
    uint4 v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = e0 + u * kThreads, t = e % NB, c = 8 * (e / NB);
      v[u] = e < NB * pieces && n0 + t < p.n
                 ? __ldg(reinterpret_cast<const uint4*>(p.x + static_cast<int64_t>(n0 + t) * p.ldx + c))
                 : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int e = e0 + u * kThreads, t = e % NB, c = 8 * (e / NB);
      if (e >= NB * pieces) break;
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        xs[x_slot<NB>(c + 2 * j, t)] = static_cast<uint16_t>(w[j]);
        xs[x_slot<NB>(c + 2 * j + 1, t)] = static_cast<uint16_t>(w[j] >> 16);
      }
    }
  }
  if (threadIdx.x < NB) xs[x_slot<NB>(p.kx, threadIdx.x)] = 0;
  __syncthreads();

  // Columns >= k read zeros: x's padding up to kx and one more column, kx, zeroed above. Out-of-range
  // columns (a corrupt layout) and the filler entries land there.
  const int zero_col = p.kx;
  constexpr int kShift = 5 - log2_tokens<NB>();
  constexpr int kUnroll = unroll<NB>();
  constexpr int kTrip = 128 * kUnroll;  // entries of a row per trip: kUnroll 16-byte loads (4 entries) per lane
  // A warp's rows form one stream of trips: the loads of the next trip (of this row, or the next row's
  // first) are issued before this trip's FMAs, and the next row's pointers a row ahead, so the warp waits
  // for memory about once per trip's compute, not two latencies per row. Trips start at a multiple of 4
  // entries (16-byte loads; the entries before the row's first are loaded and skipped).
  const int stride = gridDim.x * kWarps;
  auto row_range = [&](int64_t r, int& first, int& last) {
    first = last = 0;
    if (r < p.m) {
      first = min(max(__ldg(p.crow + r), 0), p.nnz);
      last = min(max(__ldg(p.crow + r + 1), first), p.nnz);
    }
  };
  // The lane's 4 entries at base + 4 (lane + 32 u); those outside the row [first, last) read as kFiller
  // (value +0 at the zero column), so the FMAs need no test: masking happens here, once per 4 entries.
  uint4 e[kUnroll];
  auto load_trip = [&](int base, int first, int last) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int at = base + 4 * (lane + 32 * u);
      if (at >= first && at + 4 <= last) {
        e[u] = __ldg(reinterpret_cast<const uint4*>(p.entries + at));
      } else {
        auto one = [&](int i) { return i >= first && i < last ? __ldg(p.entries + i) : kFiller; };
        e[u] = make_uint4(one(at), one(at + 1), one(at + 2), one(at + 3));
      }
    }
  };
  int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;  // 64-bit: row + 2 stride may pass 2^31
  int start, end, next_start, next_end;
  row_range(row, start, end);
  row_range(row + stride, next_start, next_end);
  load_trip(start & ~3, start, end);
  for (; row < p.m; row += stride) {
    float acc[NB];
#pragma unroll
    for (int t = 0; t < NB; ++t) acc[t] = 0.f;
    const int base0 = start & ~3;
    const int trips = (end - base0 + kTrip - 1) / kTrip;
    if (trips == 0) load_trip(next_start & ~3, next_start, next_end);
    for (int trip = 0; trip < trips; ++trip) {
      const int base = base0 + trip * kTrip;
      uint4 cur[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) cur[u] = e[u];
      if (trip + 1 < trips) {
        load_trip(base + kTrip, start, end);
      } else {
        load_trip(next_start & ~3, next_start, next_end);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t w[4] = {cur[u].x, cur[u].y, cur[u].z, cur[u].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int col = min(static_cast<int>(w[q] & 0xffffu), zero_col);
          fma_column<T, NB>(acc, Bits<T>::high(w[q]), xs, col);
        }
      }
    }
    start = next_start, end = next_end;
    row_range(row + 2 * static_cast<int64_t>(stride), next_start, next_end);
    const float sum = warp_sum_tokens<NB>(acc, lane);
    const int token = n0 + (lane >> kShift);
    if ((lane & ((1 << kShift) - 1)) == 0 && token < p.n) {
      float z = sum;
      if (p.bias != nullptr) z += Bits<T>::low(p.bias[row]);
      p.out[static_cast<int64_t>(token) * p.m + row] = Bits<T>::from_float(apply_activation(p.act, z, p.slope));
    }
  }
}

// Tokens per block: the fewest of 1, 2, 4, 8, 16 that cover n, at most what shared memory holds (x's
// tile is kx * NB * 2 bytes); 0 when not even one token's column fits.
inline int tokens_per_block(int64_t n, int64_t kx, int64_t smem_per_block) {
  int nb = 1;
  while (nb < 16 && nb < n && block_smem(static_cast<int>(kx), 2 * nb) <= smem_per_block) nb *= 2;
  return block_smem(static_cast<int>(kx), nb) <= smem_per_block ? nb : 0;
}

// f(std::integral_constant<int, NB>{}) for the tile size nb of tokens_per_block (1, 2, 4, 8 or 16): the one
// place that turns it into the kernel's template argument (the op and the standalone harness).
template <typename F>
inline void with_tile_tokens(int nb, F&& f) {
  switch (nb) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return f(std::integral_constant<int, 16>{});
  }
}

// Blocks along the rows: as many as run at once (blocks_per_sm from the occupancy API, each loads x's tile
// once), no more than the rows need.
inline int64_t row_blocks(int64_t m, int blocks_per_sm, int sms) {
  const int64_t wanted = int64_t{blocks_per_sm > 0 ? blocks_per_sm : 1} * sms;
  return std::max<int64_t>(1, std::min<int64_t>((m + kWarps - 1) / kWarps, wanted));
}

}  // namespace csr16
}  // namespace cuda
}  // namespace sparsetorch
