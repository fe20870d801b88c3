// The slot layout of a pruned bf16/fp16 weight W (out_features x in_features): the bitmap layout's groups
// (common/bitmap_layout.h: 16 rows x 64 columns, one warp's A operand for four mma.m16n8k16 steps), but
// each nonzero carries its slot in the group's fragment-order tile instead of a bit in a bitmap:
//   offsets  int32 (strips * chunks + 1)  group g's entries are entries[offsets[g] .. offsets[g + 1]);
//                                          groups in (strip, chunk) order (the banded variant:
//                                          below), the last entry = nnz
//   entries  int32 (nnz,)                  value_bits << 16 | slot (slot 0 .. 1023, distinct within a group)
// Slot s of a group is element s % 8 of lane (s / 8) % 32's 16-byte A fragment of mma step s / 256:
// register (s % 8) / 2, half s % 2. With the bitmap layout's column order (any permutation of a chunk's 64
// columns works if x is read the same way) that is row g + 8 (r % 2), column 16 t + 4 step + 2 (r / 2) + j
// for lane = 4 g + t, register r, half j. So the CUDA kernel writes each value to its slot of a zeroed
// shared tile (one store per value, no decoding) and reads each lane's 16 A registers back as four 16-byte
// loads; a lane's B fragments for the four steps are x[token][16 t .. 16 t + 15] of the chunk.
// 4 bytes per nonzero (18 MB for 11008 x 4096 at 90% sparsity; bitmap 14.8 MB, dense bf16 90 MB), read as
// one coalesced stream. sparsetorch/pruned/slots.py writes the layout; cpu/slot_cpu.cpp and cuda/slot_linear.cu
// read it.
//
// The banded variant (for weights of many strips: chosen when the weight is built, passed to the op as
// `banded`) differs in two orders, both for the CUDA kernel's sake:
//  - groups in (band, chunk, strip in band) order, band b = strips 2b and 2b + 1 (offsets hold
//    2 * ceil(strips / 2) * chunks + 1 entries; an odd last strip's partner groups are empty), so one warp
//    streams both strips of a band and loads each chunk's x fragments once for two groups;
//  - slots numbered lane-consecutively, step << 8 | register << 6 | lane << 1 | half, so the tile's 32-bit
//    words a lane reads back are 32 apart and the read-and-zero is one conflict-free atomic exchange per
//    word instead of a 16-byte load and a 16-byte store.
// (Measured in a harness, H100, 11008 x 4096, 90%, N = 16: 27.8 -> 22.4 us; on 4096 x 11008, with half as
// many work units as strips, the variant costs 2-12%; the record: docs/history.md, pruned-weight kernels.)
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

// The fragment-order slot (the plain layout's numbering, below) of a slot of the banded variant.
SPARSETORCH_SLOT_HD inline int fragment_slot(int slot, bool banded) {
  if (!banded) return slot;
  const int j = slot & 1, lane = (slot >> 1) & 31, r = (slot >> 6) & 3, step = slot >> 8;
  return step << 8 | lane << 3 | r << 1 | j;
}

// Row (0..15) and column (0..63) within its group of fragment-order slot `slot` (0..1023).
SPARSETORCH_SLOT_HD inline void slot_position(int slot, int& row, int& col) {
  const int j = slot & 1, r = (slot >> 1) & 3, lane = (slot >> 3) & 31, step = slot >> 8;
  const int g = lane >> 2, t = lane & 3;
  row = g + 8 * (r & 1);
  col = 16 * t + 4 * step + 2 * (r >> 1) + j;
}

// Groups of a weight of `strips` x `chunks` groups in either order (the banded one pads to whole bands).
SPARSETORCH_SLOT_HD inline int64_t slot_groups(int64_t strips, int64_t chunks, bool banded) {
  return banded ? 2 * ((strips + 1) / 2) * chunks : strips * chunks;
}

// The index of group (strip, chunk), and back.
SPARSETORCH_SLOT_HD inline int64_t slot_group(int64_t strip, int64_t chunk, int64_t chunks, bool banded) {
  return banded ? ((strip >> 1) * chunks + chunk) * 2 + (strip & 1) : strip * chunks + chunk;
}
SPARSETORCH_SLOT_HD inline void slot_group_position(int64_t group, int64_t chunks, bool banded, int64_t& strip,
                                                    int64_t& chunk) {
  if (banded) {
    const int64_t band = group / (2 * chunks), within = group % (2 * chunks);
    strip = 2 * band + (within & 1);
    chunk = within >> 1;
  } else {
    strip = group / chunks;
    chunk = group % chunks;
  }
}

}  // namespace sparsetorch
