// Standalone check and timing of the bitmap_linear CUDA kernel (csrc/cuda/bitmap_kernel.cuh) without
// torch: the format is built on the host here (the same layout sparsetorch/_bitmap.py writes), the
// product checked against a float64 host reference, and the kernel timed with CUDA events, L2 flushed
// before every call (a 256 MB memset), median of the repetitions. Used to develop the kernel before it
// went into the extension; the dense baseline is timed by torch in the same device call.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -I csrc -I <torch>/include \
//        benchmarks/_bitmap_standalone.cu -o bitmap_standalone
//   ./bitmap_standalone [check|corrupt|bench]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/bitmap_kernel.cuh"

using namespace sparsetorch;
using namespace sparsetorch::cuda::bitmap;

#define CK(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

static uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
static float bf2f(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
static float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

struct Format {
  int m = 0, k = 0;
  std::vector<uint64_t> bitmaps;
  std::vector<int> offsets;
  std::vector<uint16_t> values;
  size_t bytes() const { return bitmaps.size() * 8 + offsets.size() * 4 + values.size() * 2; }
};

// dense: (m, k) raw 16-bit values; an element is stored when its magnitude bits are nonzero.
static Format build(const std::vector<uint16_t>& dense, int m, int k) {
  Format f;
  f.m = m;
  f.k = k;
  const int strips = static_cast<int>(bitmap_strips(m)), chunks = static_cast<int>(bitmap_chunks(k));
  f.bitmaps.assign(static_cast<size_t>(strips) * chunks * 16, 0);
  f.offsets.reserve(static_cast<size_t>(strips) * chunks + 1);
  for (int s = 0; s < strips; ++s) {
    for (int c = 0; c < chunks; ++c) {
      f.offsets.push_back(static_cast<int>(f.values.size()));
      for (int q = 0; q < 16; ++q) {
        uint64_t bits = 0;
        for (int b = 0; b < 64; ++b) {
          int r, cc;
          bitmap_position(q, b, r, cc);
          const int row = s * 16 + r, col = c * 64 + cc;
          if (row >= m || col >= k) continue;
          const uint16_t v = dense[static_cast<size_t>(row) * k + col];
          if (v & 0x7fff) {
            bits |= uint64_t{1} << b;
            f.values.push_back(v);
          }
        }
        f.bitmaps[(static_cast<size_t>(s) * chunks + c) * 16 + q] = bits;
      }
    }
  }
  f.offsets.push_back(static_cast<int>(f.values.size()));
  return f;
}

// Magnitude pruning of an iid normal (m, k) weight to `sparsity` (the smallest |w| zeroed).
static std::vector<uint16_t> pruned_weight(int m, int k, double sparsity, bool bf16, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(m) * k);
  for (auto& v : w) v = nd(gen);
  float thr = -1.f;
  if (sparsity > 0) {
    std::vector<float> mag(w.size());
    for (size_t i = 0; i < w.size(); ++i) mag[i] = std::fabs(w[i]);
    const size_t cut = std::min(w.size() - 1, static_cast<size_t>(sparsity * w.size()));
    std::nth_element(mag.begin(), mag.begin() + cut, mag.end());
    thr = sparsity >= 1.0 ? INFINITY : mag[cut];
  }
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const float v = std::fabs(w[i]) < thr ? 0.f : w[i];
    out[i] = bf16 ? f2bf(v) : f2h(v);
    if (v == 0.f) out[i] = 0;
  }
  return out;
}

struct Device {
  uint64_t* bitmaps = nullptr;
  int* offsets = nullptr;
  uint16_t* values = nullptr;
  int64_t nvalues = 0;
  void upload(const Format& f) {
    CK(cudaMalloc(&bitmaps, std::max<size_t>(16, f.bitmaps.size() * 8)));
    CK(cudaMalloc(&offsets, f.offsets.size() * 4));
    CK(cudaMalloc(&values, std::max<size_t>(16, f.values.size() * 2)));
    CK(cudaMemcpy(bitmaps, f.bitmaps.data(), f.bitmaps.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(offsets, f.offsets.data(), f.offsets.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(values, f.values.data(), f.values.size() * 2, cudaMemcpyHostToDevice));
    nvalues = static_cast<int64_t>(f.values.size());
  }
  void release() {
    cudaFree(bitmaps);
    cudaFree(offsets);
    cudaFree(values);
  }
};

static int g_sms = 132;
static int g_scatter_max = 256;
static float* g_ws = nullptr;
static size_t g_ws_bytes = 0;

template <typename T, int NT>
static void launch_nt(const Params& p, const Launch& l, cudaStream_t s) {
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(bitmap_linear_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBlockSmem));
    set = true;
  }
  bitmap_linear_kernel<T, NT><<<dim3(l.column_tiles, l.row_blocks, l.splits), kThreads, kBlockSmem, s>>>(p);
}

