// The CSR16 layout of a pruned bf16/fp16 weight W (out_features x in_features) and the argument checks of
// csr16_linear, shared by the CPU and CUDA kernels. sparsetorch/pruned/csr16.py writes the layout.
//
// CSR16 is W's CSR with each entry packed into one 32-bit word: the value's 16 bits (bf16 or fp16) in the
// high half, its column in the low half (in_features <= 65535: the CUDA kernel's filler entries use
// column 0xffff, which must never be a real column):
//   crow     int32 (out_features + 1,)  row r's entries are entries[crow[r] .. crow[r + 1])
//   entries  int32 (nnz,)               value_bits << 16 | column
// 4 bytes per nonzero, read in one load (CSR with int32 columns: 6 bytes in two streams).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace sparsetorch {

constexpr int64_t kCsr16MaxColumns = 0xffff;
// Entries at most this many: the kernel's lane offsets (up to 508 past a row's end) stay in int32.
constexpr int64_t kCsr16MaxEntries = (int64_t{1} << 31) - 1024;

struct Csr16Problem {
  int64_t m = 0, k = 0, n = 0;  // n: tokens, the product of x's leading dimensions
  std::vector<int64_t> out_shape;
};

// O(1) checks, ValueError / TypeError naming the argument: x bfloat16 or float16 with in_features <= 65535,
// crow and entries int32 1-D on x's device, bias (out_features,) of x's dtype. The contents (crow
// non-decreasing within [0, nnz], columns < in_features) are not read here: the CPU kernel checks them as
// it reads (IndexError), the CUDA kernel clamps what it reads (a bad layout gives a wrong product there,
// never a fault).
Csr16Problem check_csr16_linear_args(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& entries,
                                     const std::optional<at::Tensor>& bias);

}  // namespace sparsetorch
