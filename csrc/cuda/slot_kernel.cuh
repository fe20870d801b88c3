// The CUDA kernel of slot_linear: y = act(x @ W^T + bias) with W in the slot layout (common/slot_layout.h),
// bf16 or fp16, fp32 accumulation on tensor cores (mma.sync m16n8k16). Torch-free (cuda/slot_linear.cu is
// the op).
//
// Why: the bitmap kernel (cuda/bitmap_kernel.cuh) spends ~400 warp instructions per 16 x 64 group on
// finding where its values go. Here each value carries its slot in the fragment-order tile and a group is
// whole rounds of 32 entries, so a round costs a lane one 4-byte load (issued 2-8 rounds early), a
// clamp and one 16-bit shared store; a group adds four 16-byte tile loads and four zeroing stores per
// lane, the x fragments and 4 * NT mma. (The first version of this layout packed groups without padding
// and scanned 128-entry trips for group boundaries: ~240 warp instructions per group at 90% sparsity,
// 26-30 us for 11008 x 4096 at N <= 16 on an H100, against ~6 us of memory floor.)
//
// Work split as in the bitmap kernel (bitmap::split_work): a block's eight warps take ws strips x wk parts
// of their chunks, chunks also split among blocks (blockIdx.z) for small grids; partial sums are added in
// a fixed order (bitmap::write_block_sums and the split-k reduction): the result does not depend on timing.
// A warp's groups (one strip, consecutive chunks) are one contiguous run of rounds, walked in order through
// a ring of rounds_ahead(NT) rounds held in registers (the loop is unrolled as many times so the ring is indexed
// statically); when a round ends its group the warp multiplies the tile. x is read from global memory
// (L1/L2: small next to W), for NT <= 2 one group ahead.
//
// Bounds: offsets are clamped to [0, entries] and made non-decreasing as read, round positions past the
// warp's last round read as padding, slots are clamped to kSlotPad (the tile has room for it): whatever the layout
// holds, every access stays in bounds and the work is bounded by the entries (a corrupt layout gives a
// wrong product; two entries of one slot keep one).
#pragma once

#include "cuda/bitmap_kernel.cuh"
#include "common/slot_layout.h"

namespace sparsetorch {
namespace cuda {
namespace slot {

using bitmap::kThreads;
using bitmap::kWarps;
using bitmap::Mma;

// One warp's tile: the group's A fragments in fragment order, and one more 16-byte word that padding
// entries (slot kSlotPad) write to.
constexpr int kTileBytes = kBitmapGroupElems * 2 + 16;
// Rounds in flight per warp (registers; the walk loop is unrolled this many times): fewer where the
// accumulators and x fragments of more tokens need the registers.
__host__ __device__ constexpr int rounds_ahead(int nt) { return nt <= 2 || nt == 4 ? 8 : 2; }
// The block's shared memory: the warps' tiles, reused as the reduction buffer at the end.
__host__ __device__ constexpr int block_smem(int nt) {
  return kWarps * kTileBytes > kWarps * 8 * nt * bitmap::kRedStride * 4 ? kWarps * kTileBytes
                                                                        : kWarps * 8 * nt * bitmap::kRedStride * 4;
}
static_assert(kTileBytes % 16 == 0, "tiles must stay 16-byte aligned");

struct Params {
  const int* offsets;       // (strips * chunks + 1)
  const uint32_t* entries;  // (nentries,): slot << 16 | value bits
  int nentries;
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
  int prefetch;             // kPrefetchEntries | kPrefetchX (hints; the result does not depend on them)
};
// Prefetch hints: the warp's entries into L2 32 rounds ahead (one prefetch per lane per 32 rounds), and the
// x rows of the group after next into L1 (one per lane per group for NT <= 2).
constexpr int kPrefetchEntries = 1, kPrefetchX = 2;

__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
}
__device__ __forceinline__ void prefetch_l1(const void* ptr) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(ptr));
}

