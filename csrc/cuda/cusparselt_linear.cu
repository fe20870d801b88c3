// 2:4 semi-structured linear layers through cuSPARSELt: y = act(x @ (W + R)^T + bias), W (m x k) with at
// most 2 nonzeros in each group of 4 consecutive entries of a row, held compressed by cuSPARSELt, and R an
// optional CSR residual (the entries of an unstructured weight beyond the two a group can hold). The
// residual is multiplied first by a kernel here, which writes every output element; cuSPARSELt then adds
// it as its C operand (beta = 1) inside the 2:4 GEMM's epilogue, with the bias, so the split costs one
// write of the output and no extra pass over it. Other activations run as one pass afterwards (the fused
// cuSPARSELt ReLU/GELU differ from ours on NaN and in the GELU form).
//
// Layout, no transposes: cuSPARSELt's A is W (row-major m x k, structured), B is x (row-major N x k, used
// transposed), C = D is column-major m x N with leading dimension m, which is y as row-major N x m. N is
// padded to a multiple of 8 (cuSPARSELt's minimum for 16-bit dense operands); m and k must be multiples
// of 16 (its minimum for the structured operand).
//
// Caching: one cuSPARSELt handle per device, initialised on first use (like ATen's handle pools; never
// destroyed: at process exit the CUDA context may be gone). Plans are keyed by everything cuSPARSELt bakes
// into one (device, dtype, m, k, N, whether C is read, the bias address, the algorithm) and kept in an LRU
// of kMaxPlans, so a steady-state call is a hash lookup, a workspace from the caching allocator and
// cusparseLtMatmul on the current stream. The layer (sparsetorch/pruned/sparse24.py) keeps the compressed weight
// and, per token-count bucket, the algorithm code sparse24_search found.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "common/activation.h"
#include "common/native_caches.h"
#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"
#include "cuda/device_code.h"

#ifdef SPARSETORCH_WITH_CUSPARSELT
#include <cusparseLt.h>
#endif

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int64_t kPadN = 8;          // cuSPARSELt: 16-bit dense operands need rows/cols multiple of 8
constexpr int64_t kStructMultiple = 16;  // ... and the structured operand multiples of 16

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

void check_operand_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, "sparse24: ", name,
                   " must be float16 or bfloat16 (2:4 tensor cores), got ", t.scalar_type());
}

// ---- the residual: out[n, r] = sum over row r of R of v * x[n, c], for every n < n_pad (x rows >= N are 0) ----
//
// A block owns T consecutive tokens. Their rows of x sit in shared memory token-minor (column c's T values
// together), so one 16-byte load gives an entry all 8 tokens of a T = 8 tile. The block's threads walk the rows
// of R, one row each, keeping T fp32 sums; writes of one token's outputs are coalesced across the warp. With
// few tiles the rows of R are split over gridDim.y blocks. Rows whose span is outside [0, nnz] and columns
// outside [0, k) are skipped. Why this layout: the first version (token-major tile, T scalar shared loads per
// entry, 256 threads, T up to 8 even for N = 1) took 185 us on an H100 at 11008 x 4096, N = 2048 and 43k
// entries - 47% of the 2:4 GEMM beside it.
constexpr int kResidualThreads = 512;

// Column c's slot in a token-minor tile: c with its low 3 bits xor-ed by the next 3, so that the tile's
// stores (a warp writes 32 / T columns eight apart) spread over the banks. Stays inside c's group of 8.
__device__ __forceinline__ int64_t tile_slot(int64_t c) { return c ^ ((c >> 3) & 7); }

// An entry's T token values from the tile (T == 1: the tile is x's row as it is), in one load where T allows.
template <typename scalar_t, int T>
__device__ __forceinline__ void tile_tokens(const scalar_t* xs, int64_t c, float (&v)[T]) {
  using Word = std::conditional_t<T == 8, uint4, std::conditional_t<T == 4, uint2, std::conditional_t<T == 2, uint32_t, scalar_t>>>;
  static_assert(sizeof(Word) == T * sizeof(scalar_t), "one load per entry");
  const Word w = *reinterpret_cast<const Word*>(xs + (T == 1 ? c : tile_slot(c)) * T);
  const scalar_t* s = reinterpret_cast<const scalar_t*>(&w);
#pragma unroll
  for (int t = 0; t < T; ++t) v[t] = static_cast<float>(s[t]);
}

