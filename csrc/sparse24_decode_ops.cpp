// Schema of sparse24_decode_linear: a 2:4-pruned bf16/fp16 weight in the packed decode layout
// (common/sparse24_decode_checks.h, sparsetorch/pruned/sparse24_decode.py) times few tokens. Kernels:
// cpu/sparse24_decode_cpu.cpp (a reference: decode, then a float32 product), cuda/sparse24_decode_linear.cu
// (mma.sp, cuda/sparse24_decode_kernel.cuh); fake kernel in sparsetorch/pruned/sparse24_decode.py. No
// autograd: the layer differentiates through its CSR (it calls this op for the forward only).
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // out (..., out_features) = act(x (..., in_features) @ W^T + bias), W (out_features x in_features) given as
  // values / meta (pack_sparse24_decode). Any number of tokens; the CUDA kernel is built for up to 64 per
  // launch (more run as several launches) and pays off at few (decode).
  m.def(
      "sparse24_decode_linear(Tensor x, Tensor values, Tensor meta, int out_features, int in_features, "
      "Tensor? bias=None, str activation=\"none\", float negative_slope=0.01) -> Tensor");
}
