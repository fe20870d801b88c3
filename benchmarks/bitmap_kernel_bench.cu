// Standalone A/B harness for the bitmap_linear CUDA kernel (csrc/cuda/bitmap_kernel.cuh) and the CSR16
// CUDA-core kernel (csrc/cuda/csr16_kernel.cuh), without torch's
// build: one nvcc call compiles it in seconds, so kernel variants (the stage count is a macro) can be
// compared on the device in one call. It builds uniformly pruned bf16 weights on the host in the bitmap
// layout (csrc/common/bitmap_layout.h), launches the kernel exactly as csrc/cuda/bitmap_linear.cu does
// (choose_launch, split-K reduce), checks every product against cuBLAS's dense product (relative Frobenius
// error), and times both with L2 flushed by reading 256 MB before every call (device events, median).
// The op's correctness against float64 is tests/test_bitmap.py's job; this is for speed.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -I<torch>/include [-DSPARSETORCH_BITMAP_STAGES=6] \
//        benchmarks/bitmap_kernel_bench.cu -lcublas -o bitmap_bench
//   ./bitmap_bench [groups per stage, 0 = the launch's choice] [m:sparsity:n, one case only]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/bitmap_kernel.cuh"
#include "cuda/csr16_kernel.cuh"

namespace bm = sparsetorch::cuda::bitmap;
namespace c16 = sparsetorch::cuda::csr16;

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

struct Weight {
  int m, k, strips, chunks;
  std::vector<uint16_t> dense;  // bf16 bits, row-major
  std::vector<uint64_t> bitmaps;
  std::vector<int> offsets;
  std::vector<uint16_t> values;
  std::vector<int> crow;         // CSR16 (common/csr16_checks.h)
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
  w.bitmaps.assign(static_cast<size_t>(w.strips) * w.chunks * 16, 0);
  w.offsets.assign(static_cast<size_t>(w.strips) * w.chunks + 1, 0);
  for (int s = 0; s < w.strips; ++s) {
    for (int c = 0; c < w.chunks; ++c) {
      const size_t g = static_cast<size_t>(s) * w.chunks + c;
      w.offsets[g] = static_cast<int>(w.values.size());
      for (int q = 0; q < 16; ++q) {
        uint64_t bits = 0;
        for (int b = 0; b < 64; ++b) {
          int rr, cc;
          sparsetorch::bitmap_position(q, b, rr, cc);
          const int row = 16 * s + rr, col = 64 * c + cc;
          if (row >= m || col >= k) continue;
          const uint16_t v = w.dense[static_cast<size_t>(row) * k + col];
          if (v != 0) {
            bits |= uint64_t{1} << b;
            w.values.push_back(v);
          }
        }
        w.bitmaps[g * 16 + q] = bits;
      }
    }
  }
  w.offsets.back() = static_cast<int>(w.values.size());
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

template <int NT>
void launch_nt(const bm::Params& p, const bm::Launch& l) {
  static bool configured = false;
  if (!configured) {
    CHECK_CUDA(cudaFuncSetAttribute(bm::bitmap_linear_kernel<__nv_bfloat16, NT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_per_block));
    configured = true;
  }
  bm::bitmap_linear_kernel<__nv_bfloat16, NT>
      <<<dim3(static_cast<unsigned>(l.column_tiles), static_cast<unsigned>(l.row_blocks), static_cast<unsigned>(l.splits)),
         bm::kThreads, l.smem>>>(p);
}

template <int NB>
void launch_csr16(const c16::Params& p, int sms) {
  const int64_t smem = c16::block_smem(p.kx, NB);
  auto* kernel = c16::csr16_linear_kernel<__nv_bfloat16, NB>;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_per_block));
  int per_sm = 0;  // per call (the harness times the kernel, not this host work)
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, c16::kThreads, static_cast<size_t>(smem)));
  const int64_t blocks = c16::row_blocks(p.m, per_sm, sms);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>((p.n + NB - 1) / NB));
  kernel<<<grid, c16::kThreads, smem>>>(p);
}