template <typename scalar_t, typename index_t, int T, bool kShared>
__global__ void __launch_bounds__(kResidualThreads, 2) residual_kernel(
    const scalar_t* __restrict__ x, int64_t n_rows, int64_t n_pad, int64_t k, const index_t* __restrict__ crow,
    const index_t* __restrict__ col, const scalar_t* __restrict__ val, int64_t nnz, int64_t m,
    scalar_t* __restrict__ out) {
  static_assert(sizeof(scalar_t) == 2 && T >= 1 && T <= 8, "16-bit values, at most 8 tokens a tile");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  scalar_t* xs = reinterpret_cast<scalar_t*>(smem_raw);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * T;
  const bool has_tokens = n0 < n_rows;  // a tile of padding rows only writes zeros
  if (kShared) {
    // Item i: token t = i % T and columns 8g .. 8g + 7 (g = i / T): one 16-byte load of x (k % 8 == 0, x
    // 16-byte aligned), eight 2-byte stores into the token-minor tile. Rows >= n_rows are zero.
    constexpr int kPer = 8;
    const int64_t items = has_tokens ? k / kPer * T : 0;
    for (int64_t i = threadIdx.x; i < items; i += blockDim.x) {
      const int t = static_cast<int>(i % T);
      const int64_t g = i / T;
      uint4 w = make_uint4(0, 0, 0, 0);
      if (n0 + t < n_rows) w = reinterpret_cast<const uint4*>(x + (n0 + t) * k)[g];
      if (T == 1) {
        reinterpret_cast<uint4*>(xs)[g] = w;  // one row: the tile is the row itself
      } else {
        const scalar_t* s = reinterpret_cast<const scalar_t*>(&w);
#pragma unroll
        for (int e = 0; e < kPer; ++e) xs[tile_slot(g * kPer + e) * T + t] = s[e];
      }
    }
    __syncthreads();
  }
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; r < m;
       r += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = 0.f;
    const int64_t start = has_tokens ? static_cast<int64_t>(crow[r]) : 0;
    const int64_t stop = has_tokens ? static_cast<int64_t>(crow[r + 1]) : 0;
    if (0 <= start && start <= stop && stop <= nnz) {
#pragma unroll 2
      for (int64_t j = start; j < stop; ++j) {
        const int64_t c = col[j];
        if (c < 0 || c >= k) continue;
        const float v = static_cast<float>(val[j]);
        float xv[T];
        if (kShared) {
          tile_tokens<scalar_t, T>(xs, c, xv);
        } else {
#pragma unroll
          for (int t = 0; t < T; ++t) xv[t] = n0 + t < n_rows ? static_cast<float>(x[(n0 + t) * k + c]) : 0.f;
        }
#pragma unroll
        for (int t = 0; t < T; ++t) acc[t] = fmaf(v, xv[t], acc[t]);
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (n0 + t < n_pad) out[(n0 + t) * m + r] = static_cast<scalar_t>(acc[t]);
    }
  }
}

template <typename scalar_t, typename index_t, int T, bool kShared>
void launch_residual(const at::Tensor& x, int64_t n_rows, int64_t n_pad, const at::Tensor& crow,
                     const at::Tensor& col, const at::Tensor& val, const at::Tensor& out) {
  const int64_t k = x.size(1), m = out.size(1);
  const int64_t smem = kShared ? T * k * static_cast<int64_t>(sizeof(scalar_t)) : 0;
  auto kernel = residual_kernel<scalar_t, index_t, T, kShared>;
  // The x tile can pass the 48 KB default; per (kernel, device), as the other kernels do. (A flag per
  // instantiation set to the first call's size made a later call with more in_features fail its launch.)
  if (smem > 48 * 1024) allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel));
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const int64_t tiles = (n_pad + T - 1) / T;
  const int64_t per_sm_by_smem =
      smem > 0 ? prop->sharedMemPerMultiprocessor / (smem + static_cast<int64_t>(prop->reservedSharedMemPerBlock)) : 64;
  const int64_t per_sm = std::max<int64_t>(
      1, std::min<int64_t>(prop->maxThreadsPerMultiProcessor / kResidualThreads, per_sm_by_smem));
  // About two waves of blocks: rows of uneven length even out, and few tiles are loaded more than once.
  const int64_t target = 2 * per_sm * prop->multiProcessorCount;
  const int64_t max_splits = (m + kResidualThreads - 1) / kResidualThreads;
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(max_splits, (target + tiles - 1) / tiles));
  TORCH_CHECK(tiles <= std::numeric_limits<int32_t>::max() && splits <= 65535, "sparse24: too many tokens (", n_pad,
              ") for the residual kernel");
  kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), kResidualThreads, smem,
           at::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<scalar_t>(), n_rows, n_pad, k, crow.data_ptr<index_t>(), col.data_ptr<index_t>(),
      val.data_ptr<scalar_t>(), col.numel(), m, out.data_ptr<scalar_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// out (n_pad x m) = x @ R^T, x (>= n_rows rows, k % 8 == 0, 16-byte aligned, contiguous).
