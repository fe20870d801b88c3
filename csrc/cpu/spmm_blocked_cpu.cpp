// spmm_blocked on the CPU: the reference for the CUDA kernel and what a CPU SpmmPlan with
// backend="blocked" runs. One task per strip of eight rows (at::parallel_for); each block's row of B
// is multiplied into the accumulator rows of the pairs it stores, then the epilogue alpha * acc +
// beta * C + bias -> activation. The layout is described in common/blocked_layout.h; its contents
// are checked here (spans in range, pairs per block matching the pattern, columns in their chunk).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <vector>

#include "common/activation.h"
#include "common/blocked_layout.h"
#include "common/csr_analysis.h"

namespace sparsetorch {
namespace {

at::Tensor spmm_blocked_cpu(const at::Tensor& crow, const at::Tensor& col_indices, const at::Tensor& values,
                            const at::Tensor& run_ptr, const at::Tensor& block_col, const at::Tensor& pair_values,
                            const at::Tensor& dense, double alpha, const std::optional<at::Tensor>& accumulate,
                            double beta, const std::optional<at::Tensor>& bias, c10::string_view activation,
                            double negative_slope) {
  const SpmmProblem p = check_blocked_args(crow, col_indices, values, run_ptr, block_col, pair_values, dense,
                                              accumulate, bias);
  checked_csr(crow, col_indices, p.k, /*validate=*/true, "spmm_blocked");  // SpmmPlan checked it: a cache hit
  // A block multiplies its zeros too, and 0 * inf is NaN where the sparse routes skip the position:
  // a B holding NaN/Inf goes to the CSR kernel.
  if (!at::isfinite(dense).all().item<bool>()) {
    static const auto spmm = c10::Dispatcher::singleton().findSchemaOrThrow("sparsetorch::spmm", "").typed<
        at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                   const std::optional<at::Tensor>&, double, const std::optional<at::Tensor>&, c10::string_view,
                   double, c10::string_view, bool)>();
    return spmm.call(crow, col_indices, values, dense, alpha, accumulate, beta, bias, activation, negative_slope,
                     "auto", true);
  }
  const Activation act = parse_activation(std::string(activation));
  const at::Tensor ptr_c = run_ptr.contiguous(), col_c = block_col.contiguous();
  const at::Tensor val_c = pair_values.contiguous(), b_c = dense.contiguous();
  const at::Tensor acc_c = accumulate.has_value() && beta != 0.0 ? accumulate->contiguous() : at::Tensor();
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty({p.m, p.n}, dense.options());
  const int64_t runs = blocked_runs(p.m, p.k);
  const int32_t* block_ptr = ptr_c.data_ptr<int32_t>();
  const int32_t* pair_ptr = block_ptr + runs + 1;
  const int32_t* col = col_c.data_ptr<int32_t>();
  const float* val = val_c.data_ptr<float>();
  const float* b = b_c.data_ptr<float>();
  const float* c = acc_c.defined() ? acc_c.data_ptr<float>() : nullptr;
  const float* bias_p = bias_c.defined() ? bias_c.data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  const int64_t blocks = block_col.size(0), pairs = pair_values.size(0);
  const int64_t n = p.n, k = p.k, chunks = blocked_chunks(p.k), strips = blocked_strips(p.m);
  const float slope = static_cast<float>(negative_slope);
  at::parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(kStripRows * n);
    for (int64_t strip = begin; strip < end; ++strip) {
      std::fill(acc.begin(), acc.end(), 0.f);
      const int64_t tile = strip / kTileStrips, in_tile = strip % kTileStrips;
      for (int64_t ch = 0; ch < chunks; ++ch) {
        for (int pattern = 1; pattern < kPatterns; ++pattern) {
          const int64_t run = ((tile * chunks + ch) * kTileStrips + in_tile) * kPatterns + pattern;
          const int64_t b0 = block_ptr[run], b1 = block_ptr[run + 1], p0 = pair_ptr[run], p1 = pair_ptr[run + 1];
          TORCH_CHECK_INDEX(0 <= b0 && b0 <= b1 && b1 <= blocks && 0 <= p0 && p0 <= p1 && p1 <= pairs &&
                                p1 - p0 == (b1 - b0) * pattern_pairs(pattern),
                            "run_ptr: run ", run, " (pattern ", pattern, ") spans blocks [", b0, ", ", b1,
                            ") and pairs [", p0, ", ", p1, "): outside [0, ", blocks, "] x [0, ", pairs,
                            "] or not ", pattern_pairs(pattern), " pairs per block");
          const float* pv = val + 2 * p0;
          for (int64_t e = b0; e < b1; ++e) {
            const int64_t kk = ch * kChunkCols + col[e];
            TORCH_CHECK_INDEX(col[e] >= 0 && col[e] < kChunkCols && kk < k, "block_col: entry ", e, " is ", col[e],
                              ", outside its chunk of columns");
            const float* brow = b + kk * n;
            for (int j = 0; j < kStripPairs; ++j) {
              if (!(pattern >> j & 1)) continue;
              const float top = pv[0], bottom = pv[1];
              pv += 2;
              float* acc_top = acc.data() + 2 * j * n;
              float* acc_bottom = acc_top + n;
              for (int64_t q = 0; q < n; ++q) {
                acc_top[q] += top * brow[q];
                acc_bottom[q] += bottom * brow[q];
              }
            }
          }
        }
      }
      for (int64_t r = 0; r < kStripRows; ++r) {
        const int64_t row = strip * kStripRows + r;
        if (row >= p.m) break;
        for (int64_t q = 0; q < n; ++q) {
          float z = static_cast<float>(alpha) * acc[r * n + q];
          if (c != nullptr) z += static_cast<float>(beta) * c[row * n + q];
          if (bias_p != nullptr) z += bias_p[q];
          o[row * n + q] = apply_activation(act, z, slope);
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) { m.impl("spmm_blocked", &spmm_blocked_cpu); }

}  // namespace sparsetorch
