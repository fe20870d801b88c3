// slot_linear on the CPU: the reference for the CUDA kernel. Each group's entries are decoded to (row,
// column) and accumulated in float, one task per strip of 16 rows (at::parallel_for), entries in stored
// order; plain and banded layouts alike (slot_layout.h: only the group and slot numbering differ). The
// layout is checked first (cpu/slot_walk.h: IndexError; the CUDA kernel's scatter keeps one value per slot).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "common/activation.h"
#include "common/slot_checks.h"
#include "common/slot_layout.h"
#include "cpu/slot_walk.h"
#include "cpu/packed_value.h"

namespace sparsetorch {
namespace {

at::Tensor slot_linear_cpu(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& entries,
                           int64_t out_features, const std::optional<at::Tensor>& bias, c10::string_view activation,
                           double negative_slope, bool banded) {
  const SlotProblem p = check_slot_linear_args(x, offsets, entries, out_features, bias, banded);
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor off_c = offsets.contiguous(), entries_c = entries.contiguous();
  const int32_t* op = off_c.data_ptr<int32_t>();
  const uint32_t* ep = reinterpret_cast<const uint32_t*>(entries_c.data_ptr<int32_t>());
  const int64_t nnz = entries_c.size(0), m = p.m, k = p.k, n = p.n;
  cpu::for_each_slot_entry(p, op, ep, nnz, [](int64_t, int64_t, uint32_t) {});  // checks the layout first
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xt = x.reshape({n, k}).to(at::kFloat).t().contiguous();  // (k, n)
  const float* xp = xt.data_ptr<float>();
  const at::Tensor bias_f = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor acc_t = at::zeros({m, n}, x.options().dtype(at::kFloat));  // (m, n): a strip's rows are its task's own
  float* ap = acc_t.data_ptr<float>();
  at::parallel_for(0, p.strips, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t c = 0; c < p.chunks; ++c) {
        const int64_t g = slot_group(s, c, p.chunks, banded);
        for (int64_t j = op[g]; j < op[g + 1]; ++j) {
          int rr = 0, cc = 0;
          slot_position(fragment_slot(static_cast<int>(ep[j] & kSlotMask), banded), rr, cc);
          const float v = packed_value(ep[j], bf16);
          const float* xc = xp + (c * kBitmapGroupCols + cc) * n;
          float* row = ap + (s * kBitmapGroupRows + rr) * n;
          for (int64_t t = 0; t < n; ++t) row[t] += v * xc[t];
        }
      }
    }
  });
  at::Tensor out_f = acc_t.t().contiguous();  // (n, m)
  float* outp = out_f.data_ptr<float>();
  const float slope = static_cast<float>(negative_slope);
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t r = 0; r < m; ++r) {
        const float b = bias_f.defined() ? bias_f.data_ptr<float>()[r] : 0.f;
        outp[t * m + r] = apply_activation(act, outp[t * m + r] + b, slope);
      }
    }
  });
  return out_f.to(x.scalar_type()).view(p.out_shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("slot_linear", &slot_linear_cpu); }

}  // namespace sparsetorch
