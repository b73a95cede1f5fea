// Tests of the reference GGUF block quantizers/dequantizers (src/quant/gguf_blocks.cpp) against
// fixtures written by gguf-py (tools/make_quant_fixtures.py) and against round-trip error bounds.
#include "quant/gguf_blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/gguf_block_layouts.h"

namespace inferx {
namespace {

std::vector<uint8_t> read_fixture(const std::string& name) {
  const std::string path = std::string(INFERX_SOURCE_DIR) + "/tests/unit/quant/fixtures/" + name;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "missing fixture " << path << " (run tools/make_quant_fixtures.py)";
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<float> as_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

struct FixtureCase {
  DType type;
  const char* name;
};

class DequantizeFixture : public ::testing::TestWithParam<FixtureCase> {};

// dequantize_row evaluates the same float expressions as gguf-py, so results must be bit-identical.
TEST_P(DequantizeFixture, MatchesGgufPyBitExactly) {
  const FixtureCase c = GetParam();
  const auto blocks = read_fixture(std::string(c.name) + "_blocks.bin");
  const auto expected = as_floats(read_fixture(std::string(c.name) + "_dequant.bin"));
  const DTypeInfo& info = dtype_info(c.type);
  ASSERT_FALSE(expected.empty());
  ASSERT_EQ(static_cast<int64_t>(blocks.size()) / info.block_bytes * info.block_elems,
            static_cast<int64_t>(expected.size()));
  std::vector<float> got(expected.size());
  dequantize_row(c.type, blocks.data(), got.data(), static_cast<int64_t>(got.size()));
  int mismatches = 0;
  for (size_t i = 0; i < got.size() && mismatches < 5; ++i)
    if (f32_to_bits(got[i]) != f32_to_bits(expected[i])) {
      ADD_FAILURE() << c.name << " element " << i << ": got " << got[i] << " expected " << expected[i];
      ++mismatches;
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantizeFixture,
                         ::testing::Values(FixtureCase{DType::Q8_0, "q8_0"}, FixtureCase{DType::Q4_0, "q4_0"},
                                           FixtureCase{DType::Q4_K, "q4_k"},
                                           FixtureCase{DType::Q6_K, "q6_k"}),
                         [](const auto& info) { return std::string(info.param.name); });

class QuantizeFixture : public ::testing::TestWithParam<FixtureCase> {};

// gguf-py implements Q8_0 and Q4_0 quantization bit-identically to ggml's reference; ours must match.
TEST_P(QuantizeFixture, MatchesGgufPyBytes) {
  const FixtureCase c = GetParam();
  const auto input = as_floats(read_fixture(std::string(c.name) + "_quant_in.bin"));
  const auto expected = read_fixture(std::string(c.name) + "_quant_out.bin");
  const int64_t n = static_cast<int64_t>(input.size());
  ASSERT_EQ(row_bytes(c.type, n), static_cast<int64_t>(expected.size()));
  std::vector<uint8_t> got(expected.size());
  quantize_row(c.type, input.data(), got.data(), n);
  const int64_t bb = dtype_info(c.type).block_bytes;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], expected[i]) << c.name << " byte " << i << " (block " << i / bb << ")";
}

INSTANTIATE_TEST_SUITE_P(RoundToNearestTypes, QuantizeFixture,
                         ::testing::Values(FixtureCase{DType::Q8_0, "q8_0"},
                                           FixtureCase{DType::Q4_0, "q4_0"}),
                         [](const auto& info) { return std::string(info.param.name); });

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(t, n)));
  quantize_row(t, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  dequantize_row(t, q.data(), y.data(), n);
  return y;
}

// Q8_0: every element is within half a quantization step of its input. The step is the stored f16 d;
// rounding d to f16 can move the largest element by up to 127 * |d16 - d| more.
TEST(GgufBlocks, Q8_0RoundTripWithinHalfStep) {
  const auto x = gaussian(32 * 64, 1);
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(DType::Q8_0, 32 * 64)));
  quantize_row(DType::Q8_0, x.data(), q.data(), 32 * 64);
  const auto y = round_trip(DType::Q8_0, x);
  const auto* blocks = reinterpret_cast<const BlockQ8_0*>(q.data());
  for (int b = 0; b < 64; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
    const float d = amax / 127, d16 = f16_to_f32(blocks[b].d);
    const float bound = 0.5f * d16 + 127 * std::fabs(d16 - d) + 1e-7f;
    for (int j = 0; j < 32; ++j) ASSERT_LE(std::fabs(y[32 * b + j] - x[32 * b + j]), bound) << b << "," << j;
  }
}

// Q4_0: the largest-magnitude element maps to -8 exactly, so values of the opposite sign clamp at +7:
// the error is at most one step d (half a step away from the clamp).
TEST(GgufBlocks, Q4_0RoundTripWithinOneStep) {
  const auto x = gaussian(32 * 64, 2);
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(DType::Q4_0, 32 * 64)));
  quantize_row(DType::Q4_0, x.data(), q.data(), 32 * 64);
  const auto y = round_trip(DType::Q4_0, x);
  const auto* blocks = reinterpret_cast<const BlockQ4_0*>(q.data());
  for (int b = 0; b < 64; ++b) {
    const float bound = std::fabs(f16_to_f32(blocks[b].d)) * 1.01f + 1e-7f;
    for (int j = 0; j < 32; ++j) ASSERT_LE(std::fabs(y[32 * b + j] - x[32 * b + j]), bound) << b << "," << j;
  }
}

