// Test hooks: ops that exist for the test suite only, in their own library (torch.ops.sparsetorch_testing.*),
// never in the production `sparsetorch` namespace. Each drives a native mechanism the way the real op does,
// with synthetic inputs, so that its bookkeeping can be tested on a machine without the hardware it serves.
#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/spmm_routing.h"
#include "common/spmm_tuning.h"
#include "cuda/bitmap_plan.h"
#include "cuda/build_targets.h"
#include "cuda/slot_plan.h"
#include "cuda/sparse24_decode_plan.h"
#include "cuda/spmm_plans.h"
#ifdef SPARSETORCH_WITH_CUDA
#include "cuda/device_code.h"
#endif

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

// --- The launch plans against faked device limits, the CUDA-targets messages, the kernel-image check.
namespace sparsetorch {
namespace {

// The launch plan kernel `kernel`'s launcher makes for `shape` on a GPU with `limits` = (SMs, shared memory per
// SM, reserved per block, opt-in per block[, threads per SM]) -- the plan headers' pure functions, so that the
// plans are checked against smaller GPUs than the ones at hand (tests/test_launch_plans.py). Shapes:
// bitmap (m, n, k, values), slot (m, n, k, banded), sparse24_decode (m, n, k; `cluster`: the loaded kernel has
// the cluster path), tiled (element bytes), blocked (m, n, k), split (entries, rows, n, lanes).
c10::Dict<std::string, int64_t> launch_plan_op(const std::string& kernel, c10::IntArrayRef shape,
                                               c10::IntArrayRef limits, bool cluster) {
  TORCH_CHECK_VALUE(limits.size() == 4 || limits.size() == 5,
                    "launch_plan: limits = (sms, smem_per_sm, smem_reserved, smem_per_block[, threads_per_sm])");
  cuda::LaunchLimits lim;
  lim.sms = static_cast<int>(limits[0]);
  lim.smem_per_sm = limits[1];
  lim.smem_reserved = limits[2];
  lim.smem_per_block = limits[3];
  const int threads_per_sm = limits.size() == 5 ? static_cast<int>(limits[4]) : 2048;
  auto need = [&](size_t n) {
    TORCH_CHECK_VALUE(shape.size() == n, "launch_plan: ", kernel, " takes ", n, " shape values, got ", shape.size());
  };
  c10::Dict<std::string, int64_t> d;
  if (kernel == "bitmap") {
    need(4);
    const cuda::bitmap::Launch l = cuda::bitmap::choose_launch(shape[0], shape[1], shape[2], shape[3], lim.sms,
                                                               lim.smem_per_sm, lim.smem_reserved, lim.smem_per_block);
    d.insert("threads", cuda::bitmap::kThreads);
    d.insert("smem", l.smem);
    d.insert("min_blocks", cuda::bitmap::min_blocks(l.nt, l.dense));  // the kernel's launch bound
    d.insert("nt", l.nt);
    d.insert("dense", l.dense);
    d.insert("batch", l.batch);
    d.insert("stage_values", l.stage_values);
    d.insert("ws", l.ws);
    d.insert("wk", l.wk);
    d.insert("splits", l.splits);
    d.insert("chunks_per_split", l.chunks_per_split);
    d.insert("column_tiles", l.column_tiles);
    d.insert("row_blocks", l.row_blocks);
  } else if (kernel == "slot") {
    need(4);
    const bool banded = shape[3] != 0;
    const cuda::slot::Launch l = cuda::slot::choose_launch(shape[0], shape[1], shape[2], banded, lim.sms,
                                                           lim.smem_per_sm, lim.smem_reserved, lim.smem_per_block);
    d.insert("threads", cuda::slot::kThreads);
    d.insert("smem", l.smem);
    d.insert("min_blocks", l.held ? cuda::slot::kHeldBlocks : cuda::slot::blocks_per_sm(l.nt, banded));
    d.insert("nt", l.nt);
    d.insert("held", l.held);
    d.insert("ws", l.ws);
    d.insert("wk", l.wk);
    d.insert("splits", l.splits);
    d.insert("chunks_per_split", l.chunks_per_split);
    d.insert("column_tiles", l.column_tiles);
    d.insert("row_blocks", l.row_blocks);
    d.insert("units", l.units);
  } else if (kernel == "sparse24_decode") {
    need(3);
    const int m = static_cast<int>(shape[0]), n = static_cast<int>(shape[1]), k = static_cast<int>(shape[2]);
    TORCH_CHECK_VALUE(m > 0 && m % 16 == 0 && k > 0 && k % 32 == 0 && n >= 1,
                      "launch_plan: sparse24_decode needs m % 16 == 0, k % 32 == 0, n >= 1");
    // As sparse24_decode_linear.cu plans a call: the tokens 64 at a time, the full chunk's plan.
    const cuda::sp24d::Config cfg = cuda::sp24d::library_config(m, k, cluster, lim.smem_per_block);
    const cuda::sp24d::Plan pl = cuda::sp24d::plan(m, std::min(n, cuda::sp24d::kMaxTokens), k, lim.sms, cfg);
    d.insert("threads", int64_t{pl.warps} * 32);
    d.insert("smem", pl.smem);
    d.insert("nt", pl.nt);
    d.insert("rt", pl.rt);
    d.insert("u", pl.u);
    d.insert("warps", pl.warps);
    d.insert("row_groups", pl.row_groups);
    d.insert("splits", pl.splits);
    d.insert("steps_per_split", pl.steps_per_split);
    d.insert("ktp", pl.ktp);
    d.insert("cluster", pl.cluster);
    d.insert("workspace_bytes", pl.workspace_bytes);
  } else if (kernel == "tiled") {
    need(1);
    d.insert("threads", cuda::tiled::kThreads);
    d.insert("smem", cuda::tiled::smem_bytes(static_cast<int>(shape[0])));
  } else if (kernel == "blocked") {
    need(3);
    d.insert("threads", cuda::blocked::kThreads);
    d.insert("smem", cuda::blocked::kSharedBytes);
    d.insert("splits", cuda::blocked::splits(shape[0], (shape[1] + 3) / 4 * 4, shape[2], lim.sms));
  } else if (kernel == "split") {
    need(4);
    d.insert("unit_entries", cuda::split::unit_entries(shape[0], shape[1], shape[2], static_cast<int>(shape[3]),
                                                       lim.sms, threads_per_sm));
  } else {
    TORCH_CHECK_VALUE(false, "launch_plan: unknown kernel '", kernel,
                      "' (bitmap, slot, sparse24_decode, tiled, blocked, split)");
  }
  return d;
}

// spmm_route_unavailable's answer for a GPU with these limits (cuda/spmm_plans.h).
std::string spmm_route_limits_op(const std::string& route, at::ScalarType dtype, int64_t smem_per_block,
                                 int64_t cc_major, int64_t cc_minor) {
  return cuda::route_limits_unmet(parse_spmm_backend(route), dtype, smem_per_block, static_cast<int>(cc_major),
                                  static_cast<int>(cc_minor));
}

std::vector<std::string> parse_build_targets_op(const std::string& encoded) {
  return cuda::parse_build_targets(encoded);
}

std::string no_kernel_image_message_op(int64_t device, const std::string& name, int64_t major, int64_t minor,
                                       const std::vector<std::string>& targets) {
  return cuda::no_kernel_image_message(static_cast<int>(device), name, static_cast<int>(major),
                                       static_cast<int>(minor), targets);
}

std::string old_device_code_message_op(const std::string& what, const std::string& needs, int64_t min_arch,
                                       int64_t arch, int64_t device, int64_t major, int64_t minor,
                                       const std::vector<std::string>& targets) {
  return cuda::old_device_code_message(what, needs, static_cast<int>(min_arch), static_cast<int>(arch),
                                       static_cast<int>(device), static_cast<int>(major), static_cast<int>(minor),
                                       targets);
}

void simulate_no_kernel_image_op(bool on) {
#ifdef SPARSETORCH_WITH_CUDA
  cuda::simulate_no_kernel_image(on);
#else
  TORCH_CHECK(!on, "simulate_no_kernel_image: this build of sparsetorch has no CUDA code");
#endif
}

std::vector<int64_t> device_code_probe_op(int64_t device) {
#ifdef SPARSETORCH_WITH_CUDA
  const std::pair<int, int> r = cuda::device_code_probe(static_cast<int>(device));
  return {r.first, r.second};
#else
  (void)device;
  TORCH_CHECK(false, "device_code_probe: this build of sparsetorch has no CUDA code");
#endif
}

}  // namespace
}  // namespace sparsetorch

