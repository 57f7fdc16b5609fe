// bf16 storage format for kernels and their tests: exact widening, round-to-nearest-even
// narrowing (what __float2bfloat16_rn does on the GPU). kernels/ may not depend on engine/, so
// this mirrors engine/base/float16.h in the kernels namespace. Pure functions, any thread.
#pragma once

#include <cstdint>
#include <cstring>

namespace specd::kernels {

inline float Bf16ToFloat(uint16_t bits16) {
  const uint32_t bits = static_cast<uint32_t>(bits16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// The value a bf16 store of `f` reads back as.
inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

}  // namespace specd::kernels
