// Which SpMM route runs: the one place that decides. The CUDA op's "auto", SpmmPlan's autotuning
// candidates, the layers and autograd's backward all ask these two functions, with the matrix's
// cached analysis (common/csr_analysis.h) and the shape of B. docs/routing.md has the measurements
// behind every rule.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "common/checks.h"
#include "common/csr_analysis.h"
#include "common/spmm_tuning.h"

namespace sparsetorch {

// "auto", "cusparse", "native", ...: the name parse_spmm_backend takes.
const char* spmm_route_name(SpmmBackend route);

// Whether `route` can run for `dtype` on `device`, given this build's loaded device code and the device's
// limits: "" if it can, else why not (the shared memory a block of tiled / blocked needs; cuSPARSE's and
// cuBLAS's bf16 need compute capability 8.0). Every route is available on the CPU (one kernel there); a CPU-only
// build has none on CUDA. The routing, the candidate lists and explicit backends all ask this one place.
std::string spmm_route_unavailable(SpmmBackend route, at::ScalarType dtype, const c10::Device& device);
inline bool spmm_route_available(SpmmBackend route, at::ScalarType dtype, const c10::Device& device) {
  return spmm_route_unavailable(route, dtype, device).empty();
}

// The route "auto" takes on `device`, among the routes available there. `a` is the matrix's analysis; nullptr
// when the caller opted out of validation (validate=False) and the matrix was never analysed: then only O(1)
// facts are known, and cuSPARSE -- which must never see a matrix that has not passed the check -- is not chosen.
SpmmBackend choose_spmm_route(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a,
                              const c10::Device& device);

// Whether the cuSPARSE route sums a half-precision product in float (a float32 C, then one rounding to
// the output) rather than in C's own type: where half sums lose accuracy (long rows, n > 2). `a`: the
// matrix's analysis (nullptr: unknown rows, so float).
bool cusparse_sums_in_float(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a);

struct ResolvedRoute {
  SpmmBackend route;
  std::shared_ptr<const CsrAnalysis> analysis;  // nullptr: an unchecked matrix (validate=False, never analysed)
  bool measured = false;  // "auto" took its signature's decided route (tuned or measured), not the rules'
  SpmmBackend rules_route = SpmmBackend::Auto;  // "auto": the rules' route (choose_spmm_route)
  bool has_signature = false;                   // "auto" on an analysed matrix: `signature` is set
  tuning::SpmmSignature signature;
};

// The route a spmm call on CUDA takes, exactly as the op resolves it: validates A against p.k columns
// (checked_csr: once per pattern; with validate=false only a cached verdict is used, but cuSPARSE is
// always validated); for "auto" on an analysed matrix, the route decided for its signature
// (common/spmm_tuning.h; B's layout is `b_layout`, tuning::b_layout) if there is one and this matrix
// can take it, else choose_spmm_route's. Raises ValueError on a malformed A. The tuning itself (which
// candidate an undecided signature's call runs) is the CUDA op's (csrc/cuda/spmm_autotune.cu).
ResolvedRoute resolve_spmm_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                                 at::ScalarType dtype, SpmmBackend requested, bool validate, int64_t b_layout = 0);

// The routes a plan times on its first call for a width of B: every route that can win here, without
// those the analysis shows to be pathological (a row-per-group kernel on a row of many thousand
// entries, shared-memory tiles on short rows). Blocked is listed when the shape suits it; the plan
// drops it where the layout cannot be built. Only routes available on `device` (spmm_route_available).
std::vector<SpmmBackend> spmm_route_candidates(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis* a,
                                               const c10::Device& device);

// The routes "auto" rotates through while a signature tunes, for this matrix: spmm_route_candidates
// without Blocked (a plan's own layout), `rules_route` first (added when the list lacks it).
std::vector<SpmmBackend> spmm_tuning_candidates(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis& a,
                                                SpmmBackend rules_route, const c10::Device& device);

// Whether "auto" tunes undecided signatures online (csrc/cuda/spmm_autotune.cu, docs/tuning.md): on
// unless the environment sets SPARSETORCH_AUTOTUNE=0; set_spmm_autotune switches it and returns the old
// setting. Off, decided signatures still take their routes; nothing new is tuned.
bool spmm_autotune_enabled();
bool set_spmm_autotune(bool enabled);

}  // namespace sparsetorch
