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
// band's warps in a fixed order (the result is bitwise repeatable; wide float4 loads, many in flight: see
// Band) and writes the band, then resets the counter. The x fragments of the next unit are loaded when a
// unit starts (NT <= 2). N > 32 tokens: blockIdx.y takes 32 tokens each (W is streamed once per 32 tokens).
// The grid is one wave: blocks per SM are capped by shared memory and by the kernel's registers (plan_for).
// Template flags (Flag) build the probe's ablation variants and the atomic-reduction alternative.
//
// BOUNDS. Every global read is clamped: offsets are read only for the warp's groups; a stage copies at most
// stage_bytes bytes and never past the blob's end (blob_units); a group is decoded only when its 128
// bitmap bytes and all the values its bitmaps count lie inside the bytes the stage received (warp-uniform
// test), so every shared read is inside its stage (the reads at e - 2 >= start - 2 fall in the group's own
// bitmap bytes); x is read only for tokens < n and columns < k; y only for rows < m and tokens < n. A
// corrupt layout gives a wrong product, never an out-of-bounds access. Requires k % 8 == 0 (x rows read
// 16 bytes at a time), x 16-byte aligned with ldx % 8 == 0, and the counters (and accum) zero before the
// first launch (each launch leaves them zero unless it is aborted).
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
  float* partials;             // (token tiles, total_warps, 2, 8 * NT tokens, 64 rows): token-major slots
  float* accum;                // (token tiles, bands, 64 rows, 8 * NT), zero (kAtomic only)
  int* counters;               // (token tiles, bands), zero
  long long* stamps;           // (total_warps * tiles, kStampWords) or null (kStamps only)
  int m, k, n;
  int bands, chunks;
  int64_t units;               // bands * chunks
  int total_warps;             // warps that take units (<= units)
  int stages, stage_bytes;     // stage_bytes % 16 == 0, >= kMaxGroupBytes
  int act;
  float slope;
};

// Kernel variants (template flags). 0 is the product; the others are the probe's ablations (each removes one
// piece of work to measure its cost; their results are wrong on purpose) and two alternatives.
enum Flag : int {
  kNoDecode = 1,    // fragments = the raw bitmap words (no scan, no value loads)
  kNoX = 2,         // x fragments = constants (no x loads)
  kNoMma = 4,       // no mma (fragments kept alive by an empty asm)
  kNoReduce = 8,    // shared bands: partial sums written, no counter, no reduction, no y
  kCopyOnly = 16,   // stream the stages, touch nothing (no decode, no x, no mma, no flush)
  kAtomic = 32,     // shared bands reduced by fp32 red.add into accum (fast, NOT bitwise repeatable)
  kStamps = 64,     // per-warp clock64 / globaltimer phase stamps into p.stamps
};
constexpr int kStampWords = 8;  // t_start ns, t_end ns, cycles total, wait, flush, first wait, x, groups

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

