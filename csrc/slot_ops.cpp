// Schema of slot_linear: a pruned bf16/fp16 weight in the slot layout (common/slot_layout.h,
// sparsetorch/_slots.py) times dense tokens. Kernels: cpu/slot_cpu.cpp, cuda/slot_linear.cu; fake kernel
// in sparsetorch/_slots.py. No autograd of its own: SparseLinear differentiates through its CSR.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // out (..., out_features) = act(x (..., in_features) @ W^T + bias), W (out_features, in_features) given
  // as offsets / entries, in the plain or the banded group and slot order (`banded`).
  m.def(
      "slot_linear(Tensor x, Tensor offsets, Tensor entries, int out_features, Tensor? bias=None, "
      "str activation=\"none\", float negative_slope=0.01, bool banded=False) -> Tensor");
}
