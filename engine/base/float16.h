// Conversions between fp32 and the 16-bit storage formats models ship in (bf16, fp16).
// Exact widening; narrowing rounds to nearest even. Pure functions, any thread.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/ref/bf16.h"

namespace specd {

// bf16 lives with the kernels (kernels/ref/bf16.h) so both layers round identically.
using kernels::Bf16ToFloat;
using kernels::FloatToBf16;

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace specd
