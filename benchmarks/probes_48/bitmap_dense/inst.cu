#include "cuda/bitmap_kernel.cuh"
namespace sparsetorch { namespace cuda { namespace bitmap {
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 1, true>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 1, false>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 2, true>(const Params);
template __global__ void bitmap_linear_kernel<__nv_bfloat16, 2, false>(const Params);
template __global__ void bitmap_splitk_reduce_kernel<__nv_bfloat16>(const float*, int, int64_t, int64_t, const uint16_t*, Activation, float, uint16_t*);
}}}
