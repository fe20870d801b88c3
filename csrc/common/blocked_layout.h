// The 4-row blocked layout of A that SpmmPlan builds for the "blocked" route (sparsetorch/_blocked.py
// writes it; cpu/spmm_blocked_cpu.cpp and cuda/spmm_blocked.cu read it).
//
// Rows are taken four at a time (a "group"); for each group, every column where any of its four rows
// has an entry becomes one block of four values (zeros where a row has no entry, repeated columns
// summed). Groups are gathered 32 to a "tile" (128 rows) and columns cut into 64-wide "chunks". Blocks
// are stored ordered by (tile, chunk, group in tile, column), so one tile's blocks of one chunk are
// contiguous:
//   tile_ptr     int32 (tiles * chunks * 32 + 1,): blocks of (tile t, chunk c, group g) are
//                [tile_ptr[(t * chunks + c) * 32 + g], tile_ptr[(t * chunks + c) * 32 + g + 1])
//   block_col    int32 (blocks,): the block's column minus its chunk's first column, in [0, 64)
//   block_values float32 (blocks, 4): the values of rows 4 * group + 0..3 in that column
// Why: each block value of B loaded into registers then feeds four rows (sparse kernels otherwise
// feed one FMA per B element loaded, capping them at shared-memory bandwidth, 25% of the FP32 peak on
// Hopper); the price is the zeros multiplied in a block (a block holds 1.46 entries on average at 25%
// density, 2.7 at 50%).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "common/checks.h"

namespace sparsetorch {

constexpr int64_t kBlockRows = 4;     // rows per group (one block = this many values)
constexpr int64_t kTileGroups = 32;   // groups per tile (128 rows: one CUDA thread block)
constexpr int64_t kChunkCols = 64;    // columns of A (rows of B) per chunk

inline int64_t blocked_groups(int64_t rows) { return (rows + kBlockRows - 1) / kBlockRows; }
inline int64_t blocked_tiles(int64_t rows) { return (blocked_groups(rows) + kTileGroups - 1) / kTileGroups; }
inline int64_t blocked_chunks(int64_t cols) { return (cols + kChunkCols - 1) / kChunkCols; }

// The checks of one spmm_blocked call, out (m, n) = act(alpha * A @ dense + beta * accumulate + bias)
// with A (m, k) given as CSR and in the blocked layout above, dense (k, n): check_spmm_args on the CSR
// (one unbatched matrix, float32), then O(1) checks of the layout against it (dtypes, devices, dims,
// tile_ptr's length for m and k). Its contents are not re-validated per call (sparsetorch/_blocked.py
// builds it; the CUDA kernel clamps what it reads to its shared-memory stages). ValueError /
// TypeError naming the argument. Returns the CSR's problem.
SpmmProblem check_blocked_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                                  const at::Tensor& tile_ptr, const at::Tensor& block_col,
                                  const at::Tensor& block_values, const at::Tensor& dense,
                                  const std::optional<at::Tensor>& accumulate, const std::optional<at::Tensor>& bias);

}  // namespace sparsetorch
