#include "common/checks.h"

#include <limits>

namespace sparsetorch {

namespace {
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Every batched operand must agree on the batch size; unbatched ones are broadcast.
class BatchAgreement {
 public:
  void take(bool is_batched, int64_t size, const char* name) {
    if (!is_batched) return;
    if (batch_ < 0) {
      batch_ = size;
      from_ = name;
      return;
    }
    TORCH_CHECK_VALUE(size == batch_, "batch sizes disagree: ", from_, " has batch ", batch_, " but ", name,
                      " has batch ", size);
  }
  int64_t batch() const { return batch_ < 0 ? 1 : batch_; }

 private:
  int64_t batch_ = -1;
  const char* from_ = nullptr;
};
}  // namespace

bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

void check_float_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(is_supported_float(t.scalar_type()), name,
                   ": expected float16, bfloat16, float32 or float64, got ", t.scalar_type());
}

void check_index_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
                   ": expected int32 or int64 indices, got ", t.scalar_type());
}

std::string dtype_name(at::ScalarType t) { return "torch." + std::string(c10::getDtypeNames(t).first); }

void check_same_device(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  TORCH_CHECK_VALUE(a.device() == b.device(), "expected ", a_name, " and ", b_name,
                    " on the same device, got ", a_name, " on ", a.device(), " and ", b_name, " on ",
                    b.device(), ": move one of them with .to(device)");
}

void check_same_dtype(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "expected ", a_name, " and ", b_name,
                   " of the same dtype, got ", a_name, " ", dtype_name(a.scalar_type()), " and ", b_name, " ",
                   dtype_name(b.scalar_type()), ": convert one of them with .to(dtype)");
}

CsrShape check_csr_components(const at::Tensor& crow, const at::Tensor& col, const at::Tensor* values) {
  check_index_dtype(crow, "crow_indices");
  check_index_dtype(col, "col_indices");
  TORCH_CHECK_TYPE(crow.scalar_type() == col.scalar_type(),
                   "expected crow_indices and col_indices of the same dtype, got ", crow.scalar_type(),
                   " and ", col.scalar_type());
  check_same_device(crow, "crow_indices", col, "col_indices");
  TORCH_CHECK_VALUE(crow.dim() == 1 || crow.dim() == 2,
                    "crow_indices: expected a 1-D (m+1,) or 2-D (batch, m+1) tensor, got shape ",
                    crow.sizes());
  TORCH_CHECK_VALUE(col.dim() == crow.dim(), "col_indices: expected ", crow.dim(),
                    "-D like crow_indices (", crow.dim() == 1 ? "(nnz,)" : "(batch, nnz)", "), got shape ",
                    col.sizes());
  TORCH_CHECK_VALUE(crow.size(-1) >= 1, "crow_indices: expected at least one entry (m+1 >= 1), got shape ",
                    crow.sizes());
  CsrShape s;
  s.batched = crow.dim() == 2;
  s.batch = s.batched ? crow.size(0) : 1;
  s.m = crow.size(-1) - 1;
  s.nnz_stride = col.size(-1);
  if (s.batched) {
    TORCH_CHECK_VALUE(col.size(0) == s.batch, "col_indices: expected batch size ", s.batch,
                      " (from crow_indices ", crow.sizes(), "), got shape ", col.sizes());
  }
  if (values != nullptr) {
    check_same_device(crow, "crow_indices", *values, "values");
    TORCH_CHECK_VALUE(values->dim() == 1 || values->dim() == 2,
                      "values: expected a 1-D (nnz,) or 2-D (batch, nnz) tensor, got shape ", values->sizes());
    TORCH_CHECK_VALUE(values->size(-1) == s.nnz_stride, "values: expected last dimension ", s.nnz_stride,
                      " (the length of col_indices), got shape ", values->sizes());
    if (s.batched) {
      TORCH_CHECK_VALUE(values->dim() == 2 && values->size(0) == s.batch, "values: expected shape (",
                        s.batch, ", ", s.nnz_stride, ") to match the batched pattern, got ", values->sizes());
    }
  }
  if (crow.scalar_type() == at::kInt) {
    TORCH_CHECK_VALUE(s.nnz_stride <= kInt32Max && s.m < kInt32Max,
                      "int32 indices cannot address nnz = ", s.nnz_stride, ", m = ", s.m,
                      "; use int64 crow_indices/col_indices");
  }
  return s;
}

