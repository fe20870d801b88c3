// Dense path on CUDA: linear (cuBLASLt with bias / activation epilogues) and strided-batched GEMM
// (cuBLAS). Handles come from ATen's pools, workspaces from the caching allocator; TF32 follows
// torch.backends.cuda.matmul.allow_tf32, as torch's own matmul does.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <torch/library.h>

#include <limits>

#include "common/activation.h"
#include "common/checks.h"
#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

template <typename T, cublasStatus_t (*Destroy)(T)>
class LtHandle {
 public:
  LtHandle() = default;
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  ~LtHandle() {
    if (h_) Destroy(h_);
  }
  T* out() { return &h_; }
  T get() const { return h_; }

 private:
  T h_ = nullptr;
};
using MatmulDesc = LtHandle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = LtHandle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using MatmulPreference = LtHandle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

cublasComputeType_t compute_type(at::ScalarType t) {
  if (t == at::kDouble) return CUBLAS_COMPUTE_64F;
  if (t == at::kFloat && at::globalContext().allowTF32CuBLAS()) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

uint32_t alignment_of(const void* p) {
  uint32_t a = 1;
  while (a < 256 && reinterpret_cast<uintptr_t>(p) % (a * 2) == 0) a *= 2;
  return a;
}

// The epilogue cuBLASLt can fuse for (bias?, activation); anything else runs as a second pass.
// cuBLASLt's GELU is not exact in float64 (1.5e-10 relative error measured on the H100), so float64
// takes our kernel for it.
cublasLtEpilogue_t lt_epilogue(bool has_bias, Activation act, at::ScalarType dtype, bool* act_fused) {
  if (act == Activation::GeluTanh && dtype == at::kDouble) {
    *act_fused = false;
    return has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  *act_fused = act == Activation::None || act == Activation::Relu || act == Activation::GeluTanh;
  if (act == Activation::Relu) return has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  if (act == Activation::GeluTanh) return has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  return has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// y (rows, out) = epilogue(x (rows, in) @ w^T). Returns false when cuBLASLt offers no algorithm.
bool lt_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, Activation act, const at::Tensor& y,
               bool* act_fused) {
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  const at::ScalarType dtype = x.scalar_type();
  const cudaDataType dt = cuda_dtype(dtype);
  const cudaDataType scale_type = dtype == at::kDouble ? CUDA_R_64F : CUDA_R_32F;
  MatmulDesc desc;
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatmulDescCreate(desc.out(), compute_type(dtype), scale_type));
  // Column-major view: Y^T (out x rows) = W (out x in) * X^T (in x rows); W row-major is W^T col-major.
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  const cublasLtEpilogue_t epilogue = lt_epilogue(bias.defined(), act, dtype, act_fused);
  SPARSETORCH_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias.defined()) {
    const void* bias_ptr = bias.data_ptr();
    SPARSETORCH_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  }
  MatrixLayout a_layout, b_layout, d_layout;
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(a_layout.out(), dt, in, out, in));
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(b_layout.out(), dt, in, rows, in));
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(d_layout.out(), dt, out, rows, out));
  MatmulPreference pref;
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(pref.out()));
  const uint64_t max_workspace = 32ull << 20;
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                &max_workspace, sizeof(max_workspace)));
  const uint32_t align_a = alignment_of(w.data_ptr()), align_b = alignment_of(x.data_ptr()),
                 align_d = alignment_of(y.data_ptr());
  cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d));
  cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, desc.get(), a_layout.get(), b_layout.get(),
                                                           d_layout.get(), d_layout.get(), pref.get(), 1, &heuristic,
                                                           &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  at::Tensor workspace = at::empty({static_cast<int64_t>(heuristic.workspaceSize)}, x.options().dtype(at::kByte));
  const double alpha_d = 1.0, beta_d = 0.0;
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const void* alpha = dtype == at::kDouble ? static_cast<const void*>(&alpha_d) : static_cast<const void*>(&alpha_f);
  const void* beta = dtype == at::kDouble ? static_cast<const void*>(&beta_d) : static_cast<const void*>(&beta_f);
  SPARSETORCH_CUBLAS_CHECK(cublasLtMatmul(handle, desc.get(), alpha, w.data_ptr(), a_layout.get(), x.data_ptr(),
                                          b_layout.get(), beta, y.data_ptr(), d_layout.get(), y.data_ptr(),
                                          d_layout.get(), &heuristic.algo, workspace.data_ptr(),
                                          heuristic.workspaceSize, at::cuda::getCurrentCUDAStream()));
  return true;
}