template <typename T, int NT>
__global__ void __launch_bounds__(kThreads, NT <= 2 ? 3 : 2) slot_linear_kernel(const Params p) {
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
  uint4* tile4 = reinterpret_cast<uint4*>(smem + warp * kTileBytes);
  uint16_t* tile = reinterpret_cast<uint16_t*>(tile4);
#pragma unroll
  for (int r = 0; r < 4; ++r) tile4[lane + 32 * r] = make_uint4(0u, 0u, 0u, 0u);
  __syncwarp();

  const int64_t group0 = static_cast<int64_t>(strip) * p.chunks + c_begin;
  const int total = p.nentries;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int g = lane >> 2, t = lane & 3;
  // The lane's row of x in tile j: token n0 + 8 j + g from column 8 t (read only when the token exists).
  const uint16_t* xlane = p.x + static_cast<int64_t>(min(n0 + g, max(p.n - 1, 0))) * p.ldx + 8 * t;
  auto load_x = [&](int j, int col, int h) {  // 8 values of x for tile j: chunk columns col + 32 h + 8 t ..
    return n0 + 8 * j + g < p.n && col + 32 * h + 8 * t + 8 <= p.kx
               ? __ldg(reinterpret_cast<const uint4*>(xlane + 8 * j * p.ldx + col + 32 * h))
               : make_uint4(0u, 0u, 0u, 0u);
  };
  // NT <= 2: the x fragments of one group in registers, fetched a group ahead.
  constexpr int kHeld = NT <= 2 ? NT : 1;
  uint4 xq[kHeld][2];
  int xq_group = -1;
  auto fetch_x = [&](int gi) {
    if (NT <= 2) {
      const int col = (c_begin + gi) * static_cast<int>(kBitmapGroupCols);
#pragma unroll
      for (int jt = 0; jt < kHeld; ++jt) {
        xq[jt][0] = load_x(jt, col, 0);
        xq[jt][1] = load_x(jt, col, 1);
      }
      xq_group = gi;
    }
  };
  // Multiplies the tile (group gi, complete) into acc and zeroes it again.
  auto multiply = [&](int gi) {
    __syncwarp();  // every lane's values are in the tile
    uint32_t a[4][4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint4 v = tile4[32 * s + lane];  // a lane reads and zeroes only its own fragments
      a[s][0] = v.x, a[s][1] = v.y, a[s][2] = v.z, a[s][3] = v.w;
      tile4[32 * s + lane] = make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();  // zeroed before any lane writes the next group's values
    if (NT <= 2 && xq_group != gi) fetch_x(gi);
    const int col = (c_begin + gi) * static_cast<int>(kBitmapGroupCols);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 xv[NT];
#pragma unroll
      for (int jt = 0; jt < NT; ++jt) xv[jt] = NT <= 2 ? xq[NT <= 2 ? jt : 0][h] : load_x(jt, col, h);
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
        for (int jt = 0; jt < NT; ++jt) {
          Mma<T>::run(acc[jt], a[2 * h + s2], s2 ? xv[jt].z : xv[jt].x, s2 ? xv[jt].w : xv[jt].y);
        }
      }
    }
    if (gi + 1 < count) fetch_x(gi + 1);
    if ((p.prefetch & kPrefetchX) && gi + 2 < count) {  // x rows of group gi + 2: token q / 2, half q % 2
      const int col = (c_begin + gi + 2) * static_cast<int>(kBitmapGroupCols);
      for (int q = lane; q < 16 * NT; q += 32) {
        const int token = n0 + (q >> 1), c = col + 32 * (q & 1);
        if (token < p.n && c < p.kx) prefetch_l1(p.x + static_cast<int64_t>(token) * p.ldx + c);
      }
    }
  };

  // The warp's entries [start_all, end_all) as rounds [r_begin, r_end); group bounds warp-uniform, clamped
  // to [previous end, end_all] as read, 32 raw ends at a time (lane l holds group (end_base + l)'s).
  int start_all = 0, end_all = 0;
  if (count > 0) {
    start_all = min(max(__ldg(p.offsets + group0), 0), total);
    end_all = min(max(__ldg(p.offsets + group0 + count), start_all), total);
  }
  const int r_begin = start_all / kSlotRound, r_end = end_all / kSlotRound;
  int end_base = 0, ends = 0;
  auto load_ends = [&](int base) {
    end_base = base;
    ends = base + lane < count ? __ldg(p.offsets + group0 + base + lane + 1) : end_all;
  };
  // Round r's word for this lane, r clamped to the warp's last round: the ring's loads past the end are
  // plain loads of a word never used (no predicate or select on a register with a load in flight, which
  // would wait for it).
  auto load_round = [&](int r) -> uint32_t { return __ldg(p.entries + min(r, r_end - 1) * kSlotRound + lane); };
  // gi: the group that round r belongs to, gend_round its end (in rounds); empty groups are passed over.
  int gi = 0, gend_entries = start_all, gend_round = r_begin;
  auto next_group = [&](int r) {  // the first group from gi on that ends past round r
    while (gi < count) {
      if (gi - end_base >= 32) load_ends(gi);
      gend_entries = min(max(__shfl_sync(0xffffffffu, ends, gi - end_base), gend_entries), end_all);
      gend_round = gend_entries / kSlotRound;
      if (gend_round > r) return;
      ++gi;
    }
  };
  // Scatters round r (word w) and multiplies the tile when r ends its group.
  auto round = [&](int r, uint32_t w) {
    tile[min(w >> 16, kSlotPad)] = static_cast<uint16_t>(w);
    if (r + 1 == gend_round) {
      multiply(gi);
      ++gi;
      next_group(r + 1);
    }
  };
  if (r_end > r_begin) {
    load_ends(0);
    next_group(r_begin);
    fetch_x(gi);
    constexpr int kAhead = rounds_ahead(NT);
    uint32_t ring[kAhead];
#pragma unroll
    for (int d = 0; d < kAhead; ++d) ring[d] = load_round(r_begin + d);
    // Entries into L2 ahead of the ring: lane l the round 32 + l past the current one, every 32 rounds.
    auto prefetch_entries = [&](int r) {
      if ((p.prefetch & kPrefetchEntries) && r + 32 + lane < r_end) prefetch_l2(p.entries + (r + 32 + lane) * kSlotRound);
    };
    if ((p.prefetch & kPrefetchEntries) && r_begin + lane < r_end) prefetch_l2(p.entries + (r_begin + lane) * kSlotRound);
    prefetch_entries(r_begin);
    int rb = r_begin;
    for (; rb + kAhead <= r_end; rb += kAhead) {  // whole trips of kAhead rounds: no per-round test
      if (((rb - r_begin) & 31) + kAhead > 32) prefetch_entries(rb + kAhead);  // once per 32 rounds
#pragma unroll
      for (int d = 0; d < kAhead; ++d) {
        const uint32_t w = ring[d];
        ring[d] = load_round(rb + d + kAhead);
        round(rb + d, w);
      }
    }
#pragma unroll
    for (int d = 0; d < kAhead; ++d) {  // the last rounds, already in the ring
      if (rb + d < r_end) round(rb + d, ring[d]);
    }
  }
  __syncthreads();  // every warp is done with its tile: the tiles become the reduction buffer
  bitmap::write_block_sums<T, NT>(acc, reinterpret_cast<float*>(smem), p.ws, p.wk, p.m, p.n, n0, p.bias, p.act,
                                  p.slope, p.out);
}

