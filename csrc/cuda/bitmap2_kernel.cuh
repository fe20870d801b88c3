// bitmap2: y = act(x @ W^T + bias) for a pruned bf16/fp16 weight W (m x k) held as fragment-order bitmap
// tiles streamed by TMA bulk copies (sm_90). Pure CUDA (no torch headers): sparsetorch/pruned/bitmap2.py
// writes the layout (and emulates this decode on the CPU), a standalone probe includes this file.
//
// LAYOUT (all of it is fixed here and in bitmap2.py; the packer's docstring repeats it).
// W is padded with zeros to mp = 64 * ceil(m / 64) rows and kp = 64 * ceil(k / 64) columns and cut into
// groups of 16 rows x 64 columns. Groups are stored band-major: a band is 64 rows (4 strips of 16 rows);
// group index gi = (band * chunks + chunk) * 4 + sub, sub = the strip within the band. A "unit" is the 4
// groups (band, chunk): one warp step, whose x fragments serve all 4 strips.
// Group gi is a blob of 16-byte-aligned bytes at blob + 16 * offsets[gi] (offsets: int32, G + 1 entries,
// in 16-byte units, offsets[G] = the blob's 16-byte units):
//   32 uint32 bitmap words, word (h * 16 + t) = half h (0: positions 0..31, 1: 32..63) of tile t
//   the group's nonzero values, tile t = 0..15 in order, within a tile in position order (p = 0..63)
//   zero padding to a multiple of 8 values (16 bytes)
// Tile t of a group (16 tiles of 8 x 8) is A register r = t & 3 of mma step s = t >> 2 (m16n8k16, k = 16
// columns per step). Position p = 2 * lane + j (lane 0..31, j = 0/1: the low/high half of the 32-bit
// register) of tile t, with g = lane >> 2, q = lane & 3, is the group's element
//   row = g + 8 * (r & 1),   col = 32 * (s >> 1) + 8 * q + 4 * (s & 1) + 2 * (r >> 1) + j.
// With that column order a lane's B fragments for steps 2h, 2h + 1 are the 8 contiguous x values
// x[token][chunk * 64 + 32 h + 8 q .. + 7] (one 16-byte load: b0 = words 0/2, b1 = words 1/3 of it).
// Bytes: 128 per group (bitmaps) + 2 per nonzero + the padding (<= 14 per group, ~7 on average) + 4 per
// group (offset): per element 0.136 + 2 d at density d: 1.14 / 0.74 / 0.34 bytes per element at 50 / 70 /
// 90% sparsity (2.27 / 2.45 / 3.36 bytes per nonzero), against 2 for the dense weight.
//
// DECODE of tile t by lane l (h = l >> 4, i = l & 15; the lane's two positions are bits 2i, 2i + 1 of
// word w = word (h * 16 + t)):
//   y = w << (30 - 2 i)                       its bits at 31 (j = 1) and 30 (j = 0), the bits below it under them
//   c = popc(y)                               values of word w up to and including the lane's pair
//   e = start(t, h) + c                       one past the lane's last value (start: the word's first value)
//   va = value[e - 2], vb = value[e - 1]      (16-bit loads; in bounds whatever the bits: see BOUNDS)
//   bits = y >> 30                            (b1 b0)
//   reg = bits 3: (va, vb); 1: (vb, 0); 2: (0, vb); 0: (0, 0)      (low half first)
// The last line is one PRMT whose selector is itself a PRMT of two constants (kSel0, kSel1) on
// bits * 0x22 + 0x10. Per tile: SHF, POPC, LEA, 2 LDS.U16, SHF, IMAD, PRMT, PRMT = 9 warp instructions
// and one POPC (16/clk/SM on sm_90, the scarce pipe). start(t, h) comes per group from a warp scan of the
// 32 words' popcounts (value order: word index 2 t + h; 1 POPC, 5 SHFL), written to a small per-warp
// table of shared addresses and read back with 4 LDS.128 (the words: 4 more).
//
// KERNEL. Each warp streams a contiguous range of units [u0, u1) (the units split evenly among all warps of
// a persistent grid: "stream-K", every SM gets the same number of groups). Its groups' blobs are
// contiguous, so the warp copies them global -> shared with cp.async.bulk (one elected lane, completion on
// an mbarrier per stage), `stages` stages of up to `stage_bytes` each, every stage as many whole groups as
// fit (a warp ballot over the next 32 groups' offsets, which are prefetched one stage ahead). While a stage
// is decoded the others are in flight; a stage is refilled as soon as it is decoded. No block barrier in
// the main loop. x is read from global memory (L1/L2: 32 bytes per lane per unit and 8-token tile).
// Per unit the warp holds acc[4 strips][NT tiles of 8 tokens][4] fp32. When the warp moves to a new band
// it flushes the band: a band it covers entirely is written directly (bias, activation, bf16/fp16); a band
// shared with other warps (at most at both ends of its range) is written as fp32 partial sums to the
// workspace, and the warp that arrives last (an atomic counter per band) adds the partials of all the
// band's warps in warp order (fixed order: the result is bitwise repeatable) and writes the band, then
// resets the counter. N > 32 tokens: blockIdx.y takes 32 tokens each (W is streamed once per 32 tokens).
//
// BOUNDS. Every global read is clamped: offsets are read only for the warp's groups; a stage copies at most
// stage_bytes bytes and never past the blob's end (blob_units); a group is decoded only when its 128
// bitmap bytes and all the values its bitmaps count lie inside the bytes the stage received (warp-uniform
// test), so every shared read is inside its stage (the reads at e - 2 >= start - 2 fall in the group's own
// bitmap bytes); x is read only for tokens < n and columns < k; y only for rows < m and tokens < n. A
// corrupt layout gives a wrong product, never an out-of-bounds access. Requires k % 8 == 0 (x rows read
// 16 bytes at a time), x 16-byte aligned with ldx % 8 == 0, and the counters zero before the first launch
// (each launch leaves them zero unless it is aborted).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace sparsetorch {
namespace cuda {
namespace bitmap2 {

constexpr int kGroupBytes = 128;       // one group's bitmap words
constexpr int kMaxGroupBytes = 128 + 2048;
constexpr int kBandRows = 64;
constexpr int kMaxNT = 4;              // tiles of 8 tokens per warp (32 tokens); more: blockIdx.y
constexpr uint32_t kSel0 = 0x32543232u, kSel1 = 0x54105432u;  // PRMT selectors for bits 0, 1 | 2, 3

// Activation codes: the values of sparsetorch::Activation (common/activation.h).
enum Act : int { kNone = 0, kRelu = 1, kLeakyRelu = 2, kGelu = 3, kGeluTanh = 4, kSilu = 5, kSigmoid = 6, kTanh = 7 };

__device__ __forceinline__ float activate(int act, float x, float slope) {
  switch (act) {
    case kRelu: return x < 0.f ? 0.f : x;
    case kLeakyRelu: return x < 0.f ? x * slope : x;
    case kGelu: return 0.5f * x * (1.f + erff(x * 0.70710678118654752440f));
    case kGeluTanh: return 0.5f * x * (1.f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
    case kSilu: return x / (1.f + expf(-x));
    case kSigmoid: return 1.f / (1.f + expf(-x));
    case kTanh: return tanhf(x);
    default: return x;
  }
}

struct Params {
  const unsigned char* blob;   // 16-byte aligned
  int64_t blob_units;          // 16-byte units of the blob
  const int* offsets;          // (G + 1,)
  const uint16_t* x;           // (n, ldx), 16-byte aligned, ldx % 8 == 0
  int64_t ldx;
  const uint16_t* bias;        // (m,) or null
  uint16_t* y;                 // (n, m)
  float* partials;             // (token tiles, total_warps, 2, 64, 8 * NT)
  int* counters;               // (token tiles, bands), zero
  int m, k, n;
  int bands, chunks;
  int64_t units;               // bands * chunks
  int total_warps;             // warps that take units (<= units)
  int stages, stage_bytes;     // stage_bytes % 16 == 0, >= kMaxGroupBytes
  int act;
  float slope;
};

// ---- PTX helpers --------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 lds_128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
}

template <typename T>
struct Traits;
template <>
struct Traits<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_float(uint16_t v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <>
struct Traits<__half> {
  static __device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float to_float(uint16_t v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ uint16_t from_float(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

// First unit of warp w when `units` units are split among `warps` warps (warps <= units: none is empty).
__host__ __device__ __forceinline__ int64_t unit_begin(int64_t w, int64_t units, int64_t warps) { return w * units / warps; }
// The warp whose range holds unit u.
__device__ __forceinline__ int64_t unit_owner(int64_t u, int64_t units, int64_t warps) { return ((u + 1) * warps - 1) / units; }

// Per-warp shared memory: the stages, then two 32-entry start tables, then the stage headers and barriers.
__host__ __device__ constexpr int warp_smem(int stages, int stage_bytes) { return stages * stage_bytes + 256 + stages * 16; }

template <typename T, int NT>
struct Band {
  // Writes band `band` (64 rows x 8 NT tokens from n0) from acc: the warp stores its fp32 sums in its
  // partial slot; when other warps share the band (its units are not all the warp's), the one that arrives
  // last (an atomic counter per band) goes on. That warp adds the slots of all the band's warps in warp
  // order (fixed order: bitwise repeatable), adds bias, applies the activation and writes y; it resets the
  // counter. One code path for whole and shared bands keeps the kernel small (the epilogue loop is rolled).
  static __device__ __forceinline__ void flush(const Params& p, float (&acc)[4][NT][4], int64_t band, int64_t w,
                                               int n0, int lane) {
    const int g = lane >> 2, q = lane & 3;
    const int64_t first_unit = band * p.chunks, last_unit = first_unit + p.chunks - 1;
    constexpr int tt = 8 * NT;
    const int tile = blockIdx.y;
    constexpr int64_t slot_size = static_cast<int64_t>(kBandRows) * tt;
    auto slot = [&](int64_t ww) {
      const int64_t which = (unit_begin(ww, p.units, p.total_warps) / p.chunks == band) ? 0 : 1;
      return p.partials + ((static_cast<int64_t>(tile) * p.total_warps + ww) * 2 + which) * slot_size;
    };
    float* mine = slot(w);
#pragma unroll
    for (int sub = 0; sub < 4; ++sub)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = 16 * sub + g + 8 * (e >> 1), tok = 8 * j + 2 * q + (e & 1);
          __stcg(mine + row * tt + tok, acc[sub][j][e]);
        }
    __threadfence();
    __syncwarp();
    const int64_t wf = unit_owner(first_unit, p.units, p.total_warps), wl = unit_owner(last_unit, p.units, p.total_warps);
    int* counter = p.counters + static_cast<int64_t>(tile) * p.bands + band;
    if (wf != wl) {
      int old = 0;
      if (lane == 0) old = atomicAdd(counter, 1);
      old = __shfl_sync(0xffffffffu, old, 0);
      if (old != static_cast<int>(wl - wf)) return;
      __threadfence();
    }
#pragma unroll 1
    for (int e = lane; e < kBandRows * tt; e += 32) {
      const int row = e / tt, tok = e % tt;
      const int64_t grow = band * kBandRows + row;
      const int gtok = n0 + tok;
      float z = 0.f;
#pragma unroll 1
      for (int64_t ww = wf; ww <= wl; ++ww) z += __ldcg(slot(ww) + e);
      if (grow < p.m && gtok < p.n) {
        if (p.bias != nullptr) z += Traits<T>::to_float(p.bias[grow]);
        p.y[static_cast<int64_t>(gtok) * p.m + grow] = Traits<T>::from_float(activate(p.act, z, p.slope));
      }
    }
    if (wf != wl && lane == 0) *counter = 0;
  }
};

template <typename T, int NT>
__global__ void __launch_bounds__(256) bitmap2_linear_kernel(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (w >= p.total_warps) return;  // whole warps only: no block barrier below
  const int n0 = blockIdx.y * 8 * NT;
  const int stages = p.stages, stage_bytes = p.stage_bytes;
  unsigned char* my = smem + warp * warp_smem(stages, stage_bytes);
  const uint32_t stage0 = smem_u32(my);
  const uint32_t table0 = stage0 + stages * stage_bytes;              // 2 x 32 uint32 (double-buffered)
  int* headers = reinterpret_cast<int*>(my + stages * stage_bytes + 256);  // stages x (groups, bytes)
  const uint32_t bars = table0 + 256 + stages * 8;                    // stages x uint64
  const int64_t u0 = unit_begin(w, p.units, p.total_warps), u1 = unit_begin(w + 1, p.units, p.total_warps);
  const int64_t gbase = 4 * u0;
  const int ng = static_cast<int>(4 * (u1 - u0));

  if (lane == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(bars + 8 * s, 1);
    mbar_init_fence();
  }
  __syncwarp();

  // ---- producer: plans and issues the copy of the next whole groups into stage s ----
  const int cap16 = stage_bytes >> 4;
  int pa = 0;                                            // next group to issue (relative)
  int pa_off = ng > 0 ? __ldg(p.offsets + gbase) : 0;    // its offset (16-byte units)
  int win = lane < ng ? __ldg(p.offsets + gbase + 1 + lane) : INT_MAX;  // end of group pa + lane
  auto issue = [&](int s) {
    const bool fits = lane < ng - pa && win >= pa_off && win - pa_off <= cap16;
    const uint32_t bal = __ballot_sync(0xffffffffu, fits);
    int n = bal == 0xffffffffu ? 32 : __ffs(~bal) - 1;
    if (n == 0) n = 1;  // a group larger than a stage (corrupt offsets): copied clamped, not decoded
    const int end = __shfl_sync(0xffffffffu, win, n - 1);
    const int64_t src = min(max(static_cast<int64_t>(pa_off), int64_t{0}), p.blob_units);
    const int64_t want = static_cast<int64_t>(end) - pa_off;
    const int bytes16 = static_cast<int>(min(max(want, int64_t{0}), min(static_cast<int64_t>(cap16), p.blob_units - src)));
    if (lane == 0) {
      headers[2 * s] = n;
      headers[2 * s + 1] = bytes16 * 16;
      const uint32_t bar = bars + 8 * s;
      mbar_arrive_expect_tx(bar, bytes16 * 16);
      if (bytes16 > 0) bulk_copy(stage0 + s * stage_bytes, p.blob + src * 16, bytes16 * 16, bar);
    }
    pa += n;
    pa_off = end;
    win = lane < ng - pa ? __ldg(p.offsets + gbase + pa + 1 + lane) : INT_MAX;
  };
  for (int s = 0; s < stages; ++s)
    if (pa < ng) issue(s);

  float acc[4][NT][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[a][j][0] = acc[a][j][1] = acc[a][j][2] = acc[a][j][3] = 0.f;

  // x rows of this lane (token n0 + 8 j + g), from column 8 q of each 32-column half of a chunk.
  const int g = lane >> 2, q = lane & 3;
  const uint16_t* xrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int tok = n0 + 8 * j + g;
    xrow[j] = tok < p.n ? p.x + static_cast<int64_t>(tok) * p.ldx + 8 * q : nullptr;
  }
  uint4 xv[NT][2];
  const int h = lane >> 4;
  const uint32_t sh = 30u - 2u * static_cast<uint32_t>(lane & 15);
  // kSel0 in a per-lane register (+ laneid >> 5, which is 0): held as a uniform value, ptxas copied it into
  // a vector register before every PRMT (one more instruction per tile).
  uint32_t sel0;
  asm volatile("{\n .reg .u32 l;\n mov.u32 l, %%laneid;\n shr.u32 l, l, 5;\n add.u32 %0, l, %1;\n}\n" : "=r"(sel0) : "n"(kSel0));
  int64_t cur_band = -1;
  int tsel = 0;

  int done = 0;
  for (int k = 0; done < ng; ++k) {
    const int s = k % stages;
    mbar_wait(bars + 8 * s, static_cast<uint32_t>((k / stages) & 1));
    const int n_groups = headers[2 * s], bytes = headers[2 * s + 1];
    const uint32_t st = stage0 + s * stage_bytes;
    int ptr = 0;
    bool ok = true;
    for (int i = 0; i < n_groups; ++i) {
      const int rel = done + i;
      const int64_t unit = u0 + (rel >> 2);
      const int sub = rel & 3;
      if (sub == 0) {
        const int64_t band = unit / p.chunks;
        if (band != cur_band) {
          if (cur_band >= 0) {
            Band<T, NT>::flush(p, acc, cur_band, w, n0, lane);
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
              for (int j = 0; j < NT; ++j) acc[a][j][0] = acc[a][j][1] = acc[a][j][2] = acc[a][j][3] = 0.f;
          }
          cur_band = band;
        }
        const int col = static_cast<int>(unit % p.chunks) * 64;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int c = col + 32 * hh + 8 * q;
            xv[j][hh] = (xrow[j] != nullptr && c + 8 <= p.k)
                            ? __ldg(reinterpret_cast<const uint4*>(xrow[j] + col + 32 * hh))
                            : make_uint4(0u, 0u, 0u, 0u);
          }
      }
      if (!ok || ptr + kGroupBytes > bytes) {
        ok = false;
        continue;
      }
      // Scan of the 32 words' popcounts in value order (word index 2 t + hw is stored at hw * 16 + t).
      const uint32_t gw = st + ptr;
      uint32_t word;
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(word) : "r"(gw + 4u * ((lane & 1) * 16 + (lane >> 1))));
      const int cnt = __popc(word);
      int incl = cnt;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += o;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (ptr + kGroupBytes + 2 * total > bytes) {
        ok = false;
        continue;
      }
      const uint32_t table = table0 + 128u * tsel;
      tsel ^= 1;
      const uint32_t vals = gw + kGroupBytes;
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(table + 4u * ((lane & 1) * 16 + (lane >> 1))),
                   "r"(vals + 2u * (incl - cnt)));
      __syncwarp();
      uint32_t a[16];
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        const uint4 wq = lds_128(gw + 64u * h + 16u * qq);
        const uint4 sq = lds_128(table + 64u * h + 16u * qq);
        const uint32_t ws4[4] = {wq.x, wq.y, wq.z, wq.w}, ss4[4] = {sq.x, sq.y, sq.z, sq.w};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const uint32_t yb = ws4[r] << sh;
          const uint32_t e = ss4[r] + 2u * __popc(yb);
          const uint32_t va = lds_u16(e - 4u), vb = lds_u16(e - 2u);
          const uint32_t sel = prmt(sel0, kSel1, (yb >> 30) * 0x22u + 0x10u);
          a[4 * qq + r] = prmt(va, vb, sel);
        }
      }
      ptr += kGroupBytes + ((2 * total + 15) & ~15);
      // mma: step st4 uses tiles 4 st4 .. 4 st4 + 3; its B fragments are words 2 (st4 & 1), +1 of xv[j][st4 >> 1].
#define BM2_MMA(SUB)                                                                                     \
  _Pragma("unroll") for (int st4 = 0; st4 < 4; ++st4) {                                                 \
    _Pragma("unroll") for (int j = 0; j < NT; ++j) {                                                    \
      const uint4 v = xv[j][st4 >> 1];                                                                   \
      Traits<T>::mma(acc[SUB][j], a[4 * st4], a[4 * st4 + 1], a[4 * st4 + 2], a[4 * st4 + 3],          \
                     (st4 & 1) ? v.z : v.x, (st4 & 1) ? v.w : v.y);                                      \
    }                                                                                                    \
  }
      if (sub == 0) {
        BM2_MMA(0)
      } else if (sub == 1) {
        BM2_MMA(1)
      } else if (sub == 2) {
        BM2_MMA(2)
      } else {
        BM2_MMA(3)
      }
#undef BM2_MMA
    }
    done += n_groups;
    __syncwarp();  // every lane is done with stage s before it is refilled
    if (pa < ng) issue(s);
  }
  if (cur_band >= 0) Band<T, NT>::flush(p, acc, cur_band, w, n0, lane);
}