double relative_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double se = 0, ss = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    se += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    ss += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(se / ss);
}

// K-quants have no per-element bound (the 6-bit super-block scales are searched), so bound the
// RMSE relative to the data's RMS on Gaussian data. Uniform quantizers with step q have RMSE q/sqrt(12);
// for N(0,1) blocks of 32 spanning about +-2.2 sigma, 16 levels give about 0.085 and 64 levels about
// 0.02; the bounds leave room for the 6-bit scale rounding.
TEST(GgufBlocks, KQuantRoundTripRmse) {
  const auto x = gaussian(256 * 32, 3, 0.02f);
  const double r4 = relative_rmse(x, round_trip(DType::Q4_K, x));
  const double r6 = relative_rmse(x, round_trip(DType::Q6_K, x));
  const double r40 = relative_rmse(x, round_trip(DType::Q4_0, x));
  const double r8 = relative_rmse(x, round_trip(DType::Q8_0, x));
  EXPECT_LT(r4, 0.10) << "Q4_K";
  EXPECT_LT(r6, 0.025) << "Q6_K";
  EXPECT_LT(r8, 0.006) << "Q8_0";
  // The affine 4-bit K-quant with searched scales must beat plain round-to-nearest Q4_0.
  EXPECT_LT(r4, r40) << "Q4_K vs Q4_0";
  RecordProperty("rel_rmse_q4_k", std::to_string(r4));
  RecordProperty("rel_rmse_q6_k", std::to_string(r6));
}

// Shifted data exercises Q4_K's min term (all-positive sub-blocks have min 0, all-negative use dmin).
TEST(GgufBlocks, Q4_KHandlesOffsetsAndZeros) {
  auto x = gaussian(256 * 4, 4);
  for (int i = 0; i < 256; ++i) x[i] += 3.0f;    // all positive
  for (int i = 256; i < 512; ++i) x[i] -= 3.0f;  // all negative
  for (int i = 512; i < 768; ++i) x[i] = 0.0f;   // zero super-block
  const auto y = round_trip(DType::Q4_K, x);
  for (int i = 512; i < 768; ++i) ASSERT_EQ(y[i], 0.0f);
  for (int sb = 0; sb < 4; ++sb) {
    if (sb == 2) continue;
    std::vector<float> xs(x.begin() + 256 * sb, x.begin() + 256 * (sb + 1));
    std::vector<float> ys(y.begin() + 256 * sb, y.begin() + 256 * (sb + 1));
    EXPECT_LT(relative_rmse(xs, ys), sb == 3 ? 0.10 : 0.05) << "super-block " << sb;
  }
}

TEST(GgufBlocks, Q4_KScalePackingRoundTrips) {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 100; ++iter) {
    uint8_t sc[8], m[8], packed[12], sc2[8], m2[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(rng() % 64);
      m[j] = static_cast<uint8_t>(rng() % 64);
    }
    pack_q4_k_scales(sc, m, packed);
    unpack_q4_k_scales(packed, sc2, m2);
    for (int j = 0; j < 8; ++j) {
      ASSERT_EQ(sc[j], sc2[j]);
      ASSERT_EQ(m[j], m2[j]);
    }
  }
}

TEST(GgufBlocks, PlainTypesConvert) {
  const std::vector<float> x = {1.0f, -2.5f, 65504.0f, 1e-8f, 3.14159f, 0.0f, -0.0f, 1e5f};
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> h(x.size());
  std::vector<float> y(x.size());
  quantize_row(DType::F16, x.data(), h.data(), n);
  dequantize_row(DType::F16, h.data(), y.data(), n);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], f16_to_f32(f32_to_f16(x[i])));
  EXPECT_TRUE(std::isinf(y[7]));
  quantize_row(DType::BF16, x.data(), h.data(), n);
  dequantize_row(DType::BF16, h.data(), y.data(), n);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], bf16_to_f32(f32_to_bf16(x[i])));
  quantize_row(DType::F32, x.data(), y.data(), n);
  EXPECT_EQ(y, x);
}

TEST(GgufBlocks, RejectsPartialBlocksAndNonWeightTypes) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> q(4096);
  EXPECT_THROW(quantize_row(DType::Q8_0, x.data(), q.data(), 33), Error);
  EXPECT_THROW(dequantize_row(DType::Q4_K, q.data(), x.data(), 255), Error);
  EXPECT_THROW(dequantize_row(DType::I32, q.data(), x.data(), 4), Error);
  EXPECT_THROW(quantize_row(DType::I8, x.data(), q.data(), 4), Error);
}

}  // namespace
}  // namespace inferx
