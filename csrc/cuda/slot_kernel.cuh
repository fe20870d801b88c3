// The CUDA kernel of slot_linear: y = act(x @ W^T + bias) with W in the slot layout (common/slot_layout.h),
// bf16 or fp16, fp32 accumulation on tensor cores (mma.sync m16n8k16). Torch-free (cuda/slot_linear.cu is
// the op).
//
// Why: the bitmap kernel (cuda/bitmap_kernel.cuh) spends ~400 warp instructions per 16 x 64 group on
// finding where its values go (popcount scans, a scatter loop as long as the fullest bitmap word): at 90%
// sparsity and N = 16 it is bound by instructions at a sixth of the memory floor. Here each value carries
// its slot in the fragment-order tile, so a group costs its entries' scatter (one 16-bit shared store per
// value, the group's entries spread over the 32 lanes as 16-byte pieces), four 16-byte loads and four
// zeroing stores per lane, the x fragments and 4 * NT mma.
//
// Work split as in the bitmap kernel (bitmap::split_work): a block's eight warps take ws strips x wk parts
// of their chunks, chunks also split among blocks (blockIdx.z) for small grids; partial sums are added in
// a fixed order (bitmap::write_block_sums and the split-k reduction): the result does not depend on timing.
// A warp's groups (one strip, consecutive chunks) are one contiguous run of entries, walked in one of two
// ways (walks_groups below, by measurement):
//  - as a stream (NT = 1, 2, 8): through a ring of kStages trips of 128 entries (one 16-byte cp.async per
//    lane per trip, kStages - 1 in flight); per trip each lane holds entries lane + 32 u (u < 4) and writes
//    those of the current group to the tile; when a group ends inside the trip the warp multiplies the
//    tile, and the trip's remaining entries go to the next group (a trip is scanned once per group it
//    touches: ~200-240 warp instructions per group at 90%, ncu_slots_n*.txt in the results);
//  - group by group (NT = 4): lane l loads the group's 16-byte pieces l, l + 32, .. directly (entries of the
//    neighbouring groups in the first and last piece skipped), the next two groups' first pieces in flight.
//    Fewer instructions, but each group waits on its own loads: faster where the x fragments are loaded
//    on the fly anyway (NT = 4), slower at NT <= 2, where the stream's longer per-group work hides the
//    x fragments fetched a group ahead, and at NT = 8 (more registers than the launch bound leaves).
// x is read from global memory (L1/L2: small next to W).
//
// The banded layout (slot_layout.h; BANDED): a warp's run is a band's two strips over its chunks, one
// stream in (chunk, strip) order, walked as a stream at every NT (1, 2, 4; more tokens take more column
// tiles): each chunk's x fragments are loaded once into registers for both groups, into two accumulator
// sets, and the tile is read back and zeroed by atomic exchanges of its lane-consecutive words. At N <= 16
// on a weight of many strips x's per-group fragments are a quarter and the tile reset a tenth of the
// plain kernel's time, bound by L1 wavefronts (docs/history.md, pruned-weight kernels). Measured, H100, 90%
// (docs/history.md, pruned-weight kernels): 11008 x 4096 N = 16 29.3 -> 24.7 us, N = 32 on
// 8192 x 4096 34.8 -> 23.2; with half as many work units it is slower where strips are few (4096 x 11008
// N = 16 26.9 -> 29.6), so the layout is chosen per weight (sparsetorch/pruned/slots.py).
//
// Bounds: offsets are clamped to [0, nnz] and made non-decreasing as read (the group walk also caps a group
// at 1024 entries), the slots masked to 0 .. 1023: whatever the layout holds, every access stays in bounds
// and the work is bounded (a corrupt layout gives a wrong product; two entries of one slot keep one).
#pragma once

#include <algorithm>
#include <type_traits>

#include "common/slot_layout.h"
#include "cuda/bitmap_kernel.cuh"
#include "cuda/slot_plan.h"