template <typename scalar_t, typename index_t>
void residual_product(const at::Tensor& x, int64_t n_rows, int64_t n_pad, const at::Tensor& crow,
                      const at::Tensor& col, const at::Tensor& val, const at::Tensor& out) {
  const int64_t row_bytes = x.size(1) * static_cast<int64_t>(sizeof(scalar_t));
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  // Tiles that leave room for two blocks per SM (one block's tile load overlaps another's walk), and no more
  // tokens than there are: N = 1 loads one row, not eight.
  const int64_t budget = std::min<int64_t>(static_cast<int64_t>(prop->sharedMemPerBlockOptin),
                                           static_cast<int64_t>(prop->sharedMemPerMultiprocessor) / 2 -
                                               static_cast<int64_t>(prop->reservedSharedMemPerBlock));
  auto fits = [&](int64_t t) { return t * row_bytes <= budget && (t == 1 || t / 2 < n_rows); };
  if (fits(8)) return launch_residual<scalar_t, index_t, 8, true>(x, n_rows, n_pad, crow, col, val, out);
  if (fits(4)) return launch_residual<scalar_t, index_t, 4, true>(x, n_rows, n_pad, crow, col, val, out);
  if (fits(2)) return launch_residual<scalar_t, index_t, 2, true>(x, n_rows, n_pad, crow, col, val, out);
  if (fits(1)) return launch_residual<scalar_t, index_t, 1, true>(x, n_rows, n_pad, crow, col, val, out);
  launch_residual<scalar_t, index_t, 1, false>(x, n_rows, n_pad, crow, col, val, out);
}

[[maybe_unused]] void run_residual(const at::Tensor& x, int64_t n_rows, int64_t n_pad, const at::Tensor& crow, const at::Tensor& col,
                  const at::Tensor& val, const at::Tensor& out) {
  AT_DISPATCH_SWITCH(x.scalar_type(), "sparse24_residual",
                     AT_DISPATCH_CASE(at::kHalf, [&] {
                       if (crow.scalar_type() == at::kInt) return residual_product<scalar_t, int32_t>(x, n_rows, n_pad, crow, col, val, out);
                       residual_product<scalar_t, int64_t>(x, n_rows, n_pad, crow, col, val, out);
                     }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
                       if (crow.scalar_type() == at::kInt) return residual_product<scalar_t, int32_t>(x, n_rows, n_pad, crow, col, val, out);
                       residual_product<scalar_t, int64_t>(x, n_rows, n_pad, crow, col, val, out);
                     }));
}

// ---- argument checks shared by linear and search ----

struct LinearArgs {
  at::Tensor x;         // (n_pad, k), contiguous, 16-byte aligned, rows >= N zero
  int64_t n = 0, n_pad = 0, k = 0, m = 0;
  at::Tensor bias;      // undefined or (m,) contiguous, 16-byte aligned
};

