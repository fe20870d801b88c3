// The CUDA kernel of bitmap_linear: y = act(x @ W^T + bias) with W in the bitmap-tile layout
// (common/bitmap_layout.h), bf16 or fp16, fp32 accumulation on tensor cores (mma.sync m16n8k16).
// Torch-free, so that a standalone benchmark can include it (cuda/bitmap_linear.cu is the op).
//
// A warp owns one strip (16 rows of W, the mma's M) and a range of chunks (64 columns each: its K),
// and multiplies them with up to 8 * NT tokens of x (the mma's N, NT tiles of 8). It streams its groups
// (a strip's consecutive groups are contiguous in bitmaps and values) through shared-memory stages of
// `batch` groups each (kStages deep, each warp its own pipeline: no block barrier in the main loop). On
// sm_90 lane 0 fills a stage with two bulk copies (cp.async.bulk: bitmaps, values) completed on the
// stage's mbarrier, the batches' first values read from a window of offsets the warp holds in registers;
// before sm_90 the lanes copy 16 bytes each with cp.async. Per group it decodes the four A registers of
// each mma step straight from the bitmaps and reads its x fragments from global memory (32 contiguous
// bytes per lane and chunk, L1/L2-resident: x is small next to W). The eight warps of a thread block
// split the work ws x wk: ws strips, each strip's chunks split among wk warps; their partial sums are
// added in shared memory in warp order, and the block writes act(sum + bias) for 16 * ws rows x 8 * NT
// tokens. When the grid would still be too small to fill the GPU (few rows, few tokens), the chunks are
// also split among thread blocks (blockIdx.z): each writes fp32 partial sums to a workspace that a second
// kernel adds in split order. Every reduction has a fixed order: the result does not depend on timing.
//
// Decode, two paths chosen per group (Params::scatter_max): gather (work ~ positions: per quadrant a
// lane's rank is its word's first value, from a warp scan of the 32 words' popcounts, plus one popcount;
// two 16-bit loads and a PRMT) for dense groups, scatter (work ~ values: each lane writes its word's
// values into a zeroed fragment-order tile, then reads its 16 registers back) for sparse ones (the sparse
// configuration only, below).
//
// What limits it: instructions and their latency chains, not bytes (ncu, H100, 14336 x 4096 at 50% per
// row, N = 1, one group per stage, 2026-11-27): 444 warp instructions per group, issue slots 55% busy at
// 3.4 warps per scheduler; DRAM 34% busy, 6% of stall samples on memory. By the stall samples: 34% in
// waiting for and issuing a stage's copies (132 instructions per stage), 22% in the group's setup and
// popcount scan (78: serial shuffles), 23% in the gather (194), 9% in the mmas. Two groups per stage
// halve the per-stage part: the dense configuration (stages()) took 50% from 52.5 to 46.7 us (N = 1),
// 80% from 51.6 to 41.2, and 70% pruned globally from 64.5 to 42.1 (its near-dense groups no longer
// fall back to global memory); performance.md, Bitmap tiles, has the table and what was tried.
//
// Bounds: whatever the bitmaps and offsets hold, a batch's copy is clamped to the values array and to at
// most 1024 values per group, and is made only when it fits its stage; a group is decoded from the stage
// only when its bitmaps ask for no more values than the stage holds, else from global memory with every
// index clamped to the values array. So every read stays in bounds; a corrupt layout gives a wrong
// product, never an out-of-bounds access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "common/activation.h"
#include "common/bitmap_layout.h"
#include "cuda/bitmap_plan.h"
#include "cuda/cp_async.cuh"