int main(int argc, char** argv) {
  const int force_sv = argc > 1 ? std::atoi(argv[1]) : 0;
  int only_m = 0, only_n = 0;
  double only_sp = -1;
  if (argc > 2) std::sscanf(argv[2], "%d:%lf:%d", &only_m, &only_sp, &only_n);
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  g_smem_per_block = static_cast<int>(prop.sharedMemPerBlockOptin);
  cublasHandle_t handle;
  cublasCreate(&handle);
  float* flush = nullptr;
  float* sink = nullptr;
  const size_t flush_floats = size_t{64} << 20;  // 256 MB
  CHECK_CUDA(cudaMalloc(&flush, flush_floats * 4));
  CHECK_CUDA(cudaMemset(flush, 0, flush_floats * 4));
  CHECK_CUDA(cudaMalloc(&sink, 4));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf("stages %d, batch %s; %s, %d SMs\n", bm::kStages, force_sv ? argv[1] : "auto", prop.name,
              prop.multiProcessorCount);
  std::printf("%-11s %5s %5s %9s %6s %3s %3s %6s %9s %9s %7s %9s %9s | %6s %8s %7s %9s %9s\n", "shape", "spars", "N",
              "b:sv", "smem", "wk", "spl", "MB", "bitmap_us", "dense_us", "speedup", "floor_us", "rel_err", "c16_MB",
              "c16_us", "c16_x", "floor_us", "rel_err");

  const int shapes[2][2] = {{11008, 4096}, {4096, 11008}};
  const double sparsities[4] = {0.5, 0.7, 0.9, 0.95};
  const int ns[6] = {1, 4, 8, 16, 64, 128};
  for (const auto& shape : shapes) {
    for (const double sp : sparsities) {
      if (only_m != 0 && (only_m != shape[0] || std::fabs(only_sp - sp) > 1e-9)) continue;
      const Weight w = make_weight(shape[0], shape[1], sp, 7 + static_cast<uint64_t>(sp * 100));
      uint64_t* d_bitmaps;
      int* d_offsets;
      uint16_t *d_values, *d_dense;
      CHECK_CUDA(cudaMalloc(&d_bitmaps, w.bitmaps.size() * 8));
      CHECK_CUDA(cudaMalloc(&d_offsets, w.offsets.size() * 4));
      CHECK_CUDA(cudaMalloc(&d_values, std::max<size_t>(16, w.values.size() * 2)));
      CHECK_CUDA(cudaMalloc(&d_dense, w.dense.size() * 2));
      CHECK_CUDA(cudaMemcpy(d_bitmaps, w.bitmaps.data(), w.bitmaps.size() * 8, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(d_offsets, w.offsets.data(), w.offsets.size() * 4, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(d_values, w.values.data(), w.values.size() * 2, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(d_dense, w.dense.data(), w.dense.size() * 2, cudaMemcpyHostToDevice));
      int* d_crow;
      uint32_t* d_entries;
      CHECK_CUDA(cudaMalloc(&d_crow, w.crow.size() * 4));
      CHECK_CUDA(cudaMalloc(&d_entries, std::max<size_t>(16, w.entries.size() * 4)));
      CHECK_CUDA(cudaMemcpy(d_crow, w.crow.data(), w.crow.size() * 4, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(d_entries, w.entries.data(), w.entries.size() * 4, cudaMemcpyHostToDevice));
      const double csr16_mb = (w.entries.size() * 4.0 + w.crow.size() * 4.0) / 1e6;
      const double weight_mb = (w.values.size() * 2.0 + w.bitmaps.size() * 8.0 + w.offsets.size() * 4.0) / 1e6;
      for (const int n : ns) {
        if (only_m != 0 && only_n != n) continue;
        const int m = w.m, k = w.k;
        std::vector<uint16_t> hx(static_cast<size_t>(n) * k);
        Rng r{static_cast<uint64_t>(n) * 977 + 3};
        for (auto& v : hx) v = __bfloat16_as_ushort(__float2bfloat16(2.f * r.uniform() - 1.f));
        uint16_t *d_x, *d_y, *d_ref, *d_y16;
        float* d_work = nullptr;
        CHECK_CUDA(cudaMalloc(&d_x, hx.size() * 2));
        CHECK_CUDA(cudaMalloc(&d_y, static_cast<size_t>(n) * m * 2));
        CHECK_CUDA(cudaMalloc(&d_ref, static_cast<size_t>(n) * m * 2));
        CHECK_CUDA(cudaMalloc(&d_y16, static_cast<size_t>(n) * m * 2));
        CHECK_CUDA(cudaMemcpy(d_x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));

        bm::Launch l = bm::choose_launch(m, n, k, static_cast<int64_t>(w.values.size()), prop.multiProcessorCount,
                                         prop.sharedMemPerMultiprocessor, prop.reservedSharedMemPerBlock,
                                         prop.sharedMemPerBlockOptin);
        if (force_sv > 0) {  // groups per stage (1, 2 or 4), the stage size from the same rule
          l.batch = force_sv;
          l.stage_values = bm::stage_values_for(static_cast<int64_t>(w.values.size()), int64_t{w.strips} * w.chunks, l.batch);
          l.smem = bm::block_smem(l.stage_values, l.batch, l.nt);
        }
        if (l.splits > 1) CHECK_CUDA(cudaMalloc(&d_work, static_cast<size_t>(l.splits) * n * m * 4));
        bm::Params p{};
        p.bitmaps = d_bitmaps;
        p.offsets = d_offsets;
        p.values = d_values;
        p.nvalues = static_cast<int64_t>(w.values.size());
        p.x = d_x;
        p.ldx = k;
        p.kx = k;
        p.n = n;
        p.m = m;
        p.strips = w.strips;
        p.chunks = w.chunks;
        p.out = l.splits > 1 ? static_cast<void*>(d_work) : static_cast<void*>(d_y);
        p.bias = nullptr;
        p.act = sparsetorch::Activation::None;
        p.slope = 0.f;
        p.ws = l.ws;
        p.wk = l.wk;
        p.chunks_per_split = l.chunks_per_split;
        p.scatter_max = 256;
        p.batch = l.batch;
        p.stage_values = l.stage_values;
        auto bitmap_call = [&] {
          switch (l.nt) {
            case 1: launch_nt<1>(p, l); break;
            case 2: launch_nt<2>(p, l); break;
            case 4: launch_nt<4>(p, l); break;
            default: launch_nt<8>(p, l); break;
          }
          if (l.splits > 1) {
            const int64_t cells = static_cast<int64_t>(n) * m;
            const int blocks = static_cast<int>(std::min<int64_t>((cells + 255) / 256, 8 * prop.multiProcessorCount));
            bm::bitmap_splitk_reduce_kernel<__nv_bfloat16><<<blocks, 256>>>(d_work, l.splits, cells, m, nullptr,
                                                                            sparsetorch::Activation::None, 0.f, d_y);
          }
        };
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
        q.out = d_y16;
        q.bias = nullptr;
        q.act = sparsetorch::Activation::None;
        const int nb = c16::tokens_per_block(n, k, prop.sharedMemPerBlockOptin);
        auto csr16_call = [&] {
          c16::with_tile_tokens(nb, [&](auto NB) { launch_csr16<decltype(NB)::value>(q, prop.multiProcessorCount); });
        };
        const float alpha = 1.f, beta = 0.f;
        auto dense_call = [&] {
          cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, d_dense, CUDA_R_16BF, k, d_x, CUDA_R_16BF, k,
                       &beta, d_ref, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        };
        bitmap_call();
        csr16_call();
        dense_call();
        CHECK_CUDA(cudaDeviceSynchronize());
        std::vector<uint16_t> hy(static_cast<size_t>(n) * m), href(hy.size()), hy16(hy.size());
        CHECK_CUDA(cudaMemcpy(hy.data(), d_y, hy.size() * 2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(hy16.data(), d_y16, hy16.size() * 2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(href.data(), d_ref, href.size() * 2, cudaMemcpyDeviceToHost));
        auto rel_err = [&](const std::vector<uint16_t>& y) {
          double num = 0, den = 0;
          for (size_t i = 0; i < y.size(); ++i) {
            const double a = __bfloat162float(__ushort_as_bfloat16(y[i]));
            const double b = __bfloat162float(__ushort_as_bfloat16(href[i]));
            num += (a - b) * (a - b);
            den += b * b;
          }
          return std::sqrt(num / std::max(den, 1e-30));
        };
        auto time = [&](auto&& fn) {
          std::vector<float> t;
          for (int rep = 0; rep < 45; ++rep) {
            read_flush<<<4 * prop.multiProcessorCount, 512>>>(reinterpret_cast<const float4*>(flush), flush_floats / 4,
                                                             sink);
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
        // Interleave the two so that clocks and neighbours affect both alike.
        float tb = 0, td = 0, tc = 0;
        for (int round = 0; round < 2; ++round) {
          tb += time(bitmap_call) / 2;
          tc += time(csr16_call) / 2;
          td += time(dense_call) / 2;
        }
        CHECK_CUDA(cudaGetLastError());
        // Floor: the weight as stored + x + y over 3.0 TB/s (the H100's measured copy rate).
        const double bytes = weight_mb * 1e6 + 2.0 * n * k + 2.0 * n * m;
        const double bytes16 = ((n + nb - 1) / nb) * csr16_mb * 1e6 + 2.0 * n * k + 2.0 * n * m;  // W once per token tile
        std::printf("%5dx%-5d %5.2f %5d %4d:%-4d %6d %3d %3d %6.1f %9.1f %9.1f %6.2fx %9.1f %9.2e | %6.1f %8.1f %6.2fx %9.1f %9.2e\n",
                    m, k, sp, n, l.batch, l.stage_values, l.smem, l.wk, l.splits, weight_mb, tb, td, td / tb,
                    bytes / 3.0e6, rel_err(hy), csr16_mb, tc, td / tc, bytes16 / 3.0e6, rel_err(hy16));
        std::fflush(stdout);
        cudaFree(d_x);
        cudaFree(d_y);
        cudaFree(d_ref);
        cudaFree(d_y16);
        if (d_work) cudaFree(d_work);
      }
      cudaFree(d_bitmaps);
      cudaFree(d_offsets);
      cudaFree(d_values);
      cudaFree(d_dense);
      cudaFree(d_crow);
      cudaFree(d_entries);
    }
  }
  return 0;
}
