// INT4 group quantization (layout and quantizer conventions in int4.h).
#include "quant/int4.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace inferx {

bool int4_group_fits(int64_t k, int64_t group) {
  return (group == 32 || group == 64 || group == 128) && k > 0 && k % group == 0;
}

void pack_int4_row(const uint8_t* codes, uint8_t* packed, int64_t k) {
  for (int64_t c0 = 0; c0 < k; c0 += 32)
    for (int j = 0; j < 16; ++j)
      packed[c0 / 2 + j] = static_cast<uint8_t>((codes[c0 + j] & 0xF) | (codes[c0 + 16 + j] & 0xF) << 4);
}

void unpack_int4_row(const uint8_t* packed, uint8_t* codes, int64_t k) {
  for (int64_t c0 = 0; c0 < k; c0 += 32)
    for (int j = 0; j < 16; ++j) {
      codes[c0 + j] = packed[c0 / 2 + j] & 0xF;
      codes[c0 + 16 + j] = packed[c0 / 2 + j] >> 4;
    }
}

void dequantize_int4_row(const uint8_t* packed, const uint16_t* scale, const uint8_t* zero, int64_t group,
                         float* out, int64_t k) {
  std::vector<uint8_t> codes(static_cast<size_t>(k));
  unpack_int4_row(packed, codes.data(), k);
  for (int64_t c = 0; c < k; ++c) {
    const int64_t g = c / group;
    const float s = f16_to_f32(scale[g]);
    const int z = zero ? zero[g] : 8;
    out[c] = s * static_cast<float>(codes[static_cast<size_t>(c)] - z);
  }
}

Int4Weight quantize_int4_weight(const float* w, int64_t n, int64_t k, int64_t group, bool symmetric) {
  INFERX_CHECK(int4_group_fits(k, group),
               "int4: {} input columns cannot be split into groups of {} (group 32, 64 or 128 dividing the "
               "columns; columns a multiple of 32)",
               k, group);
  INFERX_CHECK(n > 0, "int4: empty matrix");
  const int64_t groups = k / group;
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  std::vector<uint16_t> scales(static_cast<size_t>(n * groups));
  std::vector<uint8_t> zeros(symmetric ? 0 : static_cast<size_t>(n * groups));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = w + r * k + g * group;
      float lo = 0, hi = 0;  // the grid always contains 0 (exact zeros stay zero)
      for (int64_t i = 0; i < group; ++i) {
        INFERX_CHECK(std::isfinite(x[i]), "int4: weight row {} column {} is not finite", r, g * group + i);
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      float s = symmetric ? std::max(-lo, hi) / 7.5f : (hi - lo) / 15.0f;
      const uint16_t s16 = f32_to_f16(s);
      s = f16_to_f32(s16);
      INFERX_CHECK(std::isfinite(s), "int4: row {} group {} needs scale {} beyond the f16 range", r, g,
                   std::max(-lo, hi));
      int z = 8;
      if (!symmetric) z = s > 0 ? std::clamp(static_cast<int>(std::nearbyint(-lo / s)), 0, 15) : 8;
      scales[static_cast<size_t>(r * groups + g)] = s16;
      if (!symmetric) zeros[static_cast<size_t>(r * groups + g)] = static_cast<uint8_t>(z);
      for (int64_t i = 0; i < group; ++i) {
        const int q = s > 0 ? static_cast<int>(std::nearbyint(x[i] / s)) + z : z;
        codes[static_cast<size_t>(r * k + g * group + i)] = static_cast<uint8_t>(std::clamp(q, 0, 15));
      }
    }
  }
  return int4_from_codes(codes, std::move(scales), std::move(zeros), n, k, group);
}

Int4Weight int4_from_codes(const std::vector<uint8_t>& codes, std::vector<uint16_t> scale,
                           std::vector<uint8_t> zero, int64_t n, int64_t k, int64_t group) {
  INFERX_CHECK(int4_group_fits(k, group), "int4: group size {} does not fit {} columns", group, k);
  const auto groups = static_cast<size_t>(n * (k / group));
  INFERX_CHECK(codes.size() == static_cast<size_t>(n * k) && scale.size() == groups &&
                   (zero.empty() || zero.size() == groups),
               "int4: {} codes / {} scales / {} zero points do not fit a [{}, {}] matrix in groups of {}",
               codes.size(), scale.size(), zero.size(), n, k, group);
  Int4Weight out;
  out.n = n;
  out.k = k;
  out.group = group;
  out.codes.resize(static_cast<size_t>(n * k / 2));
  for (int64_t r = 0; r < n; ++r) pack_int4_row(codes.data() + r * k, out.codes.data() + r * k / 2, k);
  out.scale = std::move(scale);
  out.zero = std::move(zero);
  for (uint8_t z : out.zero) INFERX_CHECK(z <= 15, "int4: zero point {} is outside 0..15", z);
  return out;
}

}  // namespace inferx