__device__ __forceinline__ float4 ldcg4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ void red_add_v2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ long long globaltimer() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// y[gtok][grow] = act(z + bias[grow]).
template <typename T>
__device__ __forceinline__ void store_y(const Params& p, int64_t grow, int gtok, float z) {
  if (p.bias != nullptr) z += Traits<T>::to_float(p.bias[grow]);
  p.y[static_cast<int64_t>(gtok) * p.m + grow] = Traits<T>::from_float(activate(p.act, z, p.slope));
}
// Rows grow .. grow + 3 of token gtok (rows >= m dropped; one 8-byte store when all 4 are in and aligned).
template <typename T>
__device__ __forceinline__ void store_y4(const Params& p, int64_t grow, int gtok, float4 z) {
  const float v[4] = {z.x, z.y, z.z, z.w};
  uint32_t o[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    float t = v[r];
    if (p.bias != nullptr && grow + r < p.m) t += Traits<T>::to_float(p.bias[grow + r]);
    o[r] = Traits<T>::from_float(activate(p.act, t, p.slope));
  }
  uint16_t* dst = p.y + static_cast<int64_t>(gtok) * p.m + grow;
  if (grow + 3 < p.m && (reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(o[0] | (o[1] << 16), o[2] | (o[3] << 16));
  } else {
#pragma unroll
    for (int r = 0; r < 4; ++r)
      if (grow + r < p.m) dst[r] = static_cast<uint16_t>(o[r]);
  }
}

template <typename T, int NT, int F>
struct Band {
  // Writes band `band` (64 rows x the tile's tokens from n0) from acc. A band the warp holds entirely is
  // written straight from the registers. A shared band: the warp stores its fp32 sums (tokens < n only) in
  // its partial slot (token-major, [tok][row]); the warp that arrives last (an atomic counter per band) adds
  // the slots of all the band's warps in a fixed order (bitwise repeatable), applies bias and activation,
  // writes y and resets the counter. The last arriver's sum is wide: float4 loads, 8 (NT = 4: 4) slots x 2
  // float4 per lane in flight; with one token (16 float4 per slot) the two half-warps take the even / odd slots and
  // combine by one shuffle. (The old loop read one float per L2 round trip, 16 NT x warps-per-band of them
  // in a row, with a 64-bit division per read: ~0.4 us x 16 NT x 7..25 on the critical path.)
  // kAtomic: the warps red.add into a zeroed fp32 band buffer instead (no order: not bitwise repeatable);
  // the last arriver reads it once, writes y and zeroes it.
  static __device__ __forceinline__ void flush(const Params& p, float (&acc)[4][NT][4], int64_t band, int64_t w,
                                               int n0, int lane) {
    const int g = lane >> 2, q = lane & 3;
    constexpr int tt = 8 * NT;
    const int ntok = min(tt, p.n - n0);
    const int64_t first_unit = band * p.chunks, last_unit = first_unit + p.chunks - 1;
    const int64_t wf = unit_owner(first_unit, p.units, p.total_warps), wl = unit_owner(last_unit, p.units, p.total_warps);
    const int64_t row0 = band * kBandRows;
    const int tile = blockIdx.y;
    if (wf == wl) {
#pragma unroll
      for (int sub = 0; sub < 4; ++sub)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = 16 * sub + g + 8 * (e >> 1), tok = 8 * j + 2 * q + (e & 1);
            if (row0 + row < p.m && tok < ntok) store_y<T>(p, row0 + row, n0 + tok, acc[sub][j][e]);
          }
      return;
    }
    int* counter = p.counters + static_cast<int64_t>(tile) * p.bands + band;
    if constexpr ((F & kAtomic) != 0) {
      float* ab = p.accum + (static_cast<int64_t>(tile) * p.bands + band) * (kBandRows * tt);  // [row][tok]
#pragma unroll
      for (int sub = 0; sub < 4; ++sub)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int eh = 0; eh < 2; ++eh) {
            const int row = 16 * sub + g + 8 * eh, tok = 8 * j + 2 * q;
            if (tok < ntok) red_add_v2(ab + row * tt + tok, acc[sub][j][2 * eh], acc[sub][j][2 * eh + 1]);
          }
      if constexpr ((F & kNoReduce) != 0) return;
      __threadfence();
      __syncwarp();
      int old = 0;
      if (lane == 0) old = atomicAdd(counter, 1);
      old = __shfl_sync(0xffffffffu, old, 0);
      if (old != static_cast<int>(wl - wf)) return;
      __threadfence();
      constexpr int kPer = kBandRows * tt / 4 / 32;  // float4 per lane: 4 NT
      float4 v[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) v[i] = ldcg4(ab + 4 * (lane + 32 * i));
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int f = lane + 32 * i, row = (4 * f) / tt, tok = (4 * f) % tt;
        const float c4[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (row0 + row < p.m && tok + c < ntok) store_y<T>(p, row0 + row, n0 + tok + c, c4[c]);
        __stcg(reinterpret_cast<float4*>(ab) + f, make_float4(0.f, 0.f, 0.f, 0.f));
      }
      if (lane == 0) *counter = 0;
      return;
    } else {
      constexpr int64_t slot_size = static_cast<int64_t>(kBandRows) * tt;
      const float* part = p.partials + static_cast<int64_t>(tile) * p.total_warps * 2 * slot_size;
      // Slot 0: the band holds the warp's first unit; slot 1: the band is the last of a warp whose range
      // began before it (only the first warp of a band, wf, can be in that case).
      const int which_wf = unit_begin(wf, p.units, p.total_warps) >= first_unit ? 0 : 1;
      float* mine = const_cast<float*>(part) + (w * 2 + (w > wf ? 0 : which_wf)) * slot_size;
#pragma unroll
      for (int sub = 0; sub < 4; ++sub)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = 16 * sub + g + 8 * (e >> 1), tok = 8 * j + 2 * q + (e & 1);
            if (tok < ntok) __stcg(mine + tok * kBandRows + row, acc[sub][j][e]);
          }
      if constexpr ((F & kNoReduce) != 0) return;
      __threadfence();
      __syncwarp();
      int old = 0;
      if (lane == 0) old = atomicAdd(counter, 1);
      old = __shfl_sync(0xffffffffu, old, 0);
      if (old != static_cast<int>(wl - wf)) return;
      __threadfence();
      constexpr int kSlots = NT >= 4 ? 4 : 8;  // slots per round (registers: the NT = 4 kernel is at the edge)
      const int e4 = ntok * (kBandRows / 4);  // float4 per slot: 16 per token
      const int fl = e4 >= 32 ? 32 : 16;      // lanes per slot set
      const int sg = 32 / fl;                 // slot sets: 2 (one token) or 1
      const int half = lane / fl, fi = lane & (fl - 1);
#pragma unroll 1
      for (int f0 = 0; f0 < e4; f0 += 2 * fl) {
        float4 z[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) z[i] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
        for (int64_t b = wf + half; b <= wl; b += kSlots * sg) {
          float4 v[kSlots][2];
#pragma unroll
          for (int s = 0; s < kSlots; ++s) {
            const int64_t ww = b + s * sg;
            const float* src = part + (ww * 2 + (ww > wf ? 0 : which_wf)) * slot_size;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int f = f0 + fi + fl * i;
              v[s][i] = (ww <= wl && f < e4) ? ldcg4(src + 4 * f) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
          }
#pragma unroll
          for (int s = 0; s < kSlots; ++s)
            if (b + s * sg <= wl) {
#pragma unroll
              for (int i = 0; i < 2; ++i) {
                z[i].x += v[s][i].x;
                z[i].y += v[s][i].y;
                z[i].z += v[s][i].z;
                z[i].w += v[s][i].w;
              }
            }
        }
        if (sg == 2) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {  // a + b on one half, b + a on the other: the same bits
            z[i].x += __shfl_xor_sync(0xffffffffu, z[i].x, 16);
            z[i].y += __shfl_xor_sync(0xffffffffu, z[i].y, 16);
            z[i].z += __shfl_xor_sync(0xffffffffu, z[i].z, 16);
            z[i].w += __shfl_xor_sync(0xffffffffu, z[i].w, 16);
          }
        }
        if (half == 0) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int f = f0 + fi + fl * i;
            if (f < e4) store_y4<T>(p, row0 + 4 * (f % 16), n0 + f / 16, z[i]);
          }
        }
      }
      if (lane == 0) *counter = 0;
    }
  }
};