at::Tensor linear_cuda(const at::Tensor& x_in, const at::Tensor& w_in, const std::optional<at::Tensor>& bias_in,
                       c10::string_view activation, double negative_slope) {
  check_linear_args(x_in, w_in, bias_in);
  const Activation act = parse_activation(std::string(activation));
  const c10::cuda::CUDAGuard guard(x_in.device());
  const int64_t in = x_in.size(-1), out = w_in.size(0);
  std::vector<int64_t> out_shape = x_in.sizes().vec();
  out_shape.back() = out;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < out_shape.size(); ++d) rows *= out_shape[d];
  const at::Tensor x = x_in.reshape({rows, in}).contiguous(), w = w_in.contiguous();
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  at::Tensor y = at::empty({rows, out}, x.options());
  if (y.numel() == 0) return y.view(out_shape);
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  bool act_fused = false;
  const bool lt_ok = in > 0 && rows <= kIntMax && in <= kIntMax && out <= kIntMax && lt_linear(x, w, bias, act, y, &act_fused);
  if (!lt_ok) {  // no cuBLASLt algorithm (or k = 0): ATen's matmul, then the epilogue kernel
    y = in > 0 ? at::mm(x, w.t()) : at::zeros({rows, out}, x.options());
    act_fused = false;
    if (bias.defined() || act != Activation::None) bias_act_inplace_cuda(y, bias, act, negative_slope);
  } else if (!act_fused) {
    bias_act_inplace_cuda(y, at::Tensor(), act, negative_slope);
  }
  return y.view(out_shape);
}

at::Tensor dense_bmm_cuda(const at::Tensor& a_in, const at::Tensor& b_in) {
  const int64_t batch = check_dense_bmm_args(a_in, b_in);
  const c10::cuda::CUDAGuard guard(a_in.device());
  const int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  at::Tensor c = at::empty({batch, m, n}, a_in.options());
  if (c.numel() == 0) return c;
  if (k == 0) return c.zero_();
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  TORCH_CHECK_VALUE(m <= kIntMax && n <= kIntMax && k <= kIntMax && batch <= kIntMax,
                    "dense_bmm: dimensions above 2^31 - 1 are not supported by cuBLAS (", a_in.sizes(), ", ",
                    b_in.sizes(), ")");
  // Row-major C = A @ B is column-major C^T = B^T @ A^T: pass B first. Rows must be contiguous.
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const int64_t stride_a = a.dim() == 3 ? m * k : 0, stride_b = b.dim() == 3 ? k * n : 0;
  const at::ScalarType dtype = a.scalar_type();
  const cudaDataType dt = cuda_dtype(dtype);
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const void* alpha = dtype == at::kDouble ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
  const void* beta = dtype == at::kDouble ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // ATen sets the current stream on it
  SPARSETORCH_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), alpha,
      b.data_ptr(), dt, static_cast<int>(n), stride_b, a.data_ptr(), dt, static_cast<int>(k), stride_a, beta,
      c.data_ptr(), dt, static_cast<int>(n), m * n, static_cast<int>(batch), compute_type(dtype),
      CUBLAS_GEMM_DEFAULT));
  return c;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) {
  m.impl("linear", SPARSETORCH_CUDA_OP(linear_cuda));
  m.impl("dense_bmm", SPARSETORCH_CUDA_OP(dense_bmm_cuda));
}

}  // namespace cuda
}  // namespace sparsetorch
