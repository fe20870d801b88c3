// Ops that expose the per-matrix analysis cache and the routing module to Python (SpmmPlan's
// autotuning candidates, st.validate_csr, st.analyze, st.spmm_route, the benchmarks). They run on
// any device: the analysis itself dispatches csr_stats to the matrix's device.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/checks.h"
#include "common/csr_analysis.h"
#include "common/spmm_routing.h"

namespace sparsetorch {
namespace {

AnalysisMode mode_for(bool force) { return force ? AnalysisMode::kForce : AnalysisMode::kCompute; }

at::Tensor csr_analysis_op(const at::Tensor& crow, const at::Tensor& col, int64_t ncols, bool force) {
  const auto a = analyze_csr(crow, col, ncols, mode_for(force));
  at::Tensor out = at::empty({csr_stats::kLength}, at::TensorOptions().dtype(at::kLong));
  std::memcpy(out.data_ptr<int64_t>(), a->raw.data(), sizeof(int64_t) * csr_stats::kLength);
  return out;
}

void csr_validate_op(const at::Tensor& crow, const at::Tensor& col, int64_t ncols, bool force) {
  const auto a = analyze_csr(crow, col, ncols, mode_for(force));
  if (!a->valid()) TORCH_CHECK_VALUE(false, a->defect("validate_csr"));
}

std::string spmm_route_op(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                          const at::Tensor& dense, c10::string_view backend, bool validate, bool as_cuda) {
  const SpmmBackend requested = parse_spmm_backend(std::string(backend));
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, std::nullopt);
  if (!values.is_cuda() && !as_cuda) {
    checked_csr(crow, col, p.k, validate, "spmm");
    return "cpu";  // one kernel
  }
  return spmm_route_name(resolve_spmm_route(p, crow, col, values.scalar_type(), requested, validate).route);
}

std::vector<std::string> spmm_route_candidates_op(const at::Tensor& crow, const at::Tensor& col,
                                                  const at::Tensor& values, const at::Tensor& dense) {
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, std::nullopt);
  const auto a = checked_csr(crow, col, p.k, /*validate=*/true, "SpmmPlan");
  std::vector<std::string> names;
  for (SpmmBackend r : spmm_route_candidates(p, values.scalar_type(), a.get())) names.emplace_back(spmm_route_name(r));
  return names;
}

bool set_autotune_op(bool enabled) { return set_spmm_autotune(enabled); }

int64_t csr_analysis_cache_op(bool clear) {
  if (clear) clear_csr_analysis_cache();
  return csr_analysis_cache_size();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // The cached analysis of a pattern (validated against ncols columns; ncols < 0: columns unchecked)
  // as the int64 vector of common/csr_analysis.h, on the CPU. force=True recomputes it. Never raises
  // for a malformed matrix: the vector says what is wrong.
  m.def("csr_analysis(Tensor crow_indices, Tensor col_indices, int ncols, bool force=False) -> Tensor");
  // Raises ValueError naming the first defect of a malformed pattern; the verdict is cached.
  m.def("csr_validate(Tensor crow_indices, Tensor col_indices, int ncols, bool force=False) -> ()");
  // The route the spmm op takes for these operands ("cpu" on the CPU), validating as the op does.
  // as_cuda=True: the route the CUDA op would take for operands of these shapes and this analysis,
  // wherever they are (to test and inspect the routing decision without a GPU).
  m.def(
      "spmm_route(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense, str backend=\"auto\", "
      "bool validate=True, bool as_cuda=False) -> str");
  // The routes SpmmPlan times for these operands (CUDA).
  m.def("spmm_route_candidates(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense) -> str[]");
  // Switches the measuring of routes on a matrix's second use (csrc/cuda/spmm_autotune.cu) on or off;
  // returns the old setting.
  m.def("set_autotune(bool enabled) -> bool", &set_autotune_op);
  // CUDA: times the candidate routes for these operands now, keeps the fastest with A's analysis (every
  // later "auto" call with this B shape takes it) and returns its name. SpmmPlan's first call.
  m.def("spmm_tune(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense) -> str");
  // Entries in the analysis cache; clear=True empties it first.
  m.def("csr_analysis_cache(bool clear=False) -> int", &csr_analysis_cache_op);
}

TORCH_LIBRARY_IMPL(sparsetorch, CompositeExplicitAutograd, m) {
  m.impl("csr_analysis", &csr_analysis_op);
  m.impl("csr_validate", &csr_validate_op);
  m.impl("spmm_route", &spmm_route_op);
  m.impl("spmm_route_candidates", &spmm_route_candidates_op);
}

}  // namespace sparsetorch