namespace sparsetorch {
namespace cuda {
namespace slot {

using bitmap::kThreads;
using bitmap::kWarps;
using bitmap::Mma;

// Sizes and the launch plan: cuda/slot_plan.h.

// TileParams::strips counts bands (ceil(strips / 2)) for the banded layout.
struct Params : bitmap::TileParams {
  const int* offsets;       // (slot_groups(strips, chunks, banded) + 1)
  const uint32_t* entries;  // (nnz,): value bits << 16 | slot; 16-byte aligned
  int nnz;
};

template <typename T, int NT, bool BANDED, int MIN_BLOCKS = blocks_per_sm(NT, BANDED)>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) slot_linear_kernel(const Params p) {
#if SPARSETORCH_SM80_DEVICE_CODE
  static_assert(NT <= max_nt(BANDED), "the banded kernel's token tiles stop at NT = 4");
  constexpr int kSets = sets(BANDED);
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // run.strip is the warp's band in the banded layout.
  const bitmap::WarpRun run = bitmap::warp_run<NT>(p.ws, p.wk, p.strips, p.chunks, p.chunks_per_split);
  const int n0 = run.n0, c_begin = run.c_begin, chunks_here = run.count;
  const int count = kSets * chunks_here;  // the warp's groups, one contiguous run of entries
  uint32_t* ring = reinterpret_cast<uint32_t*>(smem + warp * warp_smem(NT, BANDED));  // stream walk only
  uint4* tile4 =
      reinterpret_cast<uint4*>(smem + warp * warp_smem(NT, BANDED) + (walks_groups(NT, BANDED) ? 0 : kRingBytes));
  uint16_t* tile = reinterpret_cast<uint16_t*>(tile4);
#pragma unroll
  for (int r = 0; r < 4; ++r) tile4[lane + 32 * r] = make_uint4(0u, 0u, 0u, 0u);
  __syncwarp();

  const int64_t group0 = (static_cast<int64_t>(run.strip) * p.chunks + c_begin) * kSets;
  const int nnz = p.nnz;

  float acc[kSets * NT][4];  // acc[NT * set + j]: token tile j of the band's strip `set`
#pragma unroll
  for (int j = 0; j < kSets * NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const bitmap::XFragments<NT> xf(p.x, p.ldx, p.n, p.kx, n0, lane);
  // NT <= 2 and banded: the x fragments of one chunk in registers, fetched a chunk ahead (NT = 4 plain
  // loads them as it multiplies).
  constexpr bool kHoldsX = NT <= 2 || BANDED;
  constexpr int kHeld = kHoldsX ? NT : 1;
  uint4 xq[kHeld][2];
  int xq_chunk = -1;
  auto fetch_x = [&](int ci) {  // ci: the chunk's index in the warp's run
    if (kHoldsX) {
      const int col = (c_begin + ci) * static_cast<int>(kBitmapGroupCols);
#pragma unroll
      for (int jt = 0; jt < kHeld; ++jt) {
        xq[jt][0] = xf.load(jt, col, 0);
        xq[jt][1] = xf.load(jt, col, 1);
      }
      xq_chunk = ci;
    }
  };
  // Multiplies the tile (group gi, complete) into its accumulator set and zeroes it again.
  auto multiply = [&](int gi) {
    __syncwarp();  // every lane's values are in the tile
    uint32_t a[4][4];
    if constexpr (BANDED) {
      // Lane-consecutive slots: the lane's register r of step s is word 128 s + 32 r + lane, read and
      // zeroed by one exchange (32 lanes, 32 banks).
      uint32_t* tile32 = reinterpret_cast<uint32_t*>(tile4);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[s][r] = atomicExch(tile32 + 128 * s + 32 * r + lane, 0u);
      }
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4 v = tile4[32 * s + lane];  // a lane reads and zeroes only its own fragments
        a[s][0] = v.x, a[s][1] = v.y, a[s][2] = v.z, a[s][3] = v.w;
        tile4[32 * s + lane] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    __syncwarp();  // zeroed before any lane writes the next group's values
    const int ci = gi / kSets, set = gi % kSets;
    if (kHoldsX && xq_chunk != ci) fetch_x(ci);
    const int col = (c_begin + ci) * static_cast<int>(kBitmapGroupCols);
    auto mma_into = [&](auto set_c) {  // the accumulator set as a constant: registers, not local memory
      constexpr int kAcc = NT * decltype(set_c)::value;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 xv[NT];
#pragma unroll
        for (int jt = 0; jt < NT; ++jt) xv[jt] = kHoldsX ? xq[kHoldsX ? jt : 0][h] : xf.load(jt, col, h);
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
          for (int jt = 0; jt < NT; ++jt) {
            Mma<T>::run(acc[kAcc + jt], a[2 * h + s2], s2 ? xv[jt].z : xv[jt].x, s2 ? xv[jt].w : xv[jt].y);
          }
        }
      }
    };
    if (kSets == 1 || set == 0) {
      mma_into(std::integral_constant<int, 0>{});
    } else {
      mma_into(std::integral_constant<int, kSets - 1>{});
    }
    if (set == kSets - 1 && ci + 1 < chunks_here) fetch_x(ci + 1);
  };

