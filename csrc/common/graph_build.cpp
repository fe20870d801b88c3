#include "common/graph_build.h"

#include <limits>

namespace sparsetorch {
namespace graph_build {

Problem make_problem(const at::Tensor& src, const at::Tensor& dst, const std::optional<at::Tensor>& weights,
                     int64_t n_src, int64_t n_dst, int64_t loops, double fill, int64_t norm, at::ScalarType dtype,
                     c10::string_view what) {
  TORCH_CHECK_VALUE(src.dim() == 1 && dst.dim() == 1 && src.size(0) == dst.size(0),
                    "_build_graph: src and dst must be 1-D of one length, got shapes ", src.sizes(), " and ",
                    dst.sizes());
  TORCH_CHECK_TYPE((src.scalar_type() == at::kInt || src.scalar_type() == at::kLong) &&
                       src.scalar_type() == dst.scalar_type(),
                   "_build_graph: src and dst must be int32 or int64 of one dtype, got ", src.scalar_type(), " and ",
                   dst.scalar_type());
  TORCH_CHECK_VALUE(src.device() == dst.device(), "_build_graph: src and dst must be on one device");
  TORCH_CHECK_VALUE(n_src >= 0 && n_dst >= 0, "_build_graph: node counts must be >= 0, got ", n_src, " and ", n_dst);
  TORCH_CHECK_VALUE(loops >= kNoLoops && loops <= kAdd, "_build_graph: loops must be 0..3, got ", loops);
  TORCH_CHECK_VALUE(norm >= kNoNorm && norm <= kMean, "_build_graph: norm must be 0..2, got ", norm);
  TORCH_CHECK_VALUE((loops == kNoLoops && norm != kGcn) || n_src == n_dst,
                    "_build_graph: self loops and the GCN norm need a square graph, got ", n_src, " sources and ",
                    n_dst, " targets");
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
                   "_build_graph: dtype must be a floating type, got ", dtype);
  Problem p;
  p.src = src.contiguous();
  p.dst = dst.contiguous();
  p.edges = src.size(0);
  TORCH_CHECK_VALUE(p.edges == 0 || (n_src > 0 && n_dst > 0), "_build_graph: ", p.edges,
                    " edges given for a graph of ", n_src, " sources and ", n_dst, " targets");
  if (weights.has_value()) {
    TORCH_CHECK_VALUE(weights->dim() == 1 && weights->size(0) == p.edges && weights->device() == src.device(),
                      "_build_graph: weights must be 1-D with one value per edge on the edges' device, got shape ",
                      weights->sizes());
    TORCH_CHECK_TYPE(weights->scalar_type() == dtype, "_build_graph: weights must be of dtype ", dtype, ", got ",
                     weights->scalar_type());
    p.weights = weights->contiguous();
  }
  p.n_src = n_src;
  p.n_dst = n_dst;
  p.loops = static_cast<Loops>(loops);
  p.norm = static_cast<Norm>(norm);
  p.fill = fill;
  p.dtype = dtype;
  p.what = std::string(what);
  p.nodes = loops == kNoLoops ? 0 : n_dst;
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  // The counts and row pointers reach edges + nodes (sparsetorch/_ops.py's fake kernel repeats this rule).
  p.index_dtype = std::max({n_src, n_dst, p.candidates()}) < kIntMax - 1 ? at::kInt : at::kLong;
  return p;
}

}  // namespace graph_build
}  // namespace sparsetorch
