#include "common/sparse24_decode_checks.h"

#include <c10/util/Exception.h>

#include "common/checks.h"

namespace sparsetorch {
namespace {

void check_sizes(int64_t out_features, int64_t in_features) {
  TORCH_CHECK_VALUE(out_features > 0 && out_features % kSparse24DecodeRowTile == 0 && out_features < (int64_t{1} << 31),
                    "out_features: expected a positive multiple of ", kSparse24DecodeRowTile, " below 2^31, got ",
                    out_features);
  TORCH_CHECK_VALUE(in_features > 0 && in_features % kSparse24DecodeTileK == 0 && in_features < (int64_t{1} << 31),
                    "in_features: expected a positive multiple of ", kSparse24DecodeTileK, " below 2^31, got ",
                    in_features);
}

}  // namespace

Sparse24DecodeProblem check_sparse24_decode_layout(const at::Tensor& values, const at::Tensor& meta,
                                                    int64_t out_features, int64_t in_features) {
  TORCH_CHECK_TYPE(values.scalar_type() == at::kBFloat16 || values.scalar_type() == at::kHalf,
                   "values: expected bfloat16 or float16 (the 2:4 decode layout packs 16-bit values), got ",
                   values.scalar_type());
  TORCH_CHECK_TYPE(meta.scalar_type() == at::kInt, "meta: expected int32, got ", meta.scalar_type());
  check_same_device(values, "values", meta, "meta");
  check_sizes(out_features, in_features);
  Sparse24DecodeProblem p;
  p.m = out_features;
  p.k = in_features;
  p.ktp = sparse24_decode_ktiles(in_features);
  const int64_t r16 = out_features / kSparse24DecodeRowTile;
  TORCH_CHECK_VALUE(values.dim() == 4 && values.size(0) == r16 && values.size(1) == p.ktp && values.size(2) == 32 &&
                        values.size(3) == 8,
                    "values: expected shape (", r16, ", ", p.ktp, ", 32, 8) for a ", out_features, " x ", in_features,
                    " weight (pack_sparse24_decode), got ", values.sizes());
  TORCH_CHECK_VALUE(meta.dim() == 4 && meta.size(0) == r16 && meta.size(1) == p.ktp / kSparse24DecodeTilePad &&
                        meta.size(2) == 32 && meta.size(3) == 4,
                    "meta: expected shape (", r16, ", ", p.ktp / kSparse24DecodeTilePad, ", 32, 4) for a ", out_features,
                    " x ", in_features, " weight (pack_sparse24_decode), got ", meta.sizes());
  TORCH_CHECK_VALUE(values.numel() < (int64_t{1} << 40), "values: too large");
  return p;
}

Sparse24DecodeProblem check_sparse24_decode_pairs(const at::Tensor& values, const at::Tensor& col, int64_t out_features,
                                                   int64_t in_features) {
  TORCH_CHECK_TYPE(values.scalar_type() == at::kBFloat16 || values.scalar_type() == at::kHalf,
                   "values: expected bfloat16 or float16 (the 2:4 decode layout packs 16-bit values), got ",
                   values.scalar_type());
  TORCH_CHECK_TYPE(col.scalar_type() == at::kInt || col.scalar_type() == at::kLong,
                   "col_indices: expected int32 or int64, got ", col.scalar_type());
  check_same_device(values, "values", col, "col_indices");
  check_sizes(out_features, in_features);
  const int64_t entries = out_features * (in_features / 2);
  TORCH_CHECK_VALUE(values.dim() == 1 && values.size(0) == entries, "values: expected shape (", entries,
                    ",) (two entries per group of 4 columns of a ", out_features, " x ", in_features,
                    " weight), got ", values.sizes());
  TORCH_CHECK_VALUE(col.dim() == 1 && col.size(0) == entries, "col_indices: expected shape (", entries,
                    ",) (two entries per group of 4 columns of a ", out_features, " x ", in_features,
                    " weight), got ", col.sizes());
  Sparse24DecodeProblem p;
  p.m = out_features;
  p.k = in_features;
  p.ktp = sparse24_decode_ktiles(in_features);
  return p;
}

Sparse24DecodeProblem check_sparse24_decode_linear_args(const at::Tensor& x, const at::Tensor& values,
                                                        const at::Tensor& meta, int64_t out_features,
                                                        int64_t in_features, const std::optional<at::Tensor>& bias) {
  check_16bit_x(x, "2:4 decode layout");
  TORCH_CHECK_TYPE(values.scalar_type() == x.scalar_type(), "values: expected ", x.scalar_type(),
                   " (x's dtype), got ", values.scalar_type());
  TORCH_CHECK_VALUE(values.device() == x.device(), "values: expected a tensor on ", x.device(),
                    " (x's device), got ", values.device());
  check_layout_tensor(meta, "meta", at::kInt, x);
  check_sizes(out_features, in_features);
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == in_features, "x: expected shape (..., ", in_features,
                    ") (in_features), got ", x.sizes());
  Sparse24DecodeProblem p = check_sparse24_decode_layout(values, meta, out_features, in_features);
  p.n = check_packed_linear_tokens(x, out_features, bias, &p.out_shape);
  return p;
}

}  // namespace sparsetorch
