// Schemas of the 2:4 semi-structured ops (cuSPARSELt, csrc/cuda/cusparselt_linear.cu). They are CUDA-only:
// on the CPU, sparsetorch/_sparse24.py multiplies the same 2:4 + residual split with a dense reference path.
// A CUDA build without cuSPARSELt registers kernels that raise a clear error; `cusparselt_version()` says
// which one this build has (0: none).
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
}
