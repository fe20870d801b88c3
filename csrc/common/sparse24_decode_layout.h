// Where a chunk of the packed 2:4 decode layout lives (layout: common/sparse24_decode_checks.h; the register
// mapping: cuda/sparse24_decode_kernel.cuh). One place for the walk that the CPU reference
// (cpu/sparse24_decode_cpu.cpp) and the conversions (cpu/pruned_layouts_cpu.cpp, cuda/pruned_layouts.cu: the
// expansion to dense, the packing of a pair CSR) all take, host and device alike.
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

// The metadata word `word` (flat index into (m/16, ktp/8, 32, 4)) holds the nibbles of 8 chunks: chunk
// chunk0 + j of rows row0 (bits 4j) and row0 + 8 (bits 16 + 4j), j = 0..3 (the inverse of the word above).
SPARSETORCH_S24_HD inline void sparse24_decode_word_chunks(int64_t word, int64_t ktp, int64_t& row0, int64_t& chunk0) {
  const int w = static_cast<int>(word & 3), lane_m = static_cast<int>(word >> 2) & 31;
  const int64_t blocks = ktp >> 3, block = (word >> 7) % blocks, rt = (word >> 7) / blocks;
  const int g = lane_m >> 2, s = (lane_m >> 1) & 1, role = lane_m & 1;
  const int64_t kt = 2 * (4 * block + w) + s;
  row0 = 16 * rt + g;
  chunk0 = 8 * kt + 4 * role;
}

// The nibble of a chunk of an all-zero padding tile: positions 0 and 1 (valid metadata, zero values).
constexpr uint32_t kSparse24DecodePadNibble = 0x4;

// A chunk's 4 positions as 16-bit fields (position p in bits 16p) from its value pair (first value in the low
// half) and its nibble: zeros elsewhere; where a nibble names one position twice the second value is kept.
SPARSETORCH_S24_HD inline uint64_t sparse24_decode_chunk_bits(uint32_t pair, uint32_t nib) {
  const int first = 16 * static_cast<int>(nib & 3u), second = 16 * static_cast<int>((nib >> 2) & 3u);
  const uint64_t bits = static_cast<uint64_t>(pair & 0xffffu) << first;
  return (bits & ~(uint64_t{0xffffu} << second)) | (static_cast<uint64_t>(pair >> 16) << second);
}

// Packs metadata word `word` of an m x k weight (k % 32 == 0) from a CSR in the pair layout (two entries per
// chunk of 4 columns, in order: entry 2 (row k/4 + chunk) + i): its 8 chunks' nibbles from the columns (whatever
// they hold, the low 2 bits name a position inside the chunk) and their value pairs (16-bit values read as
// 32-bit pairs, `pairs_in`) copied to the layout (`pairs_out`); padding tiles get zeros and the pad nibble.
// Returns the word.
template <typename index_t>
SPARSETORCH_S24_HD inline uint32_t sparse24_decode_pack_word(int64_t word, int64_t ktp, int64_t k, const index_t* col,
                                                              const uint32_t* pairs_in, uint32_t* pairs_out) {
  int64_t row0 = 0, chunk0 = 0;
  sparse24_decode_word_chunks(word, ktp, row0, chunk0);
  const int64_t chunks = k / 4;
  uint32_t bits = 0;
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      const int64_t row = row0 + 8 * h, chunk = chunk0 + j;
      uint32_t nib = kSparse24DecodePadNibble, pair = 0;
      if (chunk < chunks) {
        const index_t* c = col + 2 * (row * chunks + chunk);
        nib = (static_cast<uint32_t>(c[0]) & 3u) | ((static_cast<uint32_t>(c[1]) & 3u) << 2);
        pair = pairs_in[row * chunks + chunk];
      }
      bits |= nib << (4 * j + 16 * h);
      pairs_out[sparse24_decode_chunk(row, chunk, ktp).value >> 1] = pair;
    }
  }
  return bits;
}

}  // namespace sparsetorch
