// csr16_linear on the CPU: the reference for the CUDA kernel. x is transposed to (k, n) in the accumulate
// type once, so each entry's token loop is contiguous; one task per block of rows (at::parallel_for),
// each row summed in entry order. The layout is checked as it is read: IndexError.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "common/activation.h"
#include "common/csr16_checks.h"
#include "cpu/packed_value.h"

namespace sparsetorch {
namespace {

at::Tensor csr16_linear_cpu(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& entries,
                            const std::optional<at::Tensor>& bias, c10::string_view activation, double negative_slope) {
  const Csr16Problem p = check_csr16_linear_args(x, crow, entries, bias);
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor crow_c = crow.contiguous(), entries_c = entries.contiguous();
  const int32_t* rp = crow_c.data_ptr<int32_t>();
  const uint32_t* ep = reinterpret_cast<const uint32_t*>(entries_c.data_ptr<int32_t>());
  const int64_t nnz = entries_c.size(0), m = p.m, k = p.k, n = p.n;
  TORCH_CHECK_INDEX(rp[0] == 0 && rp[m] == nnz, "crow: expected to run from 0 to ", nnz, " (the number of entries), got ",
                    rp[0], " .. ", rp[m]);
  for (int64_t r = 0; r < m; ++r) {
    TORCH_CHECK_INDEX(rp[r] <= rp[r + 1], "crow: expected non-decreasing row pointers, got crow[", r, "] = ", rp[r],
                      " > crow[", r + 1, "] = ", rp[r + 1]);
  }
  at::parallel_for(0, nnz, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      TORCH_CHECK_INDEX(static_cast<int64_t>(ep[j] & 0xffffu) < k, "entries: entry ", j, " has column ", ep[j] & 0xffffu,
                        ", expected < in_features = ", k);
    }
  });
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xt = x.reshape({n, k}).to(at::kFloat).t().contiguous();  // (k, n)
  const float* xp = xt.data_ptr<float>();
  const at::Tensor bias_f = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor out_f = at::empty({n, m}, x.options().dtype(at::kFloat));
  float* op = out_f.data_ptr<float>();
  const float slope = static_cast<float>(negative_slope);
  at::parallel_for(0, m, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
    std::vector<float> acc(n);
    for (int64_t r = begin; r < end; ++r) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = rp[r]; j < rp[r + 1]; ++j) {
        const float v = packed_value(ep[j], bf16);
        const float* xc = xp + static_cast<int64_t>(ep[j] & 0xffffu) * n;
        for (int64_t t = 0; t < n; ++t) acc[t] += v * xc[t];
      }
      const float b = bias_f.defined() ? bias_f.data_ptr<float>()[r] : 0.f;
      for (int64_t t = 0; t < n; ++t) op[t * m + r] = apply_activation(act, acc[t] + b, slope);
    }
  });
  return out_f.to(x.scalar_type()).view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("csr16_linear", &csr16_linear_cpu); }

}  // namespace sparsetorch
