// csr_stats on CUDA: the O(nnz) validity check and row-length statistics of a CSR pattern (layout
// in common/csr_analysis.h), written into one small device tensor that the caller copies to the
// host once.
//
// Never a device-side assert (it would kill the CUDA context for the process): every defect becomes a
// 64-bit key (batch, phase, position) and the smallest key wins through atomicMin, so the report is
// the first defect in the order the CPU scans (per batch: crow[0], crow monotone, crow[-1], then
// columns); a one-thread kernel decodes it into [code, batch, position, value]. Every read is within
// crow_indices' and col_indices' own extents, whatever they hold.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraphsUtils.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/csr_analysis.h"
#include "common/csr_check_codes.h"
#include "cuda/cuda_utils.h"
#include "cuda/row_stats.cuh"

namespace sparsetorch {
namespace cuda {
namespace {

namespace cs = csr_stats;

constexpr int kThreads = 256;
constexpr int kPosBits = 42;   // positions below 2^42
constexpr int kPhaseBits = 2;  // 0: crow[0] / monotone, 1: crow[-1], 2: columns
constexpr unsigned long long kNoError = ~0ull;

int64_t blocks_for(int64_t work) {
  const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return std::max<int64_t>(1, std::min(ceil_div(work, kThreads), max_blocks));
}

__device__ inline void report(unsigned long long* key, int64_t b, int phase, int64_t pos) {
  const unsigned long long k = (static_cast<unsigned long long>(b) << (kPosBits + kPhaseBits)) |
                               (static_cast<unsigned long long>(phase) << kPosBits) |
                               static_cast<unsigned long long>(pos);
  atomicMin(key, k);
}

// One thread per crow entry: the crow checks, and for r < m the statistics of row r, per block first,
// then into stats (zeroed by the caller).
template <typename index_t>
__global__ void crow_kernel(const index_t* crow, int64_t batch, int64_t m, int64_t L, bool exact_nnz,
                            unsigned long long* key, int64_t* stats) {
  __shared__ BlockRowStats block;
  block.init();
  __syncthreads();
  const int64_t total = batch * (m + 1);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / (m + 1), r = i - b * (m + 1);
    const index_t* c = crow + b * (m + 1);
    if (r == 0) {
      if (c[0] != 0) report(key, b, 0, 0);
    } else if (c[r] < c[r - 1]) {
      report(key, b, 0, r);
    }
    if (r == m && (exact_nnz ? c[m] != L : c[m] > L)) report(key, b, 1, m);
    if (r < m) {
      const int64_t start = min(max(static_cast<int64_t>(c[r]), int64_t(0)), L);
      const int64_t stop = min(max(static_cast<int64_t>(c[r + 1]), start), L);
      block.add(stop - start);
    }
  }
  __syncthreads();
  block.flush(stats);
}

template <typename index_t>
__global__ void col_kernel(const index_t* crow, const index_t* col, int64_t batch, int64_t m, int64_t L,
                           int64_t ncols, unsigned long long* key) {
  const int64_t total = batch * L;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / L, j = i - b * L;
    const int64_t stored = min(max(static_cast<int64_t>(crow[b * (m + 1) + m]), int64_t(0)), L);
    if (j < stored && (col[i] < 0 || col[i] >= ncols)) report(key, b, 2, j);
  }
}

// Decodes the first defect.
template <typename index_t>
__global__ void finish_kernel(const unsigned long long* key, const index_t* crow, const index_t* col, int64_t m,
                              int64_t L, int64_t* stats) {
  const unsigned long long k = *key;
  if (k == kNoError) return;  // [code, batch, position, value] stay 0
  const int64_t b = static_cast<int64_t>(k >> (kPosBits + kPhaseBits));
  const int phase = static_cast<int>((k >> kPosBits) & ((1ull << kPhaseBits) - 1));
  const int64_t pos = static_cast<int64_t>(k & ((1ull << kPosBits) - 1));
  int64_t code, value;
  if (phase == 2) {
    code = kColOutOfRange;
    value = col[b * L + pos];
  } else {
    code = phase == 1 ? kCrowLastMismatch : (pos == 0 ? kCrowFirstNotZero : kCrowDecreasing);
    value = crow[b * (m + 1) + pos];
  }
  stats[cs::kCode] = code;
  stats[cs::kBatch] = b;
  stats[cs::kPos] = pos;
  stats[cs::kValue] = value;
}

at::Tensor csr_stats_cuda(const at::Tensor& crow_in, const at::Tensor& col_in, int64_t ncols) {
  const CsrShape s = check_csr_components(crow_in, col_in, nullptr);
  TORCH_CHECK_VALUE(s.nnz_stride < (int64_t(1) << kPosBits) && s.m < (int64_t(1) << kPosBits) &&
                        s.batch < (int64_t(1) << (64 - kPosBits - kPhaseBits)),
                    "csr_stats: the matrix is too large to validate on CUDA (batch ", s.batch, ", nnz ",
                    s.nnz_stride, ")");
  const c10::cuda::CUDAGuard guard(crow_in.device());
  // The caller reads the result on the host (a sync), which a CUDA graph capture cannot contain.
  TORCH_CHECK(at::cuda::currentStreamCaptureStatus() == at::cuda::CaptureStatus::None,
              "sparsetorch: a sparse matrix is validated and analysed on its first use (one O(nnz) pass and one "
              "device sync), which CUDA graph capture does not allow. Call the op once with this matrix before "
              "capturing (the result is cached), or pass validate=False if you vouch for the matrix.");
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  at::Tensor stats = at::zeros({cs::kLength}, crow.options().dtype(at::kLong));
  // Scratch: the defect key (all bits set: none).
  at::Tensor key = at::full({1}, -1, crow.options().dtype(at::kLong));
  auto* key_ptr = reinterpret_cast<unsigned long long*>(key.data_ptr<int64_t>());
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_stats_cuda", [&] {
    crow_kernel<index_t><<<blocks_for(s.batch * (s.m + 1)), kThreads, 0, stream>>>(
        crow.data_ptr<index_t>(), s.batch, s.m, s.nnz_stride, !s.batched, key_ptr, stats.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (ncols >= 0 && s.batch * s.nnz_stride > 0) {
      col_kernel<index_t><<<blocks_for(s.batch * s.nnz_stride), kThreads, 0, stream>>>(
          crow.data_ptr<index_t>(), col.data_ptr<index_t>(), s.batch, s.m, s.nnz_stride, ncols, key_ptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    finish_kernel<index_t><<<1, 1, 0, stream>>>(key_ptr, crow.data_ptr<index_t>(), col.data_ptr<index_t>(), s.m,
                                                s.nnz_stride, stats.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return stats;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("csr_stats", &csr_stats_cuda); }

}  // namespace cuda
}  // namespace sparsetorch
