// matmul_cpu on F8_E4M3 (W8A8) and INT4 weights against scalar references built from the quant/
// dequantizers: the FP8 reference rounds the activations exactly as documented in quant/fp8.h, the
// INT4 reference uses the Q8_0 activations the integer kernel reads.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/matmul_cpu.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/fp8.h"
#include "quant/gguf_blocks.h"
#include "quant/int4.h"

namespace inferx {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor view(DType t, std::initializer_list<int64_t> dims, const void* p) {
  return Tensor(t, dims, const_cast<void*>(p));
}

class Fp8Matmul : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Fp8Matmul, MatchesRoundedActivationReference) {
  const auto [m, per_channel] = GetParam();
  const int64_t n = 37, k = 200;  // k not a multiple of 16: the scalar tail runs too
  const auto w = gaussian(n * k, 1, 0.05f);
  const auto x = gaussian(m * k, 2, 1.0f);
  const auto bias = gaussian(n, 3, 0.1f);
  const Fp8Weight q = quantize_fp8_weight(
      w.data(), n, k, per_channel ? Fp8Granularity::PerChannel : Fp8Granularity::PerTensor);
  Linear lin;
  lin.weight = view(DType::F8_E4M3, {n, k}, q.codes.data());
  lin.scale = view(DType::F32, {static_cast<int64_t>(q.scale.size())}, q.scale.data());
  lin.bias = view(DType::F32, {n}, bias.data());
  ThreadPool pool(2);
  std::vector<float> out(static_cast<size_t>(m * n));
  matmul_cpu(x.data(), m, lin, out.data(), pool);
  std::vector<float> xq(static_cast<size_t>(k)), wr(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    const float sx = quantize_fp8_activation_row(x.data() + r * k, k, xq.data());
    for (int64_t j = 0; j < n; ++j) {
      dequantize_fp8_row(q.codes.data() + j * k, q.scale[per_channel ? static_cast<size_t>(j) : 0], wr.data(),
                         k);
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        ref += static_cast<double>(wr[static_cast<size_t>(c)]) * xq[static_cast<size_t>(c)] * sx;
        mag += std::fabs(static_cast<double>(wr[static_cast<size_t>(c)]) * xq[static_cast<size_t>(c)] * sx);
      }
      ASSERT_NEAR(out[static_cast<size_t>(r * n + j)], ref + bias[static_cast<size_t>(j)], 1e-5 * mag + 1e-6)
          << r << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, Fp8Matmul,
                         ::testing::Combine(::testing::Values(1, 3, 4, 9), ::testing::Bool()));

// The CUDA backend's BF16-accumulator option emulated (cpu::set_fp8_bf16_accumulator): the unscaled sum of
// the code products is rounded to BF16 (nearest even) before the activation row's scale, bit for bit: the
// same activation row with scale 1 gives the kernel's unscaled sum, which must come back rounded, and
// times the real scale.
TEST(QuantMatmul, Fp8Bf16AccumulatorRoundsTheUnscaledSum) {
  const int64_t n = 5, k = 200;
  const auto w = gaussian(n * k, 7, 0.05f);
  const auto x = gaussian(k, 8, 1.0f);
  const Fp8Weight q = quantize_fp8_weight(w.data(), n, k, Fp8Granularity::PerChannel);
  std::vector<uint8_t> row(static_cast<size_t>(cpu::act_f8_row_bytes(k)));
  cpu::quantize_act_f8(x.data(), k, row.data());
  float* act = reinterpret_cast<float*>(row.data());
  const float scale = act[k];
  ASSERT_NE(scale, 1.0f);
  int rounded = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* wr = q.codes.data() + j * k;
    float unscaled = 0, plain = 0, bf16 = 0, bf16_unit = 0;
    cpu::set_fp8_bf16_accumulator(false);
    cpu::dot_f8_rows(wr, row.data(), 0, 1, k, &plain);
    act[k] = 1.0f;
    cpu::dot_f8_rows(wr, row.data(), 0, 1, k, &unscaled);
    cpu::set_fp8_bf16_accumulator(true);
    cpu::dot_f8_rows(wr, row.data(), 0, 1, k, &bf16_unit);
    act[k] = scale;
    cpu::dot_f8_rows(wr, row.data(), 0, 1, k, &bf16);
    cpu::set_fp8_bf16_accumulator(false);
    const float want = bf16_to_f32(f32_to_bf16(unscaled));
    EXPECT_EQ(plain, unscaled * scale) << j;
    EXPECT_EQ(bf16_unit, want) << j;
    EXPECT_EQ(bf16, want * scale) << j;
    rounded += want != unscaled;
  }
  EXPECT_GT(rounded, 0) << "sums of 200 products should not all be BF16 values already";
}