namespace sparsetorch {
namespace cuda {
namespace bitmap {

// Sizes, stages and the launch plan: cuda/bitmap_plan.h.

// What both tensor-core kernels (this one, cuda/slot_kernel.cuh) take besides their layout: x, the output
// and the work split.
struct TileParams {
  const uint16_t* x;        // (n, ldx) row-major, 16-byte aligned, ldx % 8 == 0; columns >= kx read as zero
  int64_t ldx;
  int kx;                   // columns of x that may be read: a multiple of 8, zeros past k
  int n, m, strips, chunks;
  void* out;                // T (n, m) when gridDim.z == 1; float (gridDim.z, n, m) otherwise
  const uint16_t* bias;     // (m,) T, or null (only read when gridDim.z == 1)
  Activation act;
  float slope;
  int ws, wk;               // warps per block along strips and along chunks; ws * wk == kWarps
  int chunks_per_split;     // chunks of one blockIdx.z
};

struct Params : TileParams {
  const uint64_t* bitmaps;  // (strips, chunks, 16)
  const int* offsets;       // (strips * chunks + 1)
  const uint16_t* values;   // (nvalues,): the raw 16-bit values; 16-byte aligned
  int64_t nvalues;
  int scatter_max;          // groups with at most this many values take the scatter path
  int batch;                // groups per stage, 1 .. kMaxBatch
  int stage_values;         // values a stage holds (a multiple of 8); a batch with more is read from
                            // global memory instead
};

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_float(uint16_t v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_float(uint16_t v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

// The epilogue of the tensor-core kernels (this one and cuda/slot_kernel.cuh), whose kWarps warps each hold
// m16n8 accumulators acc[NT * set + j] for the 16 rows of strip (blockIdx.y * ws + warp / wk) * SETS + set
// (SETS = 2: the slot kernel's banded layout, a warp on two strips) and the block's 8 * NT tokens from n0,
// summed over a 1/wk part of the block's chunks: the parts are added in shared memory (`red`, at least
// kWarps * 8 * NT * SETS * kRedStride floats, free for reuse: the caller has synchronized the block) in warp
// order, and the block writes act(sum + bias) (gridDim.z == 1), or the plain sums into split blockIdx.z of
// the float workspace `out` (n, m) per split.
template <typename T, int NT, int SETS = 1>
__device__ __forceinline__ void write_block_sums(const float (&acc)[SETS * NT][4], float* red, int ws, int wk,
                                                 int m_total, int n_total, int n0, const uint16_t* bias,
                                                 Activation act, float slope, void* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // acc[j]: (row g, token 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1).
#pragma unroll
  for (int set = 0; set < SETS; ++set) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = 8 * j + 2 * t + (e & 1), row = g + 8 * (e >> 1);
        red[((warp * 8 * NT + token) * SETS + set) * kRedStride + row] = acc[NT * set + j][e];
      }
    }
  }
  __syncthreads();
  // Thread e of the block writes rows (strip of (ss, set), row) x token, rows fastest: for each token the
  // block's 16 * SETS * ws rows are contiguous in out.
  const int cells = ws * SETS * 16 * 8 * NT;
  for (int e = threadIdx.x; e < cells; e += kThreads) {
    const int row = e & 15, strip_i = (e >> 4) % (ws * SETS), token = (e >> 4) / (ws * SETS);
    const int ws_i = strip_i / SETS, set = strip_i % SETS;
    const int64_t m = (static_cast<int64_t>(blockIdx.y) * ws * SETS + strip_i) * 16 + row;
    const int n = n0 + token;
    if (m >= m_total || n >= n_total) continue;
    float z = 0.f;
    for (int k = 0; k < wk; ++k) z += red[(((ws_i * wk + k) * 8 * NT + token) * SETS + set) * kRedStride + row];
    if (gridDim.z == 1) {
      if (bias != nullptr) z += Mma<T>::to_float(bias[m]);
      reinterpret_cast<uint16_t*>(out)[static_cast<int64_t>(n) * m_total + m] =
          Mma<T>::from_float(apply_activation(act, z, slope));
    } else {
      reinterpret_cast<float*>(out)[(static_cast<int64_t>(blockIdx.z) * n_total + n) * m_total + m] = z;
    }
  }
}

// The warp's share of a launch of either tensor-core kernel (this one, cuda/slot_kernel.cuh): its strip
// (blockIdx.y * ws + warp / wk), its first token, and its chunks [c_begin, c_begin + count): the range of
// split blockIdx.z, cut in wk contiguous pieces (count = 0 past the last strip).
struct WarpRun {
  int strip, n0, c_begin, count;
};
template <int NT>
__device__ __forceinline__ WarpRun warp_run(int ws, int wk, int strips, int chunks, int chunks_per_split) {
  const int warp = threadIdx.x >> 5;
  WarpRun r;
  r.strip = blockIdx.y * ws + warp / wk;
  r.n0 = blockIdx.x * (8 * NT);
  const int split_begin = blockIdx.z * chunks_per_split;
  const int split_end = min(chunks, split_begin + chunks_per_split);
  const int per_warp = (max(split_end - split_begin, 0) + wk - 1) / wk;
  r.c_begin = min(split_end, split_begin + (warp % wk) * per_warp);
  r.count = r.strip < strips ? min(split_end, r.c_begin + per_warp) - r.c_begin : 0;
  return r;
}

// A lane's B fragments (x) for both tensor-core kernels: with the layouts' column order, the lane (g, t)
// needs x[token n0 + 8 j + g][16 t .. 16 t + 15] of each chunk for tile j, 16 contiguous bytes at a time;
// tokens past n and columns past kx read as zero.
template <int NT>
struct XFragments {
  const uint16_t* row[NT];  // the lane's row of x in tile j, from column 16 t; null past the last token
  int kx, t16;
  __device__ __forceinline__ XFragments(const uint16_t* x, int64_t ldx, int n, int kx_, int n0, int lane)
      : kx(kx_), t16(16 * (lane & 3)) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int token = n0 + 8 * j + (lane >> 2);
      row[j] = token < n ? x + static_cast<int64_t>(token) * ldx + t16 : nullptr;
    }
  }
  // 8 values of tile j at chunk column col + 16 t + 8 h.
  __device__ __forceinline__ uint4 load(int j, int col, int h) const {
    return row[j] != nullptr && col + t16 + 8 * h + 8 <= kx ? __ldg(reinterpret_cast<const uint4*>(row[j] + col + 8 * h))
                                                             : make_uint4(0u, 0u, 0u, 0u);
  }
};