SpmmProblem check_spmm_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                            const at::Tensor& dense, const std::optional<at::Tensor>& accumulate,
                            const std::optional<at::Tensor>& bias) {
  // In the user's terms: A is the sparse operand (st.spmm's A, a layer's weight or adjacency), B the dense one.
  TORCH_CHECK_VALUE(values.device() == dense.device(), "expected A and B on the same device, got A on ",
                    values.device(), " and B on ", dense.device(), ": move one of them, e.g. B.to(\"",
                    values.device(), "\") or A.to(\"", dense.device(), "\")");
  const CsrShape csr = check_csr_components(crow, col, &values);
  check_float_dtype(values, "A (its values)");
  check_float_dtype(dense, "B");
  TORCH_CHECK_TYPE(values.scalar_type() == dense.scalar_type(), "expected A and B of the same dtype, got A ",
                   dtype_name(values.scalar_type()), " and B ", dtype_name(dense.scalar_type()),
                   ": convert one of them, e.g. B.to(", dtype_name(values.scalar_type()), ") or A.to(",
                   dtype_name(dense.scalar_type()), ")");
  TORCH_CHECK_VALUE(dense.dim() == 2 || dense.dim() == 3,
                    "B: expected a 2-D (k, n) or 3-D (batch, k, n) tensor, got shape ", dense.sizes());

  SpmmProblem p;
  p.m = csr.m;
  p.nnz_stride = csr.nnz_stride;
  p.k = dense.size(-2);
  p.n = dense.size(-1);
  p.pattern_batched = csr.batched;
  p.values_batched = values.dim() == 2;
  p.dense_batched = dense.dim() == 3;
  p.batched = p.pattern_batched || p.values_batched || p.dense_batched;
  BatchAgreement batch;
  batch.take(p.pattern_batched, crow.size(0), "crow_indices");
  batch.take(p.values_batched, values.size(0), "values");
  batch.take(p.dense_batched, dense.size(0), "B");
  p.batch = batch.batch();

  if (crow.scalar_type() == at::kInt) {
    TORCH_CHECK_VALUE(p.k <= kInt32Max, "int32 indices cannot address k = ", p.k,
                      " columns; use int64 crow_indices/col_indices");
  }
  const auto out_shape = p.out_shape();
  if (accumulate.has_value()) {
    check_same_dtype(values, "A", *accumulate, "c (accumulate)");
    check_same_device(values, "A", *accumulate, "c (accumulate)");
    TORCH_CHECK_VALUE(accumulate->sizes().vec() == out_shape, "c (accumulate): expected shape ",
                      at::IntArrayRef(out_shape), " (the output's), got ", accumulate->sizes());
  }
  if (bias.has_value()) {
    check_same_dtype(values, "A", *bias, "bias");
    check_same_device(values, "A", *bias, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == p.n, "bias: expected shape (", p.n,
                      ",) (the output's last dimension), got ", bias->sizes());
  }
  return p;
}

SddmmProblem check_sddmm_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                              const at::Tensor& b) {
  const CsrShape csr = check_csr_components(crow, col, nullptr);
  check_float_dtype(a, "a");
  check_float_dtype(b, "b");
  check_same_dtype(a, "a", b, "b");
  check_same_device(crow, "A", a, "a");
  check_same_device(a, "a", b, "b");
  TORCH_CHECK_VALUE(a.dim() == 2 || a.dim() == 3,
                    "a: expected a 2-D (m, n) or 3-D (batch, m, n) tensor, got shape ", a.sizes());
  TORCH_CHECK_VALUE(b.dim() == 2 || b.dim() == 3,
                    "b: expected a 2-D (k, n) or 3-D (batch, k, n) tensor, got shape ", b.sizes());
  TORCH_CHECK_VALUE(a.size(-2) == csr.m, "a: expected ", csr.m, " rows (the pattern's m, from crow_indices ",
                    crow.sizes(), "), got shape ", a.sizes());
  TORCH_CHECK_VALUE(a.size(-1) == b.size(-1), "shape mismatch: a has shape ", a.sizes(), " but b has shape ",
                    b.sizes(), " (the last dimensions must agree)");
  SddmmProblem p;
  p.m = csr.m;
  p.k = b.size(-2);
  p.n = a.size(-1);
  p.nnz_stride = csr.nnz_stride;
  p.pattern_batched = csr.batched;
  p.a_batched = a.dim() == 3;
  p.b_batched = b.dim() == 3;
  p.batched = p.pattern_batched || p.a_batched || p.b_batched;
  BatchAgreement batch;
  batch.take(p.pattern_batched, crow.size(0), "crow_indices");
  batch.take(p.a_batched, a.size(0), "a");
  batch.take(p.b_batched, b.size(0), "b");
  p.batch = batch.batch();
  if (crow.scalar_type() == at::kInt) {
    TORCH_CHECK_VALUE(p.k <= kInt32Max, "int32 indices cannot address k = ", p.k,
                      " columns; use int64 crow_indices/col_indices");
  }
  return p;
}

