// The schemas of sparsetorch's core ops: the sparse x dense products (spmm, spmm_out, spmm_blocked, sddmm),
// the elementwise ops and the dense path, and the per-matrix analysis and native caches every op relies on.
// The other areas define theirs in one file each: graph_ops.cpp (the fresh-graph builder), pruned_ops.cpp
// (the pruned-weight forms), tuning_ops.cpp (the routing module's answers and the tuning table),
// device_ops.cpp (what the loaded CUDA code can run), and testing_ops.cpp the test hooks, in a library of
// their own (sparsetorch_testing). Kernels register in
// cpu/*.cpp (CPU) and cuda/*.cu (CUDA); Python adds fake (meta) kernels (sparsetorch/_ops.py) and autograd
// (sparsetorch/_autograd.py).
//
// Ops take plain component tensors (crow_indices, col_indices, values, ...) instead of sparse
// tensors, so dispatch, fake tensors, opcheck and autograd on `values` work unchanged.
#include <Python.h>
#include <torch/library.h>

#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/csr_analysis.h"
#include "common/native_caches.h"
#include "cpu/kernels.h"

#ifdef SPARSETORCH_WITH_CUDA
namespace sparsetorch {
std::string cuda_build_info();  // cuda/build_info_cuda.cpp
}
#endif

