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
  TORCH_CHECK_TYPE(bitmaps.scalar_type() == at::kLong, "bitmaps: expected int64, got ", bitmaps.scalar_type());
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kInt, "offsets: expected int32, got ", offsets.scalar_type());
  check_same_device(x, "x", bitmaps, "bitmaps");
  check_same_device(x, "x", offsets, "offsets");
  check_same_device(x, "x", values, "values");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least one dimension (..., in_features), got a scalar");
  TORCH_CHECK_VALUE(out_features >= 0 && out_features < (int64_t{1} << 31), "out_features: expected 0 <= out_features < 2^31, got ",
                    out_features);
  BitmapProblem p;
  p.m = out_features;
  p.k = x.size(-1);
  p.n = x.numel() / std::max<int64_t>(p.k, 1);
  if (p.k == 0) {
    p.n = 1;
    for (int64_t d = 0; d + 1 < x.dim(); ++d) p.n *= x.size(d);
  }
  p.strips = bitmap_strips(p.m);
  p.chunks = bitmap_chunks(p.k);
  TORCH_CHECK_VALUE(p.k < (int64_t{1} << 31) && p.n < (int64_t{1} << 31), "x: expected fewer than 2^31 tokens and in_features, got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(bitmaps.dim() == 3 && bitmaps.size(0) == p.strips && bitmaps.size(1) == p.chunks &&
                        bitmaps.size(2) == kBitmapQuadrants,
                    "bitmaps: expected shape (", p.strips, ", ", p.chunks, ", 16) for a ", p.m, " x ", p.k,
                    " weight (x has ", p.k, " features), got ", bitmaps.sizes());
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.size(0) == p.strips * p.chunks + 1, "offsets: expected shape (",
                    p.strips * p.chunks + 1, ",), got ", offsets.sizes());
  TORCH_CHECK_VALUE(values.dim() == 1 && values.size(0) < (int64_t{1} << 31), "values: expected a 1-D tensor of fewer than 2^31 values, got shape ",
                    values.sizes());
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