SpmmBackend parse_spmm_backend(const std::string& name) {
  if (name == "auto") return SpmmBackend::Auto;
  if (name == "cusparse") return SpmmBackend::Cusparse;
  if (name == "native") return SpmmBackend::Native;
  if (name == "balanced") return SpmmBackend::Balanced;
  if (name == "split") return SpmmBackend::Split;
  if (name == "tiled") return SpmmBackend::Tiled;
  if (name == "densify") return SpmmBackend::Densify;
  if (name == "blocked") return SpmmBackend::Blocked;
  TORCH_CHECK_VALUE(false, "backend: unknown SpMM backend '", name,
                    "'; expected one of auto, cusparse, native, balanced, split, tiled, densify (blocked: SpmmPlan "
                    "only)");
}

void check_spmm_out(const SpmmProblem& p, const at::Tensor& values, const at::Tensor& out) {
  check_same_dtype(values, "A", out, "out");
  check_same_device(values, "A", out, "out");
  const auto out_shape = p.out_shape();
  TORCH_CHECK_VALUE(out.sizes().vec() == out_shape, "out: expected shape ", at::IntArrayRef(out_shape),
                    ", got ", out.sizes());
}

void check_binary_args(const at::Tensor& x, const at::Tensor& y) {
  check_float_dtype(x, "x");
  check_same_dtype(x, "x", y, "y");
  check_same_device(x, "x", y, "y");
  TORCH_CHECK_VALUE(x.sizes() == y.sizes(), "y: expected the shape of x ", x.sizes(), ", got ", y.sizes());
}

namespace {
void check_channel_vector(const at::Tensor& x, const std::optional<at::Tensor>& v, const char* name) {
  if (!v.has_value()) return;
  check_same_dtype(x, "x", *v, name);
  check_same_device(x, "x", *v, name);
  TORCH_CHECK_VALUE(v->dim() == 1 && v->size(0) == x.size(-1), name, ": expected shape (", x.size(-1),
                    ",) (the last dimension of x), got ", v->sizes());
}
}  // namespace

