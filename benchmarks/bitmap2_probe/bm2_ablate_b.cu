// Ablation variants (bitmap2_kernel.cuh's Flag): no reduction, copies only, atomic reduction, stamps.
#include "bm2_entry.cuh"
BM2_ENTRY(bm2_bf16_8, __nv_bfloat16, kNoReduce, 2)
BM2_ENTRY(bm2_bf16_16, __nv_bfloat16, kCopyOnly, 2)
BM2_ENTRY(bm2_bf16_32, __nv_bfloat16, kAtomic, 2)
BM2_ENTRY(bm2_bf16_64, __nv_bfloat16, kStamps, 2)
