// Python binding of the probe kernel: raw pointers from tensors, the stream as an int64 (no CUDA headers).
#include <torch/extension.h>

#include <vector>

extern "C" int sp24_probe_launch(int bf16, const void* values, const void* meta, const void* x, long long ldx,
                                 const void* bias, void* out, long long ldo, int m, int n, int k, int act, float slope,
                                 void* workspace, long long workspace_bytes, int counters_zeroed, int library, int warps,
                                 int rt, int u, int splits, int last_block, int blocks_per_sm, long long max_smem,
                                 int sms, long long stream, long long* plan_out, int cluster);
extern "C" long long sp24_probe_workspace(int m, int n, int k, int library, int warps, int rt, int u, int splits,
                                          int blocks_per_sm, long long max_smem, int sms, int cluster);

// Returns [cuda error code, nt, rt, u, warps, row_groups, splits, steps_per_split, smem, workspace_bytes].
std::vector<int64_t> launch(const torch::Tensor& values, const torch::Tensor& meta, const torch::Tensor& x, int64_t ldx,
                            const c10::optional<torch::Tensor>& bias, const torch::Tensor& out, int64_t ldo, int64_t m,
                            int64_t n, int64_t k, int64_t act, double slope, const torch::Tensor& workspace,
                            bool counters_zeroed, int64_t library, int64_t warps, int64_t rt, int64_t u, int64_t splits,
                            int64_t last_block, int64_t blocks_per_sm, int64_t max_smem, int64_t sms, int64_t stream, int64_t cluster) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kHalf, "x: bf16 or fp16");
  TORCH_CHECK(values.scalar_type() == x.scalar_type() && out.scalar_type() == x.scalar_type(), "dtypes differ");
  TORCH_CHECK(meta.scalar_type() == torch::kInt32, "meta: int32");
  long long plan[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const void* bias_ptr = bias.has_value() && bias->defined() ? bias->data_ptr() : nullptr;
  const int err = sp24_probe_launch(
      x.scalar_type() == torch::kBFloat16, values.data_ptr(), meta.data_ptr(), x.data_ptr(), ldx, bias_ptr,
      out.data_ptr(), ldo, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), static_cast<int>(act),
      static_cast<float>(slope), workspace.numel() > 0 ? workspace.data_ptr() : nullptr,
      static_cast<long long>(workspace.numel() * workspace.element_size()), counters_zeroed ? 1 : 0,
      static_cast<int>(library), static_cast<int>(warps), static_cast<int>(rt), static_cast<int>(u),
      static_cast<int>(splits),
      static_cast<int>(last_block), static_cast<int>(blocks_per_sm), max_smem, static_cast<int>(sms), stream, plan, static_cast<int>(cluster));
  std::vector<int64_t> r{err};
  for (long long v : plan) r.push_back(v);
  return r;
}

int64_t workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t library, int64_t warps, int64_t rt, int64_t u,
                        int64_t splits, int64_t blocks_per_sm, int64_t max_smem, int64_t sms, int64_t cluster) {
  return sp24_probe_workspace(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), static_cast<int>(library),
                              static_cast<int>(warps), static_cast<int>(rt), static_cast<int>(u), static_cast<int>(splits),
                              static_cast<int>(blocks_per_sm), max_smem, static_cast<int>(sms), static_cast<int>(cluster));
}

extern "C" int sp24_probe_occupancy(int nt, int rt, int u, int warps, long long smem, int* regs);
std::vector<int64_t> occupancy(int64_t nt, int64_t rt, int64_t u, int64_t warps, int64_t smem) {
  int regs = 0;
  const int b = sp24_probe_occupancy(static_cast<int>(nt), static_cast<int>(rt), static_cast<int>(u), static_cast<int>(warps), smem, &regs);
  return {b, regs};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("launch", &launch);
  mod.def("workspace_bytes", &workspace_bytes);
  mod.def("occupancy", &occupancy);
}