void check_bias_act_args(const at::Tensor& x, const std::optional<at::Tensor>& scale,
                         const std::optional<at::Tensor>& bias) {
  check_float_dtype(x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least 1 dimension (features last), got a 0-D tensor");
  check_channel_vector(x, scale, "scale");
  check_channel_vector(x, bias, "bias");
}

void check_bias_act_backward_args(const at::Tensor& grad, const at::Tensor& x, const std::optional<at::Tensor>& scale,
                                  const std::optional<at::Tensor>& bias) {
  check_bias_act_args(x, scale, bias);
  check_same_dtype(x, "x", grad, "grad");
  check_same_device(x, "x", grad, "grad");
  TORCH_CHECK_VALUE(grad.sizes() == x.sizes(), "grad: expected the shape of x ", x.sizes(), ", got ", grad.sizes());
}

ScaleVector check_scale_vector(const std::optional<at::Tensor>& s, const at::Tensor& values, int64_t batch,
                               bool batched, const char* name, int64_t expected_len) {
  ScaleVector out;
  if (!s.has_value()) return out;
  check_same_dtype(values, "values", *s, name);
  check_same_device(values, "values", *s, name);
  TORCH_CHECK_VALUE(s->dim() == 1 || (s->dim() == 2 && batched && s->size(0) == batch), name,
                    ": expected a 1-D tensor", batched ? " or a 2-D (batch, len) tensor with batch " : "",
                    batched ? std::to_string(batch) : std::string(), ", got shape ", s->sizes());
  out.len = s->size(-1);
  if (expected_len >= 0) {
    TORCH_CHECK_VALUE(out.len == expected_len, name, ": expected ", expected_len, " entries (one per row), got shape ",
                      s->sizes());
  }
  out.t = s->contiguous();
  out.batch_stride = s->dim() == 2 ? out.len : 0;
  return out;
}

CsrScaleArgs check_csr_scale_args(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                                  const std::optional<at::Tensor>& row_scale,
                                  const std::optional<at::Tensor>& col_scale) {
  CsrScaleArgs a;
  a.shape = check_csr_components(crow, col, &values);
  check_float_dtype(values, "values");
  const bool values_batched = values.dim() == 2;
  a.batch = values_batched ? values.size(0) : 1;
  a.rows = check_scale_vector(row_scale, values, a.batch, values_batched, "row_scale", a.shape.m);
  a.cols = check_scale_vector(col_scale, values, a.batch, values_batched, "col_scale", -1);
  return a;
}

void check_linear_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_float_dtype(x, "x");
  check_same_dtype(x, "x", weight, "weight");
  check_same_device(x, "x", weight, "weight");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least 1 dimension (features last), got a 0-D tensor");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == x.size(-1), "weight: expected shape (out, ", x.size(-1),
                    ") to match x's last dimension, got ", weight.sizes());
  if (bias.has_value()) {
    check_same_dtype(x, "x", *bias, "bias");
    check_same_device(x, "x", *bias, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), "bias: expected shape (",
                      weight.size(0), ",) (weight's rows), got ", bias->sizes());
  }
}

void check_layout_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, const at::Tensor& x) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, ": expected ", dtype == at::kInt ? "int32" : "int64", ", got ",
                   t.scalar_type());
  check_same_device(x, "x", t, name);
}

void check_16bit_x(const at::Tensor& x, const char* layout) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
                   "x: expected bfloat16 or float16 (the ", layout, " packs 16-bit values), got ", x.scalar_type());
}

void check_out_features(int64_t out_features) {
  TORCH_CHECK_VALUE(out_features >= 0 && out_features < (int64_t{1} << 31), "out_features: expected 0 .. 2^31 - 1, got ",
                    out_features);
}

int64_t check_packed_linear_tokens(const at::Tensor& x, int64_t out_features, const std::optional<at::Tensor>& bias,
                                   std::vector<int64_t>* out_shape) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected at least one dimension (..., in_features), got a scalar");
  int64_t n = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) n *= x.size(d);
  TORCH_CHECK_VALUE(n < (int64_t{1} << 31), "x: expected fewer than 2^31 tokens, got shape ", x.sizes());
  if (bias.has_value()) {
    check_same_dtype(x, "x", *bias, "bias");
    check_same_device(x, "x", *bias, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == out_features, "bias: expected shape (", out_features,
                      ",), got ", bias->sizes());
  }
  *out_shape = x.sizes().vec();
  out_shape->back() = out_features;
  return n;
}

int64_t check_dense_bmm_args(const at::Tensor& a, const at::Tensor& b) {
  check_float_dtype(a, "a");
  check_same_dtype(a, "a", b, "b");
  check_same_device(a, "a", b, "b");
  TORCH_CHECK_VALUE((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3) && (a.dim() == 3 || b.dim() == 3),
                    "dense_bmm: expected a (batch, m, k) or (m, k) and b (batch, k, n) or (k, n), at least one "
                    "batched; got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK_VALUE(a.size(-1) == b.size(-2), "dense_bmm: a has ", a.size(-1), " columns but b has ", b.size(-2),
                    " rows (shapes ", a.sizes(), " and ", b.sizes(), ")");
  if (a.dim() == 3 && b.dim() == 3) {
    TORCH_CHECK_VALUE(a.size(0) == b.size(0), "dense_bmm: batch sizes disagree: ", a.size(0), " and ", b.size(0));
  }
  return a.dim() == 3 ? a.size(0) : b.size(0);
}

}  // namespace sparsetorch
