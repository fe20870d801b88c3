// O(1) argument checks shared by every backend. Messages name the argument, what it is and
// what was expected; shape problems raise ValueError, dtype problems TypeError.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

namespace sparsetorch {

// True for the floating dtypes the ops compute in: float16, bfloat16, float32, float64.
bool is_supported_float(at::ScalarType t);
void check_float_dtype(const at::Tensor& t, const char* name);
void check_index_dtype(const at::Tensor& t, const char* name);
// A dtype as users write it ("torch.float32"), for messages.
std::string dtype_name(at::ScalarType t);
void check_same_device(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name);
void check_same_dtype(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name);

// The shape of one SpMM call, out = act(alpha * A @ dense + beta * accumulate + bias).
//   crow_indices: (m+1,) or (b, m+1)      col_indices: (L,) or (b, L), batched iff crow is
//   values:       (L,) or (b, L)          (a 1-D pattern with 2-D values: shared pattern)
//   dense:        (k, n) or (b, k, n)
// Batch i of A holds entries crow[i, 0] .. crow[i, m] of row i of col/values (padding after
// crow[i, m] is ignored). The output is (m, n) when nothing is batched, else (b, m, n).
struct SpmmProblem {
  int64_t batch = 1;
  bool batched = false;  // output has a batch dimension
  int64_t m = 0, k = 0, n = 0;
  int64_t nnz_stride = 0;  // L: entries per batch slot of col/values
  bool pattern_batched = false, values_batched = false, dense_batched = false;

  std::vector<int64_t> out_shape() const {
    return batched ? std::vector<int64_t>{batch, m, n} : std::vector<int64_t>{m, n};
  }
  // Element offsets between batches of crow / col / values (0: shared by every batch).
  int64_t crow_bstride() const { return pattern_batched ? m + 1 : 0; }
  int64_t col_bstride() const { return pattern_batched ? nnz_stride : 0; }
  int64_t val_bstride() const { return values_batched ? nnz_stride : 0; }
  // How many different matrices A the batch holds (1 when one A serves every batch).
  int64_t a_batches() const { return pattern_batched || values_batched ? batch : 1; }
};

SpmmProblem check_spmm_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                            const at::Tensor& dense, const std::optional<at::Tensor>& accumulate,
                            const std::optional<at::Tensor>& bias);

// The SpMM routes. Blocked multiplies a layout SpmmPlan builds (spmm_blocked op); the spmm op refuses it.
enum class SpmmBackend { Auto, Cusparse, Native, Balanced, Split, Tiled, Densify, Blocked };
// "auto", "cusparse", "native", "balanced", "split", "tiled", "densify" or "blocked"; ValueError otherwise.
SpmmBackend parse_spmm_backend(const std::string& name);

// Checks an `out` tensor for a problem: right shape, dtype and device.
void check_spmm_out(const SpmmProblem& p, const at::Tensor& values, const at::Tensor& out);

// The shape of one SDDMM call: out[j] = alpha * dot(a[row(j), :], b[col[j], :]) for every stored
// entry j of the pattern (crow, col), i.e. (a @ b^T) sampled at A's entries.
//   crow_indices: (m+1,) or (batch, m+1)   col_indices: (L,) or (batch, L)
//   a: (m, n) or (batch, m, n)             b: (k, n) or (batch, k, n)
// The output holds one value per stored slot: (L,) when nothing is batched, else (batch, L);
// padding slots after crow[i, m] and entries with a column outside [0, k) get 0 on CUDA (the CPU
// raises IndexError for the latter, as its SpMM does).
struct SddmmProblem {
  int64_t batch = 1;
  bool batched = false;
  bool pattern_batched = false, a_batched = false, b_batched = false;
  int64_t m = 0, k = 0, n = 0;
  int64_t nnz_stride = 0;  // L
  std::vector<int64_t> out_shape() const {
    return batched ? std::vector<int64_t>{batch, nnz_stride} : std::vector<int64_t>{nnz_stride};
  }
  // Element offsets between batches of crow / col (0: one pattern for every batch).
  int64_t crow_bstride() const { return pattern_batched ? m + 1 : 0; }
  int64_t col_bstride() const { return pattern_batched ? nnz_stride : 0; }
};
SddmmProblem check_sddmm_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                              const at::Tensor& b);

