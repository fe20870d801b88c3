#include "common/csr16_checks.h"

#include <c10/util/Exception.h>

#include "common/checks.h"

namespace sparsetorch {

Csr16Problem check_csr16_linear_args(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& entries,
                                     const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
                   "x: expected bfloat16 or float16 (the CSR16 layout packs 16-bit values), got ", x.scalar_type());
  TORCH_CHECK_TYPE(crow.scalar_type() == at::kInt, "crow: expected int32, got ", crow.scalar_type());
  TORCH_CHECK_TYPE(entries.scalar_type() == at::kInt, "entries: expected int32, got ", entries.scalar_type());
  check_same_device(x, "x", crow, "crow");
  check_same_device(x, "x", entries, "entries");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least one dimension (..., in_features), got a scalar");
  TORCH_CHECK_VALUE(crow.dim() == 1 && crow.size(0) >= 1 && crow.size(0) <= (int64_t{1} << 31),
                    "crow: expected a 1-D tensor of out_features + 1 (1 .. 2^31) row pointers, got shape ", crow.sizes());
  TORCH_CHECK_VALUE(entries.dim() == 1 && entries.size(0) <= kCsr16MaxEntries,
                    "entries: expected a 1-D tensor of at most ", kCsr16MaxEntries, " entries, got shape ", entries.sizes());
  Csr16Problem p;
  p.m = crow.size(0) - 1;
  p.k = x.size(-1);
  TORCH_CHECK_VALUE(p.k <= kCsr16MaxColumns, "x: the CSR16 layout's 16-bit columns take at most ", kCsr16MaxColumns,
                    " in_features, got ", p.k);
  p.n = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) p.n *= x.size(d);
  TORCH_CHECK_VALUE(p.n < (int64_t{1} << 31), "x: expected fewer than 2^31 tokens, got shape ", x.sizes());
  if (bias.has_value()) {
    check_same_dtype(x, "x", *bias, "bias");
    check_same_device(x, "x", *bias, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == p.m, "bias: expected shape (", p.m, ",), got ", bias->sizes());
  }
  p.out_shape = x.sizes().vec();
  p.out_shape.back() = p.m;
  return p;
}

}  // namespace sparsetorch
