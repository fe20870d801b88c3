// Launch sizes of the SpMM routes that stage data in shared memory (tiled, blocked), as pure functions of
// (dtype, shape, the device's limits): one place for the kernels, the routing's availability query
// (spmm_route_available, common/spmm_routing.h) and the CPU build's tests (tests/test_launch_plans.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/blocked_layout.h"
#include "common/checks.h"
#include "common/spmm_routing.h"
#include "cuda/launch_limits.h"

namespace sparsetorch {
namespace cuda {

// --- tiled (spmm_tiled.cu): 16 warps own 32 rows of A and a tile of output columns; B streams through
// shared memory in two stages of 32 rows.
namespace tiled {
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kTileK = 32;  // B rows per shared-memory stage
constexpr int kStages = 2;

template <int kElemBytes>
struct Shape {
  static constexpr int kVec = 16 / kElemBytes;              // elements per 16-byte access
  static constexpr int kChunks = kElemBytes == 2 ? 1 : 2;   // 16-byte accesses per lane per B row
  static constexpr int kCols = kVec * kChunks;              // output columns per lane
  static constexpr int kTileN = 32 * kCols;                 // output columns per block
  static constexpr int kStage = kTileK * kTileN;            // elements per shared-memory stage
  static constexpr int64_t kSmem = int64_t{kStages} * kStage * kElemBytes;  // 64 KB (fp32, fp64), 32 KB (half)
};

// Dynamic shared memory of a block for elements of elem_bytes (2, 4 or 8); 0 for any other size.
inline int64_t smem_bytes(int elem_bytes) {
  switch (elem_bytes) {
    case 2: return Shape<2>::kSmem;
    case 4: return Shape<4>::kSmem;
    case 8: return Shape<8>::kSmem;
    default: return 0;
  }
}
}  // namespace tiled

// --- blocked (spmm_blocked.cu): a block owns 16 strips (128 rows) x 256 output columns; per 64-row chunk of B
// the B tile and the tile's blocks and pairs of that chunk are staged, double-buffered.
namespace blocked {
constexpr int kWarps = static_cast<int>(kTileStrips);  // one strip per warp
constexpr int kThreads = kWarps * 32;
constexpr int kTileCols = 256;                          // output columns per thread block
constexpr int kF4PerRow = kTileCols / 4;                // float4 per staged B row
constexpr int kF4PerLane = kTileCols / 128;             // float4 of a B row per lane (2)
constexpr int kChunk = static_cast<int>(kChunkCols);
constexpr int kBStage = kChunk * kF4PerRow;             // float4s of B per stage
constexpr int kMaxBlocks = static_cast<int>(kTileStrips * kChunkCols);  // blocks per stage at most
constexpr int kMaxPairs = kMaxBlocks * static_cast<int>(kStripPairs);   // pairs per stage at most
constexpr int kRuns = static_cast<int>(kTileStrips * kPatterns);        // runs per (tile, chunk)
constexpr int kStages = 2;
constexpr int64_t kMaxSplits = 8;                       // of the chunks among thread blocks (narrow B)
// Per stage: B tile (float4), pairs (float2), block columns (int), run starts of blocks and of pairs.
constexpr int64_t kSharedBytes = kStages * (int64_t{kBStage} * 16 + int64_t{kMaxPairs} * 8 + int64_t{kMaxBlocks} * 4 +
                                            2 * (int64_t{kRuns} + 1) * 4);

// Chunk splits among thread blocks when the output has fewer thread blocks than the GPU has SMs (narrow B, few
// rows): at 4096 rows and n = 256 there are 32 thread blocks; 4 splits fill 128 of the H200's 132 SMs.
inline int64_t splits(int64_t m, int64_t n4, int64_t k, int sms) {
  const int64_t tiles = blocked_tiles(m), column_tiles = (n4 + kTileCols - 1) / kTileCols;
  return std::max<int64_t>(
      1, std::min<int64_t>({sms / std::max<int64_t>(1, tiles * column_tiles), kMaxSplits, blocked_chunks(k)}));
}
}  // namespace blocked

// --- split (spmm_split.cu): entries cut into units of about equal size, a group of lanes per unit.
namespace split {
// Entries per unit: about 4 units per group the GPU holds at once (load balance), at least 64 (the window per
// unit), twice the mean row length (a short-row unit then holds a few rows) and n / 2 (the scratch, 2 n per
// unit, then holds at most 4 accumulators per entry of A: at E = 64 a layer of width 256 on a 170k-node graph
// took 67 MB of it; on the H100, E = 128 at n = 256 on the 100k-node power-law graphs was 0.3-2.7% faster), at
// most 4096. Groups held at once: the device's SMs x threads per SM / lanes per group (2048 threads on an
// A100 or H100, 1536 on sm_86 / sm_89, 1024 on a T4).
inline int64_t unit_entries(int64_t entries, int64_t rows, int64_t n, int lanes, int sms, int threads_per_sm) {
  const int64_t resident = std::max<int64_t>(1, int64_t{sms} * (threads_per_sm / std::max(1, lanes)));
  const int64_t mean_row = rows > 0 ? entries / rows : 0;
  return std::clamp<int64_t>(std::max({(entries + 4 * resident - 1) / (4 * resident), 2 * mean_row, n / 2}), 64,
                             4096);
}
}  // namespace split

// Why `route` cannot run for `dtype` on a GPU with these limits (opt-in shared memory per block, compute
// capability): "" if it can. spmm_route_available's CUDA answer (spmm_cuda.cu reads the device's values).
inline std::string route_limits_unmet(SpmmBackend route, at::ScalarType dtype, int64_t smem_per_block, int cc_major,
                                      int cc_minor) {
  auto too_little_smem = [&](int64_t need) {
    return std::string(spmm_route_name(route)) + " needs " + std::to_string(need) +
           " bytes of shared memory per block; this GPU offers " + std::to_string(smem_per_block);
  };
  switch (route) {
    case SpmmBackend::Tiled: {
      const int64_t need = tiled::smem_bytes(static_cast<int>(c10::elementSize(dtype)));
      return need <= smem_per_block ? "" : too_little_smem(need);
    }
    case SpmmBackend::Blocked:
      return blocked::kSharedBytes <= smem_per_block ? "" : too_little_smem(blocked::kSharedBytes);
    case SpmmBackend::Cusparse:
    case SpmmBackend::Densify:
      // Their bf16 products are cuSPARSE's and cuBLAS's own kernels, which need sm_80's bf16 support; the own
      // routes convert bf16 to float32 and run everywhere.
      if (dtype == at::kBFloat16 && cc_major < 8) {
        return std::string(spmm_route_name(route)) + " runs bf16 on cuSPARSE / cuBLAS, which need compute " +
               "capability 8.0 for it; this GPU is " + std::to_string(cc_major) + "." + std::to_string(cc_minor);
      }
      return "";
    default:
      return "";  // the row-group kernels (native, balanced, split): CUDA cores, small static shared memory
  }
}

}  // namespace cuda
}  // namespace sparsetorch
