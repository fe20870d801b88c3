// csr_stats on CUDA: the O(nnz) validity check and row-length statistics of a CSR pattern (layout
// in common/csr_analysis.h), written into one small device tensor that the caller copies to the
// host once. One memset and one kernel: on a small matrix a first call is mostly launches.
//
// Never a device-side assert (it would kill the CUDA context for the process): every defect becomes a
// 64-bit key (batch, phase, position) and the smallest key wins through an atomic, so the report is
// the first defect in the order the CPU scans (per batch: crow[0], crow monotone, crow[-1], then
// columns); the kernel's last block decodes it into [code, batch, position, value]. Every read is within
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
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

namespace cs = csr_stats;

constexpr int kThreads = 256;
constexpr int kPosBits = 42;   // positions below 2^42
constexpr int kPhaseBits = 2;  // 0: crow[0] / monotone, 1: crow[-1], 2: columns
constexpr unsigned long long kNoError = ~0ull;

int blocks_for(int64_t work) { return grid_stride_blocks(work, kThreads, 32); }

// Keeps the smallest key as the largest inverted one: zero-filled scratch then means "no defect".
__device__ inline void report(unsigned long long* key, int64_t b, int phase, int64_t pos) {
  const unsigned long long k = (static_cast<unsigned long long>(b) << (kPosBits + kPhaseBits)) |
                               (static_cast<unsigned long long>(phase) << kPosBits) |
                               static_cast<unsigned long long>(pos);
  atomicMax(key, ~k);
}

// One kernel, grid-stride over both arrays: thread i checks crow entry i (and, for a row r < m, counts its
// statistics) and column slot i. The key of the first defect is kept inverted (atomicMax of ~key), so that
// the zeroed scratch means "none". The last block to finish decodes it into [code, batch, position, value].
// scratch: [stats (kLength), inverted key, blocks finished], zeroed by the caller.
template <typename index_t>
__global__ void stats_kernel(const index_t* crow, const index_t* col, int64_t batch, int64_t m, int64_t L,
                             bool exact_nnz, int64_t ncols, int64_t* scratch) {
  __shared__ BlockRowStats block;
  __shared__ bool last_block;
  auto* key = reinterpret_cast<unsigned long long*>(scratch + cs::kLength);
  block.init();
  __syncthreads();
  ThreadRowStats mine;
  const int64_t crow_total = batch * (m + 1), col_total = ncols >= 0 ? batch * L : 0;
  const int64_t total = crow_total > col_total ? crow_total : col_total;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < crow_total) {
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
        block.add(mine, stop - start);
      }
    }
    if (i < col_total) {
      const int64_t b = i / L, j = i - b * L;
      const int64_t stored = min(max(static_cast<int64_t>(crow[b * (m + 1) + m]), int64_t(0)), L);
      if (j < stored && (col[i] < 0 || col[i] >= ncols)) report(key, b, 2, j);
    }
  }
  block.merge(mine);
  __syncthreads();
  block.flush(scratch);
  // The last block sees every block's statistics and reports (the fence orders this block's atomics
  // before its count).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    auto* finished = reinterpret_cast<unsigned long long*>(scratch + cs::kLength + 1);
    last_block = atomicAdd(finished, 1ull) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block || threadIdx.x != 0) return;
  __threadfence();
  const unsigned long long k = ~atomicAdd(key, 0ull);
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
  scratch[cs::kCode] = code;
  scratch[cs::kBatch] = b;
  scratch[cs::kPos] = pos;
  scratch[cs::kValue] = value;
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
  // One allocation and one memset: a first call on a small matrix is mostly such fixed costs.
  at::Tensor scratch = at::empty({cs::kLength + 2}, crow.options().dtype(at::kLong));
  const auto stream = at::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaMemsetAsync(scratch.data_ptr(), 0, scratch.nbytes(), stream));
  const int64_t work = std::max(s.batch * (s.m + 1), ncols >= 0 ? s.batch * s.nnz_stride : 0);
  AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_stats_cuda", [&] {
    stats_kernel<index_t><<<blocks_for(work), kThreads, 0, stream>>>(
        crow.data_ptr<index_t>(), col.data_ptr<index_t>(), s.batch, s.m, s.nnz_stride, !s.batched, ncols,
        scratch.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return scratch.narrow(0, 0, cs::kLength);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("csr_stats", SPARSETORCH_CUDA_OP(csr_stats_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
