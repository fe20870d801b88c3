// Bitmap-tile decode kernel for few tokens on sm_90 (issue 48 prototype): y = act(x @ W^T + bias), W in the
// bitmap-tile layout of common/bitmap_layout.h. The skeleton of the 2:4 decode kernel (one strip of 16 rows
// per warp, 8 warps per block, K split over blockIdx.y and summed in a thread-block cluster), with a gather
// decode straight from global memory: per quadrant a lane's two values sit at popcount(bits below 2 lane)
// past the quadrant's first value, read with two predicated 16-bit loads (the 32 lanes of one load fall in
// the quadrant's <= 128 bytes of values). Bitmaps and the group's first value are loaded one group ahead.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace bms {

constexpr int kWarps = 8;
constexpr int kMaxCluster = 8;

struct Params {
  const uint64_t* bitmaps;  // (strips, chunks, 16)
  const int* offsets;       // (strips * chunks + 1)
  const uint16_t* values;   // (nvalues,)
  int64_t nvalues;
  const uint16_t* x;        // (n, ldx), 16-byte aligned rows; columns >= kx read as zero
  int64_t ldx;
  int kx;
  uint16_t* out;            // (n, m)
  const uint16_t* bias;
  int m, n, strips, chunks, chunks_per_split;
  int act;
  float slope;
  int cluster;              // splits summed in a cluster
  int prefetch;             // prefetch the next group's values into L2
};

