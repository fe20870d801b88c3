// Ablation variants (bitmap2_kernel.cuh's Flag): no decode, no x loads, no mma.
#include "bm2_entry.cuh"
BM2_ENTRY(bm2_bf16_1, __nv_bfloat16, kNoDecode, 2)
BM2_ENTRY(bm2_bf16_2, __nv_bfloat16, kNoX, 2)
BM2_ENTRY(bm2_bf16_4, __nv_bfloat16, kNoMma, 2)
