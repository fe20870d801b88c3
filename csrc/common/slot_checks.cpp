#include "common/slot_checks.h"

#include <c10/util/Exception.h>

#include <utility>

#include "common/bitmap_layout.h"
#include "common/checks.h"
#include "common/slot_layout.h"

namespace sparsetorch {

SlotProblem check_slot_layout(const at::Tensor& offsets, const at::Tensor& entries, int64_t out_features,
                              int64_t in_features, bool banded) {
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kInt, "offsets: expected int32, got ", offsets.scalar_type());
  TORCH_CHECK_TYPE(entries.scalar_type() == at::kInt, "entries: expected int32, got ", entries.scalar_type());
  check_same_device(entries, "entries", offsets, "offsets");
  check_out_features(out_features);
  TORCH_CHECK_VALUE(in_features >= 0 && in_features < (int64_t{1} << 31), "in_features: expected 0 .. 2^31 - 1, got ",
                    in_features);
  SlotProblem p;
  p.m = out_features;
  p.k = in_features;
  p.strips = bitmap_strips(p.m);
  p.chunks = bitmap_chunks(p.k);
  p.banded = banded;
  p.groups = slot_groups(p.strips, p.chunks, banded);
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.size(0) == p.groups + 1, "offsets: expected shape (", p.groups + 1,
                    ",) (one per group of 16 x 64", banded ? ", whole bands of two strips" : "",
                    ", and one more) for a ", p.m, " x ", p.k, " weight", banded ? " in the banded layout" : "",
                    ", got ", offsets.sizes());
  TORCH_CHECK_VALUE(entries.dim() == 1 && entries.size(0) <= kSlotMaxEntries, "entries: expected a 1-D tensor of at most ",
                    kSlotMaxEntries, " entries, got shape ", entries.sizes());
  return p;
}

SlotProblem check_slot_linear_args(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& entries,
                                   int64_t out_features, const std::optional<at::Tensor>& bias, bool banded) {
  check_16bit_x(x, "slot layout");
  check_layout_tensor(offsets, "offsets", at::kInt, x);
  check_layout_tensor(entries, "entries", at::kInt, x);
  check_out_features(out_features);
  std::vector<int64_t> out_shape;
  const int64_t n = check_packed_linear_tokens(x, out_features, bias, &out_shape);
  TORCH_CHECK_VALUE(x.size(-1) < (int64_t{1} << 31), "x: expected fewer than 2^31 in_features, got ", x.size(-1));
  SlotProblem p = check_slot_layout(offsets, entries, out_features, x.size(-1), banded);
  p.n = n;
  p.out_shape = std::move(out_shape);
  return p;
}

}  // namespace sparsetorch
