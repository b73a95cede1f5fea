// Sampler: greedy, filter semantics against a plain full-sort reference, the empirical distribution of
// draws against probabilities(), seeding, and non-finite logits.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"

namespace inferx {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Straightforward reference: sort everything, cut, softmax, cut, cut, renormalise.
std::vector<double> reference(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<std::pair<float, int>> c;
  for (size_t i = 0; i < logits.size(); ++i) c.emplace_back(logits[i], static_cast<int>(i));
  std::sort(c.begin(), c.end(),
            [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(p.top_k);
  std::vector<double> prob(c.size());
  double sum = 0;
  for (size_t i = 0; i < c.size(); ++i)
    sum += prob[i] = std::exp((c[i].first - c[0].first) / double(p.temperature));
  for (auto& x : prob) x /= sum;
  size_t keep = prob.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (keep = 0; keep < prob.size();) {
      cum += prob[keep++];
      if (cum >= p.top_p) break;
    }
  }
  std::vector<double> out(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    if (p.min_p > 0 && prob[i] < p.min_p * prob[0]) continue;
    out[c[i].second] = prob[i];
    total += prob[i];
  }
  for (auto& x : out) x /= total;
  return out;
}

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  for (float t : {0.0f, -1.0f}) {
    Sampler s({.temperature = t});
    EXPECT_EQ(s.sample(logits.data(), 5), 1);
    const auto p = s.probabilities(logits.data(), 5);
    EXPECT_EQ(p, (std::vector<float>{0, 1, 0, 0, 0}));
  }
}

TEST(Sampler, TopK1AndTinyTopPAreGreedy) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const auto logits = random_logits(5000, seed);
    const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    Sampler k1({.temperature = 1.5f, .top_k = 1, .seed = seed});
    Sampler p0({.temperature = 1.5f, .top_p = 1e-6f, .seed = seed});
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(k1.sample(logits.data(), 5000), best);
      EXPECT_EQ(p0.sample(logits.data(), 5000), best);
    }
  }
}

TEST(Sampler, MinPKeepsTokensAboveTheFractionOfTheMax) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1; min_p 0.2 -> threshold 0.1 drops the last.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  Sampler s({.temperature = 1.0f, .min_p = 0.2f});
  const auto p = s.probabilities(logits.data(), 4);
  EXPECT_NEAR(p[0], 0.5 / 0.95, 1e-6);
  EXPECT_NEAR(p[1], 0.3 / 0.95, 1e-6);
  EXPECT_NEAR(p[2], 0.15 / 0.95, 1e-6);
  EXPECT_EQ(p[3], 0.0f);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.6f), std::log(0.3f)};
  Sampler s({.temperature = 1.0f, .top_p = 0.85f});
  const auto p = s.probabilities(logits.data(), 3);  // 0.6 + 0.3 >= 0.85: keep those two
  EXPECT_NEAR(p[1], 0.6 / 0.9, 1e-6);
  EXPECT_NEAR(p[2], 0.3 / 0.9, 1e-6);
  EXPECT_EQ(p[0], 0.0f);
}

TEST(Sampler, ProbabilitiesMatchTheFullSortReference) {
  const std::vector<SamplingParams> cases = {
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_k = 40},
      {.temperature = 0.8f, .top_p = 0.9f},
      {.temperature = 1.3f, .top_k = 100, .top_p = 0.95f, .min_p = 0.05f},
      {.temperature = 0.5f, .min_p = 0.1f},
      {.temperature = 2.0f, .top_p = 0.999f},  // nucleus larger than the first sorted head
      {.temperature = 1e-20f},                 // extreme scaling must not produce NaN
  };
  for (size_t n : {7u, 1000u, 152064u}) {
    auto logits = random_logits(n, static_cast<uint32_t>(n), 2.0f);
    for (int ties = 0; ties < 2; ++ties) {
      // Second round: logits rounded to 1/4, so the top-p boundary falls inside groups of equal values
      // (taken in id order) and weights repeat.
      if (ties == 1)
        for (auto& x : logits) x = std::round(x * 4.0f) / 4.0f;
      for (const auto& params : cases) {
        const auto got = Sampler(params).probabilities(logits.data(), static_cast<int64_t>(n));
        const auto want = reference(logits, params);
        double max_err = 0, sum = 0;
        for (size_t i = 0; i < n; ++i) {
          max_err = std::max(max_err, std::abs(got[i] - want[i]));
          sum += got[i];
        }
        EXPECT_LT(max_err, 1e-5) << "n=" << n << " T=" << params.temperature << " k=" << params.top_k
                                 << " p=" << params.top_p << " min_p=" << params.min_p;
        EXPECT_NEAR(sum, 1.0, 1e-4);
      }
    }
  }
}

TEST(Sampler, FastPathAgreesWithTheGeneralPath) {
  // top_k = vocab keeps every token but goes through the general path (heap, std::exp, sorted walk);
  // top_k = 0 takes the vectorised path. Same distribution up to float rounding, -inf tokens excluded.
  for (size_t n : {5u, 300u, 40000u}) {
    auto logits = random_logits(n, static_cast<uint32_t>(n) + 1, 3.0f);
    logits[n / 2] = -kInf;
    for (float top_p : {1.0f, 0.9f, 0.5f}) {
      for (float min_p : {0.0f, 0.05f}) {
        SamplingParams fast{.temperature = 0.8f, .top_p = top_p, .min_p = min_p};
        SamplingParams general = fast;
        general.top_k = static_cast<int32_t>(n);
        const auto a = Sampler(fast).probabilities(logits.data(), static_cast<int64_t>(n));
        const auto b = Sampler(general).probabilities(logits.data(), static_cast<int64_t>(n));
        EXPECT_EQ(a[n / 2], 0.0f);
        for (size_t i = 0; i < n; ++i)
          ASSERT_NEAR(a[i], b[i], 1e-6)
              << "n=" << n << " top_p=" << top_p << " min_p=" << min_p << " i=" << i;
      }
    }
  }
}