// PRMT selectors that turn (v0 = value at the lane's first index, v1 = the next value), both
// zero-extended, into the A register for the lane's two bits b: 0 -> 0, 1 -> (v0, 0), 2 -> (0, v0),
// 3 -> (v0, v1) (low half first). Four 16-bit selectors, picked by a PRMT on b * 0x22 + 0x10
// (step_selectors: two registers' selectors per PRMT).
constexpr uint32_t kSelect01 = 0x32103232u, kSelect23 = 0x54101032u;
// PRMT without the selector masking that __byte_perm adds (every selector here is well formed).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}
// The final PRMT selectors (in bits 0-15 of each) of a lane's four A registers of one mma step, from the
// step's four bitmap words w: the lane's byte of each word side by side (pick: its byte index in both
// halves of a PRMT selector), its two bits b at (shift & 7) of each byte, b * 0x22 + 0x10 for all four at
// once, and one PRMT per two registers (H100: 20 fewer instructions a group than a PRMT pair per register,
// 1-2% faster at 50-70%, 2026-11-28).
__device__ __forceinline__ void step_selectors(const uint32_t (&w)[4], uint32_t pick, int shift, uint32_t (&sel)[4]) {
  const uint32_t bytes = prmt(prmt(w[0], w[1], pick), prmt(w[2], w[3], pick), 0x5410u);
  const uint32_t index = ((bytes >> (shift & 7)) & 0x03030303u) * 0x22u + 0x10101010u;
  const uint32_t s01 = prmt(kSelect01, kSelect23, index), s23 = prmt(kSelect01, kSelect23, index >> 16);
  sel[0] = s01, sel[1] = s01 >> 16, sel[2] = s23, sel[3] = s23 >> 16;
}
__device__ __forceinline__ uint32_t lds_u16(uint32_t address) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(address));
  return v;
}

// The values a batch of ng groups copies, from its offsets lead (its first group's) and tail (the next
// batch's): [first, first + 8 * pieces) in 16-byte pieces around [start, end), clamped to the values array
// and to ng * 1024 values whatever the offsets hold; staged when the pieces fit a stage.
struct BatchValues {
  int start, first, pieces;
  bool staged;
};
__device__ __forceinline__ BatchValues batch_values(int lead, int tail, int ng, int nvalues, int stage_values) {
  BatchValues v;
  v.start = min(max(lead, 0), nvalues);
  const int end = v.start + min(max(tail - v.start, 0), min(nvalues - v.start, ng * static_cast<int>(kBitmapGroupElems)));
  v.first = v.start & ~7;
  v.pieces = (end - v.first + 7) >> 3;
  v.staged = 8 * v.pieces <= stage_values;
  return v;
}
// The stage's header (kHeaderBytes): the batch's first value counted from `first`, staged, first.
__device__ __forceinline__ void write_header(unsigned char* at, const BatchValues& v) {
  int* header = reinterpret_cast<int*>(at);
  header[0] = v.start - v.first;
  header[1] = v.staged ? 1 : 0;
  header[2] = v.first;
}

