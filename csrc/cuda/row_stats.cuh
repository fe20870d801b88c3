// Row-length statistics (common/csr_analysis.h's csr_stats layout) gathered per block in shared memory,
// then added into a statistics vector with atomics: the CSR analysis (csr_analysis_cuda.cu) and the
// fresh-graph builder (graph_build_cuda.cu) both count them.
#pragma once

#include <cstdint>

#include "common/csr_analysis.h"

namespace sparsetorch {
namespace cuda {

// Declare as __shared__; init() by every thread, add() per row, __syncthreads(), flush() by every thread.
struct BlockRowStats {
  unsigned long long rows_hist[csr_stats::kHistBins], entries_hist[csr_stats::kHistBins];
  unsigned long long entries, empty;
  long long max_row;
  double squares;

  __device__ void init() {
    for (int i = threadIdx.x; i < csr_stats::kHistBins; i += blockDim.x) rows_hist[i] = entries_hist[i] = 0;
    if (threadIdx.x == 0) {
      entries = empty = 0;
      max_row = 0;
      squares = 0.0;
    }
  }

  __device__ void add(int64_t len) {
    atomicAdd(&entries, static_cast<unsigned long long>(len));
    atomicAdd(&squares, static_cast<double>(len) * static_cast<double>(len));
    if (len == 0) {
      atomicAdd(&empty, 1ull);
      return;
    }
    atomicMax(&max_row, static_cast<long long>(len));
    const int bin = min(63 - __clzll(static_cast<long long>(len)), csr_stats::kHistBins - 1);
    atomicAdd(&rows_hist[bin], 1ull);
    atomicAdd(&entries_hist[bin], static_cast<unsigned long long>(len));
  }

  // Into `stats` (kLength values, zeroed before the first block adds: the sum of squares' slot holds a
  // double, and 0.0 is all zero bits).
  __device__ void flush(int64_t* stats) const {
    auto* u = reinterpret_cast<unsigned long long*>(stats);
    for (int i = threadIdx.x; i < csr_stats::kHistBins; i += blockDim.x) {
      if (rows_hist[i]) atomicAdd(&u[csr_stats::kRowHist + i], rows_hist[i]);
      if (entries_hist[i]) atomicAdd(&u[csr_stats::kEntryHist + i], entries_hist[i]);
    }
    if (threadIdx.x == 0) {
      atomicAdd(&u[csr_stats::kEntries], entries);
      atomicAdd(&u[csr_stats::kEmptyRows], empty);
      atomicMax(reinterpret_cast<long long*>(&stats[csr_stats::kMaxRow]), max_row);
      atomicAdd(reinterpret_cast<double*>(&stats[csr_stats::kSumSquares]), squares);
    }
  }
};

}  // namespace cuda
}  // namespace sparsetorch
