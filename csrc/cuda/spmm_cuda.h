// The CUDA SpMM routes. All take a checked SpmmProblem and write `out` (contiguous, output shape).
#pragma once

#include <ATen/ATen.h>

#include "common/activation.h"
#include "common/checks.h"
#include "common/csr_analysis.h"
#include "common/spmm_routing.h"
#include "common/spmm_tuning.h"

namespace sparsetorch {
namespace cuda {

struct SpmmEpilogue {
  double alpha = 1.0;
  double beta = 0.0;               // applied to `accumulate` when it is defined
  at::Tensor accumulate;           // undefined, or contiguous with the output's shape (may be `out`)
  at::Tensor bias;                 // undefined, or contiguous (n,)
  Activation act = Activation::None;
  double negative_slope = 0.01;
  // out = A @ B exactly: kernels may take a path without the epilogue's loads and arithmetic.
  bool is_identity() const {
    return alpha == 1.0 && !accumulate.defined() && !bias.defined() && act == Activation::None;
  }
};

// The op arguments as an epilogue: `accumulate` (contiguous, the output's shape; may be `out`) is kept
// only when beta != 0, so NaN in an ignored accumulate cannot leak; bias made contiguous.
SpmmEpilogue make_epilogue(double alpha, double beta, const at::Tensor& accumulate,
                           const std::optional<at::Tensor>& bias, c10::string_view activation,
                           double negative_slope);

// The routes that run the epilogue after the product (cuSPARSE, densify, blocked, split) end here:
// epi's bias and activation applied to `out` in one pass (bias_act_inplace_cuda), nothing when it
// has neither. alpha and the accumulate are each route's own (inside a GEMM's beta, or a pass).
void apply_bias_act(const at::Tensor& out, const SpmmEpilogue& epi);

// Own kernel: a group of 8-32 lanes per output row, 16-byte loads of B rows, fp32 accumulation for
// half types, the epilogue fused. Takes every batch layout directly (per-batch patterns, shared
// pattern, broadcasts) without copies. Entries with a column outside [0, k) and row spans outside
// [0, L] are skipped, so a malformed matrix can never fault (validate=True reports it instead).
void spmm_native(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                 const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi);

// spmm_native, decided on the device: the kernel does nothing while the int32 flag `run_flag` (one
// element, on the GPU) is 0, so a route can order a fallback without a host sync.
void spmm_native_if(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                    const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi,
                    const at::Tensor& run_flag);

// A expanded to a dense matrix in shared-memory chunks, then one cuBLAS GEMM (fp32 accumulation, no
// TF32), then the epilogue (spmm_densify.cu). Same results as the sparse routes up to rounding, also
// for NaN/Inf in B: a device-side check of B orders spmm_native_if over the output when B holds a
// non-finite value (a dense product would spread it through A's structural zeros). O(batch*m*k) memory.
void spmm_densify(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                  const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi);

// Own kernel for skewed rows: a block owns 32 rows and splits their entries evenly among its groups
// of lanes; rows cut between groups are summed in shared memory in a fixed order (spmm_balanced.cu).
// Same inputs, guarantees and epilogue as spmm_native.
void spmm_balanced(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                   const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi);

// Own kernel for skewed rows split by entries over the whole matrix: long rows cut among groups of
// lanes in any block, their pieces added in a fixed order by a second kernel; short rows never cut
// (spmm_split.cu). Same inputs, guarantees and epilogue as spmm_native; no preprocessing, scratch
// of (batch, ceil(L / E), 2, n) accumulators from the caching allocator.
void spmm_split(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi);

// Own kernel for long rows: blocks of 32-64 rows x 128-256 columns stream B through shared memory
// in 32-row tiles and share each tile row among all of a warp's rows that use it (spmm_tiled.cu).
// Same inputs, guarantees and epilogue as spmm_native; any column order, repeated columns summed.
void spmm_tiled(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi);

// cuSPARSE generic API: cusparseSpMM for one matrix; for a batch, strided batch when the pattern is
// shared (its only correct case) and one block-diagonal product when patterns differ. Bias and
// activation run as a second pass over `out`.
void spmm_cusparse(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                   const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi);

// An int32 flag (one element, on the GPU) set to 1 when B (batches of k x n, any row stride) holds a
// NaN or an infinity; no host sync (spmm_densify.cu). Routes that multiply structural zeros (densify,
// blocked) pass it to spmm_native_if so that such a B gets the sparse routes' result.
at::Tensor nonfinite_flag(const at::Tensor& dense, int64_t batches, int64_t k, int64_t n);

// Runs one route (not Auto, not Blocked) into `out` (spmm_cuda.cu).
void run_spmm_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                    const at::Tensor& dense, const at::Tensor& out, const SpmmEpilogue& epi, SpmmBackend route);

// One spmm call's route. "auto" on an analysed matrix whose signature is undecided (common/spmm_tuning.h)
// may run a candidate route as a timed sample: two pooled CUDA events around it and its host time, read
// later without a sync (spmm_autotune.cu). Otherwise `route` alone.
struct SpmmCallRoute {
  SpmmBackend route;
  SpmmBackend rules_route = SpmmBackend::Auto;  // taken instead when a sampled candidate raises
  bool sample = false;
  int64_t event_slot = -1;                      // the sample's pair of events in the pool
  tuning::SpmmSignature signature;
  double work = 0.0;                            // tuning::product_work of this call
};

// The route of an "auto" call that resolve_spmm_route left to the rules (r.route is the rules' route,
// r.analysis set): while its signature is undecided and tuning is allowed (autotune on, the current
// stream not capturing a CUDA graph), the next candidate in the signature's rotation, as a sample.
// Reads the samples of earlier calls whose events have completed first (cudaEventQuery, no sync).
SpmmCallRoute tuned_spmm_route(const SpmmProblem& p, at::ScalarType dtype, const ResolvedRoute& r);

// Runs a call's route into `out`; a sample is timed and queued for the tuning table. A sampled candidate
// that raises (out of memory, ...) is dropped from its signature and the rules' route runs instead,
// unless the epilogue reads `out` (accumulate aliasing it), where the error propagates.
void run_spmm_call(const SpmmCallRoute& route, const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                   const at::Tensor& values, const at::Tensor& dense, const at::Tensor& out,
                   const SpmmEpilogue& epi);

// Times the candidate routes for these operands now (SpmmPlan's first call for a B shape: the
// sparsetorch::spmm_tune op) and decides the matrix's signature with the fastest (every later "auto" call
// of that signature takes it). Warm-up, then interleaved rounds with the events of every sample recorded
// and read after one synchronisation (a second one when the product is so small that more rounds fit
// the budget: at most 15 rounds, more only while the time spent is under ~20x the best candidate's
// call or 1 ms); the L2 is flushed before each sample only when the product's bytes exceed it.
SpmmBackend measure_spmm_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                               const at::Tensor& values, const at::Tensor& dense, const CsrAnalysis& a);

// In place: out = act(out + bias) (elementwise_cuda.cu).
void bias_act_inplace_cuda(const at::Tensor& out, const at::Tensor& bias, Activation act, double negative_slope);

}  // namespace cuda
}  // namespace sparsetorch