template <typename T>
struct Ty;
template <>
struct Ty<__nv_bfloat16> {
  static __device__ __forceinline__ float f(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
  static __device__ __forceinline__ uint16_t h(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Ty<__half> {
  static __device__ __forceinline__ float f(uint16_t b) { return __half2float(__ushort_as_half(b)); }
  static __device__ __forceinline__ uint16_t h(float v) { return __half_as_ushort(__float2half_rn(v)); }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ float activate(int act, float x, float slope) {
  switch (act) {
    case 1: return x < 0.f ? 0.f : x;
    case 2: return x < 0.f ? x * slope : x;
    case 3: return 0.5f * x * (1.f + erff(x * 0.70710678118654752440f));
    case 4: return 0.5f * x * (1.f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
    case 5: return x / (1.f + expf(-x));
    case 6: return 1.f / (1.f + expf(-x));
    case 7: return tanhf(x);
    default: return x;
  }
}

__device__ __forceinline__ uint4 ldg_bcast(const uint4* p) {  // the same 16 bytes in every lane
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ldg_u16(const uint16_t* p) {
  unsigned short v;
  asm("ld.global.nc.u16 %0, [%1];\n" : "=h"(v) : "l"(p));
  return v;
}

template <typename T>
__device__ __forceinline__ void store_out(const Params& p, int n, int row, float z) {
  if (p.bias != nullptr) z += Ty<T>::f(p.bias[row]);
  p.out[static_cast<int64_t>(n) * p.m + row] = Ty<T>::h(activate(p.act, z, p.slope));
}

template <typename T, int NT>
__global__ void __launch_bounds__(kWarps * 32) bitmap_stream_kernel(const Params p) {
  extern __shared__ __align__(16) float red[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int strip = blockIdx.x * kWarps + warp;
  const bool active = strip < p.strips;
  const int c0 = blockIdx.y * p.chunks_per_split;
  const int c1 = min(p.chunks, c0 + p.chunks_per_split);
  // Per-lane constants of the rank: bits below 2 lane in the (lo, hi) words of a quadrant.
  const uint32_t mlo = lane < 16 ? ((1u << (2 * lane)) - 1u) : 0xffffffffu;
  const uint32_t mhi = lane < 16 ? 0u : ((1u << (2 * lane - 32)) - 1u);
  const int shift = (2 * lane) & 31;
  const bool use_hi = lane >= 16;
  const int64_t vmax = p.nvalues - 1;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  if (active && c0 < c1) {
    const int64_t group0 = static_cast<int64_t>(strip) * p.chunks;
    uint4 bm[8];  // 16 words of the current group: bm[i] = words 2i, 2i+1
    int base;
    auto load_group = [&](int c, uint4 (&w)[8], int& first) {
      const uint4* src = reinterpret_cast<const uint4*>(p.bitmaps + (group0 + c) * 16);
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = ldg_bcast(src + i);
      first = __ldg(p.offsets + group0 + c);
      if (p.prefetch) {  // the group's values, one 128-byte line per lane
        const int last = __ldg(p.offsets + group0 + c + 1);
        const int64_t b0 = (static_cast<int64_t>(first) * 2) & ~int64_t(127);
        const int64_t b = b0 + 128 * lane;
        if (b < static_cast<int64_t>(last) * 2)
          asm volatile("prefetch.global.L2 [%0];\n" ::"l"(reinterpret_cast<const char*>(p.values) + b));
      }
    };
    load_group(c0, bm, base);
    for (int c = c0; c < c1; ++c) {
      uint4 nbm[8];
      int nbase = 0;
      if (c + 1 < c1) load_group(c + 1, nbm, nbase);
      // x fragments of this chunk: token rows g (+ 8 j), columns 64 c + 16 t .. + 15.
      uint4 xb[NT][2];
      const int col = c * 64 + 16 * t;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int tok = 8 * j + g;
        const uint4* xp = reinterpret_cast<const uint4*>(p.x + static_cast<int64_t>(tok) * p.ldx + col);
        xb[j][0] = (tok < p.n && col < p.kx) ? __ldg(xp) : make_uint4(0, 0, 0, 0);
        xb[j][1] = (tok < p.n && col + 8 < p.kx) ? __ldg(xp + 1) : make_uint4(0, 0, 0, 0);
      }
      // Decode the 16 A registers.
      uint32_t a[16];
      int qbase = base;
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        const uint32_t lo = (q & 1) ? bm[q >> 1].z : bm[q >> 1].x;
        const uint32_t hi = (q & 1) ? bm[q >> 1].w : bm[q >> 1].y;
        const int rank = __popc(lo & mlo) + __popc(hi & mhi);
        const uint32_t pair = ((use_hi ? hi : lo) >> shift) & 3u;
        const int64_t i0 = min(static_cast<int64_t>(qbase + rank), vmax);
        const int64_t i1 = min(i0 + (pair & 1u), vmax);
        uint32_t v0 = 0, v1 = 0;
        if (pair & 1u) v0 = ldg_u16(p.values + i0);
        if (pair & 2u) v1 = ldg_u16(p.values + i1);
        a[q] = v0 | (v1 << 16);
        qbase += __popc(lo) + __popc(hi);
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t as[4] = {a[4 * s], a[4 * s + 1], a[4 * s + 2], a[4 * s + 3]};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint32_t w0 = (s < 2) ? ((s == 0) ? xb[j][0].x : xb[j][0].z) : ((s == 2) ? xb[j][1].x : xb[j][1].z);
          const uint32_t w1 = (s < 2) ? ((s == 0) ? xb[j][0].y : xb[j][0].w) : ((s == 2) ? xb[j][1].y : xb[j][1].w);
          Ty<T>::mma(acc[j], as, w0, w1);
        }
      }
      if (c + 1 < c1) {
#pragma unroll
        for (int i = 0; i < 8; ++i) bm[i] = nbm[i];
        base = nbase;
      }
    }
  }

  const int splits = gridDim.y;
  if (splits == 1 || !p.cluster) {
    if (!active) return;
    if (splits != 1) return;  // (non-cluster split mode is not part of the prototype)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = 8 * j + 2 * t + (e & 1), row = strip * 16 + g + 8 * (e >> 1);
        if (n < p.n && row < p.m) store_out<T>(p, n, row, acc[j][e]);
      }
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kValues = NT * 4;
  const int threads = blockDim.x, tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(j * 4 + e) * threads + tid] = acc[j][e];
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  const int total = kValues * threads, share = (total + splits - 1) / splits;
  const int e1 = min(total, (rank + 1) * share);
  for (int e = rank * share + tid; e < e1; e += threads) {
    float z = 0.f;
    for (int q = 0; q < splits; ++q) z += *cluster.map_shared_rank(red + e, q);
    const int v = e / threads, src = e - v * threads;
    const int j = v >> 2, c = v & 3, l2 = src & 31;
    const int st = blockIdx.x * kWarps + (src >> 5);
    const int n = 8 * j + 2 * (l2 & 3) + (c & 1), row = st * 16 + (l2 >> 2) + 8 * (c >> 1);
    if (st < p.strips && n < p.n && row < p.m) store_out<T>(p, n, row, z);
  }
  cluster.sync();
#endif
}

inline int pick_splits(int chunks, int row_groups, int sms) {
  const double target = 1.5 * sms / std::max(1, row_groups);
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= std::min(kMaxCluster, chunks); ++s) {
    const int longest = (chunks + s - 1) / s;
    const double imbalance = static_cast<double>(longest) * s / chunks;
    const double gap = s > target ? s / target : target / s;
    if (imbalance * gap < best_cost - 1e-9) best = s, best_cost = imbalance * gap;
  }
  return best;
}

template <typename T, int NT>
inline cudaError_t launch_nt(Params p, int splits, cudaStream_t stream) {
  const int row_groups = (p.strips + kWarps - 1) / kWarps;
  p.chunks_per_split = (p.chunks + splits - 1) / splits;
  splits = (p.chunks + p.chunks_per_split - 1) / p.chunks_per_split;
  p.cluster = splits > 1;
  const size_t smem = p.cluster ? static_cast<size_t>(NT) * 4 * kWarps * 32 * 4 : 0;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(row_groups, splits);
  lc.blockDim = dim3(kWarps * 32);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = splits;
  attr[0].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = splits > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&lc, bitmap_stream_kernel<T, NT>, p);
}

// splits <= 0: the rule.
inline cudaError_t launch(bool bf16, Params p, int splits, int sms, cudaStream_t stream) {
  const int row_groups = (p.strips + kWarps - 1) / kWarps;
  if (splits <= 0) splits = pick_splits(p.chunks, row_groups, sms);
  splits = std::max(1, std::min(splits, std::min(kMaxCluster, p.chunks)));
  const int nt = p.n <= 8 ? 1 : 2;
  if (p.n > 16) return cudaErrorInvalidValue;
  if (bf16) return nt == 1 ? launch_nt<__nv_bfloat16, 1>(p, splits, stream) : launch_nt<__nv_bfloat16, 2>(p, splits, stream);
  return nt == 1 ? launch_nt<__half, 1>(p, splits, stream) : launch_nt<__half, 2>(p, splits, stream);
}

}  // namespace bms
