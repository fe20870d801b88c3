// The elementwise CPU kernels (elementwise_kernels.h) built for the portable ISA (the baseline of the compiler flags); see kernels.h.
#include "cpu/kernels.h"

#define SPARSETORCH_ISA_AVX2 0
#include "cpu/isa_begin.h"
#include "cpu/elementwise_kernels.h"

namespace sparsetorch::cpu::default_isa {
void fill_elementwise(Kernels& k) { fill_elementwise_kernels(k); }
}  // namespace sparsetorch::cpu::default_isa

#include "cpu/isa_end.h"