__device__ __forceinline__ void sink4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("" ::"r"(a), "r"(b), "r"(c), "r"(d));
}

template <typename T, int NT, int F>
__global__ void __launch_bounds__(256, (F == 0 ? 0 : 1)) bitmap2_linear_kernel(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (w >= p.total_warps) return;  // whole warps only: no block barrier below
  constexpr bool kStamp = (F & kStamps) != 0;
  long long c_start = 0, c_wait = 0, c_flush = 0, c_first = -1, c_x = 0, t_start = 0;
  if constexpr (kStamp) {
    t_start = globaltimer();
    c_start = clock64();
  }
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

  // x rows of this lane (token n0 + 8 j + g), from column 8 q of each 32-column half of a chunk. The x
  // fragments of the next unit are loaded when a unit starts (xn), so an L2 round trip per unit is not on
  // the warp's path between a stage's arrival and its first mma.
  const int g = lane >> 2, q = lane & 3;
  const uint16_t* xrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int tok = n0 + 8 * j + g;
    xrow[j] = tok < p.n ? p.x + static_cast<int64_t>(tok) * p.ldx + 8 * q : nullptr;
  }
  uint4 xv[NT][2], xn[NT][2];
  auto load_x = [&](uint4 (&dst)[NT][2], int chunk) {
    const int col = chunk * 64;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        if constexpr ((F & kNoX) != 0) {
          dst[j][hh] = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
        } else {
          const int c = col + 32 * hh + 8 * q;
          dst[j][hh] = (xrow[j] != nullptr && c + 8 <= p.k) ? __ldg(reinterpret_cast<const uint4*>(xrow[j] + col + 32 * hh))
                                                             : make_uint4(0u, 0u, 0u, 0u);
        }
      }
  };
  // (band, chunk) of the next unit to start: advanced per unit, no 64-bit division in the loop.
  int64_t nb = ng > 0 ? u0 / p.chunks : 0;
  int nc = ng > 0 ? static_cast<int>(u0 - nb * p.chunks) : 0;
  // NT = 4 (N > 16) loads at the unit's start: 32 more registers would cost it occupancy.
  constexpr bool kPrefetchX = NT <= 2;
  if (kPrefetchX && ng > 0) load_x(xn, nc);
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
    long long cw = 0;
    if constexpr (kStamp) cw = clock64();
    mbar_wait(bars + 8 * s, static_cast<uint32_t>((k / stages) & 1));
    if constexpr (kStamp) {
      const long long d = clock64() - cw;
      c_wait += d;
      if (c_first < 0) c_first = clock64() - c_start;
    }
    const int n_groups = headers[2 * s], bytes = headers[2 * s + 1];
    if constexpr ((F & kCopyOnly) != 0) {
      done += n_groups;
      __syncwarp();
      if (pa < ng) issue(s);
      continue;
    }
    const uint32_t st = stage0 + s * stage_bytes;
    int ptr = 0;
    bool ok = true;
    for (int i = 0; i < n_groups; ++i) {
      const int rel = done + i;
      const int sub = rel & 3;
      if (sub == 0) {
        const int64_t band = nb;
        const int chunk = nc;
        if (++nc == p.chunks) {
          nc = 0;
          ++nb;
        }
        if (band != cur_band) {
          if (cur_band >= 0) {
            long long cf = 0;
            if constexpr (kStamp) cf = clock64();
            Band<T, NT, F>::flush(p, acc, cur_band, w, n0, lane);
            if constexpr (kStamp) c_flush += clock64() - cf;
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
              for (int j = 0; j < NT; ++j) acc[a][j][0] = acc[a][j][1] = acc[a][j][2] = acc[a][j][3] = 0.f;
          }
          cur_band = band;
        }
        long long cx = 0;
        if constexpr (kStamp) cx = clock64();
        if constexpr (kPrefetchX) {
#pragma unroll
          for (int j = 0; j < NT; ++j) xv[j][0] = xn[j][0], xv[j][1] = xn[j][1];
          if (rel + 4 < ng) load_x(xn, nc);
        } else {
          load_x(xv, chunk);
        }
        if constexpr (kStamp) c_x += clock64() - cx;
      }
      if (!ok || ptr + kGroupBytes > bytes) {
        ok = false;
        continue;
      }
      const uint32_t gw = st + ptr;
      uint32_t word;
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(word) : "r"(gw + 4u * ((lane & 1) * 16 + (lane >> 1))));
      const int cnt = __popc(word);
      uint32_t a[16];
      int total;
      if constexpr ((F & kNoDecode) != 0) {
        total = static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(cnt)));
        if (ptr + kGroupBytes + 2 * total > bytes) {
          ok = false;
          continue;
        }
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) {
          const uint4 wq = lds_128(gw + 64u * h + 16u * qq);
          a[4 * qq] = wq.x, a[4 * qq + 1] = wq.y, a[4 * qq + 2] = wq.z, a[4 * qq + 3] = wq.w;
        }
      } else {
        // Scan of the 32 words' popcounts in value order (word index 2 t + hw is stored at hw * 16 + t).
        int incl = cnt;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
          const int o = __shfl_up_sync(0xffffffffu, incl, d);
          if (lane >= d) incl += o;
        }
        total = __shfl_sync(0xffffffffu, incl, 31);
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
      }
      ptr += kGroupBytes + ((2 * total + 15) & ~15);
      if constexpr ((F & kNoMma) != 0) {
        sink4(a[0], a[1], a[2], a[3]);
        sink4(a[4], a[5], a[6], a[7]);
        sink4(a[8], a[9], a[10], a[11]);
        sink4(a[12], a[13], a[14], a[15]);
        if (sub == 0) {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            sink4(xv[j][0].x, xv[j][0].y, xv[j][0].z, xv[j][0].w);
            sink4(xv[j][1].x, xv[j][1].y, xv[j][1].z, xv[j][1].w);
          }
        }
        continue;
      }
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
  if constexpr ((F & kCopyOnly) == 0) {
    if (cur_band >= 0) {
      long long cf = 0;
      if constexpr (kStamp) cf = clock64();
      Band<T, NT, F>::flush(p, acc, cur_band, w, n0, lane);
      if constexpr (kStamp) c_flush += clock64() - cf;
    }
  }
  if constexpr (kStamp) {
    if (lane == 0 && p.stamps != nullptr) {
      long long* o = p.stamps + (static_cast<int64_t>(blockIdx.y) * p.total_warps + w) * kStampWords;
      o[0] = t_start;
      o[1] = globaltimer();
      o[2] = clock64() - c_start;
      o[3] = c_wait;
      o[4] = c_flush;
      o[5] = c_first;
      o[6] = c_x;
      o[7] = ng;
    }
  }
}

