// Schemas of the routing module's answers and of the tuning table of "auto" (common/spmm_routing.h,
// common/spmm_tuning.h, docs/tuning.md), with their host implementations: st.spmm_route, SpmmPlan's
// candidates and measurement, st.set_autotune and sparsetorch/tuning.py's table. They run on any device:
// a matrix's analysis dispatches csr_stats to the matrix's device.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/checks.h"
#include "common/csr_analysis.h"
#include "common/spmm_routing.h"
#include "common/spmm_tuning.h"

namespace sparsetorch {
namespace {

std::string spmm_route_op(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                          const at::Tensor& dense, c10::string_view backend, bool validate, bool as_cuda) {
  const SpmmBackend requested = parse_spmm_backend(std::string(backend));
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, std::nullopt);
  if (!values.is_cuda() && !as_cuda) {
    checked_csr(crow, col, p.k, validate, "spmm");
    return "cpu";  // one kernel
  }
  return spmm_route_name(
      resolve_spmm_route(p, crow, col, values.scalar_type(), requested, validate, tuning::b_layout(dense)).route);
}

std::vector<std::string> spmm_route_candidates_op(const at::Tensor& crow, const at::Tensor& col,
                                                  const at::Tensor& values, const at::Tensor& dense) {
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, std::nullopt);
  const auto a = checked_csr(crow, col, p.k, /*validate=*/true, "SpmmPlan");
  std::vector<std::string> names;
  for (SpmmBackend r : spmm_route_candidates(p, values.scalar_type(), a.get(), values.device())) {
    names.emplace_back(spmm_route_name(r));
  }
  return names;
}

bool set_autotune_op(bool enabled) { return set_spmm_autotune(enabled); }

// --- the tuning table (common/spmm_tuning.h; sparsetorch/tuning.py is the Python face) ----------------

std::tuple<std::string, std::vector<int64_t>> spmm_tuning_signature_op(const at::Tensor& crow, const at::Tensor& col,
                                                                       const at::Tensor& values,
                                                                       const at::Tensor& dense) {
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, std::nullopt);
  checked_csr(crow, col, p.k, /*validate=*/true, "spmm");
  const auto a = analyze_csr(crow, col, p.k, AnalysisMode::kFinal);  // a signature needs the real statistics
  const tuning::SpmmSignature s = tuning::signature(p, values.scalar_type(), *a, tuning::b_layout(dense),
                                                    tuning::device_id(values.device()));
  return {tuning::device_name(s.device), std::vector<int64_t>(s.f.begin(), s.f.end())};
}

// Every entry (least recently used first) as plain lists: device names, the signatures' fields one after
// another, the decided route ("" while undecided) and the candidates' state as
// "route:issued:cost,cost,...:flag" joined by ';' (flag: "", "dropped" or "failed"; costs in ms).
std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<std::string>, std::vector<std::string>>
spmm_tuning_export_op(bool decided_only) {
  tuning::poll_pending();
  std::vector<std::string> devices, routes, details;
  std::vector<int64_t> fields;
  for (const tuning::EntryView& e : tuning::TuningTable::global().entries(decided_only)) {
    devices.push_back(tuning::device_name(e.sig.device));
    fields.insert(fields.end(), e.sig.f.begin(), e.sig.f.end());
    routes.emplace_back(e.decided ? spmm_route_name(*e.decided) : "");
    std::ostringstream d;
    d.precision(6);
    for (size_t i = 0; i < e.candidates.size(); ++i) {
      const tuning::CandidateView& c = e.candidates[i];
      d << (i ? ";" : "") << spmm_route_name(c.route) << ":" << c.issued << ":";
      for (size_t j = 0; j < c.costs.size(); ++j) d << (j ? "," : "") << c.costs[j];
      d << ":" << (c.failed ? "failed" : c.dropped ? "dropped" : "");
    }
    details.push_back(d.str());
  }
  return {devices, fields, routes, details};
}

