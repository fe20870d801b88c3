// Where a chunk of the packed 2:4 decode layout lives (layout: common/sparse24_decode_checks.h; the register
// mapping: cuda/sparse24_decode_kernel.cuh). One place for the walk that the CPU reference
// (cpu/sparse24_decode_cpu.cpp) and the expansion to dense (cpu/pruned_to_dense_cpu.cpp,
// cuda/pruned_to_dense.cu) both take, host and device alike.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARSETORCH_S24_HD __host__ __device__
#else
#define SPARSETORCH_S24_HD
#endif

namespace sparsetorch {

// Chunk `chunk` (4 columns: 4 chunk .. 4 chunk + 3) of row `row` of a weight with `ktp` packed k-tiles of 32
// columns: its two kept values are values[value], values[value + 1] (flat index into (m/16, ktp, 32, 8)); its
// positions within the chunk are idx0 = nibble & 3 < idx1 = nibble >> 2, nibble = (meta[word] >> shift) & 0xf
// (flat index into (m/16, ktp/8, 32, 4)).
struct Sparse24DecodeChunk {
  int64_t value, word;
  int shift;
};

SPARSETORCH_S24_HD inline Sparse24DecodeChunk sparse24_decode_chunk(int64_t row, int64_t chunk, int64_t ktp) {
  const int64_t rt = row >> 4, kt = chunk >> 3;
  const int h = static_cast<int>(row >> 3) & 1, g = static_cast<int>(row) & 7;  // row = 16 rt + 8 h + g
  const int ct = static_cast<int>(chunk) & 7, role = ct >> 2, t = ct & 3;       // chunk in tile = 4 role + t
  // Lane 4 g + t holds chunks t and t + 4 of rows g and g + 8: register 2 role + h, two halves each.
  const int64_t value = ((rt * ktp + kt) * 32 + 4 * g + t) * 8 + 4 * role + 2 * h;
  // Tile kt's sparsity selector is kt & 1; its metadata thread in quad g is 2 (kt & 1) + role, holding chunks
  // 4 role .. 4 role + 3 of rows g (bits 15:0) and g + 8 (bits 31:16) in word (kt >> 1) & 3 of its four.
  const int lane_m = 4 * g + 2 * static_cast<int>(kt & 1) + role;
  const int64_t word = ((rt * (ktp >> 3) + (kt >> 3)) * 32 + lane_m) * 4 + ((kt >> 1) & 3);
  return {value, word, 4 * t + 16 * h};
}

}  // namespace sparsetorch