// y (n, m) = act(x (n, kx) @ W^T + bias); x zero-padded to kx = k rounded up to 8.
template <typename T>
static void run(const Device& d, const Format& f, const uint16_t* x, int n, int kx, const uint16_t* bias,
                Activation act, uint16_t* y, Launch l, cudaStream_t s = 0) {
  Params p{};
  p.bitmaps = d.bitmaps;
  p.offsets = d.offsets;
  p.values = d.values;
  p.nvalues = d.nvalues;
  p.x = x;
  p.ldx = kx;
  p.kx = kx;
  p.n = n;
  p.m = f.m;
  p.strips = static_cast<int>(bitmap_strips(f.m));
  p.chunks = static_cast<int>(bitmap_chunks(f.k));
  p.bias = bias;
  p.act = act;
  p.slope = 0.01f;
  p.ws = l.ws;
  p.wk = l.wk;
  p.chunks_per_split = l.chunks_per_split;
  p.scatter_max = g_scatter_max;
  p.prefetch = l.prefetch;
  if (l.splits > 1) {
    const size_t need = static_cast<size_t>(l.splits) * n * f.m * 4;
    if (need > g_ws_bytes) {
      cudaFree(g_ws);
      CK(cudaMalloc(&g_ws, need));
      g_ws_bytes = need;
    }
    p.out = g_ws;
  } else {
    p.out = y;
  }
  switch (l.nt) {
    case 1: launch_nt<T, 1>(p, l, s); break;
    case 2: launch_nt<T, 2>(p, l, s); break;
    case 4: launch_nt<T, 4>(p, l, s); break;
    default: launch_nt<T, 8>(p, l, s); break;
  }
  CK(cudaGetLastError());
  if (l.splits > 1) {
    const int64_t cells = static_cast<int64_t>(n) * f.m;
    const int blocks = static_cast<int>(std::min<int64_t>((cells + 255) / 256, 4 * g_sms));
    bitmap_splitk_reduce_kernel<T><<<std::max(blocks, 1), 256, 0, s>>>(g_ws, l.splits, cells, f.m, bias, act, 0.01f, y);
    CK(cudaGetLastError());
  }
}

static Launch with(Launch l, int wk, int splits, int64_t m, int64_t k) {
  l.wk = wk;
  l.ws = kWarps / wk;
  l.row_blocks = (bitmap_strips(m) + l.ws - 1) / l.ws;
  const int64_t chunks = bitmap_chunks(k);
  l.chunks_per_split = static_cast<int>((chunks + splits - 1) / splits);
  l.splits = static_cast<int>((chunks + l.chunks_per_split - 1) / l.chunks_per_split);
  return l;
}

static double act_ref(Activation a, double z) {
  switch (a) {
    case Activation::Relu: return z < 0 ? 0 : z;
    case Activation::Silu: return z / (1 + std::exp(-z));
    case Activation::Gelu: return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
    default: return z;
  }
}

