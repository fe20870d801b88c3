// The bitmap kernel's sizes and launch plan (cuda/bitmap_kernel.cuh is the kernel): plain C++ and a pure
// function of (shape, the weight's value count, the device's limits), so that the CPU build's tests check the
// plans against smaller GPUs' limits (tests/test_launch_plans.py, through csrc/testing_ops.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/bitmap_layout.h"
#include "cuda/launch_limits.h"

namespace sparsetorch {
namespace cuda {
namespace bitmap {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// A warp streams its groups through stages of `batch` consecutive groups each (a strip's groups are
// contiguous in bitmaps and values, so a stage is one copy of each); all stages but one are in flight.
// Two configurations (the kernel's Dense parameter, chosen per weight by choose_launch):
//  - dense weights (sparsity below ~85%): 3 stages of up to 2 groups, each sized for any two groups (a
//    heavy-tailed weight has near-dense groups), the gather path only, 2 blocks per SM at up to 128
//    registers (at 3 blocks and 80 registers the decode's lane constants were recomputed per group:
//    4-15% slower at 50-70%, H100);
//  - sparse weights: 4 stages of up to 4 groups, sized by the weight's mean group, the scatter path for
//    sparse groups, 3 blocks per SM for NT <= 4 (at 2, 90% on 11008 x 4096 took 35 us against 30).
SPARSETORCH_HD constexpr int stages(bool dense) { return dense ? 3 : 4; }
SPARSETORCH_HD constexpr int min_blocks(int nt, bool dense) { return dense || nt > 4 ? 2 : 3; }
constexpr int kMaxBatch = 4;                              // groups per stage at most
constexpr int kDenseBatch = 2;                            // groups per stage of the dense configuration
constexpr int kBitmapBytes = 16 * 8;                      // one group's 16 bitmaps
constexpr int kHeaderBytes = 16;                          // lead, staged, first (ints)
constexpr int kTileBytes = kBitmapGroupElems * 2;         // a group's A fragments, fragment order (scatter path)
constexpr int kTableBytes = 32 * 8;                       // (bitmap word, first value) of the group's 32 words
constexpr int kRedStride = 20;                            // floats per token row of the reduction buffer
// The most values a stage ever holds: a batch's 1024 per group, up to 7 before them (16-byte copies).
SPARSETORCH_HD constexpr int max_stage_values(int batch) { return batch * kBitmapGroupElems + 16; }
// Bytes of a stage of `batch` groups and `stage_values` values (a multiple of 8: whole 16-byte copies).
SPARSETORCH_HD constexpr int stage_bytes(int stage_values, int batch) {
  return batch * kBitmapBytes + kHeaderBytes + 2 * stage_values;
}
constexpr int kBarrierBytes = 16 * ((stages(false) * 8 + 15) / 16);  // one mbarrier per stage (sm_90 bulk copies)
// A warp's shared memory: its stages, the scatter tile (sparse configuration only), the gather table and
// the stages' mbarriers.
SPARSETORCH_HD constexpr int warp_smem(int stage_values, int batch, bool dense) {
  return stages(dense) * stage_bytes(stage_values, batch) + (dense ? 0 : kTileBytes) + kTableBytes + kBarrierBytes;
}
// The block's shared memory: the warps' stages, reused as the reduction buffer at the end.
SPARSETORCH_HD constexpr int block_smem(int stage_values, int batch, int nt, bool dense) {
  return kWarps * warp_smem(stage_values, batch, dense) > kWarps * 8 * nt * kRedStride * 4
             ? kWarps * warp_smem(stage_values, batch, dense)
             : kWarps * 8 * nt * kRedStride * 4;
}
static_assert(kBitmapBytes % 16 == 0 && kHeaderBytes % 16 == 0 && kTileBytes % 16 == 0 && kTableBytes % 16 == 0,
              "stages, the scatter tile and the gather table must stay 16-byte aligned (both configurations)");

// How a call is cut: NT (tiles of 8 tokens per warp), the stages (groups per stage and values per
// stage), warps per block along strips (ws) and along chunks (wk), and chunk splits among blocks. Small N:
// the product is memory-bound and the grid must keep enough bytes in flight, so the strips' chunks are
// split among the warps of a block, then among blocks, until there are about as many blocks as fit on
// the GPU at once (min_blocks: 3 or 2 by registers; shared memory may allow fewer); each warp keeps
// at least kMinChunks chunks so that its pipeline has something to overlap.
struct Launch {
  int nt = 1, ws = kWarps, wk = 1, splits = 1, chunks_per_split = 1;
  bool dense = true;
  int batch = 1, stage_values = max_stage_values(1), smem = 0;
  int64_t column_tiles = 1, row_blocks = 1;
};
constexpr int64_t kBatchValues = 640;  // mean values of four groups at most for the sparse configuration

// Values a stage of the sparse configuration holds: the mean batch's count with room for the spread
// (1.25x + 32: a uniformly pruned group's count stays within ~5 standard deviations of the mean from 50% to
// 95% sparsity), the up to 7 values before the batch's first in its 16-byte piece and the one a lane reads
// past the last. A batch with more values is decoded from global memory (correct, slower). The dense
// configuration's stages hold any batch.
inline int stage_values_for(int64_t nvalues, int64_t groups, int batch, bool dense) {
  if (dense) return max_stage_values(batch);
  const int64_t mean = groups > 0 ? batch * ((std::max<int64_t>(nvalues, 0) + groups - 1) / groups) : 0;
  const int64_t want = (5 * mean + 3) / 4 + 32 + 16;
  return static_cast<int>(std::min<int64_t>(max_stage_values(batch), (want + 7) / 8 * 8));
}

// How the strips' chunks are shared out (both tensor-core kernels): a block's kWarps warps take ws strips
// x wk parts of their chunks, and the chunks are also split among `splits` blocks (blockIdx.z), until the
// grid has about `wanted` blocks (as many as run at once) or a warp would keep fewer than kMinChunks chunks.
constexpr int kMinChunks = 4;
inline void split_work(int64_t strips, int64_t chunks, int64_t column_tiles, int64_t wanted, int& ws, int& wk,
                       int64_t& row_blocks, int& splits, int& chunks_per_split) {
  wk = 1;
  while (wk < kWarps && chunks >= 2 * wk * kMinChunks &&
         ((strips + kWarps / wk - 1) / (kWarps / wk)) * column_tiles < wanted) {
    wk *= 2;
  }
  ws = kWarps / wk;
  row_blocks = (strips + ws - 1) / ws;
  const int64_t blocks = row_blocks * column_tiles;
  int64_t s = 1;
  while (blocks * s * 2 <= wanted && chunks >= 2 * s * wk * kMinChunks) s *= 2;
  chunks_per_split = static_cast<int>(std::max<int64_t>(1, (chunks + s - 1) / s));
  splits = static_cast<int>(std::max<int64_t>(1, (chunks + chunks_per_split - 1) / chunks_per_split));
}

// The bitmap kernel's split for dense weights (and for sparse ones when split_work's grid exceeds a
// wave): the most blocks that still run in one wave (at most `wanted`), over wk in {1, 2, 4, 8} and 1..8
// chunk splits (any count, not only powers of two), fewer splits on a tie; the fewest blocks when no split
// fits one wave. H100, 2 blocks per SM (264 slots): 11008 x 4096 went from 50
// to 43 us (172 -> 258 blocks), 14336 x 4096 from 55 to 51 us (448 -> 224 blocks, a wave and 13% to one).
inline void split_work_one_wave(int64_t strips, int64_t chunks, int64_t column_tiles, int64_t wanted, int& ws,
                                int& wk, int64_t& row_blocks, int& splits, int& chunks_per_split) {
  int64_t best_blocks = -1;
  bool best_fits = false;
  for (int w = 1; w <= kWarps; w *= 2) {
    if (w > 1 && chunks < w * kMinChunks) break;  // each warp keeps at least kMinChunks chunks
    const int64_t rows = (strips + kWarps / w - 1) / (kWarps / w);
    for (int64_t s = 1; s <= 8; ++s) {
      const int64_t per_split = std::max<int64_t>(1, (chunks + s - 1) / s);
      if (s > 1 && per_split < w * kMinChunks) break;
      const int64_t n_splits = std::max<int64_t>(1, (chunks + per_split - 1) / per_split);  // 1 when k == 0
      if (s > 1 && n_splits != s) continue;  // the same split as a smaller s
      const int64_t blocks = rows * column_tiles * n_splits;
      const bool fits = blocks <= wanted;
      const bool better = best_blocks < 0 || (fits && (!best_fits || blocks > best_blocks ||
                                                       (blocks == best_blocks && n_splits < splits))) ||
                          (!fits && !best_fits && blocks < best_blocks);
      if (better) {
        best_blocks = blocks, best_fits = fits;
        ws = kWarps / w, wk = w, row_blocks = rows;
        splits = static_cast<int>(n_splits), chunks_per_split = static_cast<int>(per_split);
      }
    }
  }
}

// sms: the GPU's multiprocessors; smem_per_sm / smem_reserved / smem_per_block: shared memory per SM, the
// part each block reserves and the most one block may have (cudaDeviceProp::sharedMemPerMultiprocessor,
// reservedSharedMemPerBlock, sharedMemPerBlockOptin). Launch::smem == 0: no configuration fits.
inline Launch choose_launch(int64_t m, int64_t n, int64_t k, int64_t nvalues, int sms, int64_t smem_per_sm,
                            int64_t smem_reserved, int64_t smem_per_block) {
  Launch l;
  l.nt = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
  l.column_tiles = (n + 8 * l.nt - 1) / (8 * l.nt);
  const int64_t strips = bitmap_strips(m), chunks = bitmap_chunks(k);
  // The configuration: sparse (four groups per stage) when four mean groups stay within kBatchValues
  // and as many blocks share an SM as the registers allow, else dense (two groups per stage, or one where
  // shared memory does not allow the registers' two blocks). Sparse groups are cheap to decode, so their
  // fixed costs per stage (the copies' setup, two offsets, the wait) matter (H100, 11008 x 4096: four per
  // stage took 90% sparsity from 33.8 to 27.3 us at N = 1).
  const int64_t mean = strips * chunks > 0 ? std::max<int64_t>(nvalues, 0) / (strips * chunks) : 0;
  auto configure = [&](bool dense, int batch) {
    l.dense = dense, l.batch = batch;
    l.stage_values = stage_values_for(nvalues, strips * chunks, batch, dense);
    l.smem = block_smem(l.stage_values, batch, l.nt, dense);
    return min_blocks(l.nt, dense) * (l.smem + smem_reserved) <= smem_per_sm && l.smem <= smem_per_block;
  };
  if (!(kMaxBatch * mean <= kBatchValues && configure(false, kMaxBatch)) && !configure(true, kDenseBatch)) {
    configure(true, 1);
  }
  if (l.smem > smem_per_block) {
    l.smem = 0;
    return l;
  }
  const int64_t per_sm =
      std::max<int64_t>(1, std::min<int64_t>(min_blocks(l.nt, l.dense), smem_per_sm / (l.smem + smem_reserved)));
  if (l.dense) {  // the most blocks that fit one wave
    split_work_one_wave(strips, chunks, l.column_tiles, per_sm * sms, l.ws, l.wk, l.row_blocks, l.splits,
                        l.chunks_per_split);
  } else {
    split_work(strips, chunks, l.column_tiles, per_sm * sms, l.ws, l.wk, l.row_blocks, l.splits, l.chunks_per_split);
    // More than a wave: the one-wave split when one fits (H100, 90% at N = 1: 14336 x 4096 448 -> 336 blocks,
    // 46.3 -> 40.7 us; 11008 x 4096 688 -> 344, 30.9 -> 30.5). Within a wave split_work's grid stays: the
    // one-wave split's extra chunk splits cost more there (4096 x 4096: 16.7 against 18.3 us).
    if (l.row_blocks * l.column_tiles * l.splits > per_sm * sms) {
      Launch w = l;
      split_work_one_wave(strips, chunks, l.column_tiles, per_sm * sms, w.ws, w.wk, w.row_blocks, w.splits,
                          w.chunks_per_split);
      if (w.row_blocks * w.column_tiles * w.splits <= per_sm * sms) l = w;
    }
  }
  return l;
}

}  // namespace bitmap
}  // namespace cuda
}  // namespace sparsetorch
