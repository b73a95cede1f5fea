#pragma once
// IEEE fp16 and bfloat16 <-> fp32 conversions (portable bit manipulation; SIMD kernels use F16C).
#include <cstdint>
#include <cstring>

namespace inferx {

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_to_f32(sign);
    // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bits_to_f32(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | mant << 13);
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | mant << 13);
  return bits_to_f32(sign | (exp + 112) << 23 | mant << 13);
}

// Round to nearest even; overflow -> inf.
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (u < 0x38800000u) {                        // subnormal or zero in fp16
    float a = bits_to_f32(u) + 0.5f;            // uses fp32 rounding to place the bits
    return sign | static_cast<uint16_t>(f32_to_bits(a) - 0x3f000000u);
  }
  uint32_t mant_odd = (u >> 13) & 1u;
  u += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return sign | static_cast<uint16_t>(u >> 13);
}

}  // namespace inferx
