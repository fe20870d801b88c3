// The sparse CPU kernels (sparse_kernels.h) built for AVX2 + FMA + F16C (picked at run time where the CPU has them); see kernels.h.
#include "cpu/kernels.h"
#if SPARSETORCH_CPU_AVX2_BUILD
#define SPARSETORCH_ISA_AVX2 1
#include "cpu/isa_begin.h"
#include "cpu/sparse_kernels.h"

namespace sparsetorch::cpu::avx2_isa {
void fill_sparse(Kernels& k) { fill_sparse_kernels(k); }
}  // namespace sparsetorch::cpu::avx2_isa

#include "cpu/isa_end.h"
#endif
