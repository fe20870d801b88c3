// The fresh-graph builder on CUDA (common/graph_build.h): one op, ~20 launches, and no wait for the GPU.
//
//   1. edge_pass: the first out-of-range edge (atomicMax of edges - e), clamped sort keys, the entries
//      per target and per source (atomics), each node's last self loop (atomicMax: the largest edge
//      number, deterministic);
//   2. stats_pass: both matrices' row-length statistics (csr_stats layout) into the summary;
//   3. the summary is copied to pinned host memory behind an event (a PendingCheck, common/
//      csr_analysis.h): the products route provisionally until it lands, and a bad index raises
//      IndexError at the first lookup after that (or at the next graph built);
//   4. a stable radix sort of the entries by target (A) and by source (A^T), over only the bits the node
//      count needs; the row pointers by a scan of the counts;
//   5. row_scale (GCN: (sum of the row's weights)^-1/2; mean with dropped loops: the kept entries), a warp
//      per row in a fixed order, so results are deterministic; fill_a: A's columns, each entry's slot in
//      A (`inverse`), the values, all NaN when an index was out of range; fill_at: A^T's columns, perm
//      and values (A's values through perm, bitwise equal).
// The sizes are known on the host without the GPU: a dropped self loop stays in its row with value 0.
// Every index read is clamped or comes from the sort of clamped keys: nothing reads out of bounds.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraphsUtils.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

#include "common/graph_build.h"
#include "cuda/cuda_utils.h"
#include "cuda/row_stats.cuh"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

namespace gb = graph_build;

constexpr int kThreads = 256;

int blocks_for(int64_t work) { return grid_stride_blocks(work, kThreads, 16); }

__device__ inline void add_one(int32_t* p) { atomicAdd(p, 1); }
__device__ inline void add_one(int64_t* p) { atomicAdd(reinterpret_cast<unsigned long long*>(p), 1ull); }
__device__ inline void raise_to(int32_t* p, int32_t v) { atomicMax(p, v); }
__device__ inline void raise_to(int64_t* p, int64_t v) { atomicMax(reinterpret_cast<long long*>(p), static_cast<long long>(v)); }

// Entry e's weight: an edge's (ones without weights; 0 for a dropped self loop), or node e - edges' added
// loop: its last existing loop's weight (kRemaining with weights; last_loop holds edge + 1, 0 for none),
// else fill.
template <typename scalar_t, typename idx_t>
struct Weights {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* w;       // nullptr: ones
  const idx_t* last_loop;  // nullptr: added loops weigh `fill`
  const idx_t *key_t, *key_s;
  int64_t edges;
  bool drop_loops;
  acc_t fill;
  __device__ bool dropped(int64_t e) const { return drop_loops && e < edges && key_t[e] == key_s[e]; }
  __device__ acc_t operator()(int64_t e) const {
    if (e < edges) {
      if (dropped(e)) return acc_t(0);
      return w ? static_cast<acc_t>(w[e]) : acc_t(1);
    }
    if (last_loop) {
      const int64_t last = static_cast<int64_t>(last_loop[e - edges]);
      if (last > 0) return static_cast<acc_t>(w[last - 1]);
    }
    return fill;
  }
};

template <typename in_t, typename idx_t>
__global__ void edge_pass(const in_t* src, const in_t* dst, int64_t edges, int64_t nodes, int64_t n_src,
                          int64_t n_dst, bool drop_loops, idx_t* key_t, idx_t* key_s, idx_t* ids, idx_t* count_t,
                          idx_t* count_s, idx_t* last_loop, int64_t* bad) {
  const int64_t total = edges + nodes;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    ids[e] = static_cast<idx_t>(e);
    if (e < edges) {
      int64_t s = static_cast<int64_t>(src[e]), d = static_cast<int64_t>(dst[e]);
      if (s < 0 || s >= n_src || d < 0 || d >= n_dst) raise_to(bad, edges - e);  // the largest: the first edge
      s = min(max(s, int64_t(0)), n_src - 1);
      d = min(max(d, int64_t(0)), n_dst - 1);
      key_t[e] = static_cast<idx_t>(d);
      key_s[e] = static_cast<idx_t>(s);
      if (last_loop && drop_loops && s == d) raise_to(&last_loop[d], static_cast<idx_t>(e + 1));
      add_one(&count_t[d]);
      add_one(&count_s[s]);
    } else {
      const int64_t node = e - edges;
      key_t[e] = key_s[e] = static_cast<idx_t>(node);
      add_one(&count_t[node]);
      add_one(&count_s[node]);
    }
  }
}

