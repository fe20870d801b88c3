// Argument checks of bitmap_linear (layout in bitmap_layout.h), shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace sparsetorch {

// One bitmap_linear call: out (..., m) = act(x (..., k) @ W^T + bias), W (m, k) in the bitmap layout.
struct BitmapProblem {
  int64_t m = 0, k = 0, n = 0;  // n: tokens, the product of x's leading dimensions
  int64_t strips = 0, chunks = 0;
  std::vector<int64_t> out_shape;
};

// O(1) checks: dtypes (x, values and bias of one float dtype; bitmaps int64, offsets int32), devices,
// and shapes (bitmaps (ceil(m / 16), ceil(k / 64), 16), offsets (strips * chunks + 1,), values 1-D,
// bias (m,)). The contents of the layout are not checked here: the CPU kernel checks them as it reads,
// the CUDA kernel clamps what it reads (a bad layout gives a wrong product there, never a fault).
// ValueError / TypeError naming the argument.
BitmapProblem check_bitmap_linear_args(const at::Tensor& x, const at::Tensor& bitmaps, const at::Tensor& offsets,
                                       const at::Tensor& values, int64_t out_features,
                                       const std::optional<at::Tensor>& bias);

}  // namespace sparsetorch
