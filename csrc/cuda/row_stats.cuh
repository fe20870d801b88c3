// Row-length statistics (common/csr_analysis.h's csr_stats layout) gathered per block in shared memory,
// then added into a statistics vector with atomics: the CSR analysis (csr_analysis_cuda.cu) and the
// fresh-graph builder (graph_build_cuda.cu) both count them.
//
// Only 32-bit integer shared-memory atomics per row: the sums, the maximum and the sum of squares are kept
// per thread, reduced per warp with shuffles and added by one lane per warp. Before, every thread added
// each row into the same shared words (the double sum of squares through a compare-and-swap loop): the
// statistics kernel took 24.7 us of a 5000-row matrix's first call, the whole check now 5.9 (H200).
#pragma once

#include <cstdint>

#include "common/csr_analysis.h"

namespace sparsetorch {
namespace cuda {

// One thread's share of the rows.
struct ThreadRowStats {
  unsigned long long entries = 0, empty = 0;
  long long max_row = 0;
  double squares = 0.0;
};

// Declare as __shared__. Every thread: init(), __syncthreads(), add() per row into its ThreadRowStats,
// merge() once after its rows (every lane of every warp must reach it), __syncthreads(), flush().
struct BlockRowStats {
  // A block sees fewer than 2^32 rows: the grids have 16 or more blocks per SM, and crow_indices fits in memory.
  unsigned int rows_hist[csr_stats::kHistBins];
  unsigned int entries_lo[csr_stats::kHistBins], entries_hi[csr_stats::kHistBins];  // a 64-bit sum in halves
  unsigned long long entries, empty;
  long long max_row;
  double squares;

  __device__ void init() {
    for (int i = threadIdx.x; i < csr_stats::kHistBins; i += blockDim.x) rows_hist[i] = entries_lo[i] = entries_hi[i] = 0;
    if (threadIdx.x == 0) {
      entries = empty = 0;
      max_row = 0;
      squares = 0.0;
    }
  }

  __device__ void add(ThreadRowStats& t, int64_t len) {
    t.entries += static_cast<unsigned long long>(len);
    t.squares += static_cast<double>(len) * static_cast<double>(len);
    if (len == 0) {
      ++t.empty;
      return;
    }
    t.max_row = len > t.max_row ? len : t.max_row;
    const int bin = min(63 - __clzll(static_cast<long long>(len)), csr_stats::kHistBins - 1);
    atomicAdd(&rows_hist[bin], 1u);
    const unsigned int lo = static_cast<unsigned int>(len);
    unsigned int hi = static_cast<unsigned int>(static_cast<unsigned long long>(len) >> 32);
    if (atomicAdd(&entries_lo[bin], lo) > 0xffffffffu - lo) ++hi;  // the carry out of the low half
    if (hi != 0) atomicAdd(&entries_hi[bin], hi);
  }

  __device__ void merge(ThreadRowStats t) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      t.entries += __shfl_xor_sync(0xffffffffu, t.entries, offset);
      t.empty += __shfl_xor_sync(0xffffffffu, t.empty, offset);
      const long long other = __shfl_xor_sync(0xffffffffu, t.max_row, offset);
      t.max_row = other > t.max_row ? other : t.max_row;
      t.squares += __shfl_xor_sync(0xffffffffu, t.squares, offset);
    }
    if ((threadIdx.x & 31) == 0) {
      atomicAdd(&entries, t.entries);
      atomicAdd(&empty, t.empty);
      atomicMax(&max_row, t.max_row);
      atomicAdd(&squares, t.squares);
    }
  }

  // Into `stats` (kLength values, zeroed before the first block adds: the sum of squares' slot holds a
  // double, and 0.0 is all zero bits).
  __device__ void flush(int64_t* stats) const {
    auto* u = reinterpret_cast<unsigned long long*>(stats);
    for (int i = threadIdx.x; i < csr_stats::kHistBins; i += blockDim.x) {
      if (rows_hist[i]) atomicAdd(&u[csr_stats::kRowHist + i], static_cast<unsigned long long>(rows_hist[i]));
      const unsigned long long e = (static_cast<unsigned long long>(entries_hi[i]) << 32) | entries_lo[i];
      if (e) atomicAdd(&u[csr_stats::kEntryHist + i], e);
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
