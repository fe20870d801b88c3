// Ops of the fresh-graph builder (sparsetorch/_graph_build.py): _build_graph makes a graph's CSR, its
// transpose and both row-length statistics in one op (common/graph_build.h; CPU and CUDA kernels) and
// records them in the analysis cache (common/csr_analysis.h), so the products on the new graph neither
// re-check nor re-analyse it; _csr_analysis_store does the recording for the torch-op builder.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "common/csr_analysis.h"

namespace sparsetorch {
namespace {

void csr_analysis_store_op(const at::Tensor& crow, const at::Tensor& col, int64_t ncols, const at::Tensor& raw) {
  store_csr_analysis(crow, col, ncols, raw);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // Internal (leading underscore): `raw` is the csr_stats vector (common/csr_analysis.h) of a pattern
  // that is valid by construction; on the CPU.
  m.def("_csr_analysis_store(Tensor crow_indices, Tensor col_indices, int ncols, Tensor raw) -> ()",
        &csr_analysis_store_op);
  // Internal: loops 0..3 and norm 0..2 as in common/graph_build.h. Returns [crow, col, values, crow_t,
  // col_t, values_t, perm, summary] and records both matrices' analyses; summary: the CPU int64 vector of
  // graph_build::kSummaryLength values (on CUDA pinned, and valid only once the check has landed). The node
  // counts are SymInts so that torch.compile(dynamic=True) keeps them symbolic (one graph for every batch
  // size); the kernels take them as int64.
  m.def(
      "_build_graph(Tensor src, Tensor dst, Tensor? weights, SymInt n_src, SymInt n_dst, int loops, float fill, int norm, "
      "ScalarType dtype, str what) -> Tensor[]");
}

}  // namespace sparsetorch
