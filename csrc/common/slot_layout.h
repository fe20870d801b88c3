// The slot layout of a pruned bf16/fp16 weight W (out_features x in_features): W cut into groups of 16 rows
// x 64 columns (the bitmap layout's strips and chunks, common/bitmap_layout.h: one warp's A operand for four
// mma.m16n8k16 steps), each nonzero stored with its slot in the group's fragment-order tile:
//   offsets  int32 (strips * chunks + 1)  group g's entries are entries[offsets[g] .. offsets[g + 1]);
//                                          groups in (strip, chunk) order, every offset a multiple of 32,
//                                          the last one = the number of entries
//   entries  int32                         slot << 16 | value_bits; slot 0 .. 1023 (distinct within a
//                                          group), or kSlotPad (1024): padding, no value
// A group's entries are whole rounds of 32 (padded with kSlotPad entries): lane l of the warp writes entry
// 32 r + l of round r to its slot, so a round is one coalesced 128-byte load and one 16-bit shared store per
// lane, with no per-entry bounds or group checks. sparsetorch/_slots.py orders a group's entries so that a
// round's slots fall in distinct shared-memory banks where it can (the r-th entry of each bank in round
// order), so the stores rarely conflict.
// Slot s of a group is element s % 8 of lane (s / 8) % 32's 16-byte A fragment of mma step s / 256:
// register r = (s % 8) / 2, half j = s % 2, lane = 4 g + t: row g + 8 (r % 2) and, since any permutation of
// a chunk's 64 columns works if x is read the same way, column 32 (step / 2) + 8 t + 4 (step % 2) +
// 2 (r / 2) + j. With that order a lane's B fragments for steps 0, 1 are x[token][8 t .. 8 t + 7] of the
// chunk and for steps 2, 3 x[token][32 + 8 t .. 32 + 8 t + 7]: each 16-byte load of x reads 64 contiguous
// bytes per token across the four lanes of a row (whole 32-byte sectors).
// Bytes: 4 per entry, padding included (11008 x 4096 at 90% sparsity: 102 nonzeros per group on average,
// ~121 entries with padding, 21 MB; bitmap layout 14.8 MB; dense bf16 90 MB). sparsetorch/_slots.py writes
// the layout; cpu/slot_cpu.cpp and cuda/slot_linear.cu read it.
#pragma once

#include <cstdint>

#include "common/bitmap_layout.h"

#if defined(__CUDACC__)
#define SPARSETORCH_SLOT_HD __host__ __device__
#else
#define SPARSETORCH_SLOT_HD
#endif

namespace sparsetorch {

constexpr int kSlotRound = 32;    // entries per round: one per lane
constexpr uint32_t kSlotPad = 1024;  // the slot of a padding entry (kBitmapGroupElems: past the tile's slots)

// Row (0..15) and column (0..63) within its group of slot `slot` (0..1023).
SPARSETORCH_SLOT_HD inline void slot_position(int slot, int& row, int& col) {
  const int j = slot & 1, r = (slot >> 1) & 3, lane = (slot >> 3) & 31, step = slot >> 8;
  const int g = lane >> 2, t = lane & 3;
  row = g + 8 * (r & 1);
  col = 32 * (step >> 1) + 8 * t + 4 * (step & 1) + 2 * (r >> 1) + j;
}

}  // namespace sparsetorch
