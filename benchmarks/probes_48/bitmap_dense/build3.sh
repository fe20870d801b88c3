#!/usr/bin/env bash
# build.sh NAME [git-rev]: compile bitmap_kernel.cuh (working tree, or the header at rev) into NAME.cubin
set -e
cd "$(dirname "$0")"
export PATH=/tmp/nvdis/nvidia/cu13/bin:/tmp/cuobj/nvidia/cu13/bin:$PATH
TI=$(python3 -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I'+p for p in include_paths()))")
INC=/work/main/csrc
if [ -n "${2:-}" ]; then
  INC=/tmp/bm3src_$2; rm -rf $INC; mkdir -p $INC; (cd /work/main && git archive $2 csrc | tar -x -C /tmp/bm3src_$2 --strip-components=1)
fi
cat > /tmp/bm3_inst.cu <<'CU'
#include "cuda/bitmap_kernel.cuh"
namespace sparsetorch { namespace cuda { namespace bitmap {
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 1, 2>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 1, 3>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 2, 2>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 2, 3>(const Params);
template __global__ void bitmap_splitk_reduce_kernel<__nv_bfloat16>(const float*, int, int64_t, int64_t, const uint16_t*, Activation, float, uint16_t*);
}}}
CU
nvcc -cubin -o $1.cubin /tmp/bm3_inst.cu -std=c++20 --expt-relaxed-constexpr -O3 -arch=sm_90 -I$INC $TI -Xptxas=-v ${NVFLAGS:-} 2>&1 | grep -E "registers|error|spill" | sort | uniq -c
cuobjdump -sass $1.cubin | grep -oE "_ZN[A-Za-z0-9_]+" | sort -u