  if constexpr (walks_groups(NT, BANDED)) {
    const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
    // Entries pos .. pos + 3 (pos % 4 == 0, 0 <= pos < nnz); those past nnz read as 0.
    auto load_piece = [&](int pos) -> uint4 {
      if (pos <= nnz - 4) return __ldg(reinterpret_cast<const uint4*>(p.entries + pos));
      uint4 q = zero4;
      q.x = __ldg(p.entries + pos);
      if (pos + 1 < nnz) q.y = __ldg(p.entries + pos + 1);
      if (pos + 2 < nnz) q.z = __ldg(p.entries + pos + 2);
      return q;
    };
    // The lane's first piece of a group [s, e): entries (s & ~3) + 4 lane ..
    auto first_piece = [&](int s, int e) -> uint4 {
      const int pos = (s & ~3) + 4 * lane;
      return pos < e ? load_piece(pos) : zero4;
    };
    // Writes the piece's entries that belong to [s, e) to their slots.
    auto scatter = [&](const uint4& q, int pos, int s, int e) {
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (pos + j >= s && pos + j < e) tile[w[j] & kSlotMask] = static_cast<uint16_t>(w[j] >> 16);
      }
    };

    // Group bounds (warp-uniform): group j is [start(j), end(j)) with start(j) = end(j - 1) and end(j) =
    // offsets[group0 + j + 1] clamped to [start(j), min(nnz, start(j) + 1024)], computed in group order as
    // the groups' first pieces are requested. The raw ends come 32 at a time, lane l holding group
    // (end_base + l)'s.
    int end_base = 0, ends = 0, next_group = 0, next_start = 0;
    auto load_ends = [&](int base) {
      end_base = base;
      ends = base + lane < count ? __ldg(p.offsets + group0 + base + lane + 1) : 0;
    };
    // Bounds of the next group in order (empty past the warp's last) and its first piece, requested.
    auto request = [&](uint4& q, int& s, int& e) {
      s = e = next_start;
      if (next_group < count) {
        if (next_group - end_base >= 32) load_ends(next_group);
        const int raw = __shfl_sync(0xffffffffu, ends, next_group - end_base);
        e = min(max(raw, s), min(nnz, s + kMaxGroupEntries));
        next_start = e;
        ++next_group;
      }
      q = e > s ? first_piece(s, e) : zero4;
    };
    // Scatters group gi ([s, e), first piece q) and multiplies it.
    auto step = [&](int gi, const uint4& q, int s, int e) {
      if (e <= s) return;  // empty: nothing to add
      const int a = s & ~3;
      const int pieces = (e - a + 3) >> 2;
      scatter(q, a + 4 * lane, s, e);
      for (int base = 32; base < pieces; base += 128) {  // groups beyond ~124 entries: four pieces per lane at once
        uint4 r[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int pc = base + lane + 32 * u;
          r[u] = pc < pieces ? load_piece(a + 4 * pc) : zero4;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) scatter(r[u], a + 4 * (base + lane + 32 * u), s, e);
      }
      multiply(gi);
    };
    if (count > 0) {
      load_ends(0);
      next_start = min(max(__ldg(p.offsets + group0), 0), nnz);
      fetch_x(0);
    }
    // The next two groups' first pieces in flight: each register set is refilled as soon as its group is
    // scattered, so no load is waited for by a register copy.
    uint4 qa, qb;
    int sa, ea, sb, eb;
    request(qa, sa, ea);
    request(qb, sb, eb);
    for (int gi = 0; gi < count; gi += 2) {
      step(gi, qa, sa, ea);
      request(qa, sa, ea);
      if (gi + 1 < count) {
        step(gi + 1, qb, sb, eb);
        request(qb, sb, eb);
      }
    }
  } else {
    // The warp's entries: [start_all, end_all), streamed from s0 (16-byte aligned) in trips.
    int start_all = 0, end_all = 0;
    if (count > 0) {
      start_all = min(max(__ldg(p.offsets + group0), 0), nnz);
      end_all = min(max(__ldg(p.offsets + group0 + count), start_all), nnz);
    }
    const int s0 = start_all & ~3;
    const int trips = end_all > start_all ? (end_all - s0 + kTrip - 1) / kTrip : 0;
    auto issue = [&](int trip) {
      uint32_t* dst = ring + (trip % kStages) * kTrip + 4 * lane;
      const int e = s0 + trip * kTrip + 4 * lane;
      if (e <= nnz - 4) {
        cp_async_16(dst, p.entries + e);
      } else {
        for (int j = 0; j < 4; ++j) dst[j] = e + j < nnz ? __ldg(p.entries + e + j) : 0u;
      }
    };

    // Group ends, 32 at a time: lane l holds the raw end of group (base + l); clamped when used.
    int end_base = 0;
    auto load_ends = [&](int base) {
      end_base = base;
      return base + lane < count ? __ldg(p.offsets + group0 + base + lane + 1) : end_all;
    };
    int ends = count > 0 ? load_ends(0) : 0;
    int gi = 0, gstart = start_all;
    int gend = min(max(__shfl_sync(0xffffffffu, ends, 0), gstart), end_all);
    if (trips > 0) fetch_x(0);

#pragma unroll
    for (int b = 0; b < kStages - 1; ++b) {
      if (b < trips) issue(b);
      cp_async_commit();
    }
    for (int trip = 0; trip < trips && gi < count; ++trip) {
      cp_async_wait<kStages - 2>();
      __syncwarp();  // trip's entries are in the ring for every lane; every lane is done with the previous trip
      if (trip + kStages - 1 < trips) issue(trip + kStages - 1);
      cp_async_commit();
      const uint32_t* cur = ring + (trip % kStages) * kTrip;
      const int tb = s0 + trip * kTrip;
      uint32_t w[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) w[u] = cur[lane + 32 * u];
      while (true) {  // the groups that have entries in this trip (warp-uniform)
        const int lim = min(gend, tb + kTrip);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int pos = tb + lane + 32 * u;
          if (pos >= gstart && pos < lim) tile[w[u] & kSlotMask] = static_cast<uint16_t>(w[u] >> 16);
        }
        if (gend > tb + kTrip) break;  // the group goes on in the next trip
        if (gend > gstart) multiply(gi);
        if (++gi == count) break;
        if (gi - end_base == 32) ends = load_ends(gi);
        gstart = gend;
        gend = min(max(__shfl_sync(0xffffffffu, ends, gi - end_base), gstart), end_all);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its ring and tile: they become the reduction buffer
  bitmap::write_block_sums<T, NT, kSets>(acc, reinterpret_cast<float*>(smem), p.ws, p.wk, p.m, p.n, n0, p.bias,
                                         p.act, p.slope, p.out);
#else
  __trap();  // mma.sync on bf16/fp16 needs sm_80: slot_linear.cu refuses this build
#endif
}

}  // namespace slot
}  // namespace cuda
}  // namespace sparsetorch
