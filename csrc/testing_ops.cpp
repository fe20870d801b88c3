// Test hooks: ops that exist for the test suite only, in their own library (torch.ops.sparsetorch_testing.*),
// never in the production `sparsetorch` namespace. Each drives a native mechanism the way the real op does,
// with synthetic inputs, so that its bookkeeping can be tested on a machine without the hardware it serves.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/spmm_routing.h"
#include "common/spmm_tuning.h"

namespace sparsetorch {
namespace {

// The choice the tuning table gives a call of this signature (what csrc/cuda/spmm_autotune.cu asks it).
std::tuple<std::string, bool> spmm_tuning_next_op(const std::string& device, c10::IntArrayRef signature,
                                                  const std::vector<std::string>& candidates, bool tune) {
  std::vector<SpmmBackend> routes;
  for (const std::string& name : candidates) routes.push_back(parse_spmm_backend(name));
  TORCH_CHECK_VALUE(!routes.empty(), "spmm_tuning_next: no candidates");
  const tuning::TuningChoice c = tuning::TuningTable::global().next(
      tuning::signature_from_fields(device, signature, "spmm_tuning_next"), routes, tune && spmm_autotune_enabled());
  return {spmm_route_name(c.route), c.sample};
}

// A sample's outcome, as the CUDA op records it once its events have completed.
void spmm_tuning_record_op(const std::string& device, c10::IntArrayRef signature, const std::string& route,
                           double device_ms, double host_ms, double work, const std::string& outcome) {
  const tuning::SpmmSignature s = tuning::signature_from_fields(device, signature, "spmm_tuning_record");
  const SpmmBackend r = parse_spmm_backend(route);
  tuning::TuningTable& t = tuning::TuningTable::global();
  if (outcome == "ok") {
    t.record(s, r, device_ms, host_ms, work);
  } else if (outcome == "lost") {
    t.lost(s, r);
  } else if (outcome == "failed") {
    t.fail(s, r);
  } else {
    TORCH_CHECK_VALUE(false, "spmm_tuning_record: outcome must be 'ok', 'lost' or 'failed', got '", outcome, "'");
  }
}

}  // namespace
}  // namespace sparsetorch

TORCH_LIBRARY(sparsetorch_testing, m) {
  // The tuning table of "auto" (common/spmm_tuning.h), driven as the CUDA op drives it (tests/test_tuning.py).
  m.def("spmm_tuning_next(str device, int[] signature, str[] candidates, bool tune=True) -> (str, bool)",
        &sparsetorch::spmm_tuning_next_op);
  m.def(
      "spmm_tuning_record(str device, int[] signature, str route, float device_ms=0., float host_ms=0., "
      "float work=1., str outcome=\"ok\") -> ()",
      &sparsetorch::spmm_tuning_record_op);
}