// Chi-square goodness of fit of 20000 draws against probabilities(). Critical values are for p = 0.001;
// the seeds are fixed, so this is deterministic, but a wrong draw (off by one in the cumulative walk,
// a biased uniform) fails it by far.
double chi_square_critical_001(int df) {
  // Wilson-Hilferty approximation of the chi-square quantile, z(0.999) = 3.0902.
  const double z = 3.0902, k = df;
  return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
}

void expect_draws_follow(const std::vector<float>& logits, const SamplingParams& params) {
  Sampler s(params);
  const auto p = s.probabilities(logits.data(), static_cast<int64_t>(logits.size()));
  const int draws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    const int32_t id = s.sample(logits.data(), static_cast<int64_t>(logits.size()));
    ASSERT_GT(p[id], 0.0f) << "drew a filtered token " << id;
    ++counts[id];
  }
  double chi2 = 0;
  int bins = 0;
  double max_abs_err = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) continue;
    const double expected = p[i] * draws;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++bins;
    max_abs_err = std::max(max_abs_err, std::abs(counts[i] / double(draws) - p[i]));
  }
  ASSERT_GE(bins, 2);
  EXPECT_LT(chi2, chi_square_critical_001(bins - 1)) << "bins " << bins;
  EXPECT_LT(max_abs_err, 0.015);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  expect_draws_follow({1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, 1.5f}, {.temperature = 1.0f, .seed = 7});
  expect_draws_follow(random_logits(50, 3, 1.0f), {.temperature = 0.9f, .top_k = 12, .seed = 11});
  expect_draws_follow(random_logits(3000, 5, 2.0f), {.temperature = 0.6f, .top_p = 0.8f, .seed = 13});
  expect_draws_follow(random_logits(300, 9, 1.5f), {.temperature = 1.0f, .min_p = 0.1f, .seed = 17});
  // Plain temperature over several 256-token blocks: the draw skips whole blocks by their sums.
  expect_draws_follow(random_logits(1000, 19, 0.5f), {.temperature = 1.0f, .seed = 19});
  // Top-p with min-p on a vocabulary large enough for the candidate gathering and quickselect.
  expect_draws_follow(random_logits(20000, 23, 3.0f),
                      {.temperature = 0.7f, .top_p = 0.9f, .min_p = 0.01f, .seed = 23});
}

TEST(Sampler, UniformDrawIsTheTop53BitsOfMt19937_64) {
  // Two equal logits: token 0 iff u < 0.5, where u = (next 64-bit output >> 11) * 2^-53.
  const std::vector<float> logits = {0.0f, 0.0f};
  Sampler s({.temperature = 1.0f, .seed = 42});
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200; ++i) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    EXPECT_EQ(s.sample(logits.data(), 2), u < 0.5 ? 0 : 1);
  }
}

TEST(Sampler, SeedsAreReproducible) {
  const auto logits = random_logits(1000, 1, 1.0f);
  const auto run = [&](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .top_p = 0.95f, .seed = seed});
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.sample(logits.data(), 1000));
    return ids;
  };
  EXPECT_EQ(run(123), run(123));
  EXPECT_NE(run(123), run(124));
}

TEST(Sampler, NonFiniteLogits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // +inf wins outright, whatever the filters.
  const std::vector<float> one_inf = {1.0f, kInf, nan, 3.0f};
  Sampler s({.temperature = 1.0f, .top_k = 3, .top_p = 0.5f, .min_p = 0.1f, .seed = 1});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(one_inf.data(), 4), 1);
  Sampler g({.temperature = 0.0f});
  EXPECT_EQ(g.sample(one_inf.data(), 4), 1);
  // Several +inf: uniform over them.
  const std::vector<float> two_inf = {kInf, 0.0f, kInf};
  EXPECT_EQ(Sampler({.temperature = 1.0f}).probabilities(two_inf.data(), 3),
            (std::vector<float>{0.5f, 0, 0.5f}));
  // NaN and -inf are never drawn.
  const std::vector<float> holes = {nan, 0.0f, -kInf, 0.0f};
  const auto p = Sampler({.temperature = 1.0f}).probabilities(holes.data(), 4);
  EXPECT_EQ(p, (std::vector<float>{0, 0.5f, 0, 0.5f}));
  EXPECT_EQ(Sampler({.temperature = 0.0f}).sample(holes.data(), 4), 1);
  // No possible token: an error, in both modes.
  const std::vector<float> none = {-kInf, nan, -kInf};
  EXPECT_THROW(Sampler({.temperature = 1.0f}).sample(none.data(), 3), Error);
  EXPECT_THROW(Sampler({.temperature = 0.0f}).sample(none.data(), 3), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f}).sample(none.data(), 0), Error);
}

}  // namespace
}  // namespace inferx