// CPU kernels check each row span and column as they read it (IndexError, never an OOB read).
inline void check_row_span(int64_t start, int64_t stop, int64_t nnz_stride, int64_t row, int64_t batch) {
  TORCH_CHECK_INDEX(0 <= start && start <= stop && stop <= nnz_stride, "crow_indices: row ", row, " of batch ", batch,
                    " spans entries [", start, ", ", stop, ") outside the ", nnz_stride,
                    " stored entries (crow_indices must be non-decreasing, within [0, nnz])");
}
inline void check_column(int64_t column, int64_t k, int64_t entry, int64_t batch) {
  TORCH_CHECK_INDEX(0 <= column && column < k, "col_indices: entry ", entry, " of batch ", batch, " is column ",
                    column, ", out of range for k = ", k, " columns");
}

// CSR components of one (possibly batched) matrix, used by csr_scale and csr_check.
struct CsrShape {
  int64_t batch = 1;
  bool batched = false;
  int64_t m = 0;
  int64_t nnz_stride = 0;
};
CsrShape check_csr_components(const at::Tensor& crow, const at::Tensor& col, const at::Tensor* values);

// Elementwise ops: x and y of one float dtype, device and shape.
void check_binary_args(const at::Tensor& x, const at::Tensor& y);
// bias_act: x at least 1-D; scale and bias (optional) of shape (x.size(-1),), x's dtype and device.
void check_bias_act_args(const at::Tensor& x, const std::optional<at::Tensor>& scale,
                         const std::optional<at::Tensor>& bias);

// linear: x (..., in), weight (out, in), bias (out,); one float dtype and device.
void check_linear_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

// The x side of act(x (..., k) @ W^T + bias) for a W of out_features rows in a packed layout (bitmap_linear,
// csr16_linear): x at least 1-D with fewer than 2^31 tokens (the product of its leading dimensions, so k may
// be 0), bias (out_features,) of x's dtype and device when given. Returns the tokens; *out_shape becomes
// (..., out_features).
int64_t check_packed_linear_tokens(const at::Tensor& x, int64_t out_features, const std::optional<at::Tensor>& bias,
                                   std::vector<int64_t>* out_shape);
// The weight side of the packed layouts (bitmap, slot, CSR16): an index tensor `name` of `dtype` (int32;
// int64 for bitmaps) on x's device; x of bfloat16 or float16 where the layout packs 16-bit values; and
// out_features in 0 .. 2^31 - 1. Messages name the argument and what was expected.
void check_layout_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, const at::Tensor& x);
void check_16bit_x(const at::Tensor& x, const char* layout);
void check_out_features(int64_t out_features);
// dense_bmm: a (b, m, k) or (m, k), b (b, k, n) or (k, n), at least one batched. Returns the batch.
int64_t check_dense_bmm_args(const at::Tensor& a, const at::Tensor& b);

// bias_act_backward: bias_act's checks plus grad of x's shape, dtype and device.
void check_bias_act_backward_args(const at::Tensor& grad, const at::Tensor& x, const std::optional<at::Tensor>& scale,
                                  const std::optional<at::Tensor>& bias);

// csr_scale's row or column factors: (len,) shared by all batches, or (batch, len).
struct ScaleVector {
  at::Tensor t;  // contiguous, or undefined when absent
  int64_t batch_stride = 0;
  int64_t len = 0;
};
// expected_len < 0: any length (columns are bounds-checked against it instead).
ScaleVector check_scale_vector(const std::optional<at::Tensor>& s, const at::Tensor& values, int64_t batch,
                               bool batched, const char* name, int64_t expected_len);

// csr_scale's arguments, one check for both devices: the pattern (values of a float dtype; 2-D values
// with a 1-D pattern are a batch sharing it), row factors of length m, column factors of any length.
struct CsrScaleArgs {
  CsrShape shape;
  int64_t batch = 1;  // batches of values
  ScaleVector rows, cols;
  bool scales() const { return rows.t.defined() || cols.t.defined(); }
};
CsrScaleArgs check_csr_scale_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                                  const std::optional<at::Tensor>& row_scale,
                                  const std::optional<at::Tensor>& col_scale);

}  // namespace sparsetorch
