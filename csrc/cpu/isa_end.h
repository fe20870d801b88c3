// Closes the kernel build opened by isa_begin.h.
#if SPARSETORCH_ISA_AVX2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
#pragma GCC diagnostic pop
