// Picks the CPU kernel build for this machine, and allocates the kernels' outputs.
#include "cpu/kernels.h"

#include <ATen/Version.h>

#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sparsetorch::cpu {
namespace {

bool cpu_has_avx2() {
#if SPARSETORCH_CPU_AVX2_BUILD
  // Torch's choice first, so that ATEN_CPU_CAPABILITY=default selects the portable build; then the
  // CPU itself (torch's string follows the environment variable even where the CPU lacks the ISA).
  const std::string cap = at::get_cpu_capability();
  if (cap != "AVX2" && cap != "AVX512") return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

Kernels make_kernels() {
  Kernels k{};
#if SPARSETORCH_CPU_AVX2_BUILD
  if (cpu_has_avx2()) {
    k.isa = "avx2";
    avx2_isa::fill_elementwise(k);
    avx2_isa::fill_sparse(k);
    return k;
  }
#endif
  k.isa = "default";
  default_isa::fill_elementwise(k);
  default_isa::fill_sparse(k);
  return k;
}

bool huge_pages_enabled() {
  const char* v = std::getenv("SPARSETORCH_CPU_HUGEPAGES");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace

const Kernels& kernels() {
  static const Kernels k = make_kernels();
  return k;
}

at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = at::empty(sizes, options);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // An allocation above glibc's largest mmap threshold (32 MiB) is a fresh mapping each time, mapped
  // on first touch one 4 KiB page at a time: on the machine measured a 64 MB output costs ~16k page
  // faults, more time than the kernel that writes it. Asking for transparent huge pages on its
  // 2 MiB-aligned interior (as torch does for all allocations under THP_MEM_ALLOC_ENABLE=1) makes
  // that 32 faults. Smaller allocations come back from the heap already mapped: advising them only
  // costs (a 4 MB output measured 3x slower). The advice changes no data; it is ignored where THP is
  // off.
  static const bool enabled = huge_pages_enabled();
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  constexpr size_t kFreshMapping = size_t(32) << 20;
  const size_t bytes = t.nbytes();
  if (enabled && bytes >= kFreshMapping) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t last = (begin + bytes) & ~(kHuge - 1);
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#endif
  return t;
}

}  // namespace sparsetorch::cpu
