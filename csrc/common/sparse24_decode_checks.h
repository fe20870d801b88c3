// The packed 2:4 decode layout of a bf16/fp16 weight W (out_features x in_features, at most 2 nonzeros in every
// 4 consecutive columns of a row) and the argument checks of sparse24_decode_linear, shared by the CPU and
// CUDA kernels. sparsetorch/pruned/sparse24_decode.py writes the layout (pack_sparse24_decode); the register
// mapping it encodes is described in cuda/sparse24_decode_kernel.cuh.
//
//   values  (out_features / 16, KTP, 32, 8), x's dtype: per 16 x 32 tile, lane l's mma.sp A registers
//   meta    (out_features / 16, KTP / 8, 32, 4), int32: lane l's metadata word for tile pair 4 b + w
// KTP = in_features / 32 rounded up to a multiple of 8. out_features % 16 == 0, in_features % 32 == 0.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace sparsetorch {

constexpr int64_t kSparse24DecodeRowTile = 16;
constexpr int64_t kSparse24DecodeTileK = 32;
constexpr int64_t kSparse24DecodeTilePad = 8;

inline int64_t sparse24_decode_ktiles(int64_t in_features) {
  return (in_features / kSparse24DecodeTileK + kSparse24DecodeTilePad - 1) / kSparse24DecodeTilePad *
         kSparse24DecodeTilePad;
}

struct Sparse24DecodeProblem {
  int64_t m = 0, k = 0, n = 0, ktp = 0;  // n: tokens, the product of x's leading dimensions
  std::vector<int64_t> out_shape;        // (..., out_features)
};

// O(1) checks, TypeError / ValueError naming the argument: x bfloat16 or float16 (..., in_features); values of
// x's dtype and meta int32 on x's device with exactly the packer's shapes for (out_features, in_features);
// out_features a positive multiple of 16 below 2^31, in_features a positive multiple of 32 below 2^31 and
// equal to x.size(-1); bias (out_features,) of x's dtype. Non-contiguous values / meta are accepted (the
// kernels copy them). The metadata's contents are not read here: the CPU kernel checks them as it decodes
// (ValueError), the CUDA kernel does not (invalid metadata gives a wrong product there, never a fault).
// The layout alone (sparse24_decode_to_dense; the first checks of the one below): values bfloat16 or float16 and
// meta int32 on one device, with exactly the packer's shapes for (out_features, in_features), both sizes in range.
// Returns the problem with n = 0 and no out_shape.
Sparse24DecodeProblem check_sparse24_decode_layout(const at::Tensor& values, const at::Tensor& meta,
                                                    int64_t out_features, int64_t in_features);

// A CSR in the pair layout for sparse24_decode_pack_pairs: values bfloat16 or float16 and col int32 or int64, both
// 1-D with out_features * in_features / 2 entries, on one device; the sizes as above. The columns are not read.
Sparse24DecodeProblem check_sparse24_decode_pairs(const at::Tensor& values, const at::Tensor& col, int64_t out_features,
                                                   int64_t in_features);

Sparse24DecodeProblem check_sparse24_decode_linear_args(const at::Tensor& x, const at::Tensor& values,
                                                        const at::Tensor& meta, int64_t out_features,
                                                        int64_t in_features, const std::optional<at::Tensor>& bias);

}  // namespace sparsetorch
