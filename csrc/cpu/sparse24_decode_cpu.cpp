// sparse24_decode_linear on the CPU: the reference for the CUDA kernel. The packed weight is decoded to a dense
// float32 W with the register mapping the kernel's mma.sp applies (cuda/sparse24_decode_kernel.cuh; the same
// walk as unpack_sparse24_decode in sparsetorch/pruned/sparse24_decode.py), then out = act(x W^T + bias) in
// float32. The metadata is checked as it is decoded (ValueError): two increasing positions per chunk, and no
// nonzero value in the padding past in_features.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <string>

#include "common/activation.h"
#include "common/sparse24_decode_checks.h"
#include "common/sparse24_decode_layout.h"

namespace sparsetorch {
namespace {

// dense (m, k) float32 from values (m/16, ktp, 32, 8) as float32 and meta (m/16, ktp/8, 32, 4), chunk by chunk
// (sparse24_decode_chunk).
at::Tensor decode_dense(const at::Tensor& values_f, const at::Tensor& meta_c, int64_t m, int64_t k, int64_t ktp) {
  at::Tensor dense = at::zeros({m, k}, values_f.options());
  float* dp = dense.data_ptr<float>();
  const float* vp = values_f.data_ptr<float>();
  const int32_t* mp = meta_c.data_ptr<int32_t>();
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t chunk = 0; chunk < ktp * 8; ++chunk) {
        const Sparse24DecodeChunk c = sparse24_decode_chunk(row, chunk, ktp);
        const uint32_t nib = (static_cast<uint32_t>(mp[c.word]) >> c.shift) & 0xfu;
        const int64_t idx[2] = {static_cast<int64_t>(nib & 3u), static_cast<int64_t>(nib >> 2)};
        TORCH_CHECK_VALUE(idx[0] < idx[1], "meta: row ", row, ", k-tile ", chunk / 8, ", chunk ", chunk % 8,
                          ": metadata nibble ", nib, " is not two increasing positions (undefined for mma.sp)");
        for (int v = 0; v < 2; ++v) {
          const float val = vp[c.value + v];
          const int64_t col = 4 * chunk + idx[v];
          if (col < k) {
            dp[row * k + col] = val;
          } else {
            TORCH_CHECK_VALUE(val == 0.f, "values: row ", row, " holds a nonzero at column ", col,
                              ", in the padding past in_features = ", k);
          }
        }
      }
    }
  });
  return dense;
}

at::Tensor sparse24_decode_linear_cpu(const at::Tensor& x, const at::Tensor& values, const at::Tensor& meta,
                                      int64_t out_features, int64_t in_features, const std::optional<at::Tensor>& bias,
                                      c10::string_view activation, double negative_slope) {
  const Sparse24DecodeProblem p =
      check_sparse24_decode_linear_args(x, values, meta, out_features, in_features, bias);
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor dense = decode_dense(values.to(at::kFloat).contiguous(), meta.contiguous(), p.m, p.k, p.ktp);
  at::Tensor out_f = at::matmul(x.reshape({p.n, p.k}).to(at::kFloat), dense.t()).contiguous();  // (n, m)
  float* op = out_f.data_ptr<float>();
  const at::Tensor bias_f = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* bp = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  const float slope = static_cast<float>(negative_slope);
  const int64_t m = p.m;
  at::parallel_for(0, p.n * m, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) op[i] = apply_activation(act, op[i] + (bp != nullptr ? bp[i % m] : 0.f), slope);
  });
  return out_f.to(x.scalar_type()).view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("sparse24_decode_linear", &sparse24_decode_linear_cpu); }

}  // namespace sparsetorch