// The Q8_0 activation row as the integer kernels see it, dequantized.
std::vector<float> q8_activation(const float* x, int64_t k) {
  std::vector<uint8_t> row(static_cast<size_t>(cpu::act_q8_0_row_bytes(k)));
  cpu::quantize_act_q8_0(x, k, row.data());
  const cpu::ActQ8_0View v = cpu::act_q8_0_view(row.data(), k);
  std::vector<float> out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) out[static_cast<size_t>(i)] = v.qs[i] * v.d[i / 32];
  return out;
}

class Int4Matmul : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(Int4Matmul, MatchesDequantizedReference) {
  const auto [m, group, sym] = GetParam();
  const int64_t n = 29, k = 256;
  const auto w = gaussian(n * k, 4, 0.05f);
  const auto x = gaussian(m * k, 5, 1.0f);
  const Int4Weight q = quantize_int4_weight(w.data(), n, k, group, sym);
  Linear lin;
  lin.weight = view(DType::INT4, {n, k}, q.codes.data());
  lin.scale = view(DType::F16, {n, k / group}, q.scale.data());
  if (!sym) lin.zero = view(DType::U8, {n, k / group}, q.zero.data());
  lin.group_size = group;
  ThreadPool pool(2);
  std::vector<float> out(static_cast<size_t>(m * n));
  matmul_cpu(x.data(), m, lin, out.data(), pool);
  std::vector<float> wr(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    const auto xa = q8_activation(x.data() + r * k, k);
    for (int64_t j = 0; j < n; ++j) {
      dequantize_int4_row(q.codes.data() + j * k / 2, q.scale.data() + j * (k / group),
                          sym ? nullptr : q.zero.data() + j * (k / group), group, wr.data(), k);
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        ref += static_cast<double>(wr[static_cast<size_t>(c)]) * xa[static_cast<size_t>(c)];
        mag += std::fabs(static_cast<double>(wr[static_cast<size_t>(c)]) * xa[static_cast<size_t>(c)]);
      }
      ASSERT_NEAR(out[static_cast<size_t>(r * n + j)], ref, 1e-5 * mag + 1e-6) << r << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, Int4Matmul,
                         ::testing::Combine(::testing::Values(1, 2, 5), ::testing::Values(32, 64, 128),
                                            ::testing::Bool()));

TEST(QuantMatmul, InputPermutationGathersColumns) {
  const int64_t n = 8, k = 64;
  const auto w = gaussian(n * k, 6, 0.05f);
  const auto x = gaussian(k, 7, 1.0f);
  const Int4Weight q = quantize_int4_weight(w.data(), n, k, 32, true);
  std::vector<int32_t> perm(static_cast<size_t>(k));
  std::iota(perm.begin(), perm.end(), 0);
  std::reverse(perm.begin(), perm.end());
  std::vector<float> xr(x.rbegin(), x.rend());
  Linear lin;
  lin.weight = view(DType::INT4, {n, k}, q.codes.data());
  lin.scale = view(DType::F16, {n, k / 32}, q.scale.data());
  lin.group_size = 32;
  ThreadPool pool(1);
  std::vector<float> direct(static_cast<size_t>(n)), permuted(static_cast<size_t>(n));
  matmul_cpu(xr.data(), 1, lin, direct.data(), pool);
  lin.input_perm = view(DType::I32, {k}, perm.data());
  matmul_cpu(x.data(), 1, lin, permuted.data(), pool);
  EXPECT_EQ(direct, permuted);
}

TEST(QuantMatmul, MissingOrMisshapedScalesAreErrors) {
  std::vector<uint8_t> codes(64 * 2);
  std::vector<float> x(64), out(2), scale(3);
  ThreadPool pool(1);
  Linear f8;
  f8.weight = view(DType::F8_E4M3, {2, 64}, codes.data());
  EXPECT_THROW(matmul_cpu(x.data(), 1, f8, out.data(), pool), Error);
  f8.scale = view(DType::F32, {3}, scale.data());
  EXPECT_THROW(matmul_cpu(x.data(), 1, f8, out.data(), pool), Error);
  Linear i4;
  i4.weight = view(DType::INT4, {2, 64}, codes.data());
  i4.group_size = 48;
  EXPECT_THROW(matmul_cpu(x.data(), 1, i4, out.data(), pool), Error);
}

}  // namespace
}  // namespace inferx
