// FP8 E4M3 conversions against a brute-force nearest-value reference, and the weight quantizer's bound.
#include "quant/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"

namespace inferx {
namespace {

// Independent reference: the finite E4M3 value nearest to x (ties to the even code), by scanning all
// codes; saturates beyond 448 like the converter.
uint8_t nearest_code(float x) {
  uint8_t best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    const double v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    if (((c & 0x80) != 0) != std::signbit(x)) continue;
    const double err = std::fabs(v - std::copysign(std::fmin(std::fabs(static_cast<double>(x)), 448.0), x));
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best_err = err;
      best = static_cast<uint8_t>(c);
    }
  }
  return best;
}

TEST(Fp8Test, KnownCodes) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(fp8_e4m3_to_f32(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7F)));
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);  // tie -> even mantissa (1.0)
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3A);  // tie -> even mantissa (1.25)
  EXPECT_EQ(f32_to_fp8_e4m3(1000.0f), 0x7E);  // saturates
  EXPECT_EQ(f32_to_fp8_e4m3(-1000.0f), 0xFE);
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7E);  // would round to 480, which E4M3 lacks
  EXPECT_EQ(f32_to_fp8_e4m3(NAN), 0x7F);
}

TEST(Fp8Test, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(f32_to_fp8_e4m3(v), c == 0x80 ? 0x80 : c) << c;
    EXPECT_EQ(round_to_fp8_e4m3(v), v);
  }
}

TEST(Fp8Test, MatchesNearestValueReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exp_dist(-12.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::ldexp(1.0f, 0) * std::exp2(exp_dist(rng)) * ((i & 1) ? -1.0f : 1.0f);
    if (i % 97 == 0) x = 0.0f;
    const uint8_t want = nearest_code(x);
    ASSERT_EQ(f32_to_fp8_e4m3(x), want) << x;
    ASSERT_EQ(round_to_fp8_e4m3(x), fp8_e4m3_to_f32(want)) << x;
  }
  // Exact midpoints between neighbours in the subnormal and normal ranges go to the even code.
  for (int c = 0; c < 0x7D; ++c) {
    const float mid =
        0.5f * (fp8_e4m3_to_f32(static_cast<uint8_t>(c)) + fp8_e4m3_to_f32(static_cast<uint8_t>(c + 1)));
    ASSERT_EQ(f32_to_fp8_e4m3(mid), (c & 1) ? c + 1 : c) << "midpoint after code " << c;
  }
}

TEST(Fp8Test, WeightQuantizationErrorBound) {
  const int64_t n = 8, k = 96;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(n * k));
  for (auto& x : w) x = d(rng);
  for (int64_t c = 0; c < k; ++c) w[static_cast<size_t>(3 * k + c)] *= 40;  // one loud row
  for (auto g : {Fp8Granularity::PerTensor, Fp8Granularity::PerChannel}) {
    const Fp8Weight q = quantize_fp8_weight(w.data(), n, k, g);
    ASSERT_EQ(q.scale.size(), g == Fp8Granularity::PerTensor ? 1u : static_cast<size_t>(n));
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
      const float s = q.scale[q.scale.size() == 1 ? 0 : static_cast<size_t>(r)];
      dequantize_fp8_row(q.codes.data() + r * k, s, row.data(), k);
      for (int64_t c = 0; c < k; ++c) {
        const float x = w[static_cast<size_t>(r * k + c)];
        // Half a unit in the last place of 3 mantissa bits (2^-4 relative), or half the subnormal step.
        const float bound = std::fmax(std::fabs(x) * 0.0625f, s * std::ldexp(1.0f, -10)) * 1.0001f;
        ASSERT_LE(std::fabs(row[static_cast<size_t>(c)] - x), bound) << r << "," << c;
      }
    }
  }
  // Per-channel scales fit each row: the quiet rows keep more precision than with one tensor scale.
  const Fp8Weight pt = quantize_fp8_weight(w.data(), n, k, Fp8Granularity::PerTensor);
  const Fp8Weight pc = quantize_fp8_weight(w.data(), n, k, Fp8Granularity::PerChannel);
  EXPECT_NEAR(pc.scale[3], pt.scale[0], 1e-9);
  EXPECT_LT(pc.scale[0], pt.scale[0] / 10);
}

TEST(Fp8Test, ActivationRowScale) {
  std::vector<float> x = {0.5f, -3.0f, 0.001f, 2.0f}, q(4);
  const float s = quantize_fp8_activation_row(x.data(), 4, q.data());
  EXPECT_FLOAT_EQ(s, 3.0f / 448.0f);
  EXPECT_EQ(q[1], -448.0f);
  // The codes of x * (1 / s): one rounded product per value (the CUDA passes compute the same).
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(q[static_cast<size_t>(i)], round_to_fp8_e4m3(x[static_cast<size_t>(i)] * (1.0f / s)));
  std::vector<float> zeros(4, 0.0f);
  EXPECT_EQ(quantize_fp8_activation_row(zeros.data(), 4, q.data()), 1.0f);
  float inf = INFINITY;
  EXPECT_THROW(quantize_fp8_weight(&inf, 1, 1, Fp8Granularity::PerTensor), Error);
}

}  // namespace
}  // namespace inferx
