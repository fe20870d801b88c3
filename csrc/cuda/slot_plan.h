// The slot kernel's sizes and launch plan (cuda/slot_kernel.cuh is the kernel): plain C++, a pure function of
// (shape, layout, the device's limits), compiled into the CPU build's tests too (tests/test_launch_plans.py).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/slot_layout.h"
#include "cuda/bitmap_plan.h"

namespace sparsetorch {
namespace cuda {
namespace slot {

using bitmap::kThreads;
using bitmap::kWarps;

constexpr int kTileBytes = kBitmapGroupElems * 2;  // one group's A fragments, fragment order, per warp
constexpr int kMaxGroupEntries = static_cast<int>(kBitmapGroupElems);
// The stream walk's ring: kStages trips of kTrip entries (one 16-byte cp.async per lane per trip).
constexpr int kTrip = 128;
constexpr int kStages = 4;
constexpr int kRingBytes = kStages * kTrip * 4;
// Accumulator sets per warp: two in the banded layout (a band's two strips).
SPARSETORCH_HD constexpr int sets(bool banded) { return banded ? 2 : 1; }
// How a warp walks its entries, by tokens per warp (8 NT): group by group for NT = 4 of the plain layout,
// as a stream otherwise (measured, H100, bf16, 11008 x 4096 and 4096 x 11008 at 90%: N = 16 stream 30.0 /
// 27.3 us, group walk 32.6 / 34.6; N = 32 stream 44.7 / 51.8, group walk 39.3 / 39.9; N = 64 stream 75.0
// / 52.1, group walk 81.8 / 58.6). The banded walk is a stream: its two groups per chunk share x.
SPARSETORCH_HD constexpr bool walks_groups(int nt, bool banded) { return nt == 4 && !banded; }
SPARSETORCH_HD constexpr int warp_smem(int nt, bool banded) {
  return walks_groups(nt, banded) ? kTileBytes : kRingBytes + kTileBytes;
}
// The block's shared memory: the warps' rings and tiles, reused as the reduction buffer at the end.
SPARSETORCH_HD constexpr int block_smem(int nt, bool banded) {
  return kWarps * warp_smem(nt, banded) > kWarps * 8 * nt * sets(banded) * bitmap::kRedStride * 4
             ? kWarps * warp_smem(nt, banded)
             : kWarps * 8 * nt * sets(banded) * bitmap::kRedStride * 4;
}
// Blocks per SM the launch plans its work split for: 3 while a thread's registers fit in 85, 2 where the
// accumulators and held x fragments need more (NT = 8; NT = 4 banded).
SPARSETORCH_HD constexpr int blocks_per_sm(int nt, bool banded) { return nt <= 2 || (nt == 4 && !banded) ? 3 : 2; }
// The kernel's launch bound (MIN_BLOCKS) is the planned blocks per SM, except one case: the banded NT = 1
// kernel (70 registers: 3 blocks per SM) held to 64 registers fits 4 per SM, as the plain one does
// unbounded, so a grid of more than 3 and at most 4 blocks per SM runs in one wave. Only then: the bound
// costs 4-9% where the grid fits anyway (measured, H100, 90%, N = 1: 14336 x 4096, 448 blocks, 32.0 us
// unbounded, 26.7 held, plain 26.3; 11008 x 4096, 344 blocks, 21.1 unbounded, 23.0 held, plain 25.2).
constexpr int kHeldBlocks = 4;
// The widest token tile per warp: the banded kernel's two accumulator sets stop at NT = 4.
SPARSETORCH_HD constexpr int max_nt(bool banded) { return banded ? 4 : 8; }

// How a call is cut: NT (tiles of 8 tokens per warp) and the work split (bitmap::split_work over strips, or
// bands of two strips in the banded layout), for about as many blocks as fit on the GPU at once.
struct Launch {
  int nt = 1, ws = kWarps, wk = 1, splits = 1, chunks_per_split = 1, smem = 0;
  int64_t column_tiles = 1, row_blocks = 1;
  int64_t units = 0;      // the kernel's Params::strips: strips, or bands
  bool held = false;      // run the banded NT = 1 kernel held to kHeldBlocks per SM (above)
};

inline Launch choose_launch(int64_t m, int64_t n, int64_t k, bool banded, int sms, int64_t smem_per_sm,
                            int64_t smem_reserved, int64_t smem_per_block) {
  Launch l;
  l.nt = std::min(n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8, max_nt(banded));
  l.column_tiles = (n + 8 * l.nt - 1) / (8 * l.nt);
  l.smem = block_smem(l.nt, banded);
  if (l.smem > smem_per_block) {
    l.smem = 0;
    return l;
  }
  const int64_t per_sm =
      std::max<int64_t>(1, std::min<int64_t>(blocks_per_sm(l.nt, banded), smem_per_sm / (l.smem + smem_reserved)));
  l.units = banded ? (bitmap_strips(m) + 1) / 2 : bitmap_strips(m);
  bitmap::split_work(l.units, bitmap_chunks(k), l.column_tiles, per_sm * sms, l.ws, l.wk, l.row_blocks, l.splits,
                     l.chunks_per_split);
  const int64_t blocks = l.column_tiles * l.row_blocks * l.splits;
  l.held = banded && l.nt == 1 && blocks > per_sm * sms && blocks <= kHeldBlocks * sms &&
           kHeldBlocks * (l.smem + smem_reserved) <= smem_per_sm;
  return l;
}

}  // namespace slot
}  // namespace cuda
}  // namespace sparsetorch
