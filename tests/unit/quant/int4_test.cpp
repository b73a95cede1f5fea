// INT4 group quantization: packing layout, round trips and error bounds.
#include "quant/int4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "core/half.h"

namespace inferx {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Int4Test, PackingLayout) {
  std::vector<uint8_t> codes(64), back(64), packed(32);
  for (int i = 0; i < 64; ++i) codes[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 7) & 15);
  pack_int4_row(codes.data(), packed.data(), 64);
  // Byte j of each 32-column run: column j low nibble, column j + 16 high nibble.
  EXPECT_EQ(packed[0], codes[0] | codes[16] << 4);
  EXPECT_EQ(packed[5], codes[5] | codes[21] << 4);
  EXPECT_EQ(packed[16 + 3], codes[32 + 3] | codes[48 + 3] << 4);
  unpack_int4_row(packed.data(), back.data(), 64);
  EXPECT_EQ(back, codes);
}

TEST(Int4Test, RoundTripErrorBound) {
  const int64_t n = 5, k = 256;
  auto w = gaussian(n * k, 11);
  w[17] = 0.3f;  // an outlier inside one group
  for (int64_t group : {32, 64, 128}) {
    for (bool sym : {true, false}) {
      SCOPED_TRACE(testing::Message() << "group " << group << (sym ? " sym" : " asym"));
      const Int4Weight q = quantize_int4_weight(w.data(), n, k, group, sym);
      EXPECT_EQ(q.codes.size(), static_cast<size_t>(n * k / 2));
      EXPECT_EQ(q.scale.size(), static_cast<size_t>(n * k / group));
      EXPECT_EQ(q.zero.size(), sym ? 0u : static_cast<size_t>(n * k / group));
      std::vector<float> row(static_cast<size_t>(k));
      double err2 = 0, ref2 = 0;
      for (int64_t r = 0; r < n; ++r) {
        dequantize_int4_row(q.codes.data() + r * k / 2, q.scale.data() + r * k / group,
                            sym ? nullptr : q.zero.data() + r * k / group, group, row.data(), k);
        for (int64_t c = 0; c < k; ++c) {
          const float x = w[static_cast<size_t>(r * k + c)];
          const float s = f16_to_f32(q.scale[static_cast<size_t>(r * (k / group) + c / group)]);
          // Round to nearest: half a step (+ the f16 rounding of the scale over up to 8 steps).
          ASSERT_LE(std::fabs(row[static_cast<size_t>(c)] - x), 0.5f * s + 8 * s * 1e-3f) << r << "," << c;
          err2 += std::pow(row[static_cast<size_t>(c)] - x, 2);
          ref2 += x * x;
        }
      }
      EXPECT_LT(err2 / ref2, 0.05);  // ~1% on gaussian weights; the outlier group costs the rest
    }
  }
}

TEST(Int4Test, ZerosStayZeroAndBadShapesFail) {
  std::vector<float> w(64, 0.0f);
  w[3] = 1.0f;
  const Int4Weight q = quantize_int4_weight(w.data(), 1, 64, 32, false);
  std::vector<float> row(64);
  dequantize_int4_row(q.codes.data(), q.scale.data(), q.zero.data(), 32, row.data(), 64);
  EXPECT_EQ(row[0], 0.0f);
  EXPECT_EQ(row[40], 0.0f);  // an all-zero group
  EXPECT_NEAR(row[3], 1.0f, 1e-3);
  EXPECT_THROW(quantize_int4_weight(w.data(), 1, 48, 32, true), Error);
  EXPECT_THROW(quantize_int4_weight(w.data(), 1, 64, 16, true), Error);
  EXPECT_FALSE(int4_group_fits(172, 32));
  EXPECT_TRUE(int4_group_fits(128, 64));
}

}  // namespace
}  // namespace inferx
