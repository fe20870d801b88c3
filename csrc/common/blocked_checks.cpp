// Argument checks of spmm_blocked (see blocked_layout.h), shared by the CPU and CUDA kernels.
#include <c10/util/Exception.h>

#include "common/blocked_layout.h"
#include "common/checks.h"

namespace sparsetorch {

SpmmProblem check_blocked_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                               const at::Tensor& run_ptr, const at::Tensor& block_col, const at::Tensor& pair_values,
                               const at::Tensor& dense, const std::optional<at::Tensor>& accumulate,
                               const std::optional<at::Tensor>& bias) {
  const SpmmProblem sp = check_spmm_args(crow, col, values, dense, accumulate, bias);
  TORCH_CHECK_VALUE(!sp.batched && !sp.pattern_batched && !sp.values_batched,
                    "spmm_blocked: expected one unbatched A and a 2-D dense, got crow_indices of shape ",
                    crow.sizes(), " and dense of shape ", dense.sizes());
  TORCH_CHECK_TYPE(run_ptr.scalar_type() == at::kInt, "run_ptr: expected int32, got ", run_ptr.scalar_type());
  TORCH_CHECK_TYPE(block_col.scalar_type() == at::kInt, "block_col: expected int32, got ", block_col.scalar_type());
  TORCH_CHECK_TYPE(pair_values.scalar_type() == at::kFloat && dense.scalar_type() == at::kFloat,
                   "spmm_blocked: expected float32 pair_values and dense, got ", pair_values.scalar_type(), " and ",
                   dense.scalar_type());
  check_same_device(pair_values, "pair_values", run_ptr, "run_ptr");
  check_same_device(pair_values, "pair_values", block_col, "block_col");
  check_same_device(pair_values, "pair_values", dense, "dense");
  const int64_t runs = blocked_runs(sp.m, sp.k);
  TORCH_CHECK_VALUE(run_ptr.dim() == 2 && run_ptr.size(0) == 2 && run_ptr.size(1) == runs + 1, "run_ptr: expected shape (2, ",
                    runs + 1, ") for ", sp.m, " rows and ", sp.k,
                    " columns (the layout of sparsetorch/pruned/blocked.py), got ", run_ptr.sizes());
  TORCH_CHECK_VALUE(block_col.dim() == 1, "block_col: expected a 1-D tensor, got shape ", block_col.sizes());
  TORCH_CHECK_VALUE(pair_values.dim() == 2 && pair_values.size(1) == 2,
                    "pair_values: expected shape (pairs, 2), got ", pair_values.sizes());
  TORCH_CHECK_VALUE(block_col.size(0) < (int64_t{1} << 31) && pair_values.size(0) < (int64_t{1} << 31),
                    "spmm_blocked: at most 2^31 - 1 blocks and pairs, got ", block_col.size(0), " and ",
                    pair_values.size(0));
  return sp;
}

}  // namespace sparsetorch
