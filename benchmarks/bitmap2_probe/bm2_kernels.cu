// Probe kernels: the product (flags 0, bf16 and fp16) here; the ablation variants (bf16, N <= 16) in
// bm2_ablate_*.cu (separate files: compiled in parallel). bm2_plan / bm2_run dispatch on (dtype, flags).
#include "bm2_entry.cuh"

BM2_ENTRY(bm2_bf16_0, __nv_bfloat16, 0, 4)
BM2_ENTRY(bm2_f16_0, __half, 0, 4)
BM2_DECL(bm2_bf16_1) BM2_DECL(bm2_bf16_2) BM2_DECL(bm2_bf16_4) BM2_DECL(bm2_bf16_8)
BM2_DECL(bm2_bf16_16) BM2_DECL(bm2_bf16_32) BM2_DECL(bm2_bf16_64)

#define BM2_SWITCH(CALL)                         \
  if (!bf16) {                                   \
    if (flags == 0) return bm2_f16_0##CALL;      \
    return -1;                                   \
  }                                              \
  switch (flags) {                               \
    case 0: return bm2_bf16_0##CALL;             \
    case 1: return bm2_bf16_1##CALL;             \
    case 2: return bm2_bf16_2##CALL;             \
    case 4: return bm2_bf16_4##CALL;             \
    case 8: return bm2_bf16_8##CALL;             \
    case 16: return bm2_bf16_16##CALL;           \
    case 32: return bm2_bf16_32##CALL;           \
    case 64: return bm2_bf16_64##CALL;           \
    default: return -1;                          \
  }

extern "C" int bm2_plan(int bf16, int flags, int m, int k, int n, int warps, int stages, int stage_bytes,
                        int blocks_per_sm, int64_t* out) {
  BM2_SWITCH(_plan(m, k, n, warps, stages, stage_bytes, blocks_per_sm, out))
}

extern "C" int bm2_run(int bf16, int flags, const void* blob, int64_t blob_units, const int* offsets, const void* x,
                       int64_t ldx, const void* bias, void* y, void* workspace, void* stamps, int m, int k, int n,
                       int act, float slope, int warps, int stages, int stage_bytes, int blocks_per_sm, int64_t stream) {
  BM2_SWITCH(_run(blob, blob_units, offsets, x, ldx, bias, y, workspace, stamps, m, k, n, act, slope, warps, stages,
                  stage_bytes, blocks_per_sm, stream))
}
