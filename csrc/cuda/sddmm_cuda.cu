// Sampled dense-dense product on CUDA: out[j] = alpha * dot(a[row(j), :], b[col[j], :]) for each
// stored entry j of a CSR pattern, the gradient of spmm with respect to A's values.
//
// Two routes, like spmm:
//  - "native": a group of GROUP lanes per pattern row; for each entry of the row the lanes split
//    the n columns (16-byte loads when aligned), and a shuffle reduction gives the dot product;
//    kEntries entries are in flight at once.
//    Every dtype (fp32 accumulation for half types), int32/int64 indices, every batch layout
//    (per-batch patterns, shared pattern, broadcast a or b) without copies or host syncs. Entries
//    with an out-of-range column and spans outside [0, L] are skipped (their value stays 0).
//  - "cusparse": cusparseSDDMM (pooled handle, workspace from the caching allocator) for one
//    unbatched float32/float64 matrix; other cases take the native route.
// "auto" takes native for n <= 256 and cuSPARSE above where it applies (see sddmm_cuda()).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "common/checks.h"
#include "common/csr_analysis.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kEntries = 4;  // entries of one row processed together by a group

template <typename scalar_t, typename index_t>
struct SddmmArgs {
  const index_t* crow;
  const index_t* col;
  const scalar_t* a;
  const scalar_t* b;
  scalar_t* out;
  int64_t rows;  // batch * m
  int64_t m, k, n, L;
  int64_t crow_bstride, col_bstride, a_bstride, b_bstride, out_bstride;
  double alpha;
};

template <typename scalar_t, typename index_t, int VEC, int GROUP>
__global__ void __launch_bounds__(kThreads) sddmm_row_group_kernel(const SddmmArgs<scalar_t, index_t> p) {
  using acc_t = at::opmath_type<scalar_t>;
  using VecT = Packed<scalar_t, VEC>;
  constexpr int kGroupsPerBlock = kThreads / GROUP;
  const int lane = threadIdx.x % GROUP;
  const unsigned mask = group_lane_mask<GROUP>();
  const acc_t alpha = static_cast<acc_t>(p.alpha);

  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / GROUP; row < p.rows;
       row += static_cast<int64_t>(gridDim.x) * kGroupsPerBlock) {
    const int64_t bi = row / p.m, r = row - bi * p.m;
    const index_t* crow_b = p.crow + bi * p.crow_bstride;
    const index_t* col_b = p.col + bi * p.col_bstride;
    const scalar_t* arow = p.a + bi * p.a_bstride + r * p.n;
    const scalar_t* b_b = p.b + bi * p.b_bstride;
    scalar_t* out_b = p.out + bi * p.out_bstride;
    const auto [start, stop] = clamped_row_span(crow_b, r, p.L);
    // kEntries entries at a time: their b rows are loaded together (independent loads in flight)
    // and their dot products reduced together.
    for (int64_t j0 = start; j0 < stop; j0 += kEntries) {
      int64_t c[kEntries];
      bool ok[kEntries];
      acc_t dot[kEntries];
#pragma unroll
      for (int u = 0; u < kEntries; ++u) {
        c[u] = j0 + u < stop ? static_cast<int64_t>(col_b[j0 + u]) : int64_t(-1);
        ok[u] = c[u] >= 0 && c[u] < p.k;  // the same for every lane of the group
        dot[u] = acc_t(0);
      }
      for (int64_t c0 = static_cast<int64_t>(lane) * VEC; c0 < p.n; c0 += GROUP * VEC) {
        VecT av;
        av.load(arow + c0);
        VecT bv[kEntries];
#pragma unroll
        for (int u = 0; u < kEntries; ++u) {
          if (ok[u]) bv[u].load(b_b + c[u] * p.n + c0);
        }
#pragma unroll
        for (int u = 0; u < kEntries; ++u) {
          if (!ok[u]) continue;
#pragma unroll
          for (int q = 0; q < VEC; ++q) dot[u] += av.get(q) * bv[u].get(q);
        }
      }
#pragma unroll
      for (int u = 0; u < kEntries; ++u) {
#pragma unroll
        for (int offset = GROUP / 2; offset > 0; offset /= 2) dot[u] += __shfl_xor_sync(mask, dot[u], offset, GROUP);
      }
      if (lane == 0) {
#pragma unroll
        for (int u = 0; u < kEntries; ++u) {
          if (ok[u]) out_b[j0 + u] = static_cast<scalar_t>(alpha * dot[u]);
        }
      }
    }
  }
}

