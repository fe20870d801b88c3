// Standalone A/B harness (no torch build: one nvcc call) for the lane-mask pair kernel prototype
// (csrc/cuda/pair_kernel.cuh) against the library's slot kernel (csrc/cuda/slot_kernel.cuh), the CSR16
// kernel and cuBLAS, on uniformly pruned bf16 weights built on the host. Every product is checked against
// a float64 host reference (relative Frobenius error); times are medians of device events with L2 flushed
// (256 MB read) before each call, the three kernels interleaved.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -I<torch>/include benchmarks/pairs_kernel_bench.cu -lcublas -o pb
//   ./pb [wanted blocks per SM for the pair split, 0 = occupancy] [m:sparsity:n]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/slot_layout.h"
#include "cuda/csr16_kernel.cuh"
#include "cuda/pair_kernel.cuh"
#include "cuda/slot_kernel.cuh"

namespace bm = sparsetorch::cuda::bitmap;
namespace pk = sparsetorch::cuda::pairs;
namespace sk = sparsetorch::cuda::slot;
namespace c16 = sparsetorch::cuda::csr16;

// ---- Band-major slot walk (harness-only experiment) -------------------------------------------------
// The slot layout's groups in band-major order: band b = strips 2b, 2b + 1; groups ordered (band, chunk,
// strip in band), so a warp's run over a band's chunk range is one contiguous stream and the x fragments
// of a chunk (loaded once) serve the band's two groups. Same stream walk as the library kernel otherwise.
namespace band {
using sk::kStages;
using sk::kTrip;
using sk::kRingBytes;
using sk::kTileBytes;
constexpr int kWarpSmem = kRingBytes + kTileBytes;
__host__ __device__ constexpr int block_smem(int nt) {
  return bm::kWarps * kWarpSmem > 2 * bm::kWarps * 8 * nt * bm::kRedStride * 4 ? bm::kWarps * kWarpSmem
                                                                               : 2 * bm::kWarps * 8 * nt * bm::kRedStride * 4;
}

template <typename T, int NT>
__global__ void __launch_bounds__(bm::kThreads, 3) band_slot_kernel(const sk::Params p) {
  // p.strips = bands here; p.m = rows
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ks = warp % p.wk, ss = warp / p.wk;
  const int band = blockIdx.y * p.ws + ss;
  const int n0 = blockIdx.x * (8 * NT);
  const int split_begin = blockIdx.z * p.chunks_per_split;
  const int split_end = min(p.chunks, split_begin + p.chunks_per_split);
  const int per_warp = (max(split_end - split_begin, 0) + p.wk - 1) / p.wk;
  const int c_begin = min(split_end, split_begin + ks * per_warp);
  const int chunks_here = band < p.strips ? min(split_end, c_begin + per_warp) - c_begin : 0;
  const int count = 2 * chunks_here;  // groups of the run: (chunk, strip in band)
  uint32_t* ring = reinterpret_cast<uint32_t*>(smem + warp * kWarpSmem);
  uint4* tile4 = reinterpret_cast<uint4*>(smem + warp * kWarpSmem + kRingBytes);
  uint16_t* tile = reinterpret_cast<uint16_t*>(tile4);
#pragma unroll
  for (int r = 0; r < 4; ++r) tile4[lane + 32 * r] = make_uint4(0u, 0u, 0u, 0u);
  __syncwarp();
  const int64_t group0 = (static_cast<int64_t>(band) * p.chunks + c_begin) * 2;
  const int nnz = p.nnz;

  float acc0[NT][4], acc1[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    acc0[j][0] = acc0[j][1] = acc0[j][2] = acc0[j][3] = 0.f;
    acc1[j][0] = acc1[j][1] = acc1[j][2] = acc1[j][3] = 0.f;
  }
  const int g = lane >> 2, t = lane & 3;
  const uint16_t* xrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int token = n0 + 8 * j + g;
    xrow[j] = token < p.n ? p.x + static_cast<int64_t>(token) * p.ldx + 16 * t : nullptr;
  }
  auto load_x = [&](int j, int col, int h) {
    return xrow[j] != nullptr && col + 16 * t + 8 * h + 8 <= p.kx
               ? __ldg(reinterpret_cast<const uint4*>(xrow[j] + col + 8 * h))
               : make_uint4(0u, 0u, 0u, 0u);
  };
  uint4 xq[NT][2];
  int xq_chunk = -1;
  auto fetch_x = [&](int ci) {  // ci: chunk index within the run
    const int col = (c_begin + ci) * static_cast<int>(sparsetorch::kBitmapGroupCols);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      xq[j][0] = load_x(j, col, 0);
      xq[j][1] = load_x(j, col, 1);
    }
    xq_chunk = ci;
  };
  auto multiply = [&](int gi) {
    __syncwarp();
    uint32_t a[4][4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint4 v = tile4[32 * s + lane];
      a[s][0] = v.x, a[s][1] = v.y, a[s][2] = v.z, a[s][3] = v.w;
      tile4[32 * s + lane] = make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();
    const int ci = gi >> 1;
    if (xq_chunk != ci) fetch_x(ci);
    if (gi & 1) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2)
#pragma unroll
          for (int j = 0; j < NT; ++j)
            bm::Mma<T>::run(acc1[j], a[2 * h + s2], s2 ? xq[j][h].z : xq[j][h].x, s2 ? xq[j][h].w : xq[j][h].y);
      if (ci + 1 < chunks_here) fetch_x(ci + 1);  // the next chunk's x, a group ahead
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2)
#pragma unroll
          for (int j = 0; j < NT; ++j)
            bm::Mma<T>::run(acc0[j], a[2 * h + s2], s2 ? xq[j][h].z : xq[j][h].x, s2 ? xq[j][h].w : xq[j][h].y);
    }
  };

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
      sparsetorch::cuda::cp_async_16(dst, p.entries + e);
    } else {
      for (int j = 0; j < 4; ++j) dst[j] = e + j < nnz ? __ldg(p.entries + e + j) : 0u;
    }
  };
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
    sparsetorch::cuda::cp_async_commit();
  }
  for (int trip = 0; trip < trips && gi < count; ++trip) {
    sparsetorch::cuda::cp_async_wait<kStages - 2>();
    __syncwarp();
    if (trip + kStages - 1 < trips) issue(trip + kStages - 1);
    sparsetorch::cuda::cp_async_commit();
    const uint32_t* cur = ring + (trip % kStages) * kTrip;
    const int tb = s0 + trip * kTrip;
    uint32_t w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) w[u] = cur[lane + 32 * u];
    while (true) {
      const int lim = min(gend, tb + kTrip);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int pos = tb + lane + 32 * u;
        if (pos >= gstart && pos < lim) tile[w[u] & sparsetorch::kSlotMask] = static_cast<uint16_t>(w[u] >> 16);
      }
      if (gend > tb + kTrip) break;
      if (gend > gstart) multiply(gi);
      if (++gi == count) break;
      if (gi - end_base == 32) ends = load_ends(gi);
      gstart = gend;
      gend = min(max(__shfl_sync(0xffffffffu, ends, gi - end_base), gstart), end_all);
    }
  }
  sparsetorch::cuda::cp_async_wait<0>();
  __syncthreads();
  // Block sums: red[((warp * 8 NT + token) * 2 + sb) * kRedStride + row], parts added in warp order.
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = 8 * j + 2 * t + (e & 1), row = g + 8 * (e >> 1);
      red[((warp * 8 * NT + token) * 2 + 0) * bm::kRedStride + row] = acc0[j][e];
      red[((warp * 8 * NT + token) * 2 + 1) * bm::kRedStride + row] = acc1[j][e];
    }
  }
  __syncthreads();
  const int cells = p.ws * 32 * 8 * NT;
  for (int e = threadIdx.x; e < cells; e += bm::kThreads) {
    const int row = e & 15, sb = (e >> 4) & 1, ws_i = (e >> 5) % p.ws, token = (e >> 5) / p.ws;
    const int64_t m = ((static_cast<int64_t>(blockIdx.y) * p.ws + ws_i) * 2 + sb) * 16 + row;
    const int n = n0 + token;
    if (m >= p.m || n >= p.n) continue;
    float z = 0.f;
    for (int k = 0; k < p.wk; ++k) z += red[(((ws_i * p.wk + k) * 8 * NT + token) * 2 + sb) * bm::kRedStride + row];
    if (gridDim.z == 1) {
      reinterpret_cast<uint16_t*>(p.out)[static_cast<int64_t>(n) * p.m + m] = bm::Mma<T>::from_float(z);
    } else {
      reinterpret_cast<float*>(p.out)[(static_cast<int64_t>(blockIdx.z) * p.n + n) * p.m + m] = z;
    }
  }
}
}  // namespace band

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e = (x);                                                                       \
    if (e != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform() { return (next() >> 40) * (1.0f / 16777216.0f); }
};