namespace sparsetorch {
namespace {

at::Tensor csr_analysis_op(const at::Tensor& crow, const at::Tensor& col, int64_t ncols, bool force) {
  // The real statistics: a pattern whose check is still in flight (PendingCheck) is waited for.
  const auto a = analyze_csr(crow, col, ncols, force ? AnalysisMode::kForce : AnalysisMode::kFinal);
  at::Tensor out = at::empty({csr_stats::kLength}, at::TensorOptions().dtype(at::kLong));
  std::memcpy(out.data_ptr<int64_t>(), a->raw.data(), sizeof(int64_t) * csr_stats::kLength);
  return out;
}

void csr_validate_op(const at::Tensor& crow, const at::Tensor& col, int64_t ncols, bool force) {
  // A provisional analysis (the fresh-graph builder's, check in flight) is valid by construction: no wait.
  const auto a = analyze_csr(crow, col, ncols, force ? AnalysisMode::kForce : AnalysisMode::kCompute);
  if (!a->valid()) TORCH_CHECK_VALUE(false, a->defect("validate_csr"));
}

std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<int64_t>> csr_stats_layout_op() {
  std::vector<std::string> names;
  std::vector<int64_t> offsets, lengths;
  for (const csr_stats::Field& f : csr_stats::kFields) {
    names.emplace_back(f.name);
    offsets.push_back(f.offset);
    lengths.push_back(f.length);
  }
  return {names, offsets, lengths};
}

int64_t csr_analysis_cache_op(bool clear) {
  if (clear) clear_csr_analysis_cache();
  return csr_analysis_cache_size();
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> native_cache_sizes_op() {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  for (const auto& [name, size] : native_caches::sizes()) {
    names.push_back(name);
    sizes.push_back(size);
  }
  return {names, sizes};
}

}  // namespace
}  // namespace sparsetorch

TORCH_LIBRARY(sparsetorch, m) {
  // out = act(alpha * (A @ dense) + beta * accumulate + bias), A in CSR; see common/checks.h for
  // the batched and broadcast layouts. beta == 0 ignores `accumulate` (NaN in it does not leak).
  // backend: "auto" (common/spmm_routing.h decides) or a route name; the CPU has one kernel.
  // validate: A is checked on its first use (common/csr_analysis.h; cached per pattern) and a malformed
  // A raises ValueError; False skips the check for a caller who vouches for A (never a crash either way).
  m.def(
      "spmm(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense, float alpha=1., "
      "Tensor? accumulate=None, float beta=0., Tensor? bias=None, str activation=\"none\", "
      "float negative_slope=0.01, str backend=\"auto\", bool validate=True) -> Tensor");
  // The same product written into `out`, which also serves as the accumulate operand:
  // out = act(alpha * (A @ dense) + beta * out + bias).
  m.def(
      "spmm_out(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense, Tensor(a!) out, "
      "float alpha=1., float beta=0., Tensor? bias=None, str activation=\"none\", "
      "float negative_slope=0.01, str backend=\"auto\", bool validate=True) -> ()");
  // spmm of one unbatched float32 A given twice: as CSR and in the 8-row strip layout SpmmPlan
  // builds from it (common/blocked_layout.h, sparsetorch/pruned/blocked.py), which the product runs on.
  // The CSR serves the checks, autograd and a B holding NaN/Inf (recomputed on the CSR so that
  // structural zeros stay zeros). The layout must be the one built from this CSR.
  m.def(
      "spmm_blocked(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor run_ptr, Tensor block_col, "
      "Tensor pair_values, Tensor dense, float alpha=1., Tensor? accumulate=None, float beta=0., "
      "Tensor? bias=None, str activation=\"none\", float negative_slope=0.01) -> Tensor");
  // Sampled dense-dense product: out[j] = alpha * dot(a[row(j), :], b[col[j], :]) for each stored
  // entry of the pattern, i.e. (a @ b^T) at A's entries (the gradient of spmm w.r.t. A's values).
  // Shapes in common/checks.h (SddmmProblem). backend as for spmm.
  m.def(
      "sddmm(Tensor crow_indices, Tensor col_indices, Tensor a, Tensor b, float alpha=1., "
      "str backend=\"auto\", bool validate=True) -> Tensor");
  // Elementwise on dense tensors (or CSR values of one pattern). op: add (x + alpha*y),
  // sub (x - alpha*y), mul (x*y), div (x/y). x and y have the same shape and dtype.
  m.def("binary(Tensor x, Tensor y, str op, float alpha=1.) -> Tensor");
  // op: add (x + s), sub (x - s), rsub (s - x), mul (x*s), div (x/s).
  m.def("binary_scalar(Tensor x, float other, str op) -> Tensor");
  m.def("activation(Tensor x, str activation, float negative_slope=0.01) -> Tensor");
  // y = act(x * scale + bias) with scale and bias of shape (x.size(-1),), both optional.
  m.def(
      "bias_act(Tensor x, Tensor? scale, Tensor? bias, str activation=\"none\", "
      "float negative_slope=0.01) -> Tensor");
  // Gradients of bias_act in one pass: z = x * scale + bias, d = grad * act'(z);
  // returns (grad_x = d * scale, grad_scale = sum over rows of d * x, grad_bias = sum over rows of d).
  // output_mask says which of the three are wanted; the others come back as empty tensors.
  m.def(
      "bias_act_backward(Tensor grad, Tensor x, Tensor? scale, Tensor? bias, str activation, "
      "float negative_slope, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
  // Dense path. y = act(x @ weight^T + bias), x (..., in), weight (out, in): cuBLASLt with its bias /
  // ReLU / GELU(tanh) epilogues on CUDA (other activations as a second pass), ATen matmul on the CPU.
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str activation=\"none\", "
        "float negative_slope=0.01) -> Tensor");
  // a @ b for a (b, m, k) or (m, k) and b (b, k, n) or (k, n), at least one batched: strided-batched
  // GEMM on cuBLAS (an unbatched operand is broadcast with batch stride 0).
  m.def("dense_bmm(Tensor a, Tensor b) -> Tensor");
  // values'[j] = values[j] * row_scale[row(j)] * col_scale[col[j]] (GCN's D^-1/2 A D^-1/2).
  m.def(
      "csr_scale(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor? row_scale, "
      "Tensor? col_scale) -> Tensor");
  // The dense (m, k), or (batch, m, k) for 2-D values, of a CSR: crow (m + 1) or (patterns, m + 1), col (L) or
  // (patterns, L), values (L) or (batch, L), patterns 1 or batch. Repeated entries are summed (in float32; float64
  // for doubles), columns outside [0, k) and slots outside the row spans skipped. CUDA only (the densify kernel,
  // cuda/spmm_densify.cu; no device sync); sparsetorch.csr.to_dense calls it there and uses torch ops elsewhere.
  m.def("csr_to_dense(Tensor crow_indices, Tensor col_indices, Tensor values, int m, int k) -> Tensor");
  // The per-matrix analysis (common/csr_analysis.h). csr_stats: one uncached O(nnz) pass on the
  // indices' device, the int64 vector laid out in csr_analysis.h (first defect, row-length statistics);
  // ncols < 0 leaves the columns unchecked.
  m.def("csr_stats(Tensor crow_indices, Tensor col_indices, int ncols) -> Tensor");
  // That vector's layout, the one definition Python reads it by (sparsetorch/_stats.py): each field's name,
  // offset and length (histograms span several entries).
  m.def("csr_stats_layout() -> (str[], int[], int[])", &sparsetorch::csr_stats_layout_op);
  // The cached analysis of a pattern (validated against ncols columns; ncols < 0: columns unchecked)
  // as the csr_stats vector, on the CPU. force=True recomputes it. Never raises for a malformed matrix:
  // the vector says what is wrong.
  m.def("csr_analysis(Tensor crow_indices, Tensor col_indices, int ncols, bool force=False) -> Tensor");
  // Raises ValueError naming the first defect of a malformed pattern; the verdict is cached.
  m.def("csr_validate(Tensor crow_indices, Tensor col_indices, int ncols, bool force=False) -> ()");
  // Entries in the analysis cache; clear=True empties it first.
  m.def("csr_analysis_cache(bool clear=False) -> int", &sparsetorch::csr_analysis_cache_op);
  // Every native cache (common/native_caches.h): empties the one called `name`, or all of them for "";
  // st.clear_caches() calls it. And each one's name and entries (st.cache_info()).
  m.def("_clear_native_caches(str name=\"\") -> ()", [](const std::string& name) {
    sparsetorch::native_caches::clear(name);
  });
  m.def("_native_cache_sizes() -> (str[], int[])", &sparsetorch::native_cache_sizes_op);
  // Which build of the CPU kernels this process runs ("avx2" or "default", cpu/kernels.h).
  m.def("_cpu_isa() -> str", [] { return std::string(sparsetorch::cpu::kernels().isa); });
}

TORCH_LIBRARY_IMPL(sparsetorch, CompositeExplicitAutograd, m) {
  m.impl("csr_analysis", &sparsetorch::csr_analysis_op);
  m.impl("csr_validate", &sparsetorch::csr_validate_op);
}

namespace {

std::string build_info_string() {
  std::ostringstream s;
  s << "cpu=1\n";
#ifdef _OPENMP
  s << "openmp=" << _OPENMP << "\n";
#else
  s << "openmp=0\n";
#endif
#ifdef SPARSETORCH_WITH_CUDA
  s << "cuda=1\n" << sparsetorch::cuda_build_info();
#else
  s << "cuda=0\n";
#endif
  return s.str();
}

PyObject* py_build_info(PyObject*, PyObject*) {
  return PyUnicode_FromString(build_info_string().c_str());
}

PyMethodDef methods[] = {
    {"build_info", py_build_info, METH_NOARGS, "key=value lines: what this build compiled in"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "sparsetorch native operators", -1, methods};

}  // namespace

// Importing sparsetorch._C runs the TORCH_LIBRARY registrations above.
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module_def); }