// blockIdx.y = 0: A's rows (count_t), 1: A^T's (count_s); block-level partial statistics, then atomics
// into the summary (zeroed by the caller).
template <typename idx_t>
__global__ void stats_pass(const idx_t* count_t, int64_t n_dst, const idx_t* count_s, int64_t n_src,
                           int64_t* summary) {
  __shared__ BlockRowStats block;
  const bool transposed = blockIdx.y == 1;
  const idx_t* count = transposed ? count_s : count_t;
  const int64_t n = transposed ? n_src : n_dst;
  block.init();
  __syncthreads();
  ThreadRowStats mine;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    block.add(mine, static_cast<int64_t>(count[r]));
  }
  block.merge(mine);
  __syncthreads();
  block.flush(summary + (transposed ? gb::kStatsAT : gb::kStatsA));
}

// Per row of A: GCN's d[r] = (sum of the row's weights)^-1/2, 0 where that is infinite; the mean's divisor
// (the kept entries, at least 1) where dropped loops sit in the rows. A warp per row, lanes strided over
// its entries, then a butterfly: a fixed order, so deterministic.
template <typename scalar_t, typename idx_t>
__global__ void row_scale(int64_t rows, const idx_t* crow, const idx_t* order, Weights<scalar_t, idx_t> weight,
                          int64_t norm, at::opmath_type<scalar_t>* d) {
  using acc_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    acc_t sum = 0;
    for (int64_t i = static_cast<int64_t>(crow[r]) + lane; i < static_cast<int64_t>(crow[r + 1]); i += 32) {
      const int64_t e = static_cast<int64_t>(order[i]);
      sum += norm == gb::kGcn ? weight(e) : acc_t(weight.dropped(e) ? 0 : 1);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      if (norm == gb::kGcn) {
        const acc_t scale = ::pow(sum, acc_t(-0.5));
        d[r] = isinf(scale) ? acc_t(0) : scale;
      } else {
        d[r] = max(sum, acc_t(1));
      }
    }
  }
}

// A's slot i (rows = sorted keys): its column, the candidate's slot (inverse), its value.
template <typename scalar_t, typename idx_t>
__global__ void fill_a(int64_t entries, const idx_t* order, const idx_t* row_of, const idx_t* key_s,
                       const idx_t* count_t, Weights<scalar_t, idx_t> weight, int64_t norm,
                       const at::opmath_type<scalar_t>* d, const int64_t* bad, idx_t* col, idx_t* inverse,
                       scalar_t* values) {
  using acc_t = at::opmath_type<scalar_t>;
  const bool poisoned = *bad != 0;  // an index was out of range: every value NaN
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < entries;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = static_cast<int64_t>(order[i]);
    const idx_t c = key_s[e];
    col[i] = c;
    inverse[e] = static_cast<idx_t>(i);
    const int64_t r = static_cast<int64_t>(row_of[i]);
    const acc_t x = weight(e);
    acc_t v = x;
    if (norm == gb::kGcn) {
      v = d[r] * x * d[c];
    } else if (norm == gb::kMean) {  // d: the kept entries where loops were dropped, else the row's count
      v = x / (d ? d[r] : static_cast<acc_t>(max(static_cast<int64_t>(count_t[r]), int64_t(1))));
    }
    values[i] = poisoned ? static_cast<scalar_t>(NAN) : static_cast<scalar_t>(v);
  }
}

