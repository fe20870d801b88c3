// Probe entry points for one kernel variant (type, flags): plan and run with raw pointers.
#pragma once
#include <cstdint>
#include "cuda/bitmap2_kernel.cuh"

using namespace sparsetorch::cuda::bitmap2;

template <typename T, int F, int MaxNT>
static Plan cached_plan(int m, int k, int n, const Config& c) {
  static int key[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  static Plan pl;
  int dev = 0;
  cudaGetDevice(&dev);
  const int now[8] = {m, k, n, c.warps, c.stages, c.stage_bytes, c.blocks_per_sm, dev};
  bool same = true;
  for (int i = 0; i < 8; ++i) same = same && key[i] == now[i];
  if (!same) {
    pl = plan_for<T, F, MaxNT>(m, k, n, c);
    for (int i = 0; i < 8; ++i) key[i] = now[i];
  }
  return pl;
}

template <typename T, int F, int MaxNT>
static int plan_impl(int m, int k, int n, int warps, int stages, int stage_bytes, int blocks_per_sm, int64_t* out) {
  Config c{warps, stages, stage_bytes, blocks_per_sm};
  Plan pl = cached_plan<T, F, MaxNT>(m, k, n, c);
  out[0] = pl.nt; out[1] = pl.tiles; out[2] = pl.grid; out[3] = pl.total_warps; out[4] = pl.smem;
  out[5] = pl.counters; out[6] = pl.partial_floats; out[7] = pl.workspace_bytes(); out[8] = pl.blocks_per_sm;
  out[9] = pl.accum_floats;
  return pl.grid > 0 ? 0 : 1;
}

template <typename T, int F, int MaxNT>
static int run_impl(const void* blob, int64_t blob_units, const int* offsets, const void* x, int64_t ldx,
                    const void* bias, void* y, void* workspace, void* stamps, int m, int k, int n, int act, float slope,
                    int warps, int stages, int stage_bytes, int blocks_per_sm, int64_t stream) {
  Config c{warps, stages, stage_bytes, blocks_per_sm};
  Plan pl = cached_plan<T, F, MaxNT>(m, k, n, c);
  Params prm{};
  prm.blob = static_cast<const unsigned char*>(blob);
  prm.blob_units = blob_units;
  prm.offsets = offsets;
  prm.x = static_cast<const uint16_t*>(x);
  prm.ldx = ldx;
  prm.bias = static_cast<const uint16_t*>(bias);
  prm.y = static_cast<uint16_t*>(y);
  prm.stamps = static_cast<long long*>(stamps);
  prm.m = m; prm.k = k; prm.n = n; prm.act = act; prm.slope = slope;
  return static_cast<int>(launch<T, F, MaxNT>(pl, c, prm, workspace, reinterpret_cast<cudaStream_t>(stream)));
}

#define BM2_ENTRY(NAME, T, F, MAXNT)                                                                                 \
  extern "C" int NAME##_plan(int m, int k, int n, int w, int s, int b, int bps, int64_t* out) {                      \
    return plan_impl<T, F, MAXNT>(m, k, n, w, s, b, bps, out);                                                       \
  }                                                                                                                  \
  extern "C" int NAME##_run(const void* blob, int64_t bu, const int* off, const void* x, int64_t ldx, const void* bias, \
                            void* y, void* ws, void* st, int m, int k, int n, int act, float slope, int w, int s, int b, \
                            int bps, int64_t stream) {                                                               \
    return run_impl<T, F, MAXNT>(blob, bu, off, x, ldx, bias, y, ws, st, m, k, n, act, slope, w, s, b, bps, stream);  \
  }

#define BM2_DECL(NAME)                                                                                                 \
  extern "C" int NAME##_plan(int, int, int, int, int, int, int, int64_t*);                                           \
  extern "C" int NAME##_run(const void*, int64_t, const int*, const void*, int64_t, const void*, void*, void*, void*,  \
                            int, int, int, int, float, int, int, int, int, int64_t);