[[maybe_unused]] LinearArgs prepare(const at::Tensor& x_in, const at::Tensor& compressed, int64_t out_features,
                   const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x_in.dim() == 2, "sparse24: x must be 2-D (tokens, in_features), got shape ", x_in.sizes());
  check_operand_dtype(x_in, "x");
  TORCH_CHECK_VALUE(x_in.is_cuda() && compressed.device() == x_in.device(), "sparse24: x and compressed must be on one "
                    "CUDA device, got ", x_in.device(), " and ", compressed.device());
  TORCH_CHECK_TYPE(compressed.scalar_type() == at::kByte && compressed.dim() == 1 && compressed.is_contiguous(),
                   "sparse24: compressed must be the 1-D uint8 tensor sparse24_compress returns, got ",
                   compressed.scalar_type(), " of shape ", compressed.sizes());
  LinearArgs a;
  a.n = x_in.size(0);
  a.k = x_in.size(1);
  a.m = out_features;
  TORCH_CHECK_VALUE(a.m > 0 && a.m % kStructMultiple == 0 && a.k > 0 && a.k % kStructMultiple == 0,
                    "sparse24: out_features (", a.m, ") and in_features (", a.k, ") must be positive multiples of ",
                    kStructMultiple, " (cuSPARSELt)");
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == a.m && bias->scalar_type() == x_in.scalar_type() &&
                          bias->device() == x_in.device(),
                      "sparse24: bias must be (", a.m, ",) of x's dtype and device, got ", bias->sizes(), " ",
                      bias->scalar_type(), " on ", bias->device());
    a.bias = bias->contiguous();
    if (!is_aligned(a.bias.data_ptr(), 16)) a.bias = a.bias.clone();
  }
  a.n_pad = round_up(std::max<int64_t>(a.n, 1), kPadN);
  at::Tensor x = x_in.contiguous();
  if (a.n_pad != a.n || !is_aligned(x.data_ptr(), 16)) {
    at::Tensor padded = at::zeros({a.n_pad, a.k}, x.options());
    padded.narrow(0, 0, a.n).copy_(x);
    x = padded;
  }
  a.x = x;
  return a;
}

#ifdef SPARSETORCH_WITH_CUSPARSELT

#define SPARSETORCH_CUSPARSELT_CHECK(call)                                                              \
  do {                                                                                                 \
    const cusparseStatus_t status_ = (call);                                                           \
    TORCH_CHECK(status_ == CUSPARSE_STATUS_SUCCESS, "cuSPARSELt call ", #call, " failed: ",            \
                cusparseLtGetErrorString(status_), " (status ", static_cast<int>(status_), ")");        \
  } while (0)

// One handle per device, made on first use with that device current (the caller holds a CUDAGuard).
const cusparseLtHandle_t* handle_for(int device) {
  static std::mutex mu;
  static auto* handles = new std::vector<cusparseLtHandle_t*>();  // leaked on purpose, see the file comment
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(handles->size()) <= device) handles->resize(device + 1, nullptr);
  if ((*handles)[device] == nullptr) {
    auto* h = new cusparseLtHandle_t;
    const cusparseStatus_t status = cusparseLtInit(h);
    if (status != CUSPARSE_STATUS_SUCCESS) {
      delete h;
      TORCH_CHECK(false, "cuSPARSELt call cusparseLtInit failed: ", cusparseLtGetErrorString(status), " (status ",
                  static_cast<int>(status), ")");
    }
    (*handles)[device] = h;
  }
  return (*handles)[device];
}

cudaDataType lt_dtype(at::ScalarType t) { return t == at::kHalf ? CUDA_R_16F : CUDA_R_16BF; }

// The structured operand as both compression and the plans describe it.
struct WeightDescriptor {
  cusparseLtMatDescriptor_t d;
  WeightDescriptor(const cusparseLtHandle_t* h, int64_t m, int64_t k, at::ScalarType dtype) {
    SPARSETORCH_CUSPARSELT_CHECK(cusparseLtStructuredDescriptorInit(h, &d, m, k, k, 16, lt_dtype(dtype),
                                                                    CUSPARSE_ORDER_ROW,
                                                                    CUSPARSELT_SPARSITY_50_PERCENT));
  }
  ~WeightDescriptor() { cusparseLtMatDescriptorDestroy(&d); }
  WeightDescriptor(const WeightDescriptor&) = delete;
  WeightDescriptor& operator=(const WeightDescriptor&) = delete;
};

struct PlanKey {
  int device;
  int dtype;
  int64_t m, k, n;
  bool read_c;
  uintptr_t bias;
  int64_t alg;
  bool operator==(const PlanKey& o) const {
    return device == o.device && dtype == o.dtype && m == o.m && k == o.k && n == o.n && read_c == o.read_c &&
           bias == o.bias && alg == o.alg;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& p) const {
    size_t h = std::hash<int64_t>()(p.m);
    for (int64_t v : {static_cast<int64_t>(p.device), static_cast<int64_t>(p.dtype), p.k, p.n,
                      static_cast<int64_t>(p.read_c), static_cast<int64_t>(p.bias), p.alg}) {
      h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return h;
  }
};

// Descriptors, algorithm selection and plan live and die together: the plan refers to the others.
struct Plan {
  cusparseLtMatDescriptor_t a{}, b{}, c{};
  cusparseLtMatmulDescriptor_t matmul{};
  cusparseLtMatmulAlgSelection_t alg{};
  cusparseLtMatmulPlan_t plan{};
  int made = 0;  // how many of a, b, c, alg, plan exist (destroyed in reverse)
  size_t workspace = 0;
  size_t compressed_size = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (made >= 5) cusparseLtMatmulPlanDestroy(&plan);
    if (made >= 4) cusparseLtMatmulAlgSelectionDestroy(&alg);
    if (made >= 3) cusparseLtMatDescriptorDestroy(&c);
    if (made >= 2) cusparseLtMatDescriptorDestroy(&b);
    if (made >= 1) cusparseLtMatDescriptorDestroy(&a);
  }
};

