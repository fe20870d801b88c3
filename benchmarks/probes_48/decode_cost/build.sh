#!/usr/bin/env bash
# build.sh NAME [extra nvcc flags]: traced.cuh -> NAME.cubin (bf16, NT 1/2, dense/sparse, reduce)
set -e
cd "$(dirname "$0")"
TI=$(python3 -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I'+p for p in include_paths()))")
cat > /tmp/t48_inst.cu <<'CU'
#include HDR
namespace sparsetorch { namespace cuda { namespace bitmap {
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 1, true>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 1, false>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 2, true>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 2, false>(const Params);
template __global__ void bitmap_splitk_reduce_kernel<__nv_bfloat16>(const float*, int, int64_t, int64_t, const uint16_t*, Activation, float, uint16_t*);
}}}
CU
N=$1; shift; HDR=${HDR:-traced.cuh}
nvcc -DHDR="\"$HDR\"" -cubin -o $N.cubin /tmp/t48_inst.cu -std=c++20 --expt-relaxed-constexpr -O3 -arch=sm_90 -I$PWD -I/work/main/csrc $TI -Xptxas=-v "$@" 2>&1 | grep -E "registers|error|spill" | sort | uniq -c
