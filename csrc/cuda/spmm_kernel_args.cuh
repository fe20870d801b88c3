// What the native SpMM kernels (spmm_native.cu: a group of lanes per row; spmm_balanced.cu: a
// block's entries split evenly among its groups; spmm_tiled.cu: B tiles in shared memory) share: their argument block and the fused epilogue
// out = act(alpha * acc + beta * accumulate + bias).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <type_traits>

#include "common/activation.h"
#include "common/checks.h"
#include "cuda/cuda_utils.h"
#include "cuda/spmm_cuda.h"

namespace sparsetorch {
namespace cuda {

template <typename scalar_t, typename index_t>
struct NativeArgs {
  const index_t* crow;
  const index_t* col;
  const scalar_t* values;
  const scalar_t* dense;
  const scalar_t* accumulate;  // may be nullptr
  const scalar_t* bias;        // may be nullptr
  scalar_t* out;
  int64_t rows;  // batch * m
  int64_t m, k, n, L;
  int64_t crow_bstride, col_bstride, val_bstride, dense_bstride, ldb;
  double alpha, beta, negative_slope;
  Activation act;
  const int* run_only_if;  // nullptr, or a device flag: the row-group kernel does nothing while it is 0
};

// crow, col, values contiguous; dense with unit column stride; out contiguous in the output shape.
template <typename scalar_t, typename index_t>
NativeArgs<scalar_t, index_t> make_native_args(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                                               const at::Tensor& values, const at::Tensor& dense,
                                               const at::Tensor& out, const SpmmEpilogue& epi) {
  NativeArgs<scalar_t, index_t> args;
  args.crow = crow.data_ptr<index_t>();
  args.col = col.data_ptr<index_t>();
  args.values = values.data_ptr<scalar_t>();
  args.dense = dense.data_ptr<scalar_t>();
  args.accumulate = epi.accumulate.defined() ? epi.accumulate.data_ptr<scalar_t>() : nullptr;
  args.bias = epi.bias.defined() ? epi.bias.data_ptr<scalar_t>() : nullptr;
  args.out = out.data_ptr<scalar_t>();
  args.rows = p.batch * p.m;
  args.m = p.m;
  args.k = p.k;
  args.n = p.n;
  args.L = p.nnz_stride;
  args.crow_bstride = p.crow_bstride();
  args.col_bstride = p.col_bstride();
  args.val_bstride = p.val_bstride();
  args.dense_bstride = p.dense_batched ? dense.stride(0) : 0;
  args.ldb = dense.stride(-2);
  args.alpha = epi.alpha;
  args.beta = epi.beta;
  args.negative_slope = epi.negative_slope;
  args.act = epi.act;
  args.run_only_if = nullptr;
  return args;
}

// 16-byte accesses (vec elements) need every row start of B, out and accumulate on a 16-byte boundary.
template <typename scalar_t, typename index_t>
bool vector_access_ok(const NativeArgs<scalar_t, index_t>& a, int vec) {
  bool ok = a.n % vec == 0 && a.ldb % vec == 0 && a.dense_bstride % vec == 0 && is_aligned(a.dense, 16) &&
            is_aligned(a.out, 16);
  if (a.accumulate) ok = ok && is_aligned(a.accumulate, 16);
  return ok;
}

// The common entry of the own SpMM kernels: contiguous index/value arrays, B with unit column stride,
// dispatch on value and index dtype, then launch(args, aligned) where aligned says whether every B
// row, out and accumulate start on a 16-byte boundary (16-byte accesses allowed).
template <typename Launch>
void run_native_kernel(const SpmmProblem& p, const at::Tensor& crow_in, const at::Tensor& col_in,
                       const at::Tensor& values_in, const at::Tensor& dense_in, const at::Tensor& out,
                       const SpmmEpilogue& epi, Launch&& launch) {
  if (out.numel() == 0) return;
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
  const at::Tensor dense = dense_in.stride(-1) == 1 ? dense_in : dense_in.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "spmm_own_kernel", [&] {
    AT_DISPATCH_INDEX_TYPES(crow.scalar_type(), "spmm_own_kernel", [&] {
      const auto args = make_native_args<scalar_t, index_t>(p, crow, col, values, dense, out, epi);
      if (args.rows == 0) return;
      launch(args, vector_access_ok(args, 16 / sizeof(scalar_t)));
    });
  });
}

// The row-group style kernels hold a chunk of GROUP entries, one (column, value) per lane: lane l
// takes entry chunk + l of [chunk, stop) (column -1, value 0 past stop); count is how many are valid.
template <int GROUP, typename scalar_t, typename index_t>
struct EntryChunk {
  using acc_t = at::opmath_type<scalar_t>;
  int64_t col = -1;
  acc_t val = acc_t(0);
  int count;
  __device__ __forceinline__ EntryChunk(const index_t* col_b, const scalar_t* val_b, int64_t chunk, int64_t stop,
                                        int lane)
      : count(stop - chunk < GROUP ? static_cast<int>(stop - chunk) : GROUP) {
    if (chunk + lane < stop) {
      col = col_b[chunk + lane];
      val = static_cast<acc_t>(val_b[chunk + lane]);
    }
  }
};

// They broadcast a chunk's entries by shuffles. This fetches entries t .. t+K-1 of the chunk (count valid) and issues
// their K B-row loads at once, so K gathers are in flight instead of one: entries past `count`,
// columns outside [0, k) and inactive lanes (c0 >= n) get value 0 and a zero vector.
template <typename scalar_t, int VEC, int K>
struct GatheredRows {
  using acc_t = at::opmath_type<scalar_t>;
  Vec<scalar_t, VEC> b[K];
  acc_t v[K];

