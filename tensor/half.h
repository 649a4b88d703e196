// bf16 and f16 <-> f32 conversion (round to nearest even), bit-exact with PyTorch's CPU casts,
// including NaN, infinities and subnormals.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom {

inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

inline float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float bf16_to_float(uint16_t value) {
  return bits_float(static_cast<uint32_t>(value) << 16);
}

uint16_t float_to_f16(float value);
float f16_to_float(uint16_t value);

}  // namespace loom
