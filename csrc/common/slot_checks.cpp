#include "common/slot_checks.h"

#include <c10/util/Exception.h>

#include "common/bitmap_layout.h"
#include "common/checks.h"
#include "common/slot_layout.h"

namespace sparsetorch {

SlotProblem check_slot_linear_args(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& entries,
                                   int64_t out_features, const std::optional<at::Tensor>& bias, bool banded) {
  check_16bit_x(x, "slot layout");
  check_layout_tensor(offsets, "offsets", at::kInt, x);
  check_layout_tensor(entries, "entries", at::kInt, x);
  check_out_features(out_features);
  SlotProblem p;
  p.m = out_features;
  p.n = check_packed_linear_tokens(x, p.m, bias, &p.out_shape);
  p.k = x.size(-1);
  TORCH_CHECK_VALUE(p.k < (int64_t{1} << 31), "x: expected fewer than 2^31 in_features, got ", p.k);
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

}  // namespace sparsetorch
