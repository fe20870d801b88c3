// Argument checks of slot_linear (layout in slot_layout.h), shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace sparsetorch {

// Entries at most this many: the CUDA kernel's stream positions (up to 128 past the last entry) stay in int32.
constexpr int64_t kSlotMaxEntries = (int64_t{1} << 31) - 1024;

// One slot_linear call: out (..., m) = act(x (..., k) @ W^T + bias), W (m, k) in the slot layout.
struct SlotProblem {
  int64_t m = 0, k = 0, n = 0;  // n: tokens, the product of x's leading dimensions
  int64_t strips = 0, chunks = 0;
  bool banded = false;  // the layout's variant (slot_layout.h)
  int64_t groups = 0;   // slot_groups(strips, chunks, banded)
  std::vector<int64_t> out_shape;
};

// O(1) checks, ValueError / TypeError naming the argument: x bfloat16 or float16, offsets int32 of
// slot_groups(ceil(out_features / 16), ceil(in_features / 64), banded) + 1 entries, entries int32 1-D, both
// on x's device, bias (out_features,) of x's dtype. The contents are not read here: the CPU kernel checks
// them as it reads (IndexError), the CUDA kernel clamps what it reads (a bad layout gives a wrong product
// there, never a fault); sparsetorch.SlotWeight builds layouts from validated CSR matrices only.
// The layout alone (slot_to_dense; the last checks of the one below): offsets and entries int32 on one device,
// offsets of slot_groups(...) + 1 entries for an out_features x in_features weight, entries 1-D. n = 0.
SlotProblem check_slot_layout(const at::Tensor& offsets, const at::Tensor& entries, int64_t out_features,
                              int64_t in_features, bool banded);

SlotProblem check_slot_linear_args(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& entries,
                                   int64_t out_features, const std::optional<at::Tensor>& bias, bool banded);

}  // namespace sparsetorch
