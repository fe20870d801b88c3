#include "common/csr16_checks.h"

#include <c10/util/Exception.h>

#include "common/checks.h"

namespace sparsetorch {

Csr16Problem check_csr16_linear_args(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& entries,
                                     const std::optional<at::Tensor>& bias) {
  check_16bit_x(x, "CSR16 layout");
  check_layout_tensor(crow, "crow", at::kInt, x);
  check_layout_tensor(entries, "entries", at::kInt, x);
  TORCH_CHECK_VALUE(crow.dim() == 1 && crow.size(0) >= 1 && crow.size(0) <= (int64_t{1} << 31),
                    "crow: expected a 1-D tensor of out_features + 1 (1 .. 2^31) row pointers, got shape ", crow.sizes());
  TORCH_CHECK_VALUE(entries.dim() == 1 && entries.size(0) <= kCsr16MaxEntries,
                    "entries: expected a 1-D tensor of at most ", kCsr16MaxEntries, " entries, got shape ", entries.sizes());
  Csr16Problem p;
  p.m = crow.size(0) - 1;
  p.n = check_packed_linear_tokens(x, p.m, bias, &p.out_shape);
  p.k = x.size(-1);
  TORCH_CHECK_VALUE(p.k <= kCsr16MaxColumns, "x: the CSR16 layout's 16-bit columns take at most ", kCsr16MaxColumns,
                    " in_features, got ", p.k);
  return p;
}

}  // namespace sparsetorch