template <typename T, int NT, bool Dense>
__global__ void __launch_bounds__(kThreads, min_blocks(NT, Dense)) bitmap_linear_kernel(const Params p) {
#if SPARSETORCH_SM80_DEVICE_CODE
  constexpr int kStages = stages(Dense);
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const WarpRun run = warp_run<NT>(p.ws, p.wk, p.strips, p.chunks, p.chunks_per_split);
  const int strip = run.strip, n0 = run.n0, c_begin = run.c_begin, count = run.count;
  const int batch = p.batch, batches = (count + batch - 1) / batch;
  const int stage_size = stage_bytes(p.stage_values, batch);
  unsigned char* my = smem + warp * warp_smem(p.stage_values, batch, Dense);
  uint16_t* tile = reinterpret_cast<uint16_t*>(my + kStages * stage_size);  // sparse configuration only
  uint2* table = reinterpret_cast<uint2*>(my + kStages * stage_size + (Dense ? 0 : kTileBytes));
  const int64_t group0 = static_cast<int64_t>(strip) * p.chunks + c_begin;
  const int nvalues = static_cast<int>(p.nvalues);  // < 2^31 (the op checks)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // sm_90: lane 0 copies a whole batch with two bulk copies completed on the stage's mbarrier. The batches'
  // first values come from a window of offsets in registers: lane j holds batch 32 w + j's (its first
  // group's offset; count for the end), the next window loaded a window ahead.
  uint64_t* bars = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(table) + kTableBytes);
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(bars + s, 1);
    mbarrier_init_fence();
  }
  __syncwarp();
  auto window = [&](int w) {  // a warp past the last strip (count == 0) reads nothing: its group0 may be too
    const int at = min((32 * w + lane) * batch, count);
    return count > 0 ? __ldg(p.offsets + group0 + at) : 0;
  };
  int offsets_now = window(0), offsets_next = window(1), window_now = 0;