// ---- host side ------------------------------------------------------------------------------------------
struct Config {
  int warps = 4;            // warps per block (1..8)
  int stages = 4;
  int stage_bytes = 4096;   // multiple of 16, >= kMaxGroupBytes
  int blocks_per_sm = 0;    // 0: as many as shared memory and registers allow (at most 16 warps per SM)
};

struct Plan {
  int nt = 1, tiles = 1, grid = 0, total_warps = 0, smem = 0, blocks_per_sm = 0;
  // workspace: counters (int32, zero), then accum (fp32, zero; kAtomic), then partials (fp32)
  int64_t counters = 0, accum_floats = 0, partial_floats = 0;
  int64_t counter_bytes() const { return ((counters * 4 + 255) / 256) * 256; }
  int64_t workspace_bytes() const { return counter_bytes() + accum_floats * 4 + partial_floats * 4; }
};

// max_blocks_per_sm: the kernel's occupancy limit (registers), from plan_for; the grid must be one wave
// (a second wave ran the NT = 4 kernel, 209 registers, at 2 blocks per SM where shared memory allowed 3).
inline Plan make_plan(int m, int k, int n, const Config& c, int sms, int smem_per_sm, int smem_per_block,
                      int max_blocks_per_sm = 1 << 20) {
  Plan pl;
  pl.nt = n <= 8 ? 1 : n <= 16 ? 2 : 4;
  pl.tiles = (n + 8 * pl.nt - 1) / (8 * pl.nt);
  const int64_t bands = (m + 63) / 64, chunks = (k + 63) / 64, units = bands * chunks;
  pl.smem = c.warps * warp_smem(c.stages, c.stage_bytes);
  if (pl.smem > smem_per_block || units == 0) {
    pl.grid = 0;
    return pl;
  }
  const int fit = smem_per_sm / (pl.smem + 1024);
  int per_sm = c.blocks_per_sm > 0 ? c.blocks_per_sm : (16 / c.warps > 0 ? 16 / c.warps : 1);
  per_sm = per_sm > fit ? fit : per_sm;
  per_sm = per_sm > max_blocks_per_sm ? max_blocks_per_sm : per_sm;
  per_sm = per_sm < 1 ? 1 : per_sm;
  pl.blocks_per_sm = per_sm;
  int64_t warps = static_cast<int64_t>(sms) * per_sm * c.warps / pl.tiles;
  if (warps < 1) warps = 1;
  if (warps > units) warps = units;
  pl.total_warps = static_cast<int>(warps);
  pl.grid = static_cast<int>((warps + c.warps - 1) / c.warps);
  pl.counters = static_cast<int64_t>(pl.tiles) * bands;
  pl.accum_floats = static_cast<int64_t>(pl.tiles) * bands * kBandRows * 8 * pl.nt;
  pl.partial_floats = static_cast<int64_t>(pl.tiles) * warps * 2 * kBandRows * 8 * pl.nt;
  return pl;
}

