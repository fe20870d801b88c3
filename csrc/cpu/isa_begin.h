// Opens one kernel build: included by each per-ISA translation unit after cpu/kernels.h, with
// SPARSETORCH_ISA_AVX2 defined as 1 (AVX2 + FMA + F16C) or 0 (portable), and closed by isa_end.h.
// In between, at::vec::Vectorized is the build's, and code goes in sparsetorch::cpu::CPU_CAPABILITY.
// (No include guard: each translation unit includes it once.)

// Headers at::vec pulls in that are not ISA-specific (their inline functions live outside any
// CPU_CAPABILITY namespace): compiled here for the baseline ISA, so that the copy the linker keeps
// never holds AVX2 instructions.
#include <ATen/NumericUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/native/Math.h>
#include <ATen/native/cpu/zmath.h>
#include <c10/util/BFloat16-math.h>
#include <c10/util/Load.h>
#include <c10/util/TypeCast.h>
#include <c10/util/complex.h>
#include <c10/util/copysign.h>
#include <c10/util/irange.h>

// ATen's vector headers carry `#pragma unroll`, which GCC does not know (ATen builds with
// -Wno-unknown-pragmas).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"

#if SPARSETORCH_ISA_AVX2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
// C++ front ends do not define the ISA macros for a target pragma; at::vec and Sleef's
// declarations test them.
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#else
#define CPU_CAPABILITY DEFAULT
#endif

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
