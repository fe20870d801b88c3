// Probe glue: the kernel header, compiled with every tuning config, behind a torch-free C entry point.
#define SPARSE24_DECODE_ALL_CONFIGS 0
#include "cuda/sparse24_decode_kernel.cuh"

namespace {
namespace sp24d = sparsetorch::cuda::sp24d;

// library != 0: what the library runs (library_config), the fields given here on top; 0: plan()'s defaults.
sp24d::Config make_cfg(int m, int k, int library, int warps, int rt, int u, int splits, int last_block,
                       int blocks_per_sm, long long max_smem, int cluster = -1) {
  // library: library_config (cluster: -1 or 1 = as on sm_90, 0 = without); the nonzero fields on top.
  sp24d::Config cfg = library ? sp24d::library_config(m, k, cluster != 0) : sp24d::Config{};
  if (warps) cfg.warps = warps;
  if (rt) cfg.rt = rt;
  if (u != 0) cfg.u = u;
  cfg.splits = splits;
  cfg.last_block_reduces = last_block;
  cfg.blocks_per_sm = blocks_per_sm;
  cfg.max_smem = max_smem;
  if (cluster >= 0) cfg.cluster = cluster;
  return cfg;
}
}  // namespace

extern "C" int sp24_probe_launch(int bf16, const void* values, const void* meta, const void* x, long long ldx,
                                 const void* bias, void* out, long long ldo, int m, int n, int k, int act, float slope,
                                 void* workspace, long long workspace_bytes, int counters_zeroed, int library, int warps,
                                 int rt, int u, int splits, int last_block, int blocks_per_sm, long long max_smem,
                                 int sms, long long stream, long long* plan_out, int cluster) {
  const sp24d::Config cfg = make_cfg(m, k, library, warps, rt, u, splits, last_block, blocks_per_sm, max_smem, cluster);
  sp24d::Plan pl;
  cudaError_t err = sparsetorch::cuda::launch_sparse24_decode(
      bf16 != 0, values, meta, x, ldx, bias, out, ldo, m, n, k, act, slope, workspace, workspace_bytes,
      counters_zeroed != 0, cfg, sms, reinterpret_cast<cudaStream_t>(stream), &pl);
  if (plan_out != nullptr) {
    plan_out[0] = pl.nt, plan_out[1] = pl.rt, plan_out[2] = pl.u, plan_out[3] = pl.warps;
    plan_out[4] = pl.row_groups, plan_out[5] = pl.splits, plan_out[6] = pl.steps_per_split, plan_out[7] = pl.smem;
    plan_out[8] = pl.workspace_bytes;
    plan_out[9] = pl.cluster ? 1 : 0;
  }
  return static_cast<int>(err);
}

// Workspace bytes a config needs (no launch).
extern "C" long long sp24_probe_workspace(int m, int n, int k, int library, int warps, int rt, int u, int splits,
                                          int blocks_per_sm, long long max_smem, int sms, int cluster) {
  const sp24d::Config cfg = make_cfg(m, k, library, warps, rt, u, splits, 1, blocks_per_sm, max_smem, cluster);
  return sp24d::plan(m, n, k, sms, cfg).workspace_bytes;
}

namespace {
template <typename T, int RT, int U>
const void* kernel_nt(int nt) {
  switch (nt) {
    case 1: return reinterpret_cast<const void*>(sp24d::sparse24_decode_kernel<T, 1, RT, U>);
    case 2: return reinterpret_cast<const void*>(sp24d::sparse24_decode_kernel<T, 2, RT, U>);
    case 4: return reinterpret_cast<const void*>(sp24d::sparse24_decode_kernel<T, 4, RT, U>);
    default: return reinterpret_cast<const void*>(sp24d::sparse24_decode_kernel<T, 8, RT, U>);
  }
}
}  // namespace

// Resident blocks per SM of the bf16 kernel (nt, rt, u) at warps * 32 threads and smem bytes; regs per thread out.
extern "C" int sp24_probe_occupancy(int nt, int rt, int u, int warps, long long smem, int* regs) {
  using T = __nv_bfloat16;
  const void* k = nullptr;
  if (rt == 1 && u == 4) k = kernel_nt<T, 1, 4>(nt);
  if (rt == 1 && u == 8) k = kernel_nt<T, 1, 8>(nt);
  if (rt == 2 && u == 4) k = kernel_nt<T, 2, 4>(nt);
  if (rt == 2 && u == 8) k = kernel_nt<T, 2, 8>(nt);
  if (k == nullptr) return -1;
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, k) != cudaSuccess) return -2;
  *regs = attr.numRegs;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);  // never lowered (the launcher caches its opt-in)
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, warps * 32, static_cast<size_t>(smem)) != cudaSuccess) return -3;
  return blocks;
}