TORCH_LIBRARY_FRAGMENT(sparsetorch_testing, m) {
  m.def("launch_plan(str kernel, int[] shape, int[] limits, bool cluster=False) -> Dict(str, int)",
        &sparsetorch::launch_plan_op);
  m.def("spmm_route_limits(str route, ScalarType dtype, int smem_per_block, int cc_major, int cc_minor) -> str",
        &sparsetorch::spmm_route_limits_op);
  m.def("parse_build_targets(str encoded) -> str[]", &sparsetorch::parse_build_targets_op);
  m.def("no_kernel_image_message(int device, str name, int major, int minor, str[] targets) -> str",
        &sparsetorch::no_kernel_image_message_op);
  m.def(
      "old_device_code_message(str what, str needs, int min_arch, int arch, int device, int major, int minor, "
      "str[] targets) -> str",
      &sparsetorch::old_device_code_message_op);
  // Every CUDA op's kernel-image check then fails as if this build had no code for the GPU (cuda/device_code.h).
  m.def("simulate_no_kernel_image(bool on) -> ()", &sparsetorch::simulate_no_kernel_image_op);
  // (__CUDA_ARCH__ the probe kernel's code saw on the GPU, kernel_arch() of it): the two must agree.
  m.def("device_code_probe(int device) -> int[]", &sparsetorch::device_code_probe_op);
}
