// The bitmap-tile layout of a pruned weight W (out_features x in_features), made for tensor cores
// ("load as sparse, compute as dense", after Flash-LLM and SpInfer's TCA-BME). sparsetorch/pruned/bitmap.py
// writes it; cpu/bitmap_cpu.cpp and cuda/bitmap_linear.cu read it. No torch here: the CUDA kernel's
// header (cuda/bitmap_kernel.cuh) includes this from a standalone benchmark too.
//
// W is cut into groups of 16 rows x 64 columns (a "strip" of rows, a "chunk" of columns): one warp's
// A operand for four mma.m16n8k16 steps. A group is 16 quadrants of 8 x 8 elements; quadrant q feeds
// register r = q % 4 of the A fragment of step s = q / 4. Each quadrant has a 64-bit bitmap of its
// nonzeros, and its values are packed in bit order; a group's values follow each other in quadrant
// order, groups in (strip, chunk) order:
//   bitmaps  int64 (strips, chunks, 16)   (read as uint64)
//   offsets  int32 (strips * chunks + 1)  first packed value of each group; the last entry = nnz
//   values   (nnz,) in W's dtype
// Bit b of quadrant q is the element lane = b / 2 of the mma fragment (g = lane / 4, t = lane % 4)
// holds as its (b % 2)-th value: row g + 8 (r % 2) of the group and, since any permutation of the 64
// columns works if x is read the same way, column 16 t + 4 s + 2 (r / 2) + (b % 2). With that order
// a lane's B fragments for all four steps are x[token][16 t .. 16 t + 15] of the chunk (32
// contiguous bytes), and a lane finds its two values of a quadrant from the bitmap alone: they sit
// at popcount(bits below 2 * lane) past the quadrant's first value.
// Bytes per nonzero: 2 (value) + 8 / (64 * density) (bitmap) + 4 / (1024 * density) (offset): at 90%
// sparsity 2 + 1.25 + 0.04 = 3.29 bytes (11008 x 4096: 9.0 MB of values + 5.6 MB of bitmaps +
// 0.18 MB of offsets), against 2 / density = 20 bytes per nonzero for the dense bf16 weight.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARSETORCH_BITMAP_HD __host__ __device__
#else
#define SPARSETORCH_BITMAP_HD
#endif

namespace sparsetorch {

constexpr int64_t kBitmapGroupRows = 16;
constexpr int64_t kBitmapGroupCols = 64;
constexpr int64_t kBitmapQuadrants = 16;                                   // 8 x 8 tiles per group
constexpr int64_t kBitmapGroupElems = kBitmapGroupRows * kBitmapGroupCols;  // 1024: most values a group holds

inline int64_t bitmap_strips(int64_t rows) { return (rows + kBitmapGroupRows - 1) / kBitmapGroupRows; }
inline int64_t bitmap_chunks(int64_t cols) { return (cols + kBitmapGroupCols - 1) / kBitmapGroupCols; }

// Row (0..15) and column (0..63) within its group of bit `bit` (0..63) of quadrant `q` (0..15).
SPARSETORCH_BITMAP_HD inline void bitmap_position(int q, int bit, int& row, int& col) {
  const int s = q >> 2, r = q & 3, lane = bit >> 1, j = bit & 1;
  row = (lane >> 2) + 8 * (r & 1);
  col = 16 * (lane & 3) + 4 * s + 2 * (r >> 1) + j;
}

}  // namespace sparsetorch