  template <int GROUP, typename index_t>
  __device__ __forceinline__ void load(const NativeArgs<scalar_t, index_t>& a, const scalar_t* dense_b,
                                       unsigned mask, int64_t my_col, acc_t my_val, int t, int count, int64_t c0,
                                       bool active) {
#pragma unroll
    for (int u = 0; u < K; ++u) {
      const int tu = t + u < GROUP ? t + u : GROUP - 1;
      const int64_t c = __shfl_sync(mask, my_col, tu, GROUP);
      v[u] = __shfl_sync(mask, my_val, tu, GROUP);
      if (t + u < count && active && c >= 0 && c < a.k) {
        b[u] = *reinterpret_cast<const Vec<scalar_t, VEC>*>(dense_b + c * a.ldb + c0);
      } else {
        v[u] = acc_t(0);
#pragma unroll
        for (int q = 0; q < VEC; ++q) b[u].v[q] = scalar_t(0);
      }
    }
  }
  // acc += v[u] * b[u]
  __device__ __forceinline__ void fma(int u, acc_t* acc) const {
#pragma unroll
    for (int q = 0; q < VEC; ++q) acc[q] += v[u] * static_cast<acc_t>(b[u].v[q]);
  }
};

// Calls launch(vec, group) with the compile-time vector width (16-byte accesses when `aligned`, else
// one element) and group size (8, 16 or 32 lanes: the fewest covering n in one pass) of the
// row-group style kernels (spmm_native.cu, spmm_balanced.cu).
template <typename scalar_t, typename index_t, typename Launch>
void dispatch_vec_and_group(const NativeArgs<scalar_t, index_t>& args, bool aligned, Launch&& launch) {
  auto with_group = [&](auto vec) {
    switch (row_group_size(ceil_div(args.n, decltype(vec)::value))) {
      case 8:
        return launch(vec, std::integral_constant<int, 8>{});
      case 16:
        return launch(vec, std::integral_constant<int, 16>{});
      default:
        return launch(vec, std::integral_constant<int, 32>{});
    }
  };
  if (aligned) {
    with_group(std::integral_constant<int, 16 / sizeof(scalar_t)>{});
  } else {
    with_group(std::integral_constant<int, 1>{});
  }
}

// The entry of the row-group style kernels: run_native_kernel, then launch(args, vec, group) with the
// compile-time vector width and group size from dispatch_vec_and_group.
template <typename Launch>
void run_row_group_kernel(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                          const at::Tensor& values, const at::Tensor& dense, const at::Tensor& out,
                          const SpmmEpilogue& epi, Launch&& launch) {
  run_native_kernel(p, crow, col, values, dense, out, epi, [&](const auto& args, bool aligned) {
    dispatch_vec_and_group(args, aligned, [&](auto vec, auto group) { launch(args, vec, group); });
  });
}

// Writes the VEC outputs out[base .. base+VEC) (columns c0 .. c0+VEC) from the accumulators; one
// 16-byte access each for out and accumulate when VEC > 1 (the caller checked the alignment).
template <typename scalar_t, typename index_t, int VEC>
__device__ __forceinline__ void store_outputs(const NativeArgs<scalar_t, index_t>& a, int64_t base, int64_t c0,
                                              const at::opmath_type<scalar_t>* acc) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t alpha = static_cast<acc_t>(a.alpha), beta = static_cast<acc_t>(a.beta);
  const acc_t slope = static_cast<acc_t>(a.negative_slope);
  Packed<scalar_t, VEC> res, cin;
  if (a.accumulate) cin.load(a.accumulate + base);
#pragma unroll
  for (int q = 0; q < VEC; ++q) {
    acc_t x = alpha * acc[q];
    if (a.accumulate) x += beta * cin.get(q);
    if (a.bias) x += static_cast<acc_t>(a.bias[c0 + q]);
    res.set(q, apply_activation<acc_t>(a.act, x, slope));
  }
  res.store(a.out + base);
}

}  // namespace cuda
}  // namespace sparsetorch
