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
// Work split: the (strip, chunk) groups, in their flat order, cut in 8 * blocks runs of equal length (one
// per warp; blocks = as many as fit on the GPU at once, per column tile of tokens), so every SM gets the
// same share whatever the shape (cutting by whole strips left a partial wave: 688 one-strip blocks on 396
// slots for 11008 x 4096). A warp writes the strips it holds whole straight to `out` and keeps the first and
// last strips it shares with its neighbours for the block, which adds them in warp order; a strip cut by a
// block boundary is summed by the last of its blocks to finish (a counter per strip, reset by that block),
// in block order: the result does not depend on timing.
// A warp's groups are one contiguous run of entries, walked in one of two
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
// Bounds: offsets are clamped to [0, nnz] and made non-decreasing as read (the group walk also caps a group
// at 1024 entries), the slots masked to 0 .. 1023: whatever the layout holds, every access stays in bounds
// and the work is bounded (a corrupt layout gives a wrong product; two entries of one slot keep one).
#pragma once

#include "cuda/bitmap_kernel.cuh"
#include "common/slot_layout.h"

namespace sparsetorch {
namespace cuda {
namespace slot {

using bitmap::kThreads;
using bitmap::kWarps;
using bitmap::Mma;

constexpr int kTileBytes = kBitmapGroupElems * 2;  // one group's A fragments, fragment order, per warp
constexpr int kMaxGroupEntries = static_cast<int>(kBitmapGroupElems);
// The stream walk's ring: kStages trips of kTrip entries (one 16-byte cp.async per lane per trip).
constexpr int kTrip = 128;
constexpr int kStages = 4;
constexpr int kRingBytes = kStages * kTrip * 4;
// How a warp walks its entries, by tokens per warp (8 NT): group by group for NT = 4, as a stream otherwise
// (measured, H100, bf16, 11008 x 4096 and 4096 x 11008 at 90%: N = 16 stream 30.0 / 27.3 us, group walk
// 32.6 / 34.6; N = 32 stream 44.7 / 51.8, group walk 39.3 / 39.9; N = 64 stream 75.0 / 52.1, group walk
// 81.8 / 58.6).
__host__ __device__ constexpr bool walks_groups(int nt) { return nt == 4; }
__host__ __device__ constexpr int warp_smem(int nt) { return walks_groups(nt) ? kTileBytes : kRingBytes + kTileBytes; }
// One warp's sums of a strip's 16 rows x 8 NT tokens: token-major, kRedStride floats per token.
__host__ __device__ constexpr int sums_floats(int nt) { return 8 * nt * bitmap::kRedStride; }
// The warps' rings and tiles, reused for the warps' last strips at the end.
__host__ __device__ constexpr int walk_smem(int nt) {
  return kWarps * warp_smem(nt) > kWarps * sums_floats(nt) * 4 ? kWarps * warp_smem(nt) : kWarps * sums_floats(nt) * 4;
}
// The block's shared memory: the walk's, the warps' first strips, and per warp the ids of both (-1: none)
// and a flag.
__host__ __device__ constexpr int block_smem(int nt) {
  return walk_smem(nt) + kWarps * sums_floats(nt) * 4 + (2 * kWarps + 4) * 4;
}
// A warp's run holds at least this many groups where the GPU has room for more warps than that leaves.
constexpr int kMinGroupsPerWarp = 4;

struct Params {
  const int* offsets;       // (strips * chunks + 1)
  const uint32_t* entries;  // (nnz,): value bits << 16 | slot; 16-byte aligned
  int nnz;
  const uint16_t* x;        // (n, ldx) row-major, 16-byte aligned, ldx % 8 == 0; columns >= kx read as zero
  int64_t ldx;
  int kx;                   // columns of x that may be read: a multiple of 8, zeros past k
  int n, m, strips, chunks;  // strips * chunks < 2^31
  uint16_t* out;            // T (n, m)
  const uint16_t* bias;     // (m,) T, or null
  Activation act;
  float slope;
  int blocks;               // blocks per column tile of tokens (gridDim.y), 1 .. max(1, strips * chunks)
  float* partials;          // (gridDim.x, blocks, 2, 16 * 8 NT): a block's sums of its first and last strips
                            // when it shares them with other blocks
  int* counters;            // (gridDim.x, strips), zero between calls: blocks done with a shared strip
};

// The first group of run i when `groups` groups are cut in `runs` runs of equal length (+-1).
__host__ __device__ inline int run_begin(int64_t i, int64_t groups, int64_t runs) {
  return static_cast<int>(i * groups / runs);
}
// The block whose run holds group f (the largest b with run_begin(b, groups, blocks) <= f).
__device__ inline int block_of(int f, int groups, int blocks) {
  return static_cast<int>(((static_cast<int64_t>(f) + 1) * blocks - 1) / groups);
}

// out[token][row] of the strip = act(z + bias), inside the output only.
template <typename T>
__device__ __forceinline__ void store_cell(const Params& p, float z, int strip, int row, int token) {
  const int m = strip * 16 + row;
  if (m >= p.m || token >= p.n) return;
  if (p.bias != nullptr) z += Mma<T>::to_float(p.bias[m]);
  p.out[static_cast<int64_t>(token) * p.m + m] = Mma<T>::from_float(apply_activation(p.act, z, p.slope));
}

// A strip that blocks share: each has put its sums in p.partials; the last to arrive adds them in block
// order and writes the strip (its counter then goes back to zero for the next call). `flag`: a shared int.
template <typename T, int NT>
__device__ void settle_shared_strip(const Params& p, int s, int n0, int* flag) {
  constexpr int kCells = 16 * 8 * NT;
  const int groups = p.strips * p.chunks;
  const int b_first = block_of(s * p.chunks, groups, p.blocks);
  const int b_last = block_of((s + 1) * p.chunks - 1, groups, p.blocks);
  __threadfence();  // this block's sums are visible before it counts itself in
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = p.counters + static_cast<int64_t>(blockIdx.x) * p.strips + s;
    const bool last = atomicAdd(counter, 1) == b_last - b_first;
    if (last) *counter = 0;
    *flag = last;
  }
  __syncthreads();
  if (*flag) {
    __threadfence();
    const float* tile_partials = p.partials + static_cast<int64_t>(blockIdx.x) * p.blocks * 2 * kCells;
    for (int e = threadIdx.x; e < kCells; e += kThreads) {
      float z = 0.f;
      for (int b = b_first; b <= b_last; ++b) {
        const int slot = s == run_begin(b, groups, p.blocks) / p.chunks ? 0 : 1;
        z += __ldcg(tile_partials + (2 * static_cast<int64_t>(b) + slot) * kCells + e);
      }
      store_cell<T>(p, z, s, e & 15, n0 + (e >> 4));
    }
  }
}

// After the walk: the strips the block's warps share (ids[2 w] / ids[2 w + 1]: warp w's first / last
// strip kept in `heads` / `tails`, -1 if none), added in warp order; written out, or settled with the
// blocks that share them.
template <typename T, int NT>
__device__ void finish_shared_strips(const Params& p, const float* heads, const float* tails, int* ids, int n0) {
  constexpr int kCells = 16 * 8 * NT;
  const int groups = p.strips * p.chunks;
  const int fb0 = run_begin(blockIdx.y, groups, p.blocks), fb1 = run_begin(blockIdx.y + 1, groups, p.blocks);
  float* mine = p.partials + (static_cast<int64_t>(blockIdx.x) * p.blocks + blockIdx.y) * 2 * kCells;
  int prev = -1;
  for (int i = 0; i < 2 * kWarps; ++i) {  // ids are non-decreasing in this order
    const int s = ids[i];
    if (s < 0 || s == prev) continue;
    prev = s;
    const bool shared = s * p.chunks < fb0 || (s + 1) * p.chunks > fb1;
    for (int e = threadIdx.x; e < kCells; e += kThreads) {
      const int row = e & 15, token = e >> 4, at = token * bitmap::kRedStride + row;
      float z = 0.f;
      for (int w = 0; w < kWarps; ++w) {
        if (ids[2 * w] == s) z += heads[w * sums_floats(NT) + at];
        if (ids[2 * w + 1] == s) z += tails[w * sums_floats(NT) + at];
      }
      if (shared) {
        mine[(s == fb0 / p.chunks ? 0 : kCells) + e] = z;
      } else {
        store_cell<T>(p, z, s, row, n0 + token);
      }
    }
    if (shared) settle_shared_strip<T, NT>(p, s, n0, ids + 2 * kWarps);
  }
}

template <typename T, int NT>
__global__ void __launch_bounds__(kThreads, NT <= 4 ? 3 : 2) slot_linear_kernel(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n0 = blockIdx.x * (8 * NT);
  const int groups = p.strips * p.chunks;
  if (groups == 0) {  // no columns: act(bias) everywhere (one block per column tile)
    for (int e = threadIdx.x; e < p.strips * 16 * 8 * NT; e += kThreads) {
      store_cell<T>(p, 0.f, e / (16 * 8 * NT), e & 15, n0 + (e >> 4) % (8 * NT));
    }
    return;
  }
  // This warp's run of groups [f0, f1), in (strip, chunk) order.
  const int64_t run = static_cast<int64_t>(blockIdx.y) * kWarps + warp, runs = static_cast<int64_t>(p.blocks) * kWarps;
  const int f0 = run_begin(run, groups, runs), f1 = run_begin(run + 1, groups, runs);
  const int count = f1 - f0;
  uint32_t* ring = reinterpret_cast<uint32_t*>(smem + warp * warp_smem(NT));  // stream walk only
  uint4* tile4 = reinterpret_cast<uint4*>(smem + warp * warp_smem(NT) + (walks_groups(NT) ? 0 : kRingBytes));
  uint16_t* tile = reinterpret_cast<uint16_t*>(tile4);
#pragma unroll
  for (int r = 0; r < 4; ++r) tile4[lane + 32 * r] = make_uint4(0u, 0u, 0u, 0u);
  __syncwarp();

  const int* offs = p.offsets + f0;  // the warp's groups' offsets
  const int nnz = p.nnz;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int g = lane >> 2, t = lane & 3;
  const uint16_t* xrow[NT];  // the lane's rows of x (token 8 j + g of the tile, from column 16 t), or null
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int token = n0 + 8 * j + g;
    xrow[j] = token < p.n ? p.x + static_cast<int64_t>(token) * p.ldx + 16 * t : nullptr;
  }
  // acc sums the strip that ends before group strip_end. Few registers live through the walk for this:
  // which strips are whole, and which one goes to `heads`, follow from f0, f1 and the strip.
  int strip_end = (f0 / p.chunks + 1) * p.chunks;
  float* heads = reinterpret_cast<float*>(smem + walk_smem(NT));
  auto store_acc = [&](int s) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) store_cell<T>(p, acc[j][e], s, g + 8 * (e >> 1), n0 + 8 * j + 2 * t + (e & 1));
    }
  };
  auto keep_acc = [&](float* sums) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[(8 * j + 2 * t + (e & 1)) * bitmap::kRedStride + g + 8 * (e >> 1)] = acc[j][e];
    }
  };
  // acc holds all of its strip that this warp has, the strip ending before f1: write it out (whole) or
  // keep it for the block (only the first strip can be cut); go on to the next.
  auto next_strip = [&]() {
    if (strip_end - p.chunks >= f0) {
      store_acc(strip_end / p.chunks - 1);
    } else {
      keep_acc(heads + warp * sums_floats(NT));
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    strip_end += p.chunks;
  };
  // The first column of group gi (gi at most one past acc's strip).
  auto column_of = [&](int gi) {
    int c = f0 + gi - (strip_end - p.chunks);
    if (c >= p.chunks) c -= p.chunks;
    return c * static_cast<int>(kBitmapGroupCols);
  };
  auto load_x = [&](int j, int col, int h) {  // 8 values of x for tile j at chunk column col + 8 h
    return xrow[j] != nullptr && col + 16 * t + 8 * h + 8 <= p.kx
               ? __ldg(reinterpret_cast<const uint4*>(xrow[j] + col + 8 * h))
               : make_uint4(0u, 0u, 0u, 0u);
  };
  // NT <= 2: the x fragments of one group in registers, fetched a group ahead.
  constexpr int kHeld = NT <= 2 ? NT : 1;
  uint4 xq[kHeld][2];
  int xq_group = -1;
  auto fetch_x = [&](int gi) {
    if (NT <= 2) {
      const int col = column_of(gi);
#pragma unroll
      for (int jt = 0; jt < kHeld; ++jt) {
        xq[jt][0] = load_x(jt, col, 0);
        xq[jt][1] = load_x(jt, col, 1);
      }
      xq_group = gi;
    }
  };
  // Multiplies the tile (group gi, complete) into acc and zeroes it again.
  auto multiply = [&](int gi) {
    while (f0 + gi >= strip_end) next_strip();
    __syncwarp();  // every lane's values are in the tile
    uint32_t a[4][4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint4 v = tile4[32 * s + lane];  // a lane reads and zeroes only its own fragments
      a[s][0] = v.x, a[s][1] = v.y, a[s][2] = v.z, a[s][3] = v.w;
      tile4[32 * s + lane] = make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();  // zeroed before any lane writes the next group's values
    if (NT <= 2 && xq_group != gi) fetch_x(gi);
    const int col = column_of(gi);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 xv[NT];
#pragma unroll
      for (int jt = 0; jt < NT; ++jt) xv[jt] = NT <= 2 ? xq[NT <= 2 ? jt : 0][h] : load_x(jt, col, h);
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
        for (int jt = 0; jt < NT; ++jt) {
          Mma<T>::run(acc[jt], a[2 * h + s2], s2 ? xv[jt].z : xv[jt].x, s2 ? xv[jt].w : xv[jt].y);
        }
      }
    }
    if (gi + 1 < count) fetch_x(gi + 1);
  };

  if constexpr (walks_groups(NT)) {
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
    // offs[j + 1] clamped to [start(j), min(nnz, start(j) + 1024)], computed in group order as
    // the groups' first pieces are requested. The raw ends come 32 at a time, lane l holding group
    // (end_base + l)'s.
    int end_base = 0, ends = 0, next_group = 0, next_start = 0;
    auto load_ends = [&](int base) {
      end_base = base;
      ends = base + lane < count ? __ldg(offs + base + lane + 1) : 0;
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
      next_start = min(max(__ldg(offs), 0), nnz);
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
      start_all = min(max(__ldg(offs), 0), nnz);
      end_all = min(max(__ldg(offs + count), start_all), nnz);
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
      return base + lane < count ? __ldg(offs + base + lane + 1) : end_all;
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
  // The strips after the last group with entries (act(bias) at least), then the last strip: written out
  // when whole, else kept (tail). head: the first strip, when cut and kept by next_strip.
  int head = -1, tail = -1;
  if (count > 0) {
    while (strip_end < f1) next_strip();
    const int first = f0 / p.chunks, last = strip_end / p.chunks - 1;
    if (first != last && f0 % p.chunks != 0) head = first;
    if (strip_end - p.chunks >= f0 && strip_end <= f1) {
      store_acc(last);
    } else {
      tail = last;
    }
  }
  __syncthreads();  // every warp is done with its ring and tile: they take the warps' last strips
  float* tails = reinterpret_cast<float*>(smem);
  int* ids = reinterpret_cast<int*>(smem + walk_smem(NT) + kWarps * sums_floats(NT) * 4);
  if (tail >= 0) keep_acc(tails + warp * sums_floats(NT));
  if (lane == 0) ids[2 * warp] = head, ids[2 * warp + 1] = tail;
  __syncthreads();
  finish_shared_strips<T, NT>(p, heads, tails, ids, n0);
}

// How a call is cut: NT (tiles of 8 tokens per warp) and the blocks per column tile: as many as fit on the
// GPU at once (registers allow 3 per SM, 2 for NT = 8), fewer where a warp's run would hold fewer than
// kMinGroupsPerWarp groups. forced_blocks > 0 (a test knob) sets them, capped at the groups.
struct Launch {
  int nt = 1, smem = 0;
  int64_t column_tiles = 1, blocks = 1;
};

inline Launch choose_launch(int64_t m, int64_t n, int64_t k, int sms, int64_t smem_per_sm, int64_t smem_reserved,
                            int64_t smem_per_block, int64_t forced_blocks = 0) {
  Launch l;
  l.nt = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
  l.column_tiles = (n + 8 * l.nt - 1) / (8 * l.nt);
  l.smem = block_smem(l.nt);
  if (l.smem > smem_per_block) {
    l.smem = 0;
    return l;
  }
  const int64_t by_registers = l.nt <= 4 ? 3 : 2;
  const int64_t per_sm = std::max<int64_t>(1, std::min<int64_t>(by_registers, smem_per_sm / (l.smem + smem_reserved)));
  const int64_t groups = bitmap_strips(m) * bitmap_chunks(k);
  const int64_t fit = std::max<int64_t>(1, per_sm * sms / l.column_tiles);
  l.blocks = forced_blocks > 0 ? forced_blocks : std::min(fit, (groups + kWarps * kMinGroupsPerWarp - 1) / (kWarps * kMinGroupsPerWarp));
  l.blocks = std::max<int64_t>(1, std::min(l.blocks, groups));
  return l;
}

}  // namespace slot
}  // namespace cuda
}  // namespace sparsetorch
