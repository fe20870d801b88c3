// Schema of csr16_linear: a pruned bf16/fp16 weight in the CSR16 layout (common/csr16_checks.h,
// sparsetorch/_csr16.py) times dense tokens. Kernels: cpu/csr16_cpu.cpp, cuda/csr16_linear.cu; fake
// kernel in sparsetorch/_csr16.py. No autograd of its own: SparseLinear differentiates through its CSR
// (the layer's autograd function calls this op for the forward only).
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // out (..., out_features) = act(x (..., in_features) @ W^T + bias), W (out_features = crow.size(0) - 1,
  // in_features = x.size(-1)) given as crow / entries; structural zeros are skipped (CSR semantics).
  m.def(
      "csr16_linear(Tensor x, Tensor crow, Tensor entries, Tensor? bias=None, str activation=\"none\", "
      "float negative_slope=0.01) -> Tensor");
}