// ---- host side ------------------------------------------------------------------------------------------
struct Config {
  int warps = 4;            // warps per block (1..8)
  int stages = 4;
  int stage_bytes = 4096;   // multiple of 16, >= kMaxGroupBytes
  int blocks_per_sm = 0;    // 0: as many as shared memory allows (at most 16 warps per SM)
};

struct Plan {
  int nt = 1, tiles = 1, grid = 0, total_warps = 0, smem = 0;
  int64_t partial_floats = 0, counters = 0;  // workspace: counters (int32, zero) then partials (fp32)
  int64_t workspace_bytes() const { return ((counters * 4 + 255) / 256) * 256 + partial_floats * 4; }
};

inline Plan make_plan(int m, int k, int n, const Config& c, int sms, int smem_per_sm, int smem_per_block) {
  Plan pl;
  pl.nt = n <= 8 ? 1 : n <= 16 ? 2 : 4;
  pl.tiles = (n + 8 * pl.nt - 1) / (8 * pl.nt);
  const int64_t bands = (m + 63) / 64, chunks = (k + 63) / 64, units = bands * chunks;
  pl.smem = c.warps * warp_smem(c.stages, c.stage_bytes);
  if (pl.smem > smem_per_block || units == 0) {
    pl.grid = 0;
    return pl;
  }
  // Blocks per SM: as many as shared memory allows, at most 16 warps (the registers of the NT <= 2 kernels,
  // ~128 per thread), or the configured number if that fits.
  const int fit = smem_per_sm / (pl.smem + 1024);
  int per_sm = c.blocks_per_sm > 0 ? c.blocks_per_sm : (16 / c.warps > 0 ? 16 / c.warps : 1);
  per_sm = per_sm > fit ? fit : per_sm;
  per_sm = per_sm < 1 ? 1 : per_sm;
  int64_t warps = static_cast<int64_t>(sms) * per_sm * c.warps / pl.tiles;
  if (warps < 1) warps = 1;
  if (warps > units) warps = units;
  pl.total_warps = static_cast<int>(warps);
  pl.grid = static_cast<int>((warps + c.warps - 1) / c.warps);
  pl.counters = static_cast<int64_t>(pl.tiles) * bands;
  pl.partial_floats = static_cast<int64_t>(pl.tiles) * warps * 2 * kBandRows * 8 * pl.nt;
  return pl;
}

