// Argument checks of spmm_blocked (see blocked_layout.h), shared by the CPU and CUDA kernels.
#include <c10/util/Exception.h>

#include "common/blocked_layout.h"
#include "common/checks.h"

namespace sparsetorch {

SpmmProblem check_blocked_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                                  const at::Tensor& tile_ptr, const at::Tensor& block_col,
                                  const at::Tensor& block_values, const at::Tensor& dense,
                                  const std::optional<at::Tensor>& accumulate, const std::optional<at::Tensor>& bias) {
  const SpmmProblem sp = check_spmm_args(crow, col, values, dense, accumulate, bias);
  TORCH_CHECK_VALUE(!sp.batched && !sp.pattern_batched && !sp.values_batched,
                    "spmm_blocked: expected one unbatched A and a 2-D dense, got crow_indices of shape ",
                    crow.sizes(), " and dense of shape ", dense.sizes());
  TORCH_CHECK_TYPE(tile_ptr.scalar_type() == at::kInt, "tile_ptr: expected int32, got ", tile_ptr.scalar_type());
  TORCH_CHECK_TYPE(block_col.scalar_type() == at::kInt, "block_col: expected int32, got ", block_col.scalar_type());
  TORCH_CHECK_TYPE(block_values.scalar_type() == at::kFloat && dense.scalar_type() == at::kFloat,
                   "spmm_blocked: expected float32 block_values and dense, got ", block_values.scalar_type(),
                   " and ", dense.scalar_type());
  check_same_device(block_values, "block_values", tile_ptr, "tile_ptr");
  check_same_device(block_values, "block_values", block_col, "block_col");
  check_same_device(block_values, "block_values", dense, "dense");
  TORCH_CHECK_VALUE(tile_ptr.dim() == 1 && block_col.dim() == 1,
                    "tile_ptr and block_col: expected 1-D tensors, got shapes ", tile_ptr.sizes(), " and ",
                    block_col.sizes());
  TORCH_CHECK_VALUE(block_values.dim() == 2 && block_values.size(1) == kBlockRows &&
                        block_values.size(0) == block_col.size(0),
                    "block_values: expected shape (", block_col.size(0), ", ", kBlockRows, "), got ",
                    block_values.sizes());
  const int64_t slots = blocked_tiles(sp.m) * blocked_chunks(sp.k) * kTileGroups + 1;
  TORCH_CHECK_VALUE(tile_ptr.size(0) == slots, "tile_ptr: expected ", slots, " entries for ", sp.m, " rows and ",
                    sp.k, " columns (the layout of sparsetorch/_blocked.py), got ", tile_ptr.size(0));
  TORCH_CHECK_VALUE(block_col.size(0) < (int64_t{1} << 31), "block_col: at most 2^31 - 1 blocks, got ",
                    block_col.size(0));
  return sp;
}

}  // namespace sparsetorch