// Algorithm code: configuration id (bits 0-15), split-k (16-31), split-k mode (32-39), split-k buffers (40-55).
void apply_alg(const cusparseLtHandle_t* h, cusparseLtMatmulAlgSelection_t* alg, int64_t code) {
  int config = static_cast<int>(code & 0xffff), split_k = static_cast<int>((code >> 16) & 0xffff);
  int mode = static_cast<int>((code >> 32) & 0xff), buffers = static_cast<int>((code >> 40) & 0xffff);
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulAlgSetAttribute(h, alg, CUSPARSELT_MATMUL_ALG_CONFIG_ID, &config,
                                                               sizeof(config)));
  if (split_k > 1) {
    SPARSETORCH_CUSPARSELT_CHECK(
        cusparseLtMatmulAlgSetAttribute(h, alg, CUSPARSELT_MATMUL_SPLIT_K, &split_k, sizeof(split_k)));
    if (mode > 0) {
      const cusparseLtSplitKMode_t m = static_cast<cusparseLtSplitKMode_t>(mode);
      SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulAlgSetAttribute(h, alg, CUSPARSELT_MATMUL_SPLIT_K_MODE, &m,
                                                                   sizeof(m)));
    }
    if (buffers > 0) {
      SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulAlgSetAttribute(h, alg, CUSPARSELT_MATMUL_SPLIT_K_BUFFERS,
                                                                   &buffers, sizeof(buffers)));
    }
  }
}

int64_t read_alg(const cusparseLtHandle_t* h, const cusparseLtMatmulAlgSelection_t* alg) {
  int config = 0, split_k = 1, buffers = 0;
  cusparseLtSplitKMode_t mode = CUSPARSELT_INVALID_MODE;
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulAlgGetAttribute(h, alg, CUSPARSELT_MATMUL_ALG_CONFIG_ID, &config,
                                                               sizeof(config)));
  // Split-k attributes are optional in the code: a failed read keeps the defaults.
  if (cusparseLtMatmulAlgGetAttribute(h, alg, CUSPARSELT_MATMUL_SPLIT_K, &split_k, sizeof(split_k)) !=
      CUSPARSE_STATUS_SUCCESS) split_k = 1;
  if (split_k > 1) {
    if (cusparseLtMatmulAlgGetAttribute(h, alg, CUSPARSELT_MATMUL_SPLIT_K_MODE, &mode, sizeof(mode)) !=
        CUSPARSE_STATUS_SUCCESS) mode = CUSPARSELT_INVALID_MODE;
    if (cusparseLtMatmulAlgGetAttribute(h, alg, CUSPARSELT_MATMUL_SPLIT_K_BUFFERS, &buffers, sizeof(buffers)) !=
        CUSPARSE_STATUS_SUCCESS) buffers = 0;
  }
  return (static_cast<int64_t>(config) & 0xffff) | ((static_cast<int64_t>(std::max(split_k, 1)) & 0xffff) << 16) |
         ((static_cast<int64_t>(mode) & 0xff) << 32) | ((static_cast<int64_t>(std::max(buffers, 0)) & 0xffff) << 40);
}