// How a call is cut: NT (tiles of 8 tokens per warp) and the work split (bitmap::split_work), for about as
// many blocks as fit on the GPU at once (registers allow 3 per SM for NT <= 2, else 2).
struct Launch {
  int nt = 1, ws = kWarps, wk = 1, splits = 1, chunks_per_split = 1, smem = 0;
  int64_t column_tiles = 1, row_blocks = 1;
};

inline Launch choose_launch(int64_t m, int64_t n, int64_t k, int sms, int64_t smem_per_sm, int64_t smem_reserved,
                            int64_t smem_per_block) {
  Launch l;
  l.nt = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
  l.column_tiles = (n + 8 * l.nt - 1) / (8 * l.nt);
  l.smem = block_smem(l.nt);
  if (l.smem > smem_per_block) {
    l.smem = 0;
    return l;
  }
  const int64_t by_registers = l.nt <= 2 ? 3 : 2;
  const int64_t per_sm = std::max<int64_t>(1, std::min<int64_t>(by_registers, smem_per_sm / (l.smem + smem_reserved)));
  bitmap::split_work(bitmap_strips(m), bitmap_chunks(k), l.column_tiles, per_sm * sms, l.ws, l.wk, l.row_blocks,
                     l.splits, l.chunks_per_split);
  return l;
}

}  // namespace slot
}  // namespace cuda
}  // namespace sparsetorch
