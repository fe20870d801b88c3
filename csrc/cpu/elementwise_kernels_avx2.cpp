// The elementwise CPU kernels (elementwise_kernels.h) built for AVX2 + FMA + F16C (picked at run time where the CPU has them); see kernels.h.
#include "cpu/kernels.h"
#if SPARSETORCH_CPU_AVX2_BUILD
#define SPARSETORCH_ISA_AVX2 1
#include "cpu/isa_begin.h"
#include "cpu/elementwise_kernels.h"

namespace sparsetorch::cpu::avx2_isa {
void fill_elementwise(Kernels& k) { fill_elementwise_kernels(k); }
}  // namespace sparsetorch::cpu::avx2_isa

#include "cpu/isa_end.h"
#endif
