// Prototype (issue 18): entry-stream SpMM with precomputed unit starts, chunked (col, val) loads
// prefetched one chunk ahead, 8 gathers in flight per group. n == G * VEC exactly.
#include <cuda_bf16.h>
#include <stdint.h>

template <typename T> struct Traits;
template <> struct Traits<float> {
  static constexpr int VEC = 4;
  using Vec = float4;
  using Val4 = float4;
  __device__ static void unpack(const Vec& v, float* o) { o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w; }
  __device__ static float val(const Val4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
  __device__ static float one(const float* p) { return *p; }
  __device__ static Val4 pack4(float a, float b, float c, float d) { return make_float4(a, b, c, d); }
  __device__ static void store(float* dst, const float* a) { *reinterpret_cast<float4*>(dst) = make_float4(a[0], a[1], a[2], a[3]); }
};
template <> struct Traits<__nv_bfloat16> {
  static constexpr int VEC = 8;
  using Vec = uint4;
  using Val4 = uint2;
  __device__ static void unpack(const Vec& v, float* o) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) { float2 f = __bfloat1622float2(h[i]); o[2 * i] = f.x; o[2 * i + 1] = f.y; }
  }
  __device__ static float val(const Val4& v, int i) {
    const unsigned w = i < 2 ? v.x : v.y;
    const unsigned short b = (i & 1) ? (w >> 16) : (w & 0xffff);
    return __uint_as_float(static_cast<unsigned>(b) << 16);
  }
  __device__ static float one(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  __device__ static unsigned bits(__nv_bfloat16 x) { return static_cast<unsigned>(__bfloat16_as_ushort(x)); }
  __device__ static Val4 pack4(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c, __nv_bfloat16 d) {
    return make_uint2(bits(a) | bits(b) << 16, bits(c) | bits(d) << 16);
  }
  __device__ static void store(__nv_bfloat16* dst, const float* a) {
    uint4 o; __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(a[2 * i], a[2 * i + 1]);
    *reinterpret_cast<uint4*>(dst) = o;
  }
};

__device__ __forceinline__ int comp(const int4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

template <typename T, int G, int NB>
__device__ __forceinline__ void stream_body(const int* __restrict__ crow, const int* __restrict__ col,
                                            const T* __restrict__ val, const T* __restrict__ B, T* __restrict__ C,
                                            float* __restrict__ partial, const int* __restrict__ ustart,
                                            const int* __restrict__ urow, int m, int k, int n, int nnz, int units) {
  using Tr = Traits<T>;
  constexpr int VEC = Tr::VEC;
  constexpr int CH = 4 * G;
  const int lane = threadIdx.x % G;
  const unsigned mask = G == 32 ? 0xffffffffu : (((1u << G) - 1u) << (threadIdx.x % 32 / G * G));
  const int groups = gridDim.x * (blockDim.x / G);
  const int c0 = lane * VEC;
  for (int u = (blockIdx.x * blockDim.x + threadIdx.x) / G; u < units; u += groups) {
    const int s = ustart[u], t = ustart[u + 1];
    if (s >= t) continue;
    int row = urow[u];
    int wbase = row;
    int wv = crow[min(row + lane, m)];
    int row_start = __shfl_sync(mask, wv, 0, G), row_end = __shfl_sync(mask, wv, 1, G);
    float acc[VEC];
#pragma unroll
    for (int q = 0; q < VEC; ++q) acc[q] = 0.f;
    auto flush = [&]() {
      if (row_start < row_end) {
        if (row_start >= s && row_end <= t) {
          Tr::store(C + (size_t)row * n + c0, acc);
        } else {
          const int slot = row_start < s ? 0 : 1;
          *reinterpret_cast<float4*>(partial + ((size_t)u * 2 + slot) * n + c0) = make_float4(acc[0], acc[1], acc[2], acc[3]);
          if (VEC == 8)
            *reinterpret_cast<float4*>(partial + ((size_t)u * 2 + slot) * n + c0 + 4) = make_float4(acc[4 % VEC], acc[5 % VEC], acc[6 % VEC], acc[7 % VEC]);
        }
      }
#pragma unroll
      for (int q = 0; q < VEC; ++q) acc[q] = 0.f;
    };
    auto load_chunk = [&](int base, int4& cc, typename Tr::Val4& vv) {
      const int e = base + 4 * lane;
      if (e + 3 < nnz) {
        cc = *reinterpret_cast<const int4*>(col + e);
        vv = *reinterpret_cast<const typename Tr::Val4*>(val + e);
      } else {
        int tmp[4]; T tv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) { tmp[i] = e + i < nnz ? col[e + i] : -1; tv[i] = e + i < nnz ? val[e + i] : T(0.f); }
        cc = make_int4(tmp[0], tmp[1], tmp[2], tmp[3]);
        vv = Tr::pack4(tv[0], tv[1], tv[2], tv[3]);
      }
    };
    const int a0 = s & ~3;
    int4 nc; typename Tr::Val4 nv;
    load_chunk(a0, nc, nv);
    for (int c = a0; c < t; c += CH) {
      const int4 cc = nc; const typename Tr::Val4 vv = nv;
      if (c + CH < t) load_chunk(c + CH, nc, nv);
#pragma unroll 1
      for (int jb = 0; jb < CH; jb += NB) {
        if (c + jb >= t) break;
        typename Tr::Vec g[NB];
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const int jj = jb + j, e = c + jj;
          const int cj = __shfl_sync(mask, comp(cc, jj % 4), jj / 4, G);
          if (e >= s && e < t && (unsigned)cj < (unsigned)k) g[j] = *reinterpret_cast<const typename Tr::Vec*>(B + (size_t)cj * n + c0);
          else g[j] = typename Tr::Vec{};
        }
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const int jj = jb + j, e = c + jj;
          const float v = __shfl_sync(mask, Tr::val(vv, jj % 4), jj / 4, G);
          if (e < s || e >= t) continue;
          while (e >= row_end) {
            flush();
            ++row;
            if (row + 1 - wbase >= G) { wbase = row; wv = crow[min(row + lane, m)]; }
            row_start = row_end;
            row_end = __shfl_sync(mask, wv, row + 1 - wbase, G);
          }
          float b[VEC];
          Tr::unpack(g[j], b);
#pragma unroll
          for (int q = 0; q < VEC; ++q) acc[q] = fmaf(v, b[q], acc[q]);
        }
      }
    }
    flush();
  }
}

