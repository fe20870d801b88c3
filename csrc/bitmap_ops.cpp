// Schema of bitmap_linear: a pruned weight in the bitmap-tile layout (common/bitmap_layout.h,
// sparsetorch/_bitmap.py) times dense tokens. Kernels: cpu/bitmap_cpu.cpp, cuda/bitmap_linear.cu;
// fake kernel and autograd in sparsetorch/_bitmap.py.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // out (..., out_features) = act(x (..., in_features) @ W^T + bias), W (out_features, in_features) given
  // as bitmaps / offsets / values. The t_* and csr_* tensors are not read by the product: they are W^T
  // in the same layout (t_index: which of `values` each of its values is) and W's CSR pattern
  // (csr_index: the CSR slot of each of `values`), which the backward needs for grad x and grad values;
  // sparsetorch.bitmap_linear passes them only when autograd records.
  m.def(
      "bitmap_linear(Tensor x, Tensor bitmaps, Tensor offsets, Tensor values, int out_features, Tensor? bias=None, "
      "str activation=\"none\", float negative_slope=0.01, Tensor? t_bitmaps=None, Tensor? t_offsets=None, "
      "Tensor? t_index=None, Tensor? csr_crow=None, Tensor? csr_col=None, Tensor? csr_index=None) -> Tensor");
}
