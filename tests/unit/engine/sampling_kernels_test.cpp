// Sampling kernels against plain scalar references: the exp against exp in double, the vectorised
// weights pass against the scalar exp element by element (bit-identical), argmax / scan / gather /
// compaction / masked sums against one-line loops, on lengths around the vector width and with NaN,
// +-inf and ties.
#include "engine/sampling_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace inferx::sampling_kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const std::vector<int64_t> kLengths = {1, 2, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000, 32000};

std::vector<float> random_row(int64_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(SamplingKernels, ExpIsWithin3UlpOfDoubleExp) {
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-86.5f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-kInf), 0.0f);
  EXPECT_EQ(exp_nonpositive(kNaN), 0.0f);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-86.0f, 0.0f);
  double worst = 0.0;
  for (int i = 0; i < 2000000; ++i) {
    // Half uniform on [-86, 0], half near 0 where most weights of a peaked distribution are.
    const float x = i % 2 ? d(rng) : d(rng) / 64.0f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(exp_nonpositive(x) - want) / want);
  }
  EXPECT_LT(worst, 3 * 0x1p-24) << "relative error " << worst;
  // Monotone (non-decreasing) over a dense sweep of a reduction interval boundary region.
  float prev = 0.0f;
  for (float x = -3.0f; x <= 0.0f; x = std::nextafter(x, 1.0f) + 1e-6f) {
    const float e = exp_nonpositive(x);
    ASSERT_GE(e, prev) << "at " << x;
    prev = e;
  }
}

TEST(SamplingKernels, ScanAndArgmaxMatchScalarReferences) {
  std::mt19937 rng(9);
  for (int64_t n : kLengths) {
    for (int variant = 0; variant < 6; ++variant) {
      auto row = random_row(n, static_cast<uint32_t>(n * 7 + variant), 2.0f);
      if (variant >= 1)
        for (auto& x : row) x = std::round(x);  // many ties
      if (variant >= 2) row[rng() % n] = kNaN;
      if (variant >= 3) row[rng() % n] = -kInf;
      if (variant == 4) row[rng() % n] = kInf;
      if (variant == 5)
        for (auto& x : row) x = rng() % 3 ? -kInf : kNaN;  // nothing can be chosen
      float max = -kInf;
      bool nan = false;
      int64_t best = -1;
      for (int64_t i = 0; i < n; ++i) {
        const float x = row[static_cast<size_t>(i)];
        if (std::isnan(x)) {
          nan = true;
          continue;
        }
        if (x > max) max = x;
        if (x != -kInf && (best < 0 || x > row[static_cast<size_t>(best)])) best = i;
      }
      const RowScan s = scan_row(row.data(), n);
      EXPECT_EQ(s.max, max) << "n=" << n << " variant " << variant;
      EXPECT_EQ(s.has_nan, nan) << "n=" << n << " variant " << variant;
      EXPECT_EQ(argmax(row.data(), n), best) << "n=" << n << " variant " << variant;
    }
  }
}

TEST(SamplingKernels, WeightsPassIsTheScalarExpElementByElement) {
  for (int64_t n : kLengths) {
    auto row = random_row(n, static_cast<uint32_t>(n), 4.0f);
    row[0] = -kInf;  // a "never" token: weight 0
    const float max = scan_row(row.data(), n).max;
    for (float inv_t : {1.0f, 1.25f, 10.0f}) {
      std::vector<float> w(static_cast<size_t>(n));
      std::vector<double> blocks(static_cast<size_t>((n + kBlock - 1) / kBlock));
      std::vector<int32_t> ids(static_cast<size_t>(n) + 16);
      std::vector<float> ws(static_cast<size_t>(n) + 16);
      int64_t count = -1;
      const float t = 0x1p-9f;
      const double total = softmax_weights(row.data(), n, max, inv_t, w.data(), blocks.data(), t, ids.data(),
                                           ws.data(), &count);
      double sum = 0.0, block_total = 0.0;
      std::vector<int32_t> want_ids;
      for (int64_t i = 0; i < n; ++i) {
        const float e = exp_nonpositive((row[static_cast<size_t>(i)] - max) * inv_t);
        ASSERT_TRUE(same_bits(w[static_cast<size_t>(i)], e)) << "n=" << n << " i=" << i;
        sum += e;
        if (e >= t) want_ids.push_back(static_cast<int32_t>(i));
      }
      for (double b : blocks) block_total += b;
      EXPECT_EQ(w[0], 0.0f);
      EXPECT_NEAR(total, sum, 1e-12 * sum);
      EXPECT_EQ(total, block_total);
      ASSERT_EQ(count, static_cast<int64_t>(want_ids.size()));
      for (size_t i = 0; i < want_ids.size(); ++i) {
        EXPECT_EQ(ids[i], want_ids[i]);
        EXPECT_EQ(ws[i], w[static_cast<size_t>(want_ids[i])]);
      }
      // The same set from the separate gather.
      std::vector<int32_t> ids2(static_cast<size_t>(n) + 16);
      std::vector<float> ws2(static_cast<size_t>(n) + 16);
      ASSERT_EQ(gather_at_least(w.data(), n, t, ids2.data(), ws2.data()), count);
      for (int64_t i = 0; i < count; ++i)
        EXPECT_EQ(ids2[static_cast<size_t>(i)], ids[static_cast<size_t>(i)]);
      // Threshold 0 gathers exactly the positive weights.
      int64_t positive = 0;
      for (float e : w) positive += e > 0.0f;
      EXPECT_EQ(gather_at_least(w.data(), n, 0.0f, ids2.data(), ws2.data()), positive);
    }
  }
}

TEST(SamplingKernels, CompactionSumsAndFirstGreater) {
  for (int64_t n : kLengths) {
    std::vector<float> v(static_cast<size_t>(n) + 16);
    std::mt19937 rng(static_cast<uint32_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(rng() % 64) / 64.0f;
    const float t = 0.5f;
    std::vector<float> high, low;
    std::vector<int32_t> high_ids;
    double sum = 0.0;
    int64_t first = n;
    for (int64_t i = 0; i < n; ++i) {
      const float x = v[static_cast<size_t>(i)];
      (x >= t ? high : low).push_back(x);
      if (x >= t) {
        high_ids.push_back(static_cast<int32_t>(i));
        sum += x;
      }
      if (x > t && first == n) first = i;
    }
    EXPECT_NEAR(sum_at_least(v.data(), n, t), sum, 1e-12 * (sum + 1));
    EXPECT_EQ(first_greater(v.data(), n, t), first);
    std::vector<float> a = v, b = v;
    std::vector<int32_t> ids(static_cast<size_t>(n) + 16);
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    ASSERT_EQ(keep_at_least(a.data(), n, t), static_cast<int64_t>(high.size()));
    ASSERT_EQ(keep_below(b.data(), n, t), static_cast<int64_t>(low.size()));
    EXPECT_TRUE(std::equal(high.begin(), high.end(), a.begin()));
    EXPECT_TRUE(std::equal(low.begin(), low.end(), b.begin()));
    std::vector<float> c = v;
    ASSERT_EQ(keep_pairs_at_least(ids.data(), c.data(), n, t), static_cast<int64_t>(high.size()));
    EXPECT_TRUE(std::equal(high_ids.begin(), high_ids.end(), ids.begin()));
    EXPECT_TRUE(std::equal(high.begin(), high.end(), c.begin()));
  }
}

}  // namespace
}  // namespace inferx::sampling_kernels
