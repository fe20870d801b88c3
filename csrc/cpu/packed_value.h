// 16 value bits of a packed 32-bit entry as a float: bf16 is the high half of a float, fp16 a half. CSR16
// keeps them in the high half (value << 16 | column), the slot layout in the low half (slot << 16 | value).
// Shared by their CPU kernels.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace sparsetorch {

inline float half_bits_value(uint16_t bits, bool bf16) {
  if (bf16) {
    const uint32_t f = uint32_t{bits} << 16;
    float v;
    std::memcpy(&v, &f, 4);
    return v;
  }
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

inline float packed_value(uint32_t entry, bool bf16) { return half_bits_value(static_cast<uint16_t>(entry >> 16), bf16); }

}  // namespace sparsetorch
