// Conversions of the packed layouts on CUDA (schemas in pruned_ops.cpp; the CPU versions in
// cpu/pruned_layouts_cpu.cpp take the same walks through the same headers), one kernel each, 16-bit values
// copied as bits, no device sync (usable inside CUDA graph capture):
//  - back to a dense weight: a compact SparseLinear runs its prefill token counts on the dense weight expanded
//    from its one stored form and frees it after the call, so this is on the path of every such call;
//  - the 2:4 decode layout packed from a 2:4 pruning's own CSR: a layer's first decode call builds it.
// Bytes: the output written once, the input read once; the torch-op chains these replace took 2.8 ms (expansion)
// and 5.2-5.9 ms (packing, then from the CSR's scatter) per 14336 x 4096 layer on an H100 (the serving profile,
// docs/performance.md).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "common/slot_checks.h"
#include "common/slot_layout.h"
#include "common/sparse24_decode_checks.h"
#include "common/sparse24_decode_layout.h"
#include "cuda/cuda_utils.h"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t work_items, int64_t blocks_per_sm) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(work_items, sms * blocks_per_sm)));
}

// One thread per chunk of 4 columns of W (m x k/4 chunks, row-major): the chunk's 8 bytes written in one store
// (adjacent threads, adjacent chunks), its value pair read as one 32-bit word. A nibble names two positions
// inside its own chunk whatever it holds; where both are one position the second value is kept (as on the CPU).
__global__ void __launch_bounds__(kThreads)
    sparse24_decode_to_dense_kernel(const uint32_t* __restrict__ value_pairs, const uint32_t* __restrict__ meta,
                                    uint2* __restrict__ dense, int64_t m, int64_t chunks, int64_t ktp) {
  const int64_t total = m * chunks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = i / chunks, chunk = i - row * chunks;
    const Sparse24DecodeChunk c = sparse24_decode_chunk(row, chunk, ktp);
    const uint32_t nib = (__ldg(meta + c.word) >> c.shift) & 0xfu;
    const uint64_t bits = sparse24_decode_chunk_bits(__ldg(value_pairs + (c.value >> 1)), nib);  // c.value is even
    dense[i] = make_uint2(static_cast<uint32_t>(bits), static_cast<uint32_t>(bits >> 32));
  }
}

// One thread per metadata word (sparse24_decode_pack_word): the word and its 8 chunks' value pairs.
template <typename index_t>
__global__ void __launch_bounds__(kThreads)
    sparse24_decode_pack_pairs_kernel(const uint32_t* __restrict__ pairs_in, const index_t* __restrict__ col,
                                      uint32_t* __restrict__ pairs_out, uint32_t* __restrict__ words, int64_t count,
                                      int64_t ktp, int64_t k) {
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; w < count;
       w += static_cast<int64_t>(gridDim.x) * kThreads) {
    words[w] = sparse24_decode_pack_word(w, ktp, k, col, pairs_in, pairs_out);
  }
}

// One block per group of 16 x 64 (grid-stride): the group's entries placed in a zeroed shared tile, then the tile
// stored row by row, 4 columns per thread. Offsets are clamped to [0, nnz], slots past 1023 skipped, positions
// outside W not stored (a banded layout's padding strip included).
__global__ void __launch_bounds__(kThreads)
    slot_to_dense_kernel(const int32_t* __restrict__ offsets, const uint32_t* __restrict__ entries,
                         uint16_t* __restrict__ dense, int64_t m, int64_t k, int64_t chunks, int64_t groups,
                         int64_t nnz, bool banded) {
  __shared__ alignas(8) uint16_t tile[kBitmapGroupElems];  // row-major: 16 rows of 64 columns
  const bool wide_stores = k % 4 == 0;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    for (int i = threadIdx.x; i < kBitmapGroupElems / 4; i += kThreads) reinterpret_cast<uint2*>(tile)[i] = make_uint2(0, 0);
    __syncthreads();
    const int64_t start = min(max(static_cast<int64_t>(offsets[g]), int64_t{0}), nnz);
    const int64_t stop = min(max(static_cast<int64_t>(offsets[g + 1]), start), nnz);
    for (int64_t j = start + threadIdx.x; j < stop; j += kThreads) {
      const uint32_t e = __ldg(entries + j);
      if ((e & 0xffffu) > static_cast<uint32_t>(kSlotMask)) continue;
      int rr = 0, cc = 0;
      slot_position(fragment_slot(static_cast<int>(e & 0xffffu), banded), rr, cc);
      tile[rr * kBitmapGroupCols + cc] = static_cast<uint16_t>(e >> 16);
    }
    __syncthreads();
    int64_t strip = 0, chunk = 0;
    slot_group_position(g, chunks, banded, strip, chunk);
    for (int i = threadIdx.x; i < kBitmapGroupElems / 4; i += kThreads) {
      const int rr = i / (kBitmapGroupCols / 4), cc = 4 * (i % (kBitmapGroupCols / 4));
      const int64_t row = strip * kBitmapGroupRows + rr, col = chunk * kBitmapGroupCols + cc;
      if (row >= m || col >= k) continue;
      uint16_t* dst = dense + row * k + col;
      if (wide_stores && col + 4 <= k) {
        *reinterpret_cast<uint2*>(dst) = reinterpret_cast<const uint2*>(tile)[i];
      } else {
        for (int q = 0; q < 4 && col + q < k; ++q) dst[q] = tile[rr * kBitmapGroupCols + cc + q];
      }
    }
    __syncthreads();  // the tile is reused by the block's next group
  }
}

