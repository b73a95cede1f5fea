// Tests of matmul_cpu (src/backend/cpu/matmul_cpu.cpp and the dot_*.cpp kernels) for every weight type
// against dot_reference (dequantize_row + a double-precision dot).
//
// Two checks per output:
//  * quantization-aware: quantized weight types quantize the activations to Q8 first; the reference
//    applies the same activation quantization (cpu::quantize_act_*, dequantized) and must agree to 1e-4
//    of sum |w x| (the kernels sum exactly in int32 and only round in the f32 scaling);
//  * exact: against the f32 activations, within the activation-quantization error bound
//    sum_i |w_i| * d_i / 2 (d_i = that element's activation scale, max|x| / 127 of its block).
#include "backend/cpu/matmul_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/dot_kernels.h"
#include "core/error.h"
#include "quant/gguf_blocks.h"

namespace inferx {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

int64_t act_block(DType t) {
  switch (t) {
    case DType::Q8_0:
    case DType::Q4_0:
      return 32;
    case DType::Q4_K:
    case DType::Q6_K:
      return 256;
    default:
      return 0;  // f32 activations
  }
}

// The activations exactly as the integer kernels see them: quantized to Q8 and dequantized.
std::vector<float> quantized_activation(DType t, const float* x, int64_t k) {
  std::vector<float> xq(x, x + k);
  if (act_block(t) == 0) return xq;
  const bool k_quant = act_block(t) == 256;
  std::vector<uint8_t> row(
      static_cast<size_t>(k_quant ? cpu::act_q8_k_row_bytes(k) : cpu::act_q8_0_row_bytes(k)));
  if (k_quant) {
    cpu::quantize_act_q8_k(x, k, row.data());
    const auto v = cpu::act_q8_k_view(row.data(), k);
    for (int64_t i = 0; i < k; ++i) xq[i] = v.d[i / 256] * v.qs[i];
  } else {
    cpu::quantize_act_q8_0(x, k, row.data());
    const auto v = cpu::act_q8_0_view(row.data(), k);
    for (int64_t i = 0; i < k; ++i) xq[i] = v.d[i / 32] * v.qs[i];
  }
  return xq;
}

struct Shape {
  int64_t m, n, k;
};

void check_matmul(DType t, Shape s, bool with_bias, ThreadPool& pool, uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
               " k=" + std::to_string(s.k) + (with_bias ? " bias" : ""));
  const auto wf = gaussian(s.n * s.k, seed, 0.05f);
  const int64_t rb = row_bytes(t, s.k);
  std::vector<uint8_t> wq(static_cast<size_t>(rb * s.n));
  for (int64_t j = 0; j < s.n; ++j) quantize_row(t, wf.data() + j * s.k, wq.data() + j * rb, s.k);
  auto x = gaussian(s.m * s.k, seed + 1);
  if (s.k > 40) x[7] = 9.0f;  // an outlier widens one activation block's scale
  const auto bias = gaussian(s.n, seed + 2);

  Linear lin;
  lin.weight = Tensor(t, {s.n, s.k}, wq.data());
  if (with_bias) lin.bias = Tensor(DType::F32, {s.n}, const_cast<float*>(bias.data()));
  std::vector<float> out(static_cast<size_t>(s.m * s.n), NAN);
  matmul_cpu(x.data(), s.m, lin, out.data(), pool);

  std::vector<float> wrow(static_cast<size_t>(s.k));
  for (int64_t i = 0; i < s.m; ++i) {
    const float* xi = x.data() + i * s.k;
    const auto xq = quantized_activation(t, xi, s.k);
    for (int64_t j = 0; j < s.n; ++j) {
      const void* wr = wq.data() + j * rb;
      dequantize_row(t, wr, wrow.data(), s.k);
      const double b = with_bias ? bias[static_cast<size_t>(j)] : 0.0;
      double mag = std::fabs(b), act_err = 0;
      for (int64_t e = 0; e < s.k; ++e) {
        mag += std::fabs(static_cast<double>(wrow[e]) * xq[e]);
        act_err += std::fabs(wrow[e]) * std::fabs(static_cast<double>(xi[e]) - xq[e]);
      }
      const double got = out[static_cast<size_t>(i * s.n + j)];
      const double ref_q = dot_reference(t, wr, xq.data(), s.k) + b;
      ASSERT_NEAR(got, ref_q, 1e-4 * mag + 1e-6)
          << "row " << i << " col " << j << " (same activation quantization)";
      // Exact f32 activations: the quantization error of each activation element is at most half its
      // block's step, so |sum w (x - xq)| <= sum |w| d / 2; check that bound with the independently
      // computed |x - xq| and that those differences themselves respect d / 2.
      double bound = 1e-4 * mag + 1e-6;
      if (act_block(t) != 0) {
        const int64_t blk = act_block(t);
        for (int64_t b0 = 0; b0 < s.k; b0 += blk) {
          double amax = 0, wsum = 0;
          for (int64_t e = b0; e < b0 + blk; ++e) {
            amax = std::max(amax, static_cast<double>(std::fabs(xi[e])));
            wsum += std::fabs(wrow[e]);
          }
          for (int64_t e = b0; e < b0 + blk; ++e)
            ASSERT_LE(std::fabs(static_cast<double>(xi[e]) - xq[e]), amax / 254 * 1.0001 + 1e-12);
          bound += wsum * amax / 254 * 1.0001;
        }
      }
      ASSERT_LE(act_err, bound + 1e-9);
      ASSERT_NEAR(got, dot_reference(t, wr, xi, s.k) + b, bound) << "row " << i << " col " << j << " (exact)";
    }
  }
}

const DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                           DType::Q4_0, DType::Q4_K, DType::Q6_K};

class MatmulCpu : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulCpu, MatchesReferenceOnOddShapes) {
  const DType t = GetParam();
  const int64_t blk = dtype_info(t).block_elems;
  // K: one block and many blocks; float types also get K values that are not a multiple of the
  // SIMD width (tails).
  std::vector<int64_t> ks =
      blk == 1 ? std::vector<int64_t>{1, 7, 37, 768} : std::vector<int64_t>{blk, blk * 9};
  if (blk == 32) ks.push_back(32 * 64);
  ThreadPool pool(2);
  uint32_t seed = 10;
  for (int64_t k : ks)
    for (int64_t m : {1, 3, 17})
      for (int64_t n : {1, 37, 300}) {
        check_matmul(t, {m, n, k}, /*with_bias=*/(m + n) % 2 == 0, pool, seed++);
        if (HasFatalFailure()) return;
      }
}

// Results must not depend on how the columns are split between threads.
TEST_P(MatmulCpu, SameResultForAnyThreadCount) {
  const DType t = GetParam();
  const int64_t k = dtype_info(t).block_elems == 1 ? 96 : 512, n = 513, m = 5;
  const auto wf = gaussian(n * k, 77, 0.05f);
  const int64_t rb = row_bytes(t, k);
  std::vector<uint8_t> wq(static_cast<size_t>(rb * n));
  for (int64_t j = 0; j < n; ++j) quantize_row(t, wf.data() + j * k, wq.data() + j * rb, k);
  const auto x = gaussian(m * k, 78);
  Linear lin;
  lin.weight = Tensor(t, {n, k}, wq.data());
  std::vector<float> ref(static_cast<size_t>(m * n));
  ThreadPool p1(1);
  matmul_cpu(x.data(), m, lin, ref.data(), p1);
  for (int threads : {2, 3}) {
    ThreadPool p(threads);
    std::vector<float> out(ref.size());
    matmul_cpu(x.data(), m, lin, out.data(), p);
    EXPECT_EQ(out, ref) << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulCpu, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(MatmulCpuErrors, RejectsBadShapesAndTypes) {
  ThreadPool pool(1);
  std::vector<float> buf(4096, 0.0f), out(64);
  Linear lin;
  lin.weight = Tensor(DType::Q8_0, {2, 48}, buf.data());  // 48 is not a multiple of 32
  EXPECT_THROW(matmul_cpu(buf.data(), 1, lin, out.data(), pool), Error);
  lin.weight = Tensor(DType::I32, {2, 32}, buf.data());
  EXPECT_THROW(matmul_cpu(buf.data(), 1, lin, out.data(), pool), Error);
  lin.weight = Tensor(DType::F32, {2, 32}, buf.data());
  lin.bias = Tensor(DType::F32, {3}, buf.data());  // wrong length
  EXPECT_THROW(matmul_cpu(buf.data(), 1, lin, out.data(), pool), Error);
  lin.bias = Tensor();
  lin.weight = Tensor(DType::F32, {64}, buf.data());  // not 2-D
  EXPECT_THROW(matmul_cpu(buf.data(), 1, lin, out.data(), pool), Error);
}

TEST(MatmulCpuActivations, Q8QuantizationIsWithinHalfStepAndSumsAreExact) {
  auto x = gaussian(512, 5);
  x[3] = -20.0f;
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
  std::vector<uint8_t> r0(static_cast<size_t>(cpu::act_q8_0_row_bytes(512)));
  cpu::quantize_act_q8_0(x.data(), 512, r0.data());
  const auto v0 = cpu::act_q8_0_view(r0.data(), 512);
  for (int b = 0; b < 16; ++b) {
    float amax = 0;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(x[32 * b + j]));
      sum += v0.qs[32 * b + j];
    }
    EXPECT_FLOAT_EQ(v0.d[b], amax / 127);
    EXPECT_FLOAT_EQ(v0.dsum[b], v0.d[b] * static_cast<float>(sum));
    for (int j = 0; j < 32; ++j)
      EXPECT_LE(std::fabs(v0.d[b] * v0.qs[32 * b + j] - x[32 * b + j]), amax / 254 * 1.0001f);
  }
  std::vector<uint8_t> rk(static_cast<size_t>(cpu::act_q8_k_row_bytes(512)));
  cpu::quantize_act_q8_k(x.data(), 512, rk.data());
  const auto vk = cpu::act_q8_k_view(rk.data(), 512);
  for (int g = 0; g < 32; ++g) {
    int s = 0;
    for (int j = 0; j < 16; ++j) s += vk.qs[16 * g + j];
    EXPECT_EQ(vk.sum16[g], s);
  }
  for (int g = 0; g < 16; ++g) EXPECT_EQ(vk.sum32[g], vk.sum16[2 * g] + vk.sum16[2 * g + 1]);
  EXPECT_EQ(vk.qs[3], -127);
}

}  // namespace
}  // namespace inferx
