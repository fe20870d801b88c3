// The 2:4 decode kernel's sizes and launch plan (cuda/sparse24_decode_kernel.cuh is the kernel and its design):
// plain C++, a pure function of (shape, the device's limits, whether the loaded kernel has the cluster path),
// compiled into the CPU build's tests too (tests/test_launch_plans.py).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/launch_limits.h"

namespace sparsetorch {
namespace cuda {
namespace sp24d {

constexpr int kTileK = 32;        // original columns per mma.sp k-step
constexpr int kTilePad = 8;       // packed k-tiles are padded to a multiple of 8 (one metadata block)
constexpr int kMaxThreads = 256;  // at most 8 warps per block
constexpr int kMaxTokens = 64;
constexpr int kMaxDevices = 64;  // per-device launch state (shared-memory opt-in)
constexpr int kMaxCluster = 8;   // splits summed through distributed shared memory (the portable cluster size)

// Shared memory of a block: the x slice, NT * 8 rows of steps_per_split * U * 32 columns + 8 (padding).
SPARSETORCH_HD inline int64_t slice_cols(int steps_per_split, int u) { return int64_t{steps_per_split} * u * kTileK; }
SPARSETORCH_HD inline int64_t block_smem(int nt, int steps_per_split, int u) {
  return int64_t{nt} * 8 * (slice_cols(steps_per_split, u) + 8) * 2;
}
// The cluster reduction's buffer (in the same shared memory, after the x slice is done): each thread's sums.
SPARSETORCH_HD inline int64_t cluster_smem(int nt, int rt, int warps) { return int64_t{rt} * nt * 4 * warps * 32 * 4; }

// How a call is cut. Zero fields are chosen by plan() (the defaults per token tiles).
struct Config {
  int warps = 0;            // warps per block (1..8)
  int rt = 0;               // row tiles per warp
  int u = 0;                // k-tiles per step: 2, 4 or 8
  int splits = 0;           // K-splits (0: from the grid, below)
  int last_block_reduces = 1;
  int cluster = 0;          // 1: sum the splits in a thread-block cluster when there are 2..kMaxCluster (sm_90)
  int blocks_per_sm = 0;    // the grid plan aims at about this many blocks per SM
  int64_t max_smem = 0;     // shared memory bound per block (the x slice; 0: kSliceSmem)
};

// The x slice's bound per block when the config sets none: about 2 blocks per SM on an H100 (227 KB each).
constexpr int64_t kSliceSmem = 100 * 1024;

struct Plan {
  int nt = 1, rt = 2, u = 4, warps = 4;
  int row_groups = 0, splits = 1, steps_per_split = 0, ktp = 0;
  bool cluster = false;         // the splits are summed in a cluster (no workspace)
  int64_t smem = 0;
  int64_t workspace_bytes = 0;  // counters (256-byte aligned) + partials
  int64_t counters_bytes = 0;
};

inline int tokens_tiles(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }
inline int packed_ktiles(int64_t k) { return static_cast<int>(((k / kTileK) + kTilePad - 1) / kTilePad * kTilePad); }

inline int64_t plan_smem(const Plan& pl, int sps) { return block_smem(pl.nt, sps, pl.u); }

// m % 16 == 0, k % 32 == 0, 1 <= n <= 64 (checked by the caller).
//
// Split rule: blocks of warps * rt row tiles. Without clusters splits = ceil(blocks_per_sm (4) * sms /
// row_groups), so every SM streams. With clusters (cluster_splits), about 1.5 blocks per SM and splits of even
// length: among 1..kMaxCluster the s that minimises (longest split / mean split) x (ratio distance between s and
// the target). An uneven split idles blocks at the cluster barrier (H100, 14336 x 4096, N = 16: 41.3 us with 3
// splits of 16 steps against 36.5-37.0 with 2 or 4), too few blocks leave bandwidth unused (4096 x 11008:
// 2 splits of 86 steps, 41.9 us at N = 1 against 28.5 with 16 splits and no cluster). Either way, more splits
// when the x slice would not fit max_smem (100 KB); past kMaxCluster the cluster mode is dropped.
inline int cluster_splits(int total_steps, int row_groups, int sms) {
  const double target = 1.5 * sms / std::max(1, row_groups);
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= std::min(kMaxCluster, total_steps); ++s) {
    const int longest = (total_steps + s - 1) / s;
    const double imbalance = static_cast<double>(longest) * s / total_steps;
    const double gap = s > target ? s / target : target / s;
    if (imbalance * gap < best_cost - 1e-9) best = s, best_cost = imbalance * gap;
  }
  return best;
}

// The next split count when the x slice does not fit in shared memory. In cluster mode the next one that
// divides the steps evenly, if there is one up to kMaxCluster (see cluster_splits: 2 -> 3 splits of 16 steps
// would idle blocks at the cluster barrier).
inline int more_splits(int splits, int total_steps, bool cluster) {
  if (cluster) {
    for (int s = splits + 1; s <= std::min(kMaxCluster, total_steps); ++s) {
      if (total_steps % s == 0) return s;
    }
  }
  return splits + 1;
}

inline Plan plan(int m, int n, int k, int sms, const Config& cfg) {
  Plan pl;
  pl.nt = tokens_tiles(n);
  pl.ktp = packed_ktiles(k);
  const int bps = cfg.blocks_per_sm > 0 ? cfg.blocks_per_sm : 4;
  const int64_t max_smem = cfg.max_smem > 0 ? cfg.max_smem : kSliceSmem;
  pl.rt = cfg.rt > 0 ? cfg.rt : (n <= 32 ? 2 : 1);
  pl.u = cfg.u > 0 ? cfg.u : 4;
  pl.warps = cfg.warps > 0 ? cfg.warps : 4;
  pl.warps = std::max(1, std::min(pl.warps, kMaxThreads / 32));
  const int row_tiles = m / 16;
  pl.row_groups = (row_tiles + pl.warps * pl.rt - 1) / (pl.warps * pl.rt);
  const int total_steps = pl.ktp / pl.u;
  int splits = cfg.splits;
  if (splits <= 0 && cfg.cluster) splits = cluster_splits(total_steps, pl.row_groups, sms);
  if (splits <= 0) {
    const int64_t want = int64_t{bps} * std::max(1, sms);
    splits = static_cast<int>(std::max<int64_t>(1, (want + pl.row_groups - 1) / pl.row_groups));
  }
  if (cfg.cluster) splits = std::min(splits, kMaxCluster);
  splits = std::max(1, std::min(splits, total_steps));
  int sps = (total_steps + splits - 1) / splits;
  while (sps > 1 && plan_smem(pl, sps) > max_smem) {
    splits = more_splits(splits, total_steps, cfg.cluster != 0);
    sps = (total_steps + splits - 1) / splits;
  }
  pl.steps_per_split = sps;
  pl.splits = (total_steps + sps - 1) / sps;  // no empty split
  pl.smem = plan_smem(pl, sps);
  pl.cluster = cfg.cluster && pl.splits > 1 && pl.splits <= kMaxCluster;
  if (pl.cluster) {
    pl.smem = std::max(pl.smem, cluster_smem(pl.nt, pl.rt, pl.warps));
    return pl;  // no workspace
  }
  pl.counters_bytes = (int64_t{pl.row_groups} * 4 + 255) / 256 * 256;
  pl.workspace_bytes = pl.splits > 1 ? pl.counters_bytes + int64_t{pl.splits} * n * m * 4 : 0;
  return pl;
}

// What the library runs. On sm_90 (cluster: the device supports clusters) one row tile per warp and 8 warps per
// block, the splits summed in the cluster: 16 warps per SM instead of 8 at these registers, and no partials
// through global memory; U = 8 (more weight loads in flight per lane) for every shape (H100, clean L2,
// 2026-11-28, U = 8 against 4 on wide weights, N = 1 / 16: 4096 x 14336 29.8 / 33.4 against 32.0 / 35.2 us,
// 4096 x 11008 24.6 / 27.7 against 26.8 / 29.5, 1024 x 4096 9.3 / 9.8 against 10.8 / 11.3). Without clusters
// U = 8 for tall weights (m >= k), 4 for wide ones (2026-11-27: 4096 x 14336 at N = 16, 46.0 against 60.4 us).
// H100, 14336 x 4096 / 4096 x 14336 bf16 (the probe's sweep, docs/history.md):
// N = 16 from 45.8 / 46.6 us to 36.5 / 36.8, N = 8 from 38.0 / 38.6 to 33.4 / 34.6, N = 1 from 33.5 / 34.4 to
// 32.2 / 33.1. cluster: the loaded kernel has the cluster path (compiled for sm_90, device_code.h) -- not the
// device's capability: a compute_80 build JIT-compiled on an H100 has none. The x slice stays within the
// device's opt-in shared memory per block as well as kSliceSmem.
inline Config library_config(int m, int k, bool cluster, int64_t smem_per_block) {
  Config cfg;
  cfg.u = cluster || m >= k ? 8 : 4;
  if (cluster) cfg.rt = 1, cfg.warps = 8, cfg.cluster = 1;
  cfg.max_smem = std::min(kSliceSmem, smem_per_block);
  return cfg;
}

}  // namespace sp24d
}  // namespace cuda
}  // namespace sparsetorch