// Fixup: one block per listed row (empty rows: pieces 0), the row's pieces summed by the block's
// groups (strided, then added in group order).
template <typename T, int G>
__device__ __forceinline__ void fixup_body(const int* __restrict__ rows, const int* __restrict__ first,
                                           const int* __restrict__ pieces, const float* __restrict__ partial,
                                           T* __restrict__ C, int n) {
  using Tr = Traits<T>;
  constexpr int VEC = Tr::VEC;
  constexpr int NG = 256 / G;
  __shared__ float part[NG][G * VEC];
  const int i = blockIdx.x;
  const int r = rows[i], u0 = first[i], p = pieces[i];
  const int g = threadIdx.x / G, lane = threadIdx.x % G, c0 = lane * VEC;
  float acc[VEC];
#pragma unroll
  for (int q = 0; q < VEC; ++q) acc[q] = 0.f;
  for (int j = g; j < p; j += NG) {
    const float* src = partial + ((size_t)(u0 + j) * 2 + (j == 0 ? 1 : 0)) * n + c0;
#pragma unroll
    for (int q = 0; q < VEC; ++q) acc[q] += src[q];
  }
  if (p <= NG) {  // few pieces: only group j holds piece j; let group 0 add in order
#pragma unroll
    for (int q = 0; q < VEC; ++q) part[g][c0 + q] = acc[q];
    __syncthreads();
    if (g == 0) {
      float s[VEC];
#pragma unroll
      for (int q = 0; q < VEC; ++q) s[q] = 0.f;
      for (int h = 0; h < min(p, NG); ++h)
#pragma unroll
        for (int q = 0; q < VEC; ++q) s[q] += part[h][c0 + q];
      Tr::store(C + (size_t)r * n + c0, s);
    }
  } else {
#pragma unroll
    for (int q = 0; q < VEC; ++q) part[g][c0 + q] = acc[q];
    __syncthreads();
    if (g == 0) {
      float s[VEC];
#pragma unroll
      for (int q = 0; q < VEC; ++q) s[q] = 0.f;
      for (int h = 0; h < NG; ++h)
#pragma unroll
        for (int q = 0; q < VEC; ++q) s[q] += part[h][c0 + q];
      Tr::store(C + (size_t)r * n + c0, s);
    }
  }
}

#define STREAM(NAME, T, G, NB, MINB)                                                                               \
  extern "C" __global__ void __launch_bounds__(256, MINB)                                                         \
      NAME(const int* crow, const int* col, const T* val, const T* B, T* C, float* partial, const int* ustart,     \
           const int* urow, int m, int k, int n, int nnz, int units) {                                             \
    stream_body<T, G, NB>(crow, col, val, B, C, partial, ustart, urow, m, k, n, nnz, units);                      \
  }
#define FIXUP(NAME, T, G)                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                               \
      NAME(const int* rows, const int* first, const int* pieces, const float* partial, T* C, int n) {              \
    fixup_body<T, G>(rows, first, pieces, partial, C, n);                                                          \
  }

typedef __nv_bfloat16 bf16;
STREAM(stream_f32_g4, float, 4, 8, 3)
STREAM(stream_f32_g8, float, 8, 8, 3)
STREAM(stream_f32_g16, float, 16, 8, 3)
STREAM(stream_f32_g32, float, 32, 8, 3)
STREAM(stream4_f32_g8, float, 8, 4, 4)
STREAM(stream16_f32_g8, float, 8, 16, 2)
STREAM(stream_bf16_g4, bf16, 4, 8, 3)
STREAM(stream_bf16_g8, bf16, 8, 8, 3)
STREAM(stream_bf16_g16, bf16, 16, 8, 3)
STREAM(stream_bf16_g32, bf16, 32, 8, 3)
STREAM(stream4_bf16_g4, bf16, 4, 4, 4)
STREAM(stream16_bf16_g4, bf16, 4, 16, 2)
FIXUP(fixup_f32_g4, float, 4)
FIXUP(fixup_f32_g8, float, 8)
FIXUP(fixup_f32_g16, float, 16)
FIXUP(fixup_f32_g32, float, 32)
FIXUP(fixup_bf16_g4, bf16, 4)
FIXUP(fixup_bf16_g8, bf16, 8)
FIXUP(fixup_bf16_g16, bf16, 16)
FIXUP(fixup_bf16_g32, bf16, 32)
