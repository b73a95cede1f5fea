// FP8 E4M3 conversions and the weight quantizer (conventions in fp8.h).
#include "quant/fp8.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace inferx {

namespace {

float decode(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 0xF, man = code & 7;
  if (exp == 0xF && man == 7) return std::numeric_limits<float>::quiet_NaN();
  // OFP8 section 5.1: subnormal (exp 0) = man/8 * 2^(1-7); normal = (1 + man/8) * 2^(exp-7).
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                             : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

const std::array<float, 256>& table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int i = 0; i < 256; ++i) v[static_cast<size_t>(i)] = decode(static_cast<uint8_t>(i));
    return v;
  }();
  return t;
}

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// Magnitude code (0..0x7E) of a finite non-negative float.
uint8_t magnitude_code(float a) {
  if (a >= kFp8E4M3Max) return 0x7E;
  if (a < 0.015625f) {  // below 2^-6: subnormal grid of step 2^-9 (code = multiple of 2^-9; 8 = 2^-6)
    return static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: keep 3 mantissa bits of the f32, rounding to nearest even on the 20 dropped bits.
  uint32_t b = bits_of(a);
  b += 0x7FFFFu + ((b >> 20) & 1u);
  const int exp = static_cast<int>(b >> 23) - 127 + 7;
  const uint32_t code = static_cast<uint32_t>(exp) << 3 | ((b >> 20) & 7u);
  return static_cast<uint8_t>(code > 0x7E ? 0x7E : code);
}

}  // namespace

float fp8_e4m3_to_f32(uint8_t code) { return table()[code]; }

uint8_t f32_to_fp8_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  return static_cast<uint8_t>(sign | magnitude_code(std::fabs(x)));
}

float round_to_fp8_e4m3(float x) {
  const float a = std::fabs(x);
  float r;
  if (!(a < kFp8E4M3Max)) {
    r = std::isnan(a) ? a : kFp8E4M3Max;
  } else if (a < 0.015625f) {
    r = std::nearbyint(a * 512.0f) * (1.0f / 512.0f);
  } else {
    uint32_t b = bits_of(a);
    b += 0x7FFFFu + ((b >> 20) & 1u);
    r = std::fmin(from_bits(b & 0xFFF00000u), kFp8E4M3Max);
  }
  return std::copysign(r, x);
}

float fp8_scale_for(float amax) {
  INFERX_CHECK(std::isfinite(amax), "fp8: cannot scale a set holding a non-finite value");
  return amax > 0 ? amax / kFp8E4M3Max : 1.0f;
}

Fp8Weight quantize_fp8_weight(const float* w, int64_t n, int64_t k, Fp8Granularity granularity) {
  INFERX_CHECK(n > 0 && k > 0, "fp8: cannot quantize an empty [{}, {}] matrix", n, k);
  Fp8Weight out;
  out.codes.resize(static_cast<size_t>(n * k));
  auto amax_of = [&](int64_t r0, int64_t r1) {
    float m = 0;
    for (int64_t i = r0 * k; i < r1 * k; ++i) m = std::fmax(m, std::fabs(w[i]));
    return m;
  };
  if (granularity == Fp8Granularity::PerTensor)
    out.scale.assign(1, fp8_scale_for(amax_of(0, n)));
  else
    for (int64_t r = 0; r < n; ++r) out.scale.push_back(fp8_scale_for(amax_of(r, r + 1)));
  for (int64_t r = 0; r < n; ++r) {
    const float s = out.scale[out.scale.size() == 1 ? 0 : static_cast<size_t>(r)];
    for (int64_t c = 0; c < k; ++c)
      out.codes[static_cast<size_t>(r * k + c)] = f32_to_fp8_e4m3(w[r * k + c] / s);
  }
  return out;
}

void dequantize_fp8_row(const uint8_t* codes, float scale, float* out, int64_t k) {
  const auto& t = table();
  for (int64_t i = 0; i < k; ++i) out[i] = t[codes[i]] * scale;
}

float quantize_fp8_activation_row(const float* x, int64_t k, float* q) {
  float amax = 0;
  for (int64_t i = 0; i < k; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float s = fp8_scale_for(amax);
  // x * (1 / s), not x / s: one multiplication per value, as the CUDA passes compute it (quant_codes.cuh),
  // so both backends give the same codes.
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < k; ++i) q[i] = round_to_fp8_e4m3(x[i] * inv);
  return s;
}

}  // namespace inferx