template <typename scalar_t, typename index_t>
void launch_native(const SddmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                   const at::Tensor& b, double alpha, const at::Tensor& out) {
  SddmmArgs<scalar_t, index_t> args;
  args.crow = crow.data_ptr<index_t>();
  args.col = col.data_ptr<index_t>();
  args.a = a.data_ptr<scalar_t>();
  args.b = b.data_ptr<scalar_t>();
  args.out = out.data_ptr<scalar_t>();
  args.rows = p.batch * p.m;
  args.m = p.m;
  args.k = p.k;
  args.n = p.n;
  args.L = p.nnz_stride;
  args.crow_bstride = p.crow_bstride();
  args.col_bstride = p.col_bstride();
  args.a_bstride = p.a_batched ? p.m * p.n : 0;
  args.b_bstride = p.b_batched ? p.k * p.n : 0;
  args.out_bstride = p.batched ? p.nnz_stride : 0;
  args.alpha = alpha;

  constexpr int kVec = 16 / sizeof(scalar_t);
  const bool vec_ok = p.n % kVec == 0 && is_aligned(args.a, 16) && is_aligned(args.b, 16);
  const int vec = vec_ok ? kVec : 1;
  const int group = row_group_size(ceil_div(p.n, vec));
  const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 16;
  const int64_t blocks = std::max<int64_t>(1, std::min(ceil_div(args.rows, kThreads / group), max_blocks));
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto vec_tag, auto group_tag) {
    constexpr int V = decltype(vec_tag)::value, G = decltype(group_tag)::value;
    sddmm_row_group_kernel<scalar_t, index_t, V, G><<<blocks, kThreads, 0, stream>>>(args);
  };
  using V1 = std::integral_constant<int, 1>;
  using VN = std::integral_constant<int, kVec>;
  auto with_group = [&](auto vec_tag) {
    if (group == 8) {
      launch(vec_tag, std::integral_constant<int, 8>{});
    } else if (group == 16) {
      launch(vec_tag, std::integral_constant<int, 16>{});
    } else {
      launch(vec_tag, std::integral_constant<int, 32>{});
    }
  };
  if (vec_ok) {
    with_group(VN{});
  } else {
    with_group(V1{});
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// cusparseSDDMM: C = alpha * (a @ op(b)) sampled at C's pattern, a (m x n) row-major, b (k x n)
// row-major read as its transpose (n x k).
void run_cusparse(const SddmmProblem& p, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                  const at::Tensor& b, double alpha, const at::Tensor& out) {
  const auto dtype = a.scalar_type();
  cusparseHandle_t handle = at::cuda::getCurrentCUDASparseHandle();
  SPARSETORCH_CUSPARSE_CHECK(cusparseSetStream(handle, at::cuda::getCurrentCUDAStream()));
  SpMatDescriptor mat_c;
  mat_c.create_csr(p.m, p.k, p.nnz_stride, crow, col, out);
  DnMatDescriptor mat_a, mat_b;
  mat_a.create(p.m, p.n, p.n, a.data_ptr(), dtype, CUSPARSE_ORDER_ROW);
  mat_b.create(p.k, p.n, p.n, b.data_ptr(), dtype, CUSPARSE_ORDER_ROW);
  const Scalar alpha_s(alpha, dtype), beta_s(0.0, dtype);
  const auto op_a = CUSPARSE_OPERATION_NON_TRANSPOSE, op_b = CUSPARSE_OPERATION_TRANSPOSE;
  size_t buffer_size = 0;
  SPARSETORCH_CUSPARSE_CHECK(cusparseSDDMM_bufferSize(handle, op_a, op_b, alpha_s.ptr(), mat_a.get(), mat_b.get(),
                                                      beta_s.ptr(), mat_c.get(), cuda_dtype(dtype),
                                                      CUSPARSE_SDDMM_ALG_DEFAULT, &buffer_size));
  const at::Tensor workspace = at::empty({static_cast<int64_t>(std::max<size_t>(buffer_size, 1))},
                                         a.options().dtype(at::kByte));
  SPARSETORCH_CUSPARSE_CHECK(cusparseSDDMM(handle, op_a, op_b, alpha_s.ptr(), mat_a.get(), mat_b.get(),
                                           beta_s.ptr(), mat_c.get(), cuda_dtype(dtype),
                                           CUSPARSE_SDDMM_ALG_DEFAULT, workspace.data_ptr()));
}

at::Tensor sddmm_cuda(const at::Tensor& crow_in, const at::Tensor& col_in, const at::Tensor& a_in,
                      const at::Tensor& b_in, double alpha, c10::string_view backend_name, bool validate) {
  const SpmmBackend backend = parse_spmm_backend(std::string(backend_name));
  const SddmmProblem p = check_sddmm_args(crow_in, col_in, a_in, b_in);
  const c10::cuda::CUDAGuard guard(a_in.device());
  // Validated once per pattern unless the caller opted out; cuSPARSE only ever sees a checked matrix.
  const auto analysis = checked_csr(crow_in, col_in, p.k, validate || backend == SpmmBackend::Cusparse, "sddmm");
  // Slots that are not visited (padding, skipped entries) read 0.
  at::Tensor out = at::zeros(p.out_shape(), a_in.options());
  if (p.nnz_stride == 0 || p.m == 0 || p.k == 0 || p.n == 0) return out;
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const auto dtype = a.scalar_type();
  // "auto", from `python benchmarks/sddmm_cuda.py` on an H100 (fp32): native for n <= 256 (random
  // 100k x 100k, 20/row: 63 vs 79 us at n = 32, 232 vs 261 us at n = 128), cuSPARSE above (4096 x
  // 4096 at 10%, n = 1024: 830 vs 1095 us); native for half types and batches, which cuSPARSE lacks.
  // "tiled" names an SpMM kernel (the backward of a tiled spmm passes it on): SDDMM runs native.
  const bool cusparse_ok = !p.batched && (dtype == at::kFloat || dtype == at::kDouble) && analysis != nullptr;
  const bool auto_cusparse = cusparse_ok && p.nnz_stride <= p.m * p.k;  // cuSPARSE refuses nnz > m k
  const bool cusparse = cusparse_ok && (backend == SpmmBackend::Cusparse || (backend == SpmmBackend::Auto && auto_cusparse && p.n > 256));
  if (cusparse) {
    run_cusparse(p, crow, col, a, b, alpha, out);
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "sddmm_cuda", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "sddmm_cuda", [&] {
      launch_native<scalar_t, index_t>(p, crow, col, a, b, alpha, out);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("sddmm", SPARSETORCH_CUDA_OP(sddmm_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