template <typename T, int F = 0, int MaxNT = 4>
inline const void* kernel_for(int nt) {
  if (nt == 1) return reinterpret_cast<const void*>(bitmap2_linear_kernel<T, 1, F>);
  if (nt == 2) return reinterpret_cast<const void*>(bitmap2_linear_kernel<T, 2, F>);
  if constexpr (MaxNT >= 4) {
    if (nt == 4) return reinterpret_cast<const void*>(bitmap2_linear_kernel<T, 4, F>);
  }
  return nullptr;
}

// Plans a launch on the current device: one wave, blocks per SM capped by shared memory and by the kernel's
// own occupancy (registers). grid == 0: no plan.
template <typename T, int F = 0, int MaxNT = 4>
inline Plan plan_for(int m, int k, int n, const Config& c) {
  int dev = 0, sms = 0, smem_sm = 0, smem_blk = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  cudaDeviceGetAttribute(&smem_blk, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  Plan pl = make_plan(m, k, n, c, sms, smem_sm, smem_blk);
  if (pl.grid == 0) return pl;
  const void* kern = kernel_for<T, F, MaxNT>(pl.nt);
  int occ = 0;
  if (kern == nullptr || cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 32 * c.warps, pl.smem) != cudaSuccess || occ < 1) {
    pl.grid = 0;
    return pl;
  }
  return make_plan(m, k, n, c, sms, smem_sm, smem_blk, occ);
}