// Relative Frobenius error of y against float64 on `rows` (all when empty).
static double check_rows(const std::vector<uint16_t>& w, const std::vector<uint16_t>& xh, const std::vector<uint16_t>& yh,
                         const std::vector<uint16_t>& biash, int m, int k, int kx, int n, bool bf16, Activation act,
                         const std::vector<int>& rows) {
  auto cvt = [&](uint16_t v) { return bf16 ? bf2f(v) : h2f(v); };
  double num = 0, den = 0;
  std::vector<double> wrow(k);
  auto one = [&](int r) {
    for (int c = 0; c < k; ++c) wrow[c] = cvt(w[static_cast<size_t>(r) * k + c]);
    for (int t = 0; t < n; ++t) {
      double z = biash.empty() ? 0.0 : cvt(biash[r]);
      const uint16_t* xr = xh.data() + static_cast<size_t>(t) * kx;
      for (int c = 0; c < k; ++c) z += wrow[c] * cvt(xr[c]);
      z = act_ref(act, z);
      const double got = cvt(yh[static_cast<size_t>(t) * m + r]);
      num += (got - z) * (got - z);
      den += z * z;
      if (!std::isfinite(got)) num = INFINITY;
    }
  };
  if (rows.empty()) {
    for (int r = 0; r < m; ++r) one(r);
  } else {
    for (int r : rows) one(r);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Case {
  int m, k, n;
  double sparsity;
  bool bf16;
  Activation act;
  bool bias;
  int wk, splits;  // 0: choose_launch's
};

static int run_checks() {
  std::vector<Case> cases = {
      {37, 150, 1, 0.5, true, Activation::None, false, 0, 0},   {37, 150, 3, 0.0, true, Activation::Relu, true, 0, 0},
      {37, 150, 17, 0.9, false, Activation::Silu, true, 0, 0},  {16, 64, 8, 0.0, true, Activation::None, false, 0, 0},
      {130, 1000, 33, 0.7, true, Activation::Gelu, true, 0, 0}, {130, 1000, 70, 0.7, false, Activation::None, true, 0, 0},
      {300, 2000, 5, 0.9, true, Activation::None, true, 8, 4},  {300, 2000, 16, 0.5, false, Activation::Silu, false, 2, 3},
      {64, 256, 9, 1.0, true, Activation::None, true, 0, 0},    {1000, 4100, 2, 0.95, true, Activation::None, false, 0, 0},
      {513, 777, 129, 0.8, true, Activation::Relu, true, 0, 0}, {100, 64, 200, 0.3, false, Activation::None, true, 1, 1},
  };
  int failures = 0;
  std::mt19937_64 gen(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int mode = 0; mode < 3; ++mode)
  for (const Case& c : cases) {
    g_scatter_max = mode == 0 ? -1 : mode == 1 ? 1024 : 256;
    const std::vector<uint16_t> w = pruned_weight(c.m, c.k, c.sparsity, c.bf16, gen());
    const Format f = build(w, c.m, c.k);
    Device d;
    d.upload(f);
    const int kx = (c.k + 7) / 8 * 8;
    std::vector<uint16_t> xh(static_cast<size_t>(c.n) * kx, 0), biash;
    for (int t = 0; t < c.n; ++t)
      for (int j = 0; j < c.k; ++j) xh[static_cast<size_t>(t) * kx + j] = c.bf16 ? f2bf(nd(gen)) : f2h(nd(gen));
    if (c.bias)
      for (int r = 0; r < c.m; ++r) biash.push_back(c.bf16 ? f2bf(nd(gen)) : f2h(nd(gen)));
    uint16_t *x, *y, *bias = nullptr;
    CK(cudaMalloc(&x, xh.size() * 2));
    CK(cudaMalloc(&y, static_cast<size_t>(c.n) * c.m * 2));
    CK(cudaMemset(y, 0xff, static_cast<size_t>(c.n) * c.m * 2));  // NaN poison: every output must be written
    CK(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    if (c.bias) {
      CK(cudaMalloc(&bias, biash.size() * 2));
      CK(cudaMemcpy(bias, biash.data(), biash.size() * 2, cudaMemcpyHostToDevice));
    }
    Launch l = choose_launch(c.m, c.n, c.k, g_sms);
    if (c.wk) l = with(l, c.wk, c.splits, c.m, c.k);
    if (mode == 1) l.prefetch = kPrefetchGroups;  // prefetch with every token count, checked under memcheck
    if (c.bf16)
      run<__nv_bfloat16>(d, f, x, c.n, kx, bias, c.act, y, l);
    else
      run<__half>(d, f, x, c.n, kx, bias, c.act, y, l);
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> yh(static_cast<size_t>(c.n) * c.m), y2(yh.size());
    CK(cudaMemcpy(yh.data(), y, yh.size() * 2, cudaMemcpyDeviceToHost));
    // Run again: a fixed-order reduction gives the same bits.
    if (c.bf16)
      run<__nv_bfloat16>(d, f, x, c.n, kx, bias, c.act, y, l);
    else
      run<__half>(d, f, x, c.n, kx, bias, c.act, y, l);
    CK(cudaMemcpy(y2.data(), y, y2.size() * 2, cudaMemcpyDeviceToHost));
    const double err = check_rows(w, xh, yh, biash, c.m, c.k, kx, c.n, c.bf16, c.act, {});
    const bool same = yh == y2;
    const bool ok = err <= (c.bf16 ? 1e-2 : 2e-3) && same;
    failures += !ok;
    std::printf("check scatter<=%d m=%d k=%d n=%d sp=%.2f %s act=%d bias=%d nt=%d ws=%d wk=%d splits=%d: rel err %.3g %s%s\n",
                g_scatter_max, c.m, c.k, c.n, c.sparsity, c.bf16 ? "bf16" : "fp16", static_cast<int>(c.act), c.bias, l.nt, l.ws, l.wk,
                l.splits, err, same ? "" : "NONDETERMINISTIC ", ok ? "ok" : "FAIL");
    cudaFree(x);
    cudaFree(y);
    cudaFree(bias);
    d.release();
  }
  return failures;
}

// Garbage bitmaps and offsets (negative, huge, decreasing): the kernel must not fault.
static int run_corrupt() {
  std::mt19937_64 gen(11);
  const int m = 200, k = 700, n = 20;
  Format f = build(pruned_weight(m, k, 0.8, true, 3), m, k);
  for (auto& b : f.bitmaps) b = gen();
  for (auto& o : f.offsets) {
    const uint64_t r = gen() % 4;
    o = r == 0 ? static_cast<int>(gen()) : r == 1 ? -static_cast<int>(gen() % 1000) : static_cast<int>(gen() % 20000);
  }
  f.values.resize(50);  // far fewer values than the bitmaps claim
  Device d;
  d.upload(f);
  const int kx = (k + 7) / 8 * 8;
  uint16_t *x, *y;
  CK(cudaMalloc(&x, static_cast<size_t>(n) * kx * 2));
  CK(cudaMalloc(&y, static_cast<size_t>(n) * m * 2));
  CK(cudaMemset(x, 0, static_cast<size_t>(n) * kx * 2));
  for (int variant = 0; variant < 6; ++variant) {
    g_scatter_max = variant < 3 ? -1 : 1024;
    Launch l = choose_launch(m, n, k, g_sms);
    if (variant % 3 == 1) l = with(l, 8, 3, m, k);
    if (variant % 3 == 2) l = with(l, 1, 1, m, k);
    l.prefetch = variant % 2 ? kPrefetchGroups : 0;
    run<__nv_bfloat16>(d, f, x, n, kx, nullptr, Activation::None, y, l);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("corrupt layout: %s\n", cudaGetErrorString(e));
  return e != cudaSuccess;
}

// Reads the flush buffer (L2 then holds clean lines: no write-back during the timed call).
__global__ void read_flush(const uint4* buf, size_t n, unsigned* sink) {
  uint32_t x = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = buf[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x12345678u) *sink = x;
}

struct Timer {
  cudaEvent_t a, b;
  char* flush = nullptr;
  unsigned* sink = nullptr;
  bool clean = false;  // false: memset flush (dirty L2, as triton's do_bench); true: read flush
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaMalloc(&flush, 256 << 20));
    CK(cudaMemset(flush, 1, 256 << 20));
    CK(cudaMalloc(&sink, 4));
  }
  template <typename F>
  float median_us(F f, int reps = 30) {
    for (int i = 0; i < 3; ++i) f();
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      if (clean) {
        read_flush<<<4 * g_sms, 512>>>(reinterpret_cast<const uint4*>(flush), (256 << 20) / 16, sink);
      } else {
        CK(cudaMemsetAsync(flush, i, 256 << 20));
      }
      CK(cudaEventRecord(a));
      f();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

static void run_bench() {
  Timer timer;
  // Copy bandwidth (bytes read + written).
  {
    const size_t bytes = size_t{1} << 30;
    char *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    const float us = timer.median_us([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
    std::printf("copy bandwidth: %.0f GB/s (read + write of 1 GiB in %.0f us)\n", 2.0 * bytes / us / 1e3, us);
    cudaFree(a);
    cudaFree(b);
  }
  const int shapes[2][2] = {{11008, 4096}, {4096, 11008}};
  const double sparsities[] = {0.5, 0.7, 0.9};
  const int ns[] = {1, 16, 64, 128, 512, 2048};
  std::mt19937_64 gen(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  uint16_t *x, *y;
  CK(cudaMalloc(&x, size_t{2048} * 11008 * 2));
  CK(cudaMalloc(&y, size_t{2048} * 11008 * 2));
  {
    std::vector<uint16_t> xh(size_t{2048} * 11008);
    for (auto& v : xh) v = f2bf(nd(gen));
    CK(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
  }
  std::printf("%-12s %5s %5s %9s %9s %9s %8s %8s %5s %3s %3s %3s %5s %10s\n", "shape", "sp", "N", "MB", "us_dirty",
              "us_clean", "GB/s", "TFLOP/s", "nt", "ws", "wk", "spl", "scat", "rel_err");
  for (auto& sh : shapes) {
    const int m = sh[0], k = sh[1];
    for (double sp : sparsities) {
      const std::vector<uint16_t> w = pruned_weight(m, k, sp, true, gen());
      const Format f = build(w, m, k);
      Device d;
      d.upload(f);
      const double mb = f.bytes() / 1e6;
      for (int n : ns) {
        const Launch l = choose_launch(m, n, k, g_sms);
        const std::vector<int> modes = n <= 16 ? std::vector<int>{256, -1, 1024, 128, 512} : std::vector<int>{256, -1};
        for (size_t v = 0; v < modes.size(); ++v) {
          g_scatter_max = modes[v];
          auto call = [&] { run<__nv_bfloat16>(d, f, x, n, k, nullptr, Activation::None, y, l); };
          timer.clean = false;
          const float us = timer.median_us(call);
          timer.clean = true;
          const float us_clean = timer.median_us(call);
          call();
          CK(cudaDeviceSynchronize());
          double err = -1;
          if (v == 0) {
            std::vector<uint16_t> yh(static_cast<size_t>(n) * m), xh(static_cast<size_t>(n) * k);
            CK(cudaMemcpy(yh.data(), y, yh.size() * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(xh.data(), x, xh.size() * 2, cudaMemcpyDeviceToHost));
            std::vector<int> rows;
            const int sample = n <= 16 ? 256 : 24;
            for (int i = 0; i < sample; ++i) rows.push_back(static_cast<int>(gen() % m));
            err = check_rows(w, xh, yh, {}, m, k, k, n, true, Activation::None, rows);
          }
          std::printf("%5dx%-6d %5.2f %5d %9.2f %9.2f %9.2f %8.0f %8.1f %5d %3d %3d %3d %5d %10.3g\n", m, k, sp, n, mb, us,
                      us_clean, mb * 1e3 / us_clean, 2.0 * m * k * n / us_clean / 1e6, l.nt, l.ws, l.wk, l.splits,
                      modes[v], err);
          std::fflush(stdout);
        }
      }
      d.release();
    }
  }
}

// Prefetch on/off (Launch::prefetch) on 11008 x 4096 at 50% and 90%, clean L2 flush.
static void run_prefetch_ab() {
  Timer timer;
  timer.clean = true;
  const int m = 11008, k = 4096;
  std::mt19937_64 gen(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  uint16_t *x, *y;
  CK(cudaMalloc(&x, size_t{512} * k * 2));
  CK(cudaMalloc(&y, size_t{512} * m * 2));
  {
    std::vector<uint16_t> xh(size_t{512} * k);
    for (auto& v : xh) v = f2bf(nd(gen));
    CK(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
  }
  for (double sp : {0.5, 0.9}) {
    const std::vector<uint16_t> w = pruned_weight(m, k, sp, true, gen());
    const Format f = build(w, m, k);
    Device d;
    d.upload(f);
    for (int n : {1, 16, 64, 512}) {
      Launch l = choose_launch(m, n, k, g_sms);
      float us[2];
      for (int pf = 0; pf < 2; ++pf) {
        l.prefetch = pf ? kPrefetchGroups : 0;
        us[pf] = timer.median_us([&] { run<__nv_bfloat16>(d, f, x, n, k, nullptr, Activation::None, y, l); });
      }
      std::vector<uint16_t> yh(static_cast<size_t>(n) * m), xh(static_cast<size_t>(n) * k);
      CK(cudaMemcpy(yh.data(), y, yh.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(xh.data(), x, xh.size() * 2, cudaMemcpyDeviceToHost));
      std::vector<int> rows;
      for (int i = 0; i < 16; ++i) rows.push_back(static_cast<int>(gen() % m));
      const double err = check_rows(w, xh, yh, {}, m, k, k, n, true, Activation::None, rows);
      std::printf("prefetch A/B 11008x4096 sp=%.2f N=%d: no prefetch %.1f us, prefetch %d: %.1f us (auto: %d) err %.2e\n",
                  sp, n, us[0], kPrefetchGroups, us[1], choose_launch(m, n, k, g_sms).prefetch, err);
    }
    d.release();
  }
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs, %zu KB smem/block opt-in\n", prop.name, g_sms, prop.sharedMemPerBlockOptin / 1024);
  int failures = 0;
  if (mode == "check" || mode == "all") failures += run_checks();
  if (mode == "corrupt" || mode == "all") failures += run_corrupt();
  if (mode == "bench" || mode == "all") run_bench();
  if (mode == "prefetch") run_prefetch_ab();
  std::printf("failures: %d\n", failures);
  return failures != 0;
}
