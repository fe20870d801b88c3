// Schemas of the pruned-weight forms: a pruned linear layer's weight in a packed layout times dense tokens,
// y = act(x @ W^T + bias). SparseLinear (sparsetorch/nn/linear.py) picks among them; each form's Python side
// (layout, fake kernel, and autograd where it has its own) is in sparsetorch/pruned/. Kernels: cpu/*_cpu.cpp
// and cuda/*.cu.
#include <torch/library.h>

#include <cstdint>

namespace sparsetorch {
#ifdef SPARSETORCH_WITH_CUSPARSELT
int64_t cusparselt_compiled_version();  // cuda/cusparselt_linear.cu
#else
static int64_t cusparselt_compiled_version() { return 0; }
#endif
}  // namespace sparsetorch

TORCH_LIBRARY_FRAGMENT(sparsetorch, m) {
  // --- 2:4 semi-structured (cuSPARSELt, cuda/cusparselt_linear.cu). CUDA-only: on the CPU,
  // sparsetorch/pruned/sparse24.py multiplies the same 2:4 + residual split with a dense reference path. A
  // CUDA build without cuSPARSELt registers kernels that raise a clear error; cusparselt_version() says which
  // one this build has (0: none).
  // The weight (m, k) float16/bfloat16, at most 2 nonzeros in each group of 4 consecutive entries of a row
  // (m and k multiples of 16), compressed by cuSPARSELt: uint8 bytes (the kept values and their 2-bit
  // positions), the operand of sparse24_linear.
  m.def("sparse24_compress(Tensor weight) -> Tensor");
  // cuSPARSELt's own check of the 2:4 structure of a weight as sparse24_compress takes it: int32 [1], 0 = valid.
  m.def("sparse24_check(Tensor weight) -> Tensor");
  // y (N, m) = act(x @ (W + R)^T + bias): x (N, k) of the weight's dtype; W given compressed (out_features = m);
  // R an optional CSR residual (m x k; crow (m+1), col, values), added through cuSPARSELt's C operand.
  // alg: -1 = cuSPARSELt's default algorithm, else a code returned by sparse24_search for this shape.
  m.def(
      "sparse24_linear(Tensor x, Tensor compressed, int out_features, Tensor? residual_crow=None, "
      "Tensor? residual_col=None, Tensor? residual_values=None, Tensor? bias=None, str activation=\"none\", "
      "float negative_slope=0.01, int alg=-1) -> Tensor");
  // Runs cusparseLtMatmulSearch for sparse24_linear with these operands (x's row count included) and returns
  // the algorithm code to pass as `alg` (the configuration, split-k and its mode); synchronises the device.
  m.def(
      "sparse24_search(Tensor x, Tensor compressed, int out_features, bool residual=False, Tensor? bias=None, "
      "str activation=\"none\") -> int");
  // CUSPARSELT_VERSION this build was compiled against (e.g. 801 for 0.8.1), 0 without cuSPARSELt.
  m.def("cusparselt_version() -> int", [] { return sparsetorch::cusparselt_compiled_version(); });

  // --- 2:4 decode: a 2:4-pruned bf16/fp16 weight in the packed decode layout (common/sparse24_decode_checks.h,
  // sparsetorch/pruned/sparse24_decode.py) times few tokens. Kernels: cpu/sparse24_decode_cpu.cpp (a reference:
  // decode, then a float32 product), cuda/sparse24_decode_linear.cu (mma.sp). No autograd: the layer
  // differentiates through its CSR (it calls this op for the forward only).
  // out (..., out_features) = act(x (..., in_features) @ W^T + bias), W (out_features x in_features) given as
  // values / meta (pack_sparse24_decode). Any number of tokens; the CUDA kernel is built for up to 64 per
  // launch (more run as several launches) and pays off at few (decode).
  m.def(
      "sparse24_decode_linear(Tensor x, Tensor values, Tensor meta, int out_features, int in_features, "
      "Tensor? bias=None, str activation=\"none\", float negative_slope=0.01) -> Tensor");
  // W (out_features, in_features) as a dense tensor of values' dtype from values / meta: the values as stored
  // (bits), zeros elsewhere. The metadata is not checked (a layer's own layout, or one checked by
  // unpack_sparse24_decode): the kernels write only inside W's chunks whatever it holds. No device sync.
  m.def("sparse24_decode_to_dense(Tensor values, Tensor meta, int out_features, int in_features) -> Tensor");
  // (values, meta) of the layout from a CSR in the pair layout of a 2:4 pruning: two entries per group of 4 columns,
  // in column order, values and col_indices of out_features * in_features / 2 entries (sparse24_decode.py checks
  // that once per pattern, is_pair_layout; the kernels read the columns' low 2 bits only). No device sync.
  m.def(
      "sparse24_decode_pack_pairs(Tensor values, Tensor col_indices, int out_features, int in_features) -> "
      "(Tensor, Tensor)");

  // --- bitmap tiles (common/bitmap_layout.h, sparsetorch/pruned/bitmap.py; its autograd is there).
  // out (..., out_features) = act(x (..., in_features) @ W^T + bias), W (out_features, in_features) given
  // as bitmaps / offsets / values. The t_* and csr_* tensors are not read by the product: they are W^T
  // in the same layout (t_index: which of `values` each of its values is) and W's CSR pattern
  // (csr_index: the CSR slot of each of `values`), which the backward needs for grad x and grad values;
  // sparsetorch.bitmap_linear passes them only when autograd records.
  m.def(
      "bitmap_linear(Tensor x, Tensor bitmaps, Tensor offsets, Tensor values, int out_features, Tensor? bias=None, "
      "str activation=\"none\", float negative_slope=0.01, Tensor? t_bitmaps=None, Tensor? t_offsets=None, "
      "Tensor? t_index=None, Tensor? csr_crow=None, Tensor? csr_col=None, Tensor? csr_index=None) -> Tensor");

  // --- slots: a bf16/fp16 weight in the slot layout (common/slot_layout.h, sparsetorch/pruned/slots.py). No
  // autograd of its own: SparseLinear differentiates through its CSR.
  // out (..., out_features) = act(x (..., in_features) @ W^T + bias), W (out_features, in_features) given
  // as offsets / entries, in the plain or the banded group and slot order (`banded`).
  m.def(
      "slot_linear(Tensor x, Tensor offsets, Tensor entries, int out_features, Tensor? bias=None, "
      "str activation=\"none\", float negative_slope=0.01, bool banded=False) -> Tensor");
  // W (out_features, in_features) of `dtype` (bfloat16 / float16: the entries' value bits) as a dense tensor. The
  // CPU kernel checks the layout as it reads (IndexError, as slot_linear's); the CUDA kernel clamps the offsets
  // and skips entries outside W (no device sync).
  m.def(
      "slot_to_dense(Tensor offsets, Tensor entries, int out_features, int in_features, ScalarType dtype, "
      "bool banded=False) -> Tensor");

  // --- CSR16: a bf16/fp16 weight in the CSR16 layout (common/csr16_checks.h, sparsetorch/pruned/csr16.py). No
  // autograd of its own: SparseLinear differentiates through its CSR.
  // out (..., out_features) = act(x (..., in_features) @ W^T + bias), W (out_features = crow.size(0) - 1,
  // in_features = x.size(-1)) given as crow / entries; structural zeros are skipped (CSR semantics).
  m.def(
      "csr16_linear(Tensor x, Tensor crow, Tensor entries, Tensor? bias=None, str activation=\"none\", "
      "float negative_slope=0.01) -> Tensor");
}