float bf(uint16_t v) { return __bfloat162float(__ushort_as_bfloat16(v)); }

struct Weight {
  int m, k, strips, chunks;
  std::vector<uint16_t> dense;
  std::vector<int> pair_offsets;  // pair layout
  std::vector<uint32_t> words;
  std::vector<int> slot_offsets;  // slot layout
  std::vector<uint32_t> slot_entries;
  std::vector<int> crow;  // CSR16
  std::vector<uint32_t> entries;
};

Weight make_weight(int m, int k, double sparsity, uint64_t seed) {
  Weight w;
  w.m = m;
  w.k = k;
  w.strips = static_cast<int>(sparsetorch::bitmap_strips(m));
  w.chunks = static_cast<int>(sparsetorch::bitmap_chunks(k));
  w.dense.assign(static_cast<size_t>(m) * k, 0);
  Rng r{seed * 0x9E3779B97F4A7C15ull + 1};
  for (auto& v : w.dense) {
    if (r.uniform() >= sparsity) {
      const float f = 2.f * r.uniform() - 1.f;
      v = __bfloat16_as_ushort(__float2bfloat16(f == 0.f ? 0.5f : f));
    }
  }
  auto at = [&](int row, int col) -> uint16_t {
    return row < m && col < k ? w.dense[static_cast<size_t>(row) * k + col] : uint16_t{0};
  };
  const size_t groups = static_cast<size_t>(w.strips) * w.chunks;
  w.pair_offsets.assign(groups + 1, 0);
  w.slot_offsets.assign(groups + 1, 0);
  for (int s = 0; s < w.strips; ++s) {
    for (int c = 0; c < w.chunks; ++c) {
      const size_t g = static_cast<size_t>(s) * w.chunks + c;
      w.pair_offsets[g] = static_cast<int>(w.words.size());
      w.slot_offsets[g] = static_cast<int>(w.slot_entries.size());
      const size_t head = w.words.size();
      w.words.resize(head + pk::kHeaderWords, 0u);
      for (int reg = 0; reg < pk::kRegisters; ++reg) {
        const int step = reg >> 2, rr = reg & 3;
        for (int lane = 0; lane < 32; ++lane) {
          uint16_t v[2];
          for (int j = 0; j < 2; ++j) {
            const int slot = step * 256 + lane * 8 + rr * 2 + j;
            int row, col;
            sparsetorch::slot_position(slot, row, col);
            v[j] = at(16 * s + row, 64 * c + col);
            if (v[j] != 0) w.slot_entries.push_back(uint32_t{v[j]} << 16 | static_cast<uint32_t>(slot));
          }
          if (v[0] != 0 || v[1] != 0) {
            w.words[head + reg] |= 1u << lane;
            w.words.push_back(uint32_t{v[1]} << 16 | v[0]);
          }
        }
      }
      while (w.words.size() % 4 != 0) w.words.push_back(0u);
    }
  }
  w.pair_offsets[groups] = static_cast<int>(w.words.size());
  w.slot_offsets[groups] = static_cast<int>(w.slot_entries.size());
  w.words.resize(w.words.size() + pk::kMaxRecordWords, 0u);
  w.crow.assign(static_cast<size_t>(m) + 1, 0);
  for (int row = 0; row < m; ++row) {
    for (int col = 0; col < k; ++col) {
      const uint16_t v = w.dense[static_cast<size_t>(row) * k + col];
      if (v != 0) w.entries.push_back(uint32_t{v} << 16 | static_cast<uint32_t>(col));
    }
    w.crow[row + 1] = static_cast<int>(w.entries.size());
  }
  return w;
}

