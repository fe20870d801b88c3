// Host helpers shared by the standalone CUDA prototype harnesses (tile_entries_proto/, slot_walk_proto/):
// the timing setup (cuBLAS on one stream, do_bench's 256 MB flush buffer, two events), error checks,
// comma-separated environment lists and bfloat16 conversions. Header-only, no torch.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

// The comma-separated items of environment variable `name`, or of `dflt` where it is unset.
static std::vector<std::string> env_list(const char* name, const char* dflt) {
  const char* v = getenv(name);
  std::string s = v ? v : dflt;
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

// float -> bfloat16 bits, round to nearest even (finite inputs), and back.
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
static float bf2f(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// What every timed round needs: cuBLAS (with a 32 MB workspace) on a stream of its own, the buffer that
// do_bench-style rounds memset before each launch (it leaves the L2 dirty, as triton's do_bench does), and
// the two events around the launch.
struct BenchSetup {
  static constexpr size_t kFlushBytes = 256ull << 20;
  cublasHandle_t blas;
  cudaStream_t stream;
  void* flush;
  cudaEvent_t e0, e1;
  BenchSetup() {
    cublasCreate(&blas);
    void* ws;
    CK(cudaMalloc(&ws, 32 << 20));
    cublasSetWorkspace(blas, ws, 32 << 20);
    CK(cudaStreamCreate(&stream));
    cublasSetStream(blas, stream);
    CK(cudaMalloc(&flush, kFlushBytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
  }
  // Microseconds between events recorded around `launch()` on the stream.
  template <class F>
  float timed_us(F&& launch) {
    cudaEventRecord(e0, stream);
    launch();
    cudaEventRecord(e1, stream);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms * 1000.f;
  }
  // y (n, m) = x (n, k) @ w (m, k)^T in bf16 with fp32 accumulation: F.linear's GEMM.
  void dense_bf16(int m, int n, int k, const void* w, const void* x, void* y) {
    const float alpha = 1.f, beta = 0.f;
    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &beta, y,
                 CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
};
