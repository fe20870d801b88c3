// PROTOTYPE (standalone harness benchmarks/pairs_kernel_bench.cu only; not an op yet).
//
// y = act(x @ W^T + bias) with W in the "lane-mask pair" layout, bf16/fp16, fp32 accumulation on tensor
// cores (mma.sync m16n8k16). The groups are the bitmap/slot layouts' 16 x 64 tiles (one warp's A operand
// for four mma steps, the same column order, so a lane's B fragments are x[token][16 t .. 16 t + 15]).
// A lane holds 16 A registers per group, each a pair of adjacent values (register R = 4 step + r, r the
// mma's a0..a3). A group's record:
//   16 masks     word R: bit l set when lane l's register R is not zero
//   pairs        the nonzero registers' words (value j = 0 in the low half), register by register,
//                lanes ascending
// padded to a multiple of 4 words (16-byte aligned records). Lane l decodes register R with no search:
// its word sits popcount(mask_R & lanes below l) past the register's first pair, which is the sum of the
// earlier masks' popcounts. So a group costs ~8 instructions per register and lane whatever it holds,
// the loads of one register are contiguous across lanes (one or two sectors), and the 16 loads of a
// group are independent (issued one group ahead, with the next group's masks).
//
// Bytes per group: 64 + 4 x (nonzero pairs): at 90% sparsity ~19% of the 512 pairs are nonzero (452 bytes
// against the slot layout's 408 and dense 2048), at 70% 51% (1108), at 50% 75% (1600).
//
// Bounds: a record's start is clamped so that the record's largest possible extent (16 + 512 words) stays
// inside `words`, which carries that many zero words past the last record: whatever the offsets and masks
// hold, every read stays in bounds (a corrupt layout gives a wrong product).
#pragma once

#include "cuda/bitmap_kernel.cuh"

namespace sparsetorch {
namespace cuda {
namespace pairs {

using bitmap::kThreads;
using bitmap::kWarps;
using bitmap::Mma;

constexpr int kRegisters = 16;                                  // A registers per lane and group
constexpr int kHeaderWords = kRegisters;                        // one mask per register
constexpr int kMaxRecordWords = kHeaderWords + 32 * kRegisters;  // 528: every pair present

#ifndef SPARSETORCH_PAIR_MIN_BLOCKS
#define SPARSETORCH_PAIR_MIN_BLOCKS 2
#endif

__host__ __device__ constexpr int block_smem(int nt) { return kWarps * 8 * nt * bitmap::kRedStride * 4; }

struct Params {
  const int* offsets;     // (strips * chunks + 1): word offset of each group's record (multiples of 4)
  const uint32_t* words;  // records, then >= kMaxRecordWords zero words
  int nwords;             // >= kMaxRecordWords
  const uint16_t* x;      // (n, ldx) row-major, 16-byte aligned, ldx % 8 == 0; columns >= kx read as zero
  int64_t ldx;
  int kx;
  int n, m, strips, chunks;
  void* out;  // T (n, m) when gridDim.z == 1; float (gridDim.z, n, m) otherwise
  const uint16_t* bias;
  Activation act;
  float slope;
  int ws, wk, chunks_per_split;
};

template <typename T, int NT>
__global__ void __launch_bounds__(kThreads, SPARSETORCH_PAIR_MIN_BLOCKS) pair_linear_kernel(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ks = warp % p.wk, ss = warp / p.wk;
  const int strip = blockIdx.y * p.ws + ss;
  const int n0 = blockIdx.x * (8 * NT);
  const int split_begin = blockIdx.z * p.chunks_per_split;
  const int split_end = min(p.chunks, split_begin + p.chunks_per_split);
  const int per_warp = (max(split_end - split_begin, 0) + p.wk - 1) / p.wk;
  const int c_begin = min(split_end, split_begin + ks * per_warp);
  const int count = strip < p.strips ? min(split_end, c_begin + per_warp) - c_begin : 0;
  const int64_t group0 = static_cast<int64_t>(strip) * p.chunks + c_begin;
  const uint32_t below = (1u << lane) - 1u, mine = 1u << lane;
  const int last_record = (p.nwords - kMaxRecordWords) & ~3;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int g = lane >> 2, t = lane & 3;
  const uint16_t* xrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int token = n0 + 8 * j + g;
    xrow[j] = token < p.n ? p.x + static_cast<int64_t>(token) * p.ldx + 16 * t : nullptr;
  }
  auto load_x = [&](int j, int col, int h) {
    return xrow[j] != nullptr && col + 16 * t + 8 * h + 8 <= p.kx
               ? __ldg(reinterpret_cast<const uint4*>(xrow[j] + col + 8 * h))
               : make_uint4(0u, 0u, 0u, 0u);
  };
  constexpr int kHeld = NT <= 2 ? NT : 1;  // x fragments held a group ahead (NT <= 2), else loaded in place
  auto fetch_x = [&](int gi, uint4 (&xq)[kHeld][2]) {
    if constexpr (NT <= 2) {
      const int col = (c_begin + gi) * static_cast<int>(kBitmapGroupCols);
#pragma unroll
      for (int j = 0; j < kHeld; ++j) {
        xq[j][0] = load_x(j, col, 0);
        xq[j][1] = load_x(j, col, 1);
      }
    }
  };