#endif

  // Copies batch b of this warp (groups b * batch ..) into stage `stage` (b % kStages): the bitmaps, then the
  // values from the batch's first, in 16-byte pieces (the last one, past the end of the values array,
  // value by value). A batch with more values than a stage holds is left in global memory (header:
  // staged = 0) and decoded from there. Offsets are read at the batch's two ends only: inside a batch a
  // group's first value follows from the popcounts of the groups before it.
  auto issue = [&](int b, int stage) {
    unsigned char* st = my + stage * stage_size;
    const int64_t g = group0 + static_cast<int64_t>(b) * batch;
    const int ng = min(batch, count - b * batch);
    uint16_t* dst = reinterpret_cast<uint16_t*>(st + batch * kBitmapBytes + kHeaderBytes);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if ((b >> 5) != window_now) {  // warp-uniform: batches are issued in order
      window_now = b >> 5;
      offsets_now = offsets_next;
      offsets_next = window(window_now + 1);
    }
    const int next = (b + 1) & 31;
    const int lead = __shfl_sync(0xffffffffu, offsets_now, b & 31);
    const int tail = __shfl_sync(0xffffffffu, next != 0 ? offsets_now : offsets_next, next);
    const BatchValues v = batch_values(lead, tail, ng, nvalues, p.stage_values);
    const int whole = v.staged ? min(v.pieces, (nvalues - v.first) >> 3) : 0;  // 16-byte pieces inside the array
    if (v.staged && whole < v.pieces) {  // the values array's last piece (< 8 values): value by value
      const int e = v.first + 8 * whole;
      if (lane < nvalues - e) dst[8 * whole + lane] = __ldg(p.values + e + lane);
      fence_proxy_async_shared();
    }
    __syncwarp();
    if (lane == 0) {
      write_header(st + batch * kBitmapBytes, v);
      uint64_t* bar = bars + stage;
      mbarrier_arrive_expect_tx(bar, ng * kBitmapBytes + 16 * whole);
      bulk_copy_to_shared(st, p.bitmaps + g * 16, ng * kBitmapBytes, bar);
      if (whole > 0) bulk_copy_to_shared(dst, p.values + v.first, 16 * whole, bar);
    }
#else
    if (lane < 8 * ng) cp_async_16(st + 16 * lane, p.bitmaps + g * 16 + 2 * lane);
    const BatchValues v = batch_values(__ldg(p.offsets + g), __ldg(p.offsets + g + ng), ng, nvalues, p.stage_values);
    for (int c = lane; v.staged && c < v.pieces; c += 32) {
      const int e = v.first + 8 * c;
      if (e <= nvalues - 8) {
        cp_async_16(dst + 8 * c, p.values + e);
      } else {
        for (int j = 0; j < nvalues - e; ++j) dst[8 * c + j] = __ldg(p.values + e + j);
      }
    }
    if (lane == 0) write_header(st + batch * kBitmapBytes, v);
#endif
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int high = lane >> 4, shift = 2 * (lane & 15);
  const uint32_t below = (1u << shift) - 1u;  // the bits of the lane's word below its two
  const uint32_t pick = (shift >> 3) | ((4 + (shift >> 3)) << 4);  // the byte holding them (step_selectors)
  const XFragments<NT> xf(p.x, p.ldx, p.n, p.kx, n0, lane);

#pragma unroll
  for (int b = 0; b < kStages - 1; ++b) {
    if (b < batches) issue(b, b);
    cp_async_commit();
  }
  // Batch b is in stage b % kStages, its mbarrier in phase (b / kStages) % 2: from b when kStages is a
  // power of two (sparse configuration: shifts), else (dense: 3) kept running, without a division per
  // batch; the running pair costs the sparse configuration's 80 registers spills, so it is not used there.
  constexpr bool kPow2 = (kStages & (kStages - 1)) == 0;
  for (int b = 0, run_stage = 0, run_phase = 0; b < batches; ++b) {
    const int stage = kPow2 ? b % kStages : run_stage;
    [[maybe_unused]] const int phase = kPow2 ? (b / kStages) & 1 : run_phase;  // the mbarrier's (sm_90)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    mbarrier_wait(bars + stage, phase);
#else
    cp_async_wait<kStages - 2>();
#endif
    __syncwarp();  // batch b is in its stage for every lane; every lane is done with stage b - 1
    if (b + kStages - 1 < batches) issue(b + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
    cp_async_commit();
    const unsigned char* st = my + stage * stage_size;
    if (++run_stage == kStages) run_stage = 0, run_phase ^= 1;
    const int* header = reinterpret_cast<const int*>(st + batch * kBitmapBytes);
    const bool staged = header[1] != 0;
    const int first = header[2];
    const uint16_t* vals = reinterpret_cast<const uint16_t*>(st + batch * kBitmapBytes + kHeaderBytes);
    int base = header[0];  // the next group's first value, counted from `first`
    const int ng = min(batch, count - b * batch);
    for (int j = 0; j < ng; ++j) {
      const int col = (c_begin + b * batch + j) * static_cast<int>(kBitmapGroupCols);

      // x for the whole chunk first (NT <= 2): its latency hides behind the decode.
      uint4 xq[NT <= 2 ? NT : 1][2];
      if (NT <= 2) {
#pragma unroll
        for (int jt = 0; jt < (NT <= 2 ? NT : 1); ++jt) {
          xq[jt][0] = xf.load(jt, col, 0);
          xq[jt][1] = xf.load(jt, col, 1);
        }
      }

      // The group's 32 bitmap words (word l: quadrant l / 2, bits 32 (l % 2) ..), each word's first
      // value by a warp scan of their popcounts (values follow each other in word order).
      const uint32_t word = reinterpret_cast<const uint32_t*>(st + j * kBitmapBytes)[lane];
      const int cnt = __popc(word);
      int incl = cnt;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
      }
      const int first_value = base + incl - cnt;
      const int group_values = __shfl_sync(0xffffffffu, incl, 31);

      // Gather: each lane reads its two values of each quadrant from its word's first value plus the
      // set bits below its own. table[16 half + q] = (word 2q + half, its first value). load(at) is
      // value `at` counted from `first` (in the stage, or in global memory).
      uint32_t a[4][4];
      // table[16 half + q] = (word 2q + half, where its first value is: to_entry(first_value)); the
      // lane's two values of quadrant q are at entry + popcount(bits below its own) (load_pair).
      auto gather = [&](auto to_entry, auto load_pair) {
        table[16 * (lane & 1) + (lane >> 1)] = make_uint2(word, to_entry(first_value));
        __syncwarp();
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const uint4 e01 = reinterpret_cast<const uint4*>(table)[8 * high + 2 * s];
          const uint4 e23 = reinterpret_cast<const uint4*>(table)[8 * high + 2 * s + 1];
          const uint32_t ew[4] = {e01.x, e01.z, e23.x, e23.z}, ev[4] = {e01.y, e01.w, e23.y, e23.w};
          uint32_t sel[4];
          step_selectors(ew, pick, shift, sel);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            uint32_t v0, v1;
            load_pair(ev[r], __popc(ew[r] & below), v0, v1);
            a[s][r] = prmt(v0, v1, sel[r]);
          }
        }
        __syncwarp();  // every lane has read the table before the next group rewrites it
      };
      // The stage serves the group when the batch's values were copied and the bitmaps ask for no
      // more values than the stage holds (a lane reads at most value base + group_values): warp-uniform.
      if (!staged || base + group_values + 1 > p.stage_values) {
        auto load = [&](int at) -> uint32_t {  // 0 <= at <= ~4100: first + at only clamped, never overflows
          return nvalues > 0 ? __ldg(p.values + (at < nvalues - first ? first + at : nvalues - 1)) : 0u;
        };
        gather([](int f) { return static_cast<uint32_t>(f); },
               [&](uint32_t entry, int below_count, uint32_t& v0, uint32_t& v1) {
                 const int at = static_cast<int>(entry) + below_count;
                 v0 = load(at);
                 v1 = load(at + 1);
               });
      } else if (!Dense && group_values <= p.scatter_max) {
        // Scatter: each lane writes its word's values into their fragment slots of a zeroed tile
        // (work ~ values, not positions: the sparse groups), then reads its 16 registers back.
#pragma unroll
        for (int r = 0; r < 4; ++r) reinterpret_cast<uint4*>(tile)[lane + 32 * r] = make_uint4(0u, 0u, 0u, 0u);
        __syncwarp();
        const int q = lane >> 1, half = lane & 1;
        // Slot of bit b of this word: fragment lane 16 half + b / 2, register q % 4 of step q / 4.
        const int slot0 = 256 * (q >> 2) + 128 * half + 2 * (q & 3);
        uint32_t rest = word;
        int src = first_value;
        while (rest != 0u) {
          const int bit = __ffs(rest) - 1;
          rest &= rest - 1u;
          tile[slot0 + 8 * (bit >> 1) + (bit & 1)] = vals[src++];
        }
        __syncwarp();
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const uint4 v = reinterpret_cast<const uint4*>(tile)[s * 32 + lane];
          a[s][0] = v.x;
          a[s][1] = v.y;
          a[s][2] = v.z;
          a[s][3] = v.w;
        }
        __syncwarp();  // every lane has read the tile before the next group zeroes it
      } else {
        // Entries are shared-memory addresses: value at + 1 <= base + group_values is in the stage.
        const uint32_t vals_address = smem_address(vals);
        gather([&](int f) { return vals_address + 2u * static_cast<uint32_t>(f); },
               [](uint32_t entry, int below_count, uint32_t& v0, uint32_t& v1) {
                 const uint32_t at = entry + 2u * static_cast<uint32_t>(below_count);
                 v0 = lds_u16(at);
                 v1 = lds_u16(at + 2u);
               });
      }
      base += group_values;

      // B fragments of step s: x[token][col + 16 t + 4 s .. + 3] (b0 the first two, b1 the last two);
      // 16 bytes (two steps) per lane and tile at a time.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 xv[NT];
