// Ops of the fresh-graph builder (sparsetorch/_graph_build.py): the builder makes a graph's CSR, its
// transpose and both row-length statistics in one pass of torch ops and reads them with one
// device-to-host copy; this op hands the statistics to the analysis cache (common/csr_analysis.h), so
// the products on the new graph neither re-check nor re-analyse it (no second pass, no second sync).
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
}

}  // namespace sparsetorch