at::Tensor sparse24_decode_to_dense_cuda(const at::Tensor& values, const at::Tensor& meta, int64_t out_features,
                                         int64_t in_features) {
  const Sparse24DecodeProblem p = check_sparse24_decode_layout(values, meta, out_features, in_features);
  const c10::cuda::CUDAGuard guard(values.device());
  at::Tensor values_c = values.contiguous();
  if (!is_aligned(values_c.data_ptr(), 4)) values_c = values_c.clone();  // read as 32-bit pairs
  const at::Tensor meta_c = meta.contiguous();
  at::Tensor dense = at::empty({p.m, p.k}, values.options());  // k % 32 == 0: rows of whole 8-byte chunks
  const int64_t chunks = p.k / 4;
  sparse24_decode_to_dense_kernel<<<grid_for(ceil_div(p.m * chunks, int64_t{kThreads}), 16), kThreads, 0,
                                    at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const uint32_t*>(values_c.data_ptr()), reinterpret_cast<const uint32_t*>(meta_c.data_ptr()),
      reinterpret_cast<uint2*>(dense.data_ptr()), p.m, chunks, p.ktp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return dense;
}

std::tuple<at::Tensor, at::Tensor> sparse24_decode_pack_pairs_cuda(const at::Tensor& values, const at::Tensor& col,
                                                                    int64_t out_features, int64_t in_features) {
  const Sparse24DecodeProblem p = check_sparse24_decode_pairs(values, col, out_features, in_features);
  const c10::cuda::CUDAGuard guard(values.device());
  at::Tensor values_c = values.contiguous();
  if (!is_aligned(values_c.data_ptr(), 4)) values_c = values_c.clone();  // read as 32-bit pairs
  const at::Tensor col_c = col.contiguous();
  const int64_t r16 = p.m / kSparse24DecodeRowTile;
  at::Tensor packed = at::empty({r16, p.ktp, 32, 8}, values.options());
  at::Tensor meta = at::empty({r16, p.ktp / kSparse24DecodeTilePad, 32, 4}, values.options().dtype(at::kInt));
  const int64_t count = meta.numel();
  AT_DISPATCH_INDEX_TYPES(col_c.scalar_type(), "sparse24_decode_pack_pairs", [&] {
    sparse24_decode_pack_pairs_kernel<index_t><<<grid_for(ceil_div(count, int64_t{kThreads}), 16), kThreads, 0,
                                                 at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const uint32_t*>(values_c.data_ptr()), col_c.data_ptr<index_t>(),
        reinterpret_cast<uint32_t*>(packed.data_ptr()), reinterpret_cast<uint32_t*>(meta.data_ptr<int32_t>()), count,
        p.ktp, p.k);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {packed, meta};
}

at::Tensor slot_to_dense_cuda(const at::Tensor& offsets, const at::Tensor& entries, int64_t out_features,
                              int64_t in_features, at::ScalarType dtype, bool banded) {
  TORCH_CHECK_TYPE(dtype == at::kBFloat16 || dtype == at::kHalf,
                   "dtype: expected bfloat16 or float16 (the slot layout packs 16-bit values), got ", dtype);
  const SlotProblem p = check_slot_layout(offsets, entries, out_features, in_features, banded);
  const c10::cuda::CUDAGuard guard(entries.device());
  at::Tensor dense = at::empty({p.m, p.k}, entries.options().dtype(dtype));
  if (dense.numel() == 0) return dense;
  const at::Tensor off_c = offsets.contiguous(), entries_c = entries.contiguous();
  slot_to_dense_kernel<<<grid_for(p.groups, 8), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      off_c.data_ptr<int32_t>(), reinterpret_cast<const uint32_t*>(entries_c.data_ptr<int32_t>()),
      reinterpret_cast<uint16_t*>(dense.data_ptr()), p.m, p.k, p.chunks, p.groups, entries_c.size(0), banded);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return dense;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) {
  m.impl("sparse24_decode_to_dense", SPARSETORCH_CUDA_OP(sparse24_decode_to_dense_cuda));
  m.impl("slot_to_dense", SPARSETORCH_CUDA_OP(slot_to_dense_cuda));
  m.impl("sparse24_decode_pack_pairs", SPARSETORCH_CUDA_OP(sparse24_decode_pack_pairs_cuda));
}

}  // namespace cuda
}  // namespace sparsetorch
