// The 16 value bits in the high half of a packed 32-bit entry (CSR16's and the slot layout's: value << 16 |
// column or slot) as a float: bf16 is the high half of a float, fp16 a half. Shared by their CPU kernels.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace sparsetorch {

inline float packed_value(uint32_t entry, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(entry >> 16);
  if (bf16) {
    const uint32_t f = uint32_t{bits} << 16;
    float v;
    std::memcpy(&v, &f, 4);
    return v;
  }
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

}  // namespace sparsetorch
