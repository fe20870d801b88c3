// The strip layout of A that SpmmPlan builds for the "blocked" route (sparsetorch/pruned/blocked.py writes
// it; cpu/spmm_blocked_cpu.cpp and cuda/spmm_blocked.cu read it).
//
// Rows are taken eight at a time (a "strip") and each strip as four pairs of rows. For every column
// where any row of a strip has an entry there is one block: its column and the values of the pairs
// that have an entry in that column (both values of such a pair stored, a zero where one row has no
// entry; repeated columns summed). Which pairs a block stores is its pattern (bit j: pair j = rows
// 2j, 2j + 1 of the strip; 1..15). Strips are gathered 16 to a "tile" (128 rows) and columns cut into
// 64-wide "chunks". A "run" is the blocks of one (tile, chunk, strip in tile, pattern), stored in
// that order (patterns 0..15, 0 always empty), columns ascending inside a run:
//   run_ptr     int32 (2, runs + 1), runs = tiles * chunks * 16 * 16: row 0 the first block of each run,
//               row 1 its first pair; run r = ((t * chunks + c) * 16 + s) * 16 + pattern
//   block_col   int32 (blocks,): the block's column minus its chunk's first column, in [0, 64)
//   pair_values float32 (pairs, 2): a run's blocks' pairs, block after block, pairs in ascending j
// So one tile's blocks (and pairs) of one chunk are contiguous, and the CUDA kernel runs each pattern's
// blocks with code specialised to that pattern: no branch per block, no pair of zeros multiplied.
// Why: each B element loaded feeds every pair of the strip that has an entry in its column (3.9 FMAs
// per element at 25% density) instead of one, so the kernel is not capped by shared-memory bandwidth
// at 25% of the FP32 peak; the price is the zero of a pair with one entry (at 25% density 57% of the
// FMAs are useful).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "common/checks.h"

namespace sparsetorch {

constexpr int64_t kStripRows = 8;     // rows per strip
constexpr int64_t kStripPairs = kStripRows / 2;
constexpr int64_t kPatterns = int64_t{1} << kStripPairs;  // 16: which pairs a block stores
constexpr int64_t kTileStrips = 16;   // strips per tile (128 rows: one CUDA thread block)
constexpr int64_t kChunkCols = 64;    // columns of A (rows of B) per chunk

inline int64_t blocked_strips(int64_t rows) { return (rows + kStripRows - 1) / kStripRows; }
inline int64_t blocked_tiles(int64_t rows) { return (blocked_strips(rows) + kTileStrips - 1) / kTileStrips; }
inline int64_t blocked_chunks(int64_t cols) { return (cols + kChunkCols - 1) / kChunkCols; }
inline int64_t blocked_runs(int64_t rows, int64_t cols) {
  return blocked_tiles(rows) * blocked_chunks(cols) * kTileStrips * kPatterns;
}
// Pairs a block of pattern `pattern` stores.
constexpr int pattern_pairs(int pattern) {
  return (pattern & 1) + (pattern >> 1 & 1) + (pattern >> 2 & 1) + (pattern >> 3 & 1);
}

// The checks of one spmm_blocked call, out (m, n) = act(alpha * A @ dense + beta * accumulate + bias)
// with A (m, k) given as CSR and in the strip layout above, dense (k, n): check_spmm_args on the CSR
// (one unbatched matrix, float32), then O(1) checks of the layout against it (dtypes, devices, dims,
// run_ptr's shape for m and k). Its contents are not re-validated per call on CUDA
// (sparsetorch/pruned/blocked.py builds it; the kernel clamps what it reads to the arrays and to its
// shared-memory stages, so a bad layout gives a wrong product, never a fault); the CPU kernel checks
// them. ValueError / TypeError naming the argument. Returns the CSR's problem.
SpmmProblem check_blocked_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                               const at::Tensor& run_ptr, const at::Tensor& block_col, const at::Tensor& pair_values,
                               const at::Tensor& dense, const std::optional<at::Tensor>& accumulate,
                               const std::optional<at::Tensor>& bias);

}  // namespace sparsetorch
