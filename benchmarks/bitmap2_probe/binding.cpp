// Probe binding for bitmap2 (no CUDA headers: raw pointers, the stream as an int64).
#include <torch/extension.h>

#include <vector>

extern "C" int bm2_plan(int bf16, int flags, int m, int k, int n, int warps, int stages, int stage_bytes,
                        int blocks_per_sm, int64_t* out);
extern "C" int bm2_run(int bf16, int flags, const void* blob, int64_t blob_units, const int* offsets, const void* x,
                       int64_t ldx, const void* bias, void* y, void* workspace, void* stamps, int m, int k, int n,
                       int act, float slope, int warps, int stages, int stage_bytes, int blocks_per_sm, int64_t stream);

// (nt, tiles, grid, total_warps, smem, counters, partial_floats, workspace_bytes, blocks_per_sm, accum_floats, rc)
std::vector<int64_t> plan(int64_t bf16, int64_t flags, int64_t m, int64_t k, int64_t n, int64_t warps, int64_t stages,
                          int64_t stage_bytes, int64_t blocks_per_sm) {
  std::vector<int64_t> out(10, 0);
  const int rc = bm2_plan((int)bf16, (int)flags, (int)m, (int)k, (int)n, (int)warps, (int)stages, (int)stage_bytes,
                          (int)blocks_per_sm, out.data());
  out.push_back(rc);
  return out;
}

int64_t run(int64_t flags, torch::Tensor blob, torch::Tensor offsets, torch::Tensor x, c10::optional<torch::Tensor> bias,
            torch::Tensor y, torch::Tensor workspace, c10::optional<torch::Tensor> stamps, int64_t m, int64_t k,
            int64_t act, double slope, int64_t warps, int64_t stages, int64_t stage_bytes, int64_t blocks_per_sm,
            int64_t stream) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) == k, "x: (n, k) with unit column stride");
  TORCH_CHECK(offsets.scalar_type() == torch::kInt32 && blob.scalar_type() == torch::kUInt8, "blob/offsets dtypes");
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  return bm2_run(bf16 ? 1 : 0, (int)flags, blob.data_ptr(), blob.numel() / 16, offsets.data_ptr<int>(), x.data_ptr(),
                 x.stride(0), bias.has_value() ? bias->data_ptr() : nullptr, y.data_ptr(), workspace.data_ptr(),
                 stamps.has_value() ? stamps->data_ptr() : nullptr, (int)m, (int)k, (int)x.size(0), (int)act,
                 (float)slope, (int)warps, (int)stages, (int)stage_bytes, (int)blocks_per_sm, stream);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("plan", &plan);
  mod.def("run", &run);
}
