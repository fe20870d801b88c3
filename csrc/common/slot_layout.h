// The slot layout of a pruned bf16/fp16 weight W (out_features x in_features): the bitmap layout's groups
// (common/bitmap_layout.h: 16 rows x 64 columns, one warp's A operand for four mma.m16n8k16 steps), but
// each nonzero carries its slot in the group's fragment-order tile instead of a bit in a bitmap:
//   offsets  int32 (strips * chunks + 1)  group g's entries are entries[offsets[g] .. offsets[g + 1]);
//                                          groups in (strip, chunk) order, the last entry = nnz
//   entries  int32 (nnz,)                  value_bits << 16 | slot (slot 0 .. 1023, distinct within a group)
// Slot s of a group is element s % 8 of lane (s / 8) % 32's 16-byte A fragment of mma step s / 256:
// register (s % 8) / 2, half s % 2. With the bitmap layout's column order (any permutation of a chunk's 64
// columns works if x is read the same way) that is row g + 8 (r % 2), column 16 t + 4 step + 2 (r / 2) + j
// for lane = 4 g + t, register r, half j. So the CUDA kernel writes each value to its slot of a zeroed
// shared tile (one store per value, no decoding) and reads each lane's 16 A registers back as four 16-byte
// loads; a lane's B fragments for the four steps are x[token][16 t .. 16 t + 15] of the chunk.
// 4 bytes per nonzero (18 MB for 11008 x 4096 at 90% sparsity; bitmap 14.8 MB, dense bf16 90 MB), read as
// one coalesced stream. sparsetorch/_slots.py writes the layout; cpu/slot_cpu.cpp and cuda/slot_linear.cu
// read it.
#pragma once

#include <cstdint>

#include "common/bitmap_layout.h"

#if defined(__CUDACC__)
#define SPARSETORCH_SLOT_HD __host__ __device__
#else
#define SPARSETORCH_SLOT_HD
#endif

namespace sparsetorch {

constexpr int kSlotMask = 1023;  // kBitmapGroupElems - 1: the slot bits of an entry

// Row (0..15) and column (0..63) within its group of slot `slot` (0..1023).
SPARSETORCH_SLOT_HD inline void slot_position(int slot, int& row, int& col) {
  const int j = slot & 1, r = (slot >> 1) & 3, lane = (slot >> 3) & 31, step = slot >> 8;
  const int g = lane >> 2, t = lane & 3;
  row = g + 8 * (r & 1);
  col = 16 * t + 4 * step + 2 * (r >> 1) + j;
}

}  // namespace sparsetorch