#pragma unroll
        for (int jt = 0; jt < NT; ++jt) xv[jt] = NT <= 2 ? xq[NT <= 2 ? jt : 0][h] : xf.load(jt, col, h);
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
          for (int jt = 0; jt < NT; ++jt) {
            Mma<T>::run(acc[jt], a[2 * h + s2], s2 ? xv[jt].z : xv[jt].x, s2 ? xv[jt].w : xv[jt].y);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __syncwarp();
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_invalidate(bars + s);
  }
#endif
  __syncthreads();  // every warp is done with its stages: they become the reduction buffer

  write_block_sums<T, NT>(acc, reinterpret_cast<float*>(smem), p.ws, p.wk, p.m, p.n, n0, p.bias, p.act, p.slope, p.out);
#else
  __trap();  // mma.sync on bf16/fp16 needs sm_80: bitmap_linear.cu refuses this build
#endif
}

// out[n, m] = act(sum over splits of ws[split, n, m] (in split order) + bias[m]).
template <typename T>
__global__ void bitmap_splitk_reduce_kernel(const float* ws, int splits, int64_t cells, int64_t m,
                                            const uint16_t* bias, Activation act, float slope, uint16_t* out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < cells;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float z = 0.f;
    for (int s = 0; s < splits; ++s) z += ws[s * cells + e];
    if (bias != nullptr) z += Mma<T>::to_float(bias[e % m]);
    out[e] = Mma<T>::from_float(apply_activation(act, z, slope));
  }
}


}  // namespace bitmap
}  // namespace cuda
}  // namespace sparsetorch