std::shared_ptr<Plan> make_plan(const cusparseLtHandle_t* h, const PlanKey& key, at::ScalarType dtype) {
  auto p = std::make_shared<Plan>();
  const cudaDataType dt = lt_dtype(dtype);
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtStructuredDescriptorInit(h, &p->a, key.m, key.k, key.k, 16, dt,
                                                                  CUSPARSE_ORDER_ROW,
                                                                  CUSPARSELT_SPARSITY_50_PERCENT));
  p->made = 1;
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtDenseDescriptorInit(h, &p->b, key.n, key.k, key.k, 16, dt, CUSPARSE_ORDER_ROW));
  p->made = 2;
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtDenseDescriptorInit(h, &p->c, key.m, key.n, key.m, 16, dt, CUSPARSE_ORDER_COL));
  p->made = 3;
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulDescriptorInit(h, &p->matmul, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                                              CUSPARSE_OPERATION_TRANSPOSE, &p->a, &p->b, &p->c,
                                                              &p->c, CUSPARSE_COMPUTE_32F));
  if (key.bias != 0) {
    void* bias = reinterpret_cast<void*>(key.bias);
    SPARSETORCH_CUSPARSELT_CHECK(
        cusparseLtMatmulDescSetAttribute(h, &p->matmul, CUSPARSELT_MATMUL_BIAS_POINTER, &bias, sizeof(bias)));
  }
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulAlgSelectionInit(h, &p->alg, &p->matmul, CUSPARSELT_MATMUL_ALG_DEFAULT));
  p->made = 4;
  if (key.alg >= 0) apply_alg(h, &p->alg, key.alg);
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulPlanInit(h, &p->plan, &p->matmul, &p->alg));
  p->made = 5;
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulGetWorkspace(h, &p->plan, &p->workspace));
  size_t buffer = 0;
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtSpMMACompressedSize(h, &p->plan, &p->compressed_size, &buffer));
  return p;
}

constexpr size_t kMaxPlans = 256;

class PlanCache {
 public:
  // The plan for `key`, made on a miss (the least recently used one dropped beyond kMaxPlans); `insert`
  // stores a plan made elsewhere (the search's).
  std::shared_ptr<Plan> get(const cusparseLtHandle_t* h, const PlanKey& key, at::ScalarType dtype) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    std::shared_ptr<Plan> plan;
    try {
      plan = make_plan(h, key, dtype);
    } catch (const c10::Error&) {
      if (key.alg < 0) throw;
      PlanKey fallback = key;  // a searched code that does not apply to this N: cuSPARSELt's default
      fallback.alg = -1;
      plan = make_plan(h, fallback, dtype);
    }
    return put(key, std::move(plan));
  }
  void insert(const PlanKey& key, std::shared_ptr<Plan> plan) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      lru_.erase(it->second);
      map_.erase(it);
    }
    put(key, std::move(plan));
  }
  void clear() {  // a call still using a plan holds its own reference
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
    lru_.clear();
  }
  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(lru_.size());
  }

 private:
  std::shared_ptr<Plan> put(const PlanKey& key, std::shared_ptr<Plan> plan) {
    lru_.emplace_front(key, plan);
    map_[key] = lru_.begin();
    while (lru_.size() > kMaxPlans) {
      map_.erase(lru_.back().first);
      lru_.pop_back();  // a call still using it holds its own reference
    }
    return plan;
  }
  std::mutex mu_;
  std::list<std::pair<PlanKey, std::shared_ptr<Plan>>> lru_;
  std::unordered_map<PlanKey, std::list<std::pair<PlanKey, std::shared_ptr<Plan>>>::iterator, PlanKeyHash> map_;
};

PlanCache& plan_cache() {
  static auto* cache = new PlanCache();  // leaked on purpose, see the file comment
  return *cache;
}

const bool kCacheListed = native_caches::add("cusparselt_plans", [] { plan_cache().clear(); },
                                             [] { return plan_cache().size(); });

at::Tensor weight_for_compression(const at::Tensor& weight) {
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.is_cuda(), "sparse24: weight must be a 2-D CUDA tensor, got shape ",
                    weight.sizes(), " on ", weight.device());
  check_operand_dtype(weight, "weight");
  TORCH_CHECK_VALUE(weight.size(0) > 0 && weight.size(0) % kStructMultiple == 0 && weight.size(1) > 0 &&
                        weight.size(1) % kStructMultiple == 0,
                    "sparse24: the weight's dimensions must be positive multiples of ", kStructMultiple,
                    " (cuSPARSELt), got ", weight.sizes());
  at::Tensor w = weight.contiguous();
  return is_aligned(w.data_ptr(), 16) ? w : w.clone();
}