template <typename scalar_t, typename idx_t>
__global__ void fill_at(int64_t entries, const idx_t* order_t, const idx_t* key_t, const idx_t* inverse,
                        const scalar_t* values, idx_t* col_t, idx_t* perm, scalar_t* values_t) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < entries;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = static_cast<int64_t>(order_t[t]);
    col_t[t] = key_t[e];
    const idx_t slot = inverse[e];
    perm[t] = slot;
    values_t[t] = values[slot];
  }
}

int key_bits(int64_t largest_key) {
  int bits = 1;
  while (bits < 63 && (largest_key >> bits) != 0) ++bits;
  return bits;
}

// Carves 256-byte aligned arrays out of one workspace.
struct Carver {
  int64_t offset = 0;
  template <typename T>
  int64_t take(int64_t count) {
    const int64_t at = offset;
    offset += (count * static_cast<int64_t>(sizeof(T)) + 255) / 256 * 256;
    return at;
  }
};

template <typename scalar_t, typename idx_t, typename in_t>
std::vector<at::Tensor> build(const gb::Problem& p) {
  using acc_t = at::opmath_type<scalar_t>;
  using key_t = std::make_unsigned_t<idx_t>;  // the keys are >= 0: sort them as unsigned
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int64_t E = p.edges, T = p.candidates(), n_dst = p.n_dst, n_src = p.n_src;
  const bool last_loops = p.loop_weights_from_edges();

  // Zeroed: the summary, the counts and the last loops. One allocation, one memset.
  Carver zeroed;
  const int64_t at_summary = zeroed.take<int64_t>(gb::kSummaryLength);
  const int64_t at_count_t = zeroed.take<idx_t>(n_dst), at_count_s = zeroed.take<idx_t>(n_src);
  const int64_t at_last = zeroed.take<idx_t>(last_loops ? n_dst : 0);
  at::Tensor zero_block = at::zeros({zeroed.offset}, p.src.options().dtype(at::kByte));
  auto* zero_base = static_cast<char*>(zero_block.data_ptr());
  auto* summary = reinterpret_cast<int64_t*>(zero_base + at_summary);
  auto* count_t = reinterpret_cast<idx_t*>(zero_base + at_count_t);
  auto* count_s = reinterpret_cast<idx_t*>(zero_base + at_count_s);
  idx_t* last_loop = last_loops ? reinterpret_cast<idx_t*>(zero_base + at_last) : nullptr;

  // Scratch: keys, ids, sorted keys and orders, inverse, the GCN scales, the sorts' and scans' temporaries.
  size_t sort_bytes = 0, sort_t_bytes = 0, scan_bytes = 0, scan_t_bytes = 0;
  const int bits_t = key_bits(std::max<int64_t>(n_dst - 1, 0));
  const int bits_s = key_bits(std::max<int64_t>(n_src - 1, 0));
  const auto count = static_cast<idx_t>(T);
  if (T > 0) {
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const key_t*>(nullptr),
                                                   static_cast<key_t*>(nullptr), static_cast<const idx_t*>(nullptr),
                                                   static_cast<idx_t*>(nullptr), count, 0, bits_t, stream));
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_t_bytes, static_cast<const key_t*>(nullptr),
                                                   static_cast<key_t*>(nullptr), static_cast<const idx_t*>(nullptr),
                                                   static_cast<idx_t*>(nullptr), count, 0, bits_s, stream));
  }
  if (n_dst > 0) {
    C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<const idx_t*>(nullptr),
                                                 static_cast<idx_t*>(nullptr), static_cast<idx_t>(n_dst), stream));
  }
  if (n_src > 0) {
    C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_t_bytes, static_cast<const idx_t*>(nullptr),
                                                 static_cast<idx_t*>(nullptr), static_cast<idx_t>(n_src), stream));
  }
  const size_t temp_bytes = std::max({sort_bytes, sort_t_bytes, scan_bytes, scan_t_bytes, size_t(1)});
  Carver scratch;
  const int64_t at_key_t = scratch.take<idx_t>(T), at_key_s = scratch.take<idx_t>(T), at_ids = scratch.take<idx_t>(T);
  const int64_t at_row = scratch.take<idx_t>(T), at_row_s = scratch.take<idx_t>(T);
  const int64_t at_order = scratch.take<idx_t>(T), at_order_t = scratch.take<idx_t>(T);
  const int64_t at_inverse = scratch.take<idx_t>(T);
  // row_scale's output: GCN's scales, or the mean's divisors where dropped loops sit in the rows
  const bool scaled_rows = p.norm == gb::kGcn || (p.norm == gb::kMean && p.drop_loops());
  const int64_t at_d = scratch.take<acc_t>(scaled_rows ? n_dst : 0);
  const int64_t at_temp = scratch.take<char>(static_cast<int64_t>(temp_bytes));
  at::Tensor scratch_block = at::empty({scratch.offset}, p.src.options().dtype(at::kByte));
  auto* base = static_cast<char*>(scratch_block.data_ptr());
  auto* key_t_in = reinterpret_cast<idx_t*>(base + at_key_t);
  auto* key_s_in = reinterpret_cast<idx_t*>(base + at_key_s);
  auto* ids = reinterpret_cast<idx_t*>(base + at_ids);
  auto* row_of = reinterpret_cast<idx_t*>(base + at_row);
  auto* row_of_t = reinterpret_cast<idx_t*>(base + at_row_s);
  auto* order = reinterpret_cast<idx_t*>(base + at_order);
  auto* order_t = reinterpret_cast<idx_t*>(base + at_order_t);
  auto* inverse = reinterpret_cast<idx_t*>(base + at_inverse);
  auto* d = reinterpret_cast<acc_t*>(base + at_d);
  void* temp = base + at_temp;

  // 1-2. counts, keys, flag; statistics.
  if (T > 0) {
    edge_pass<in_t, idx_t><<<blocks_for(T), kThreads, 0, stream>>>(
        p.src.data_ptr<in_t>(), p.dst.data_ptr<in_t>(), E, p.nodes, n_src, n_dst, p.drop_loops(), key_t_in,
        key_s_in, ids, count_t, count_s, last_loop, summary + gb::kBadIndex);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (n_dst > 0 || n_src > 0) {
    const dim3 grid(blocks_for(std::max(n_dst, n_src)), 2);
    stats_pass<idx_t><<<grid, kThreads, 0, stream>>>(count_t, n_dst, count_s, n_src, summary);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // 3. the summary to pinned host memory behind an event: read by the analysis cache once it has landed.
  auto check = std::make_shared<PendingCheck>();
  check->summary = at::empty({gb::kSummaryLength}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  check->summary.copy_(zero_block.narrow(0, at_summary, gb::kSummaryLength * 8).view(at::kLong), /*non_blocking=*/true);
  check->done.record(stream);
  check->src = p.src;
  check->dst = p.dst;
  check->edges = E;
  check->n_src = n_src;
  check->n_dst = n_dst;
  check->what = p.what;
  const int64_t entries = T;  // a dropped loop stays in its row (value 0): the sizes need no data

  const auto index_options = p.src.options().dtype(p.index_dtype);
  at::Tensor crow = at::empty({n_dst + 1}, index_options), crow_t = at::empty({n_src + 1}, index_options);
  at::Tensor col = at::empty({entries}, index_options), col_t = at::empty({entries}, index_options);
  at::Tensor perm = at::empty({entries}, index_options);
  at::Tensor values = at::empty({entries}, p.src.options().dtype(p.dtype));
  at::Tensor values_t = at::empty({entries}, p.src.options().dtype(p.dtype));

  // 4. row pointers; the stable sorts.
  C10_CUDA_CHECK(cudaMemsetAsync(crow.data_ptr(), 0, sizeof(idx_t), stream));
  C10_CUDA_CHECK(cudaMemsetAsync(crow_t.data_ptr(), 0, sizeof(idx_t), stream));
  if (n_dst > 0) {
    size_t bytes = temp_bytes;
    C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, bytes, count_t, crow.data_ptr<idx_t>() + 1,
                                                 static_cast<idx_t>(n_dst), stream));
  }
  if (n_src > 0) {
    size_t bytes = temp_bytes;
    C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, bytes, count_s, crow_t.data_ptr<idx_t>() + 1,
                                                 static_cast<idx_t>(n_src), stream));
  }
  if (entries > 0) {
    size_t bytes = temp_bytes;
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, reinterpret_cast<const key_t*>(key_t_in),
                                                   reinterpret_cast<key_t*>(row_of), ids, order, count, 0, bits_t,
                                                   stream));
    bytes = temp_bytes;
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, reinterpret_cast<const key_t*>(key_s_in),
                                                   reinterpret_cast<key_t*>(row_of_t), ids, order_t, count, 0,
                                                   bits_s, stream));

    // 5. A, then A^T.
    const Weights<scalar_t, idx_t> weight{p.weights ? p.weights->data_ptr<scalar_t>() : nullptr,
                                          last_loop,
                                          key_t_in,
                                          key_s_in,
                                          E,
                                          p.drop_loops(),
                                          static_cast<acc_t>(p.fill)};
    if (scaled_rows) {
      row_scale<scalar_t, idx_t><<<blocks_for(n_dst * 32), kThreads, 0, stream>>>(
          n_dst, crow.data_ptr<idx_t>(), order, weight, p.norm, d);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    fill_a<scalar_t, idx_t><<<blocks_for(entries), kThreads, 0, stream>>>(
        entries, order, row_of, key_s_in, count_t, weight, p.norm, scaled_rows ? d : nullptr,
        summary + gb::kBadIndex, col.data_ptr<idx_t>(), inverse, values.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    fill_at<scalar_t, idx_t><<<blocks_for(entries), kThreads, 0, stream>>>(
        entries, order_t, key_t_in, inverse, values.data_ptr<scalar_t>(), col_t.data_ptr<idx_t>(),
        perm.data_ptr<idx_t>(), values_t.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // The workspaces are freed into the caching allocator on this stream: reuse is ordered after the kernels.
  store_pending_csr_analysis(crow, col, n_src, check, gb::kStatsA);
  store_pending_csr_analysis(crow_t, col_t, n_dst, check, gb::kStatsAT);
  return {crow, col, values, crow_t, col_t, values_t, perm, check->summary};
}

std::vector<at::Tensor> build_graph_cuda(const at::Tensor& src, const at::Tensor& dst,
                                         const std::optional<at::Tensor>& weights, int64_t n_src, int64_t n_dst,
                                         int64_t loops, double fill, int64_t norm, at::ScalarType dtype,
                                         c10::string_view what) {
  const gb::Problem p = gb::make_problem(src, dst, weights, n_src, n_dst, loops, fill, norm, dtype, what);
  const c10::cuda::CUDAGuard guard(p.src.device());
  TORCH_CHECK(at::cuda::currentStreamCaptureStatus() == at::cuda::CaptureStatus::None,
              "sparsetorch: a new graph's check is read back through pinned memory and an event, which CUDA graph "
              "capture does not allow: build the graph's matrix before capturing (st.nn.gcn_norm / st.nn.mean_norm, "
              "or one call of the layer) and pass it to the captured layers");
  poll_pending_checks(/*wait=*/false);  // a bad graph built earlier raises here at the latest
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "_build_graph_cuda", [&] {
    AT_DISPATCH_INDEX_TYPES(p.src.scalar_type(), "_build_graph_cuda", [&] {
      using in_t = index_t;
      out = p.index_dtype == at::kInt ? build<scalar_t, int32_t, in_t>(p) : build<scalar_t, int64_t, in_t>(p);
    });
  });
  return out;
}

// Lets the analysis cache (common code) ask whether a CUDA graph is being captured.
const bool kCaptureQueryRegistered = [] {
  cuda_stream_capturing = [] { return at::cuda::currentStreamCaptureStatus() != at::cuda::CaptureStatus::None; };
  return true;
}();

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("_build_graph", SPARSETORCH_CUDA_OP(build_graph_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
