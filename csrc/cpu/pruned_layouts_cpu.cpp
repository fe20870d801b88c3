// Conversions of the packed layouts on the CPU (schemas in pruned_ops.cpp; the CUDA kernels in
// cuda/pruned_layouts.cu walk the layouts the same way, through the same headers): back to a dense weight, and
// the 2:4 decode layout packed from a pair CSR. The 16-bit values are copied as bits.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

#include "common/slot_checks.h"
#include "common/slot_layout.h"
#include "common/sparse24_decode_checks.h"
#include "common/sparse24_decode_layout.h"
#include "cpu/slot_walk.h"

namespace sparsetorch {
namespace {

// Chunk by chunk (sparse24_decode_chunk): its two values at their two positions, zeros at the other two. The
// metadata is not checked (a nibble names positions inside its own chunk whatever it holds; idx0 == idx1 keeps
// the second value); the padding tiles past in_features are not read.
at::Tensor sparse24_decode_to_dense_cpu(const at::Tensor& values, const at::Tensor& meta, int64_t out_features,
                                        int64_t in_features) {
  const Sparse24DecodeProblem p = check_sparse24_decode_layout(values, meta, out_features, in_features);
  at::Tensor values_c = values.contiguous();
  if (reinterpret_cast<uintptr_t>(values_c.data_ptr()) % 4 != 0) values_c = values_c.clone();  // read as pairs
  const at::Tensor meta_c = meta.contiguous();
  at::Tensor dense = at::empty({p.m, p.k}, values.options());
  const uint32_t* pp = reinterpret_cast<const uint32_t*>(values_c.data_ptr());  // value pairs
  const int32_t* mp = meta_c.data_ptr<int32_t>();
  uint16_t* dp = reinterpret_cast<uint16_t*>(dense.data_ptr());
  const int64_t chunks = p.k / 4, ktp = p.ktp;
  at::parallel_for(0, p.m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const Sparse24DecodeChunk c = sparse24_decode_chunk(row, chunk, ktp);
        const uint32_t nib = (static_cast<uint32_t>(mp[c.word]) >> c.shift) & 0xfu;
        const uint64_t bits = sparse24_decode_chunk_bits(pp[c.value >> 1], nib);
        for (int q = 0; q < 4; ++q) dp[row * p.k + 4 * chunk + q] = static_cast<uint16_t>(bits >> (16 * q));
      }
    }
  });
  return dense;
}

// Word by word (sparse24_decode_pack_word): each metadata word and the 8 value pairs it describes.
std::tuple<at::Tensor, at::Tensor> sparse24_decode_pack_pairs_cpu(const at::Tensor& values, const at::Tensor& col,
                                                                   int64_t out_features, int64_t in_features) {
  const Sparse24DecodeProblem p = check_sparse24_decode_pairs(values, col, out_features, in_features);
  at::Tensor values_c = values.contiguous();
  if (reinterpret_cast<uintptr_t>(values_c.data_ptr()) % 4 != 0) values_c = values_c.clone();  // read as pairs
  const at::Tensor col_c = col.contiguous();
  const int64_t r16 = p.m / kSparse24DecodeRowTile;
  at::Tensor packed = at::empty({r16, p.ktp, 32, 8}, values.options());
  at::Tensor meta = at::empty({r16, p.ktp / kSparse24DecodeTilePad, 32, 4}, values.options().dtype(at::kInt));
  const uint32_t* in = reinterpret_cast<const uint32_t*>(values_c.data_ptr());
  uint32_t* out = reinterpret_cast<uint32_t*>(packed.data_ptr());
  uint32_t* words = reinterpret_cast<uint32_t*>(meta.data_ptr<int32_t>());
  AT_DISPATCH_INDEX_TYPES(col_c.scalar_type(), "sparse24_decode_pack_pairs", [&] {
    const index_t* cp = col_c.data_ptr<index_t>();
    at::parallel_for(0, meta.numel(), 1024, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w) words[w] = sparse24_decode_pack_word(w, p.ktp, p.k, cp, in, out);
    });
  });
  return {packed, meta};
}

// Every entry's value at its slot's position, the layout checked as it is read (cpu/slot_walk.h, as slot_linear's
// CPU kernel does: IndexError).
at::Tensor slot_to_dense_cpu(const at::Tensor& offsets, const at::Tensor& entries, int64_t out_features,
                             int64_t in_features, at::ScalarType dtype, bool banded) {
  TORCH_CHECK_TYPE(dtype == at::kBFloat16 || dtype == at::kHalf,
                   "dtype: expected bfloat16 or float16 (the slot layout packs 16-bit values), got ", dtype);
  const SlotProblem p = check_slot_layout(offsets, entries, out_features, in_features, banded);
  const at::Tensor off_c = offsets.contiguous(), entries_c = entries.contiguous();
  const int32_t* op = off_c.data_ptr<int32_t>();
  const uint32_t* ep = reinterpret_cast<const uint32_t*>(entries_c.data_ptr<int32_t>());
  at::Tensor dense = at::zeros({p.m, p.k}, entries.options().dtype(dtype));
  uint16_t* dp = reinterpret_cast<uint16_t*>(dense.data_ptr());
  const int64_t k = p.k;
  cpu::for_each_slot_entry(p, op, ep, entries_c.size(0), [&](int64_t row, int64_t col, uint32_t entry) {
    dp[row * k + col] = static_cast<uint16_t>(entry >> 16);
  });
  return dense;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CPU, m) {
  m.impl("sparse24_decode_to_dense", &sparse24_decode_to_dense_cpu);
  m.impl("slot_to_dense", &slot_to_dense_cpu);
  m.impl("sparse24_decode_pack_pairs", &sparse24_decode_pack_pairs_cpu);
}

}  // namespace sparsetorch