// Decided entries from plain lists (a cache file): entry i is devices[i], signatures[i*F:(i+1)*F] and
// routes[i]. Entries with an unknown route or a wrong length are skipped; a signature this process has
// decided itself keeps its decision unless overwrite. Returns how many were taken.
int64_t spmm_tuning_import_op(const std::vector<std::string>& devices, c10::IntArrayRef signatures,
                              const std::vector<std::string>& routes, bool overwrite) {
  constexpr size_t F = tuning::kFields;
  TORCH_CHECK_VALUE(devices.size() == routes.size() && signatures.size() == F * devices.size(),
                    "spmm_tuning_import: expected ", F, " signature fields per entry and one route per device, got ",
                    devices.size(), " devices, ", signatures.size(), " fields, ", routes.size(), " routes");
  int64_t taken = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    SpmmBackend route;
    try {
      route = parse_spmm_backend(routes[i]);
    } catch (const c10::Error&) {
      continue;
    }
    if (route == SpmmBackend::Auto || route == SpmmBackend::Blocked) continue;
    tuning::TuningTable::global().decide(
        tuning::signature_from_fields(devices[i], signatures.slice(i * F, F), "spmm_tuning_import"), route, overwrite);
    ++taken;
  }
  return taken;
}

// [entries, decided, samples in flight, generation, capacity, signature version, fields per signature]
std::vector<int64_t> spmm_tuning_stats_op() {
  const int64_t in_flight = tuning::poll_pending();
  tuning::TuningTable& t = tuning::TuningTable::global();
  return {t.size(), t.decided_count(), in_flight, t.generation(), t.capacity(), tuning::kSignatureVersion,
          static_cast<int64_t>(tuning::kFields)};
}

void spmm_tuning_clear_op() { tuning::TuningTable::global().clear(); }

int64_t spmm_tuning_capacity_op(int64_t capacity) {
  tuning::TuningTable& t = tuning::TuningTable::global();
  return capacity == 0 ? t.capacity() : t.set_capacity(capacity);  // (a negative bound raises)
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // The route the spmm op takes for these operands ("cpu" on the CPU), validating as the op does.
  // as_cuda=True: the route the CUDA op would take for operands of these shapes and this analysis,
  // wherever they are (to test and inspect the routing decision without a GPU).
  m.def(
      "spmm_route(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense, str backend=\"auto\", "
      "bool validate=True, bool as_cuda=False) -> str");
  // The routes SpmmPlan times for these operands (CUDA).
  m.def("spmm_route_candidates(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense) -> str[]");
  // Switches the online tuning of "auto" (csrc/cuda/spmm_autotune.cu) on or off; returns the old setting.
  // Off, signatures already decided keep their routes.
  m.def("set_autotune(bool enabled) -> bool", &set_autotune_op);
  // CUDA: times the candidate routes for these operands now, decides their signature with the fastest
  // (every later "auto" call of that signature takes it) and returns its name. SpmmPlan's first call.
  m.def("spmm_tune(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense) -> str");
  // The tuning table of "auto" (common/spmm_tuning.h, docs/tuning.md; sparsetorch/tuning.py wraps these).
  // The signature "auto" keys these operands' decision on: (device name, fields).
  m.def("spmm_tuning_signature(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense) -> (str, int[])");
  // Entries as plain lists (devices, fields flattened, decided routes, candidates' state).
  m.def("spmm_tuning_export(bool decided_only=False) -> (str[], int[], str[], str[])", &spmm_tuning_export_op);
  // Decided entries from plain lists (a cache file); returns how many were taken.
  m.def("spmm_tuning_import(str[] devices, int[] signatures, str[] routes, bool overwrite=False) -> int",
        &spmm_tuning_import_op);
  m.def("spmm_tuning_stats() -> int[]", &spmm_tuning_stats_op);
  m.def("spmm_tuning_clear() -> ()", &spmm_tuning_clear_op);
  // Sets the table's bound (capacity > 0) and returns the old one; 0 only returns it.
  m.def("spmm_tuning_capacity(int capacity=0) -> int", &spmm_tuning_capacity_op);
}

TORCH_LIBRARY_IMPL(sparsetorch, CompositeExplicitAutograd, m) {
  m.impl("spmm_route", &spmm_route_op);
  m.impl("spmm_route_candidates", &spmm_route_candidates_op);
  m.impl("spmm_tuning_signature", &spmm_tuning_signature_op);
}

}  // namespace sparsetorch
