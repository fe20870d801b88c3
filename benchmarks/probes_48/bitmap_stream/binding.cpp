#include <torch/extension.h>
extern "C" int bms_launch(int bf16, const void* bitmaps, const void* offsets, const void* values, long long nvalues,
                          const void* x, long long ldx, int kx, void* out, const void* bias, int m, int n, int strips,
                          int chunks, int act, float slope, int splits, int sms, long long stream, int prefetch);
int64_t launch(const torch::Tensor& bitmaps, const torch::Tensor& offsets, const torch::Tensor& values,
               const torch::Tensor& x, const torch::Tensor& out, const c10::optional<torch::Tensor>& bias, int64_t m,
               int64_t strips, int64_t chunks, int64_t act, int64_t splits, int64_t sms, int64_t stream, int64_t prefetch) {
  const void* b = bias.has_value() && bias->defined() ? bias->data_ptr() : nullptr;
  return bms_launch(x.scalar_type() == torch::kBFloat16, bitmaps.data_ptr(), offsets.data_ptr(), values.data_ptr(),
                    values.numel(), x.data_ptr(), x.stride(0), static_cast<int>(x.size(1)), out.data_ptr(), b,
                    static_cast<int>(m), static_cast<int>(x.size(0)), static_cast<int>(strips), static_cast<int>(chunks),
                    static_cast<int>(act), 0.01f, static_cast<int>(splits), static_cast<int>(sms), stream, static_cast<int>(prefetch));
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) { mod.def("launch", &launch); }
