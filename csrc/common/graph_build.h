// The fresh-graph builder as one op (sparsetorch::_build_graph; Python: sparsetorch/_graph_build.py):
// from an edge list to a layer's propagation matrix A = adj_t (n_dst x n_src, rows = targets), its
// transpose and the row-length statistics of both, in ~20 launches without waiting for the GPU (the
// check's result is read when it lands: PendingCheck, common/csr_analysis.h) and without Python between
// the steps. Mini-batch GNN training meets a new graph every step, so this is paid every step: a wait
// for the GPU there serialises the host's work with the GPU's.
//
// What it computes (the Python builder's definitions, which stay for autograd through edge weights and
// for torch.compile's tracing):
//  - edges src[e] -> dst[e], indices checked against n_src / n_dst (clamped before any use, so nothing
//    reads out of bounds whatever they hold). A bad index raises IndexError naming the first bad edge: on
//    the CPU at once; on CUDA when the check lands, with every value of the matrix NaN meanwhile;
//  - loops (square graphs): kRemaining drops existing self loops and gives each node one loop weighing its
//    last existing loop's weight, else `fill` (PyG's add_remaining_self_loops); kFill drops them and
//    adds loops of weight `fill`; kAdd keeps them and adds loops of weight `fill`. Added loops follow
//    every edge (entry e = edges + node). A dropped loop stays in its row as an entry of value 0, so
//    every size is edges + nodes, known without reading the data;
//  - norm: kGcn scales entry (t, s) by d_t d_s with d = (row sums)^-1/2 (0 where the sum is 0);
//    kMean divides an entry by its row's entry count (a dropped loop's zero entry not counted);
//  - both matrices keep the edge order within a row (stable), A^T's slot t holds A's slot perm[t].
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "common/csr_analysis.h"

namespace sparsetorch {
namespace graph_build {

enum Loops : int64_t { kNoLoops = 0, kRemaining = 1, kFill = 2, kAdd = 3 };
enum Norm : int64_t { kNoNorm = 0, kGcn = 1, kMean = 2 };

// The summary (int64): [edges - the first out-of-range edge (0: none), csr_stats of A, csr_stats of A^T].
constexpr int64_t kBadIndex = 0;
constexpr int64_t kStatsA = 1;
constexpr int64_t kStatsAT = 1 + csr_stats::kLength;
constexpr int64_t kSummaryLength = 1 + 2 * csr_stats::kLength;

struct Problem {
  at::Tensor src, dst;              // 1-D, same length and index dtype, contiguous
  std::optional<at::Tensor> weights;  // 1-D of `dtype`, contiguous, or none (ones)
  int64_t n_src = 0, n_dst = 0, edges = 0;
  int64_t nodes = 0;   // loops added: n_dst (square graphs), else 0
  Loops loops = kNoLoops;
  Norm norm = kNoNorm;
  double fill = 1.0;
  at::ScalarType dtype = at::kFloat;
  at::ScalarType index_dtype = at::kInt;  // of the outputs: int32 unless a size needs int64
  std::string what;                       // the graph's name in errors ("edge_index", "adj_t")

  int64_t candidates() const { return edges + nodes; }  // the entries of A and of A^T
  bool drop_loops() const { return loops == kRemaining || loops == kFill; }
  bool loop_weights_from_edges() const { return loops == kRemaining && weights.has_value() && edges > 0; }
};

// Checks the op's arguments (ValueError / TypeError naming them) and makes them contiguous.
Problem make_problem(const at::Tensor& src, const at::Tensor& dst, const std::optional<at::Tensor>& weights,
                     int64_t n_src, int64_t n_dst, int64_t loops, double fill, int64_t norm, at::ScalarType dtype,
                     c10::string_view what);

}  // namespace graph_build
}  // namespace sparsetorch