  // Record starts, 32 groups at a time: lane l holds group (off_base + l)'s raw offset.
  int off_base = 0, offs = 0;
  auto load_offsets = [&](int base) {
    off_base = base;
    offs = base + lane < count ? __ldg(p.offsets + group0 + base + lane) : 0;
  };
  auto record = [&](int gi) {  // gi warp-uniform, called in increasing order
    if (gi - off_base >= 32) load_offsets(gi);
    const int raw = __shfl_sync(0xffffffffu, offs, gi - off_base);
    return min(max(raw, 0), last_record) & ~3;
  };
  auto load_masks = [&](int rec, uint32_t (&mk)[kRegisters]) {
    const uint4* q = reinterpret_cast<const uint4*>(p.words + rec);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = __ldg(q + i);
      mk[4 * i] = v.x, mk[4 * i + 1] = v.y, mk[4 * i + 2] = v.z, mk[4 * i + 3] = v.w;
    }
  };
  auto load_pairs = [&](int rec, const uint32_t (&mk)[kRegisters], uint32_t (&a)[kRegisters]) {
    // 32-bit word indices: each address is one 32 x 4 -> 64-bit multiply-add, not a 64-bit add chain.
    uint32_t first = static_cast<uint32_t>(rec + kHeaderWords);
#pragma unroll
    for (int r = 0; r < kRegisters; ++r) {
      const uint32_t at = first + static_cast<uint32_t>(__popc(mk[r] & below));
      const uint32_t v = __ldg(p.words + at);  // in bounds whether the lane's bit is set or not
      a[r] = (mk[r] & mine) != 0u ? v : 0u;
      first += static_cast<uint32_t>(__popc(mk[r]));
    }
  };
  auto multiply = [&](int gi, const uint32_t (&a)[kRegisters], const uint4 (&xq)[kHeld][2]) {
    const int col = (c_begin + gi) * static_cast<int>(kBitmapGroupCols);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 xv[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) xv[j] = NT <= 2 ? xq[NT <= 2 ? j : 0][h] : load_x(j, col, h);
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
        const int s = 2 * h + s2;
        const uint32_t f[4] = {a[4 * s], a[4 * s + 1], a[4 * s + 2], a[4 * s + 3]};
#pragma unroll
        for (int j = 0; j < NT; ++j) Mma<T>::run(acc[j], f, s2 ? xv[j].z : xv[j].x, s2 ? xv[j].w : xv[j].y);
      }
    }
  };

  // Two register sets: set (gi & 1) holds group gi's registers, loaded two groups before its multiply;
  // the masks of the next group to load are fetched one group before its pairs.
  uint32_t mk[kRegisters], a0[kRegisters], a1[kRegisters];
  uint4 x0[kHeld][2], x1[kHeld][2];
  int rec = 0;
  if (count > 0) {
    load_offsets(0);
    rec = record(0);
    load_masks(rec, mk);
    load_pairs(rec, mk, a0);
    fetch_x(0, x0);
    if (count > 1) {
      rec = record(1);
      load_masks(rec, mk);
      load_pairs(rec, mk, a1);
      fetch_x(1, x1);
      if (count > 2) {
        rec = record(2);
        load_masks(rec, mk);
      }
    }
  }
  for (int gi = 0; gi < count; gi += 2) {
    multiply(gi, a0, x0);
    if (gi + 2 < count) {
      load_pairs(rec, mk, a0);
      fetch_x(gi + 2, x0);
      if (gi + 3 < count) {
        rec = record(gi + 3);
        load_masks(rec, mk);
      }
    }
    if (gi + 1 < count) {
      multiply(gi + 1, a1, x1);
      if (gi + 3 < count) {
        load_pairs(rec, mk, a1);
        fetch_x(gi + 3, x1);
        if (gi + 4 < count) {
          rec = record(gi + 4);
          load_masks(rec, mk);
        }
      }
    }
  }
  bitmap::write_block_sums<T, NT>(acc, reinterpret_cast<float*>(smem), p.ws, p.wk, p.m, p.n, n0, p.bias, p.act,
                                  p.slope, p.out);
}

}  // namespace pairs
}  // namespace cuda
}  // namespace sparsetorch
