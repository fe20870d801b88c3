// Probe glue: the kernel header, compiled with every tuning config, behind a torch-free C entry point.
#define SPARSE24_DECODE_ALL_CONFIGS 1
#include "cuda/sparse24_decode_kernel.cuh"

namespace {
namespace sp24d = sparsetorch::cuda::sp24d;

// library != 0: what the library runs (library_config), the fields given here on top; 0: plan()'s defaults.
sp24d::Config make_cfg(int m, int k, int library, int warps, int rt, int u, int splits, int last_block,
                       int blocks_per_sm, long long max_smem) {
  sp24d::Config cfg = library ? sp24d::library_config(m, k) : sp24d::Config{};
  cfg.warps = warps;
  cfg.rt = rt;
  if (u != 0) cfg.u = u;
  cfg.splits = splits;
  cfg.last_block_reduces = last_block;
  cfg.blocks_per_sm = blocks_per_sm;
  cfg.max_smem = max_smem;
  return cfg;
}
}  // namespace

extern "C" int sp24_probe_launch(int bf16, const void* values, const void* meta, const void* x, long long ldx,
                                 const void* bias, void* out, long long ldo, int m, int n, int k, int act, float slope,
                                 void* workspace, long long workspace_bytes, int counters_zeroed, int library, int warps,
                                 int rt, int u, int splits, int last_block, int blocks_per_sm, long long max_smem,
                                 int sms, long long stream, long long* plan_out) {
  const sp24d::Config cfg = make_cfg(m, k, library, warps, rt, u, splits, last_block, blocks_per_sm, max_smem);
  sp24d::Plan pl;
  cudaError_t err = sparsetorch::cuda::launch_sparse24_decode(
      bf16 != 0, values, meta, x, ldx, bias, out, ldo, m, n, k, act, slope, workspace, workspace_bytes,
      counters_zeroed != 0, cfg, sms, reinterpret_cast<cudaStream_t>(stream), &pl);
  if (plan_out != nullptr) {
    plan_out[0] = pl.nt, plan_out[1] = pl.rt, plan_out[2] = pl.u, plan_out[3] = pl.warps;
    plan_out[4] = pl.row_groups, plan_out[5] = pl.splits, plan_out[6] = pl.steps_per_split, plan_out[7] = pl.smem;
    plan_out[8] = pl.workspace_bytes;
  }
  return static_cast<int>(err);
}

// Workspace bytes a config needs (no launch).
extern "C" long long sp24_probe_workspace(int m, int n, int k, int library, int warps, int rt, int u, int splits,
                                          int blocks_per_sm, long long max_smem, int sms) {
  const sp24d::Config cfg = make_cfg(m, k, library, warps, rt, u, splits, 1, blocks_per_sm, max_smem);
  return sp24d::plan(m, n, k, sms, cfg).workspace_bytes;
}