__global__ void read_flush(const float4* p, size_t n, float* sink) {
  float acc = 0.f;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float4 v = p[i];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.f) *sink = acc;
}

int g_smem_per_block = 0;
bool g_variants = false;  // argv[3] == "variants": time the slot kernel under other work splits

template <typename P, typename K>
void launch3(K kernel, dim3 grid, int smem, const P& p) {
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_per_block));
  kernel<<<grid, bm::kThreads, smem>>>(p);
}

template <typename F>
void with_nt(int nt, F&& f) {
  switch (nt) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(16, v.size() * sizeof(T))));
  if (!v.empty()) CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

int main(int argc, char** argv) {
  const int force_per_sm = argc > 1 ? std::atoi(argv[1]) : 0;
  int only_m = 0, only_n = 0;
  double only_sp = -1;
  if (argc > 2) std::sscanf(argv[2], "%d:%lf:%d", &only_m, &only_sp, &only_n);
  g_variants = argc > 3 && std::string(argv[3]) == "variants";
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  g_smem_per_block = static_cast<int>(prop.sharedMemPerBlockOptin);
  const int sms = prop.multiProcessorCount;
  cublasHandle_t handle;
  cublasCreate(&handle);
  CHECK_CUDA(cudaFuncSetAttribute(band::band_slot_kernel<__nv_bfloat16, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  g_smem_per_block));
  CHECK_CUDA(cudaFuncSetAttribute(band::band_slot_kernel<__nv_bfloat16, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  g_smem_per_block));
  float *flush = nullptr, *sink = nullptr;
  const size_t flush_floats = size_t{64} << 20;
  CHECK_CUDA(cudaMalloc(&flush, flush_floats * 4));
  CHECK_CUDA(cudaMemset(flush, 0, flush_floats * 4));
  CHECK_CUDA(cudaMalloc(&sink, 4));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf("pair kernel prototype, min blocks %d, per_sm %s; %s, %d SMs\n", SPARSETORCH_PAIR_MIN_BLOCKS,
              force_per_sm ? argv[1] : "occupancy", prop.name, sms);
  std::printf("%-11s %5s %5s | %6s %4s %3s %3s %6s %8s %8s | %8s %6s | %8s | %7s %7s %6s | %8s %8s %8s\n", "shape",
              "spars", "N", "pairMB", "psm", "wk", "spl", "slotMB", "pair_us", "floor", "slot_us", "c16_us", "dense_us",
              "x_pair", "x_slot", "x_c16", "err_pair", "err_slot", "err_c16");

  const int shapes[2][2] = {{11008, 4096}, {4096, 11008}};
  const double sparsities[4] = {0.5, 0.7, 0.9, 0.95};
  const int ns[6] = {1, 8, 16, 32, 64, 128};
  for (const auto& shape : shapes) {
    for (const double sp : sparsities) {
      if (only_m != 0 && (only_m != shape[0] || std::fabs(only_sp - sp) > 1e-9)) continue;
      const Weight w = make_weight(shape[0], shape[1], sp, 7 + static_cast<uint64_t>(sp * 100));
      const int m = w.m, k = w.k;
      int* d_poff = upload(w.pair_offsets);
      uint32_t* d_words = upload(w.words);
      int* d_soff = upload(w.slot_offsets);
      uint32_t* d_sent = upload(w.slot_entries);
      int* d_crow = upload(w.crow);
      uint32_t* d_entries = upload(w.entries);
      uint16_t* d_dense = upload(w.dense);
      const double pair_mb = (w.words.size() - pk::kMaxRecordWords + w.pair_offsets.size()) * 4.0 / 1e6;
      const double slot_mb = (w.slot_entries.size() + w.slot_offsets.size()) * 4.0 / 1e6;
      for (const int n : ns) {
        if (only_m != 0 && only_n != n) continue;
        std::vector<uint16_t> hx(static_cast<size_t>(n) * k);
        Rng r{static_cast<uint64_t>(n) * 977 + 3};
        for (auto& v : hx) v = __bfloat16_as_ushort(__float2bfloat16(2.f * r.uniform() - 1.f));
        // float64 reference
        std::vector<double> ref(static_cast<size_t>(n) * m, 0.0);
        std::vector<double> xd(hx.size());
        for (size_t i = 0; i < hx.size(); ++i) xd[i] = bf(hx[i]);
        for (int row = 0; row < m; ++row) {
          for (int e = w.crow[row]; e < w.crow[row + 1]; ++e) {
            const double v = bf(static_cast<uint16_t>(w.entries[e] >> 16));
            const int col = static_cast<int>(w.entries[e] & 0xffffu);
            for (int t = 0; t < n; ++t) ref[static_cast<size_t>(t) * m + row] += v * xd[static_cast<size_t>(t) * k + col];
          }
        }
        uint16_t* d_x = upload(hx);
        uint16_t *d_yp, *d_ys, *d_yc, *d_yd;
        for (uint16_t** d : {&d_yp, &d_ys, &d_yc, &d_yd}) CHECK_CUDA(cudaMalloc(d, static_cast<size_t>(n) * m * 2));

        // pair kernel launch: same split rule as the other tensor-core kernels, blocks per SM from occupancy
        const int nt = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
        int per_sm = 0;
        with_nt(nt, [&](auto NT) {
          CHECK_CUDA(cudaFuncSetAttribute(pk::pair_linear_kernel<__nv_bfloat16, NT.value>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_per_block));
          CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &per_sm, pk::pair_linear_kernel<__nv_bfloat16, NT.value>, bm::kThreads, pk::block_smem(NT.value)));
        });
        if (force_per_sm > 0) per_sm = force_per_sm;
        const int64_t column_tiles = (n + 8 * nt - 1) / (8 * nt);
        int ws, wk, splits, cps;
        int64_t row_blocks;
        bm::split_work(w.strips, w.chunks, column_tiles, int64_t{per_sm} * sms, ws, wk, row_blocks, splits, cps);
        float* d_pwork = nullptr;
        if (splits > 1) CHECK_CUDA(cudaMalloc(&d_pwork, static_cast<size_t>(splits) * n * m * 4));
        pk::Params pp{};
        pp.offsets = d_poff;
        pp.words = d_words;
        pp.nwords = static_cast<int>(w.words.size());
        pp.x = d_x;
        pp.ldx = k;
        pp.kx = k;
        pp.n = n;
        pp.m = m;
        pp.strips = w.strips;
        pp.chunks = w.chunks;
        pp.out = splits > 1 ? static_cast<void*>(d_pwork) : static_cast<void*>(d_yp);
        pp.act = sparsetorch::Activation::None;
        pp.ws = ws;
        pp.wk = wk;
        pp.chunks_per_split = cps;
        auto reduce = [&](float* work, int nsplit, uint16_t* y) {
          const int64_t cells = static_cast<int64_t>(n) * m;
          const int blocks = static_cast<int>(std::min<int64_t>((cells + 255) / 256, 8 * sms));
          bm::bitmap_splitk_reduce_kernel<__nv_bfloat16>
              <<<blocks, 256>>>(work, nsplit, cells, m, nullptr, sparsetorch::Activation::None, 0.f, y);
        };
        auto pair_call = [&] {
          with_nt(nt, [&](auto NT) {
            pk::pair_linear_kernel<__nv_bfloat16, NT.value>
                <<<dim3(column_tiles, row_blocks, splits), bm::kThreads, pk::block_smem(NT.value)>>>(pp);
          });
          if (splits > 1) reduce(d_pwork, splits, d_yp);
        };

        // slot kernel, launched as csrc/cuda/slot_linear.cu does
        const sk::Launch sl = sk::choose_launch(m, n, k, sms, prop.sharedMemPerMultiprocessor,
                                                prop.reservedSharedMemPerBlock, prop.sharedMemPerBlockOptin);
        float* d_swork = nullptr;
        if (sl.splits > 1) CHECK_CUDA(cudaMalloc(&d_swork, static_cast<size_t>(sl.splits) * n * m * 4));
        sk::Params sp_{};
        sp_.offsets = d_soff;
        sp_.entries = d_sent;
        sp_.nnz = static_cast<int>(w.slot_entries.size());
        sp_.x = d_x;
        sp_.ldx = k;
        sp_.kx = k;
        sp_.n = n;
        sp_.m = m;
        sp_.strips = w.strips;
        sp_.chunks = w.chunks;
        sp_.out = sl.splits > 1 ? static_cast<void*>(d_swork) : static_cast<void*>(d_ys);
        sp_.act = sparsetorch::Activation::None;
        sp_.ws = sl.ws;
        sp_.wk = sl.wk;
        sp_.chunks_per_split = sl.chunks_per_split;
        with_nt(sl.nt, [&](auto NT) {
          CHECK_CUDA(cudaFuncSetAttribute(sk::slot_linear_kernel<__nv_bfloat16, NT.value>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_per_block));
        });
        auto slot_call = [&] {
          with_nt(sl.nt, [&](auto NT) {
            sk::slot_linear_kernel<__nv_bfloat16, NT.value>
                <<<dim3(sl.column_tiles, sl.row_blocks, sl.splits), sk::kThreads, sl.smem>>>(sp_);
          });
          if (sl.splits > 1) reduce(d_swork, sl.splits, d_ys);
        };

        // CSR16 (N <= 64)
        c16::Params q{};
        q.crow = d_crow;
        q.entries = d_entries;
        q.nnz = static_cast<int>(w.entries.size());
        q.x = d_x;
        q.ldx = k;
        q.n = n;
        q.m = m;
        q.k = k;
        q.kx = k;
        q.out = d_yc;
        q.act = sparsetorch::Activation::None;
        const int nb = c16::tokens_per_block(n, k, prop.sharedMemPerBlockOptin);
        int c16_per_sm = 1;
        c16::with_tile_tokens(nb, [&](auto NB) {
          auto* kernel = c16::csr16_linear_kernel<__nv_bfloat16, NB.value>;
          const int64_t smem = c16::block_smem(k, NB.value);
          CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_per_block));
          CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c16_per_sm, kernel, c16::kThreads, smem));
        });
        const bool run_c16 = n <= 64;
        auto c16_call = [&] {
          c16::with_tile_tokens(nb, [&](auto NB) {
            const int64_t blocks = c16::row_blocks(m, c16_per_sm, sms);
            c16::csr16_linear_kernel<__nv_bfloat16, NB.value>
                <<<dim3(blocks, (n + NB.value - 1) / NB.value), c16::kThreads, c16::block_smem(k, NB.value)>>>(q);
          });
        };
        const float alpha = 1.f, beta = 0.f;
        auto dense_call = [&] {
          cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, d_dense, CUDA_R_16BF, k, d_x, CUDA_R_16BF, k,
                       &beta, d_yd, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        };
        pair_call();
        slot_call();
        if (run_c16) c16_call();
        dense_call();
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaGetLastError());
        auto rel_err = [&](uint16_t* d_y) {
          std::vector<uint16_t> y(static_cast<size_t>(n) * m);
          CHECK_CUDA(cudaMemcpy(y.data(), d_y, y.size() * 2, cudaMemcpyDeviceToHost));
          double num = 0, den = 0;
          for (size_t i = 0; i < y.size(); ++i) {
            const double d = bf(y[i]) - ref[i];
            num += d * d;
            den += ref[i] * ref[i];
          }
          return std::sqrt(num / std::max(den, 1e-30));
        };
        const double err_p = rel_err(d_yp), err_s = rel_err(d_ys), err_c = run_c16 ? rel_err(d_yc) : 0.0;
        auto time = [&](auto&& fn) {
          std::vector<float> t;
          for (int rep = 0; rep < 35; ++rep) {
            read_flush<<<4 * sms, 512>>>(reinterpret_cast<const float4*>(flush), flush_floats / 4, sink);
            cudaEventRecord(e0);
            fn();
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (rep >= 5) t.push_back(ms * 1000.f);
          }
          std::sort(t.begin(), t.end());
          return t[t.size() / 2];
        };
        float tp = 0, ts = 0, tc = 0, td = 0;
        for (int round = 0; round < 2; ++round) {
          tp += time(pair_call) / 2;
          ts += time(slot_call) / 2;
          if (run_c16) tc += time(c16_call) / 2;
          td += time(dense_call) / 2;
        }
        CHECK_CUDA(cudaGetLastError());
        const double floor_us = (pair_mb * 1e6 + 2.0 * n * k + 2.0 * n * m) / 3.0e6;  // 3.0 TB/s copy rate
        std::printf("%5dx%-5d %5.2f %5d | %6.1f %4d %3d %3d %6.1f %8.1f %8.1f | %8.1f %6.1f | %8.1f | %7.2f %7.2f %6.2f | %8.1e %8.1e %8.1e\n",
                    m, k, sp, n, pair_mb, per_sm, wk, splits, slot_mb, tp, floor_us, ts, tc, td, td / tp, td / ts,
                    run_c16 ? td / tc : 0.0, err_p, err_s, err_c);
        std::fflush(stdout);
        // The library slot kernel under other work splits (ws strips x wk chunk parts per block, splits
        // blocks along the chunks), same weight and x: how much the split alone moves it.
        if (g_variants) {
          const int variants[][3] = {{1, 8, 1}, {2, 4, 1}, {4, 2, 1}, {1, 8, 2}, {2, 4, 2}, {8, 1, 4}, {8, 1, 8}};
          for (const auto& v : variants) {
            sk::Params q2 = sp_;
            const int vws = v[0], vwk = v[1], vsplits = v[2];
            if ((w.chunks + vsplits - 1) / vsplits < vwk) continue;
            q2.ws = vws;
            q2.wk = vwk;
            q2.chunks_per_split = (w.chunks + vsplits - 1) / vsplits;
            const int real_splits = (w.chunks + q2.chunks_per_split - 1) / q2.chunks_per_split;
            float* d_vwork = nullptr;
            if (real_splits > 1) CHECK_CUDA(cudaMalloc(&d_vwork, static_cast<size_t>(real_splits) * n * m * 4));
            q2.out = real_splits > 1 ? static_cast<void*>(d_vwork) : static_cast<void*>(d_ys);
            const int64_t vrows = (w.strips + vws - 1) / vws;
            auto vcall = [&] {
              with_nt(sl.nt, [&](auto NT) {
                sk::slot_linear_kernel<__nv_bfloat16, NT.value>
                    <<<dim3(sl.column_tiles, vrows, real_splits), sk::kThreads, sl.smem>>>(q2);
              });
              if (real_splits > 1) reduce(d_vwork, real_splits, d_ys);
            };
            vcall();
            CHECK_CUDA(cudaDeviceSynchronize());
            const double verr = rel_err(d_ys);
            const float tv = time(vcall);
            std::printf("    slot split ws %d wk %d splits %d: blocks %lld, %.1f us (%.2fx dense), err %.1e\n", vws, vwk,
                        real_splits, static_cast<long long>(vrows * sl.column_tiles * real_splits), tv, td / tv, verr);
            if (d_vwork) cudaFree(d_vwork);
          }
          std::fflush(stdout);
        }
        if (n <= 16) {  // the band-major variant of the slot walk (x fragments shared by a band's two strips)
          const int bands = (w.strips + 1) / 2;
          std::vector<int> boff(static_cast<size_t>(bands) * w.chunks * 2 + 1, 0);
          std::vector<uint32_t> bent;
          bent.reserve(w.slot_entries.size());
          for (int b = 0; b < bands; ++b) {
            for (int c = 0; c < w.chunks; ++c) {
              for (int sb = 0; sb < 2; ++sb) {
                boff[(static_cast<size_t>(b) * w.chunks + c) * 2 + sb] = static_cast<int>(bent.size());
                const int strip = 2 * b + sb;
                if (strip >= w.strips) continue;
                const size_t gidx = static_cast<size_t>(strip) * w.chunks + c;
                bent.insert(bent.end(), w.slot_entries.begin() + w.slot_offsets[gidx],
                            w.slot_entries.begin() + w.slot_offsets[gidx + 1]);
              }
            }
          }
          boff.back() = static_cast<int>(bent.size());
          int* d_boff = upload(boff);
          uint32_t* d_bent = upload(bent);
          int bws, bwk, bsplits, bcps;
          int64_t brows;
          bm::split_work(bands, w.chunks, 1, int64_t{3} * sms, bws, bwk, brows, bsplits, bcps);
          float* d_bwork = nullptr;
          if (bsplits > 1) CHECK_CUDA(cudaMalloc(&d_bwork, static_cast<size_t>(bsplits) * n * m * 4));
          sk::Params bp = sp_;
          bp.offsets = d_boff;
          bp.entries = d_bent;
          bp.nnz = static_cast<int>(bent.size());
          bp.strips = bands;
          bp.ws = bws;
          bp.wk = bwk;
          bp.chunks_per_split = bcps;
          bp.out = bsplits > 1 ? static_cast<void*>(d_bwork) : static_cast<void*>(d_ys);
          const int bnt = n <= 8 ? 1 : 2;
          auto band_call = [&] {
            if (bnt == 1) {
              band::band_slot_kernel<__nv_bfloat16, 1>
                  <<<dim3(1, brows, bsplits), bm::kThreads, band::block_smem(1)>>>(bp);
            } else {
              band::band_slot_kernel<__nv_bfloat16, 2>
                  <<<dim3(1, brows, bsplits), bm::kThreads, band::block_smem(2)>>>(bp);
            }
            if (bsplits > 1) reduce(d_bwork, bsplits, d_ys);
          };
          CHECK_CUDA(cudaMemset(d_ys, 0, static_cast<size_t>(n) * m * 2));
          band_call();
          CHECK_CUDA(cudaDeviceSynchronize());
          CHECK_CUDA(cudaGetLastError());
          const double berr = rel_err(d_ys);
          float tb = 0, ts2 = 0;
          for (int round = 0; round < 2; ++round) {
            tb += time(band_call) / 2;
            ts2 += time(slot_call) / 2;
          }
          std::printf("    band-major slots: ws %d wk %d splits %d blocks %lld: %.1f us (%.2fx dense), library slots %.1f us, err %.1e\n",
                      bws, bwk, bsplits, static_cast<long long>(brows * bsplits), tb, td / tb, ts2, berr);
          std::fflush(stdout);
          cudaFree(d_boff);
          cudaFree(d_bent);
          if (d_bwork) cudaFree(d_bwork);
        }
        for (uint16_t* d : {d_x, d_yp, d_ys, d_yc, d_yd}) cudaFree(d);
        if (d_pwork) cudaFree(d_pwork);
        if (d_swork) cudaFree(d_swork);
      }
      cudaFree(d_poff);
      cudaFree(d_words);
      cudaFree(d_soff);
      cudaFree(d_sent);
      cudaFree(d_crow);
      cudaFree(d_entries);
      cudaFree(d_dense);
    }
  }
  return 0;
}