// Launches y = act(x @ W^T + bias) on `stream`. workspace: pl.workspace_bytes() bytes, 256-byte aligned, its
// first pl.counters int32 zero (the kernel leaves them zero). Returns the launch's error.
template <typename T>
inline cudaError_t launch(const Plan& pl, const Config& c, Params prm, void* workspace, cudaStream_t stream) {
  if (pl.grid == 0) return cudaErrorInvalidConfiguration;
  prm.counters = static_cast<int*>(workspace);
  prm.partials = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + ((pl.counters * 4 + 255) / 256) * 256);
  prm.total_warps = pl.total_warps;
  prm.stages = c.stages;
  prm.stage_bytes = c.stage_bytes;
  prm.bands = (prm.m + 63) / 64;
  prm.chunks = (prm.k + 63) / 64;
  prm.units = static_cast<int64_t>(prm.bands) * prm.chunks;
  const dim3 grid(static_cast<unsigned>(pl.grid), static_cast<unsigned>(pl.tiles));
  const dim3 block(static_cast<unsigned>(32 * c.warps));
  cudaError_t err = cudaSuccess;
  auto go = [&](auto kernel) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.smem);
    if (err != cudaSuccess) return;
    kernel<<<grid, block, pl.smem, stream>>>(prm);
    err = cudaGetLastError();
  };
  if (pl.nt == 1) go(bitmap2_linear_kernel<T, 1>);
  else if (pl.nt == 2) go(bitmap2_linear_kernel<T, 2>);
  else go(bitmap2_linear_kernel<T, 4>);
  return err;
}

}  // namespace bitmap2
}  // namespace cuda
}  // namespace sparsetorch
