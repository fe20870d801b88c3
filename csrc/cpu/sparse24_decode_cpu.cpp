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

namespace sparsetorch {
namespace {

// dense (m, k) float32 from values (m/16, ktp, 32, 8) as float32 and meta (m/16, ktp/8, 32, 4).
at::Tensor decode_dense(const at::Tensor& values_f, const at::Tensor& meta_c, int64_t m, int64_t k, int64_t ktp) {
  at::Tensor dense = at::zeros({m, k}, values_f.options());
  float* dp = dense.data_ptr<float>();
  const float* vp = values_f.data_ptr<float>();
  const int32_t* mp = meta_c.data_ptr<int32_t>();
  const int64_t r16 = m / 16, mblocks = ktp / 8;
  at::parallel_for(0, r16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t rt = begin; rt < end; ++rt) {
      for (int64_t kt = 0; kt < ktp; ++kt) {
        const int32_t* words = mp + (rt * mblocks + kt / 8) * 32 * 4;
        const float* tile = vp + (rt * ktp + kt) * 32 * 8;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          for (int reg = 0; reg < 4; ++reg) {
            const int h = reg & 1, chunk = t + 4 * (reg >> 1);
            const int64_t row = rt * 16 + g + 8 * h;
            // The tile's sparsity selector is kt & 1; its metadata threads are 2 (kt & 1) + role of quad g, the
            // role holding chunks 4 role .. 4 role + 3; word (kt >> 1) & 3 of the lane's four.
            const int lane_m = 4 * g + 2 * static_cast<int>(kt & 1) + chunk / 4;
            const uint32_t word = static_cast<uint32_t>(words[lane_m * 4 + ((kt >> 1) & 3)]);
            const uint32_t nib = (word >> (4 * (chunk % 4) + 16 * h)) & 0xfu;
            const int64_t idx[2] = {static_cast<int64_t>(nib & 3u), static_cast<int64_t>(nib >> 2)};
            TORCH_CHECK_VALUE(idx[0] < idx[1], "meta: row ", row, ", k-tile ", kt, ", chunk ", chunk,
                              ": metadata nibble ", nib, " is not two increasing positions (undefined for mma.sp)");
            for (int v = 0; v < 2; ++v) {
              const float val = tile[lane * 8 + 2 * reg + v];
              const int64_t col = kt * 32 + 4 * chunk + idx[v];
              if (col < k) {
                dp[row * k + col] = val;
              } else {
                TORCH_CHECK_VALUE(val == 0.f, "values: row ", row, " holds a nonzero at column ", col,
                                  ", in the padding past in_features = ", k);
              }
            }
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