at::Tensor sparse24_compress_cuda(const at::Tensor& weight) {
  const at::Tensor w = weight_for_compression(weight);
  const c10::cuda::CUDAGuard guard(w.device());
  const cusparseLtHandle_t* h = handle_for(w.get_device());
  WeightDescriptor desc(h, w.size(0), w.size(1), w.scalar_type());
  size_t size = 0, buffer = 0;
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtSpMMACompressedSize2(h, &desc.d, &size, &buffer));
  at::Tensor out = at::empty({static_cast<int64_t>(size)}, w.options().dtype(at::kByte));
  at::Tensor scratch = at::empty({static_cast<int64_t>(std::max<size_t>(buffer, 1))}, w.options().dtype(at::kByte));
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtSpMMACompress2(h, &desc.d, 1, CUSPARSE_OPERATION_NON_TRANSPOSE, w.data_ptr(),
                                                        out.data_ptr(), scratch.data_ptr(),
                                                        at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor sparse24_check_cuda(const at::Tensor& weight) {
  const at::Tensor w = weight_for_compression(weight);
  const c10::cuda::CUDAGuard guard(w.device());
  const cusparseLtHandle_t* h = handle_for(w.get_device());
  WeightDescriptor desc(h, w.size(0), w.size(1), w.scalar_type());
  at::Tensor valid = at::zeros({1}, w.options().dtype(at::kInt));
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtSpMMAPruneCheck2(h, &desc.d, 1, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                                          w.data_ptr(), valid.data_ptr<int>(),
                                                          at::cuda::getCurrentCUDAStream()));
  return valid;
}

PlanKey key_for(const LinearArgs& a, bool read_c, int64_t alg) {
  return PlanKey{a.x.get_device(), static_cast<int>(a.x.scalar_type()), a.m, a.k, a.n_pad, read_c,
                 a.bias.defined() ? reinterpret_cast<uintptr_t>(a.bias.data_ptr()) : 0, alg};
}

void matmul(const cusparseLtHandle_t* h, Plan& plan, const LinearArgs& a, const at::Tensor& compressed, float beta,
            const at::Tensor& out, bool search) {
  TORCH_CHECK_VALUE(static_cast<size_t>(compressed.numel()) >= plan.compressed_size, "sparse24: compressed has ",
                    compressed.numel(), " bytes but a ", a.m, " x ", a.k, " ", a.x.scalar_type(),
                    " weight compresses to ", plan.compressed_size, " (out_features or in_features do not match it)");
  at::Tensor workspace = at::empty({static_cast<int64_t>(std::max<size_t>(plan.workspace, 1))},
                                   a.x.options().dtype(at::kByte));
  const float alpha = 1.0f;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (search) {
    SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulSearch(h, &plan.plan, &alpha, compressed.data_ptr(), a.x.data_ptr(),
                                                        &beta, out.data_ptr(), out.data_ptr(), workspace.data_ptr(),
                                                        &stream, 1));
  } else {
    SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmul(h, &plan.plan, &alpha, compressed.data_ptr(), a.x.data_ptr(), &beta,
                                                  out.data_ptr(), out.data_ptr(), workspace.data_ptr(), &stream, 1));
  }
}

void check_residual(const LinearArgs& a, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& val) {
  TORCH_CHECK_VALUE(crow.dim() == 1 && crow.size(0) == a.m + 1 && col.dim() == 1 && val.dim() == 1 &&
                        col.size(0) == val.size(0),
                    "sparse24: the residual must be a CSR of ", a.m, " rows (crow of ", a.m + 1,
                    " entries, col and values of one length), got crow ", crow.sizes(), ", col ", col.sizes(),
                    ", values ", val.sizes());
  TORCH_CHECK_TYPE((crow.scalar_type() == at::kInt || crow.scalar_type() == at::kLong) &&
                       col.scalar_type() == crow.scalar_type() && val.scalar_type() == a.x.scalar_type(),
                   "sparse24: residual indices must be int32 or int64 (both the same) and its values of x's dtype, "
                   "got ", crow.scalar_type(), ", ", col.scalar_type(), ", ", val.scalar_type());
  for (const at::Tensor* t : {&crow, &col, &val}) {
    TORCH_CHECK_VALUE(t->device() == a.x.device(), "sparse24: the residual must be on x's device ", a.x.device());
  }
}