// Launches y = act(x @ W^T + bias) on `stream`. workspace: pl.workspace_bytes() bytes, 256-byte aligned, its
// first counter_bytes() + 4 accum_floats bytes zero (the kernel leaves them zero). Returns the launch's error.
template <typename T, int F = 0, int MaxNT = 4>
inline cudaError_t launch(const Plan& pl, const Config& c, Params prm, void* workspace, cudaStream_t stream) {
  if (pl.grid == 0) return cudaErrorInvalidConfiguration;
  const void* kern = kernel_for<T, F, MaxNT>(pl.nt);
  if (kern == nullptr) return cudaErrorInvalidConfiguration;
  prm.counters = static_cast<int*>(workspace);
  prm.accum = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + pl.counter_bytes());
  prm.partials = prm.accum + pl.accum_floats;
  prm.total_warps = pl.total_warps;
  prm.stages = c.stages;
  prm.stage_bytes = c.stage_bytes;
  prm.bands = (prm.m + 63) / 64;
  prm.chunks = (prm.k + 63) / 64;
  prm.units = static_cast<int64_t>(prm.bands) * prm.chunks;
  const dim3 grid(static_cast<unsigned>(pl.grid), static_cast<unsigned>(pl.tiles));
  const dim3 block(static_cast<unsigned>(32 * c.warps));
  cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.smem);
  if (err != cudaSuccess) return err;
  void* args[] = {&prm};
  err = cudaLaunchKernel(kern, grid, block, args, static_cast<size_t>(pl.smem), stream);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace bitmap2
}  // namespace cuda
}  // namespace sparsetorch
