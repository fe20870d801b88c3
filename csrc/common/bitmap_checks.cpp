#include "common/bitmap_checks.h"

#include <c10/util/Exception.h>

#include "common/bitmap_layout.h"
#include "common/checks.h"

namespace sparsetorch {

BitmapProblem check_bitmap_linear_args(const at::Tensor& x, const at::Tensor& bitmaps, const at::Tensor& offsets,
                                       const at::Tensor& values, int64_t out_features,
                                       const std::optional<at::Tensor>& bias) {
  check_float_dtype(x, "x");
  check_same_dtype(x, "x", values, "values");
  check_layout_tensor(bitmaps, "bitmaps", at::kLong, x);
  check_layout_tensor(offsets, "offsets", at::kInt, x);
  check_same_device(x, "x", values, "values");
  check_out_features(out_features);
  BitmapProblem p;
  p.m = out_features;
  p.n = check_packed_linear_tokens(x, p.m, bias, &p.out_shape);
  p.k = x.size(-1);
  TORCH_CHECK_VALUE(p.k < (int64_t{1} << 31), "x: expected fewer than 2^31 in_features, got shape ", x.sizes());
  p.strips = bitmap_strips(p.m);
  p.chunks = bitmap_chunks(p.k);
  TORCH_CHECK_VALUE(bitmaps.dim() == 3 && bitmaps.size(0) == p.strips && bitmaps.size(1) == p.chunks &&
                        bitmaps.size(2) == kBitmapQuadrants,
                    "bitmaps: expected shape (", p.strips, ", ", p.chunks, ", 16) for a ", p.m, " x ", p.k,
                    " weight (x has ", p.k, " features), got ", bitmaps.sizes());
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.size(0) == p.strips * p.chunks + 1, "offsets: expected shape (",
                    p.strips * p.chunks + 1, ",), got ", offsets.sizes());
  TORCH_CHECK_VALUE(values.dim() == 1 && values.size(0) < (int64_t{1} << 31), "values: expected a 1-D tensor of fewer than 2^31 values, got shape ",
                    values.sizes());
  return p;
}

}  // namespace sparsetorch