at::Tensor sparse24_linear_cuda(const at::Tensor& x_in, const at::Tensor& compressed, int64_t out_features,
                                const std::optional<at::Tensor>& residual_crow,
                                const std::optional<at::Tensor>& residual_col,
                                const std::optional<at::Tensor>& residual_values, const std::optional<at::Tensor>& bias,
                                c10::string_view activation, double negative_slope, int64_t alg) {
  const Activation act = parse_activation(std::string(activation));
  const int given = residual_crow.has_value() + residual_col.has_value() + residual_values.has_value();
  TORCH_CHECK_VALUE(given == 0 || given == 3, "sparse24: pass all of residual_crow, residual_col and residual_values, "
                    "or none");
  const c10::cuda::CUDAGuard guard(x_in.device());
  const LinearArgs a = prepare(x_in, compressed, out_features, bias);
  at::Tensor out = at::empty({a.n_pad, a.m}, a.x.options());
  if (a.n == 0) return out.narrow(0, 0, 0);
  bool read_c = false;
  if (given == 3) {
    check_residual(a, *residual_crow, *residual_col, *residual_values);
    if (residual_col->numel() > 0) {
      run_residual(a.x, a.n, a.n_pad, residual_crow->contiguous(), residual_col->contiguous(),
                   residual_values->contiguous(), out);
      read_c = true;
    }
  }
  const cusparseLtHandle_t* h = handle_for(a.x.get_device());
  const std::shared_ptr<Plan> plan = plan_cache().get(h, key_for(a, read_c, alg), a.x.scalar_type());
  matmul(h, *plan, a, compressed, read_c ? 1.0f : 0.0f, out, false);
  at::Tensor y = out.narrow(0, 0, a.n);
  if (act != Activation::None) bias_act_inplace_cuda(y, at::Tensor(), act, negative_slope);
  return y;
}

int64_t sparse24_search_cuda(const at::Tensor& x_in, const at::Tensor& compressed, int64_t out_features,
                             bool residual, const std::optional<at::Tensor>& bias, c10::string_view activation) {
  parse_activation(std::string(activation));  // the activation runs after the product: no part of the plan
  const c10::cuda::CUDAGuard guard(x_in.device());
  const LinearArgs a = prepare(x_in, compressed, out_features, bias);
  const cusparseLtHandle_t* h = handle_for(a.x.get_device());
  // A plan of its own (the search rewrites its algorithm), stored afterwards under the code it found.
  const PlanKey probe = key_for(a, residual, -1);
  std::shared_ptr<Plan> plan = make_plan(h, probe, a.x.scalar_type());
  at::Tensor scratch = at::zeros({a.n_pad, a.m}, a.x.options());
  matmul(h, *plan, a, compressed, residual ? 1.0f : 0.0f, scratch, true);
  const int64_t code = read_alg(h, &plan->alg);
  SPARSETORCH_CUSPARSELT_CHECK(cusparseLtMatmulGetWorkspace(h, &plan->plan, &plan->workspace));
  plan_cache().insert(key_for(a, residual, code), std::move(plan));
  return code;
}

#else  // built without cuSPARSELt: the 2:4 ops say so when called

[[noreturn]] void no_cusparselt() {
  TORCH_CHECK(false, "sparse24: this build of sparsetorch has no cuSPARSELt (it was not found when building). Install "
              "the nvidia-cusparselt package matching your CUDA (or set SPARSETORCH_CUSPARSELT_HOME) and rebuild; "
              "2:4 weights still run on the CPU and as CSR/dense on the GPU");
}

at::Tensor sparse24_compress_cuda(const at::Tensor&) { no_cusparselt(); }
at::Tensor sparse24_check_cuda(const at::Tensor&) { no_cusparselt(); }
at::Tensor sparse24_linear_cuda(const at::Tensor&, const at::Tensor&, int64_t, const std::optional<at::Tensor>&,
                                const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                                const std::optional<at::Tensor>&, c10::string_view, double, int64_t) {
  no_cusparselt();
}
int64_t sparse24_search_cuda(const at::Tensor&, const at::Tensor&, int64_t, bool, const std::optional<at::Tensor>&,
                             c10::string_view) {
  no_cusparselt();
}

#endif

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) {
  m.impl("sparse24_compress", SPARSETORCH_CUDA_OP(sparse24_compress_cuda));
  m.impl("sparse24_check", SPARSETORCH_CUDA_OP(sparse24_check_cuda));
  m.impl("sparse24_linear", SPARSETORCH_CUDA_OP(sparse24_linear_cuda));
  m.impl("sparse24_search", SPARSETORCH_CUDA_OP(sparse24_search_cuda));
}

}  // namespace cuda

#ifdef SPARSETORCH_WITH_CUSPARSELT
int64_t cusparselt_compiled_version() { return CUSPARSELT_VERSION; }
#endif

}  // namespace sparsetorch
