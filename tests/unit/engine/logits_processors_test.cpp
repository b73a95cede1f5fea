// Penalties, logit_bias and logprobs against values worked out by hand / in double precision.
#include "engine/logits_processors.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/block_pool.h"
#include "engine/prefix_cache.h"

namespace inferx {
namespace {

TEST(LogitsProcessors, RepetitionPenaltyDividesPositivesAndMultipliesNegatives) {
  GenerationParams p;
  p.repetition_penalty = 2.0f;
  PenaltyState s(p, {0, 1});
  s.add_generated(3);
  std::vector<float> row = {4.0f, -1.0f, 2.0f, 0.5f, -3.0f};
  s.apply(row.data(), 5);
  EXPECT_EQ(row, (std::vector<float>{2.0f, -2.0f, 2.0f, 0.25f, -3.0f}));
}

TEST(LogitsProcessors, FrequencyAndPresenceCountGeneratedTokensOnly) {
  GenerationParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 1.0f;
  PenaltyState s(p, {4, 4, 4});  // prompt tokens carry no frequency/presence penalty
  for (int32_t t : {1, 1, 1, 2}) s.add_generated(t);
  std::vector<float> row = {0.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  s.apply(row.data(), 5);
  // token 1: 1 - 3 * 0.5 - 1 = -1.5; token 2: 1 - 0.5 - 1 = -0.5.
  EXPECT_EQ(row, (std::vector<float>{0.0f, -1.5f, -0.5f, 1.0f, 1.0f}));
}

TEST(LogitsProcessors, OffPenaltiesTouchNothing) {
  PenaltyState s(GenerationParams{}, {0, 1, 2});
  EXPECT_FALSE(s.active());
  s.add_generated(1);
  std::vector<float> row = {1.0f, 2.0f, 3.0f};
  s.apply(row.data(), 3);
  EXPECT_EQ(row, (std::vector<float>{1.0f, 2.0f, 3.0f}));
}

TEST(LogitsProcessors, LogitBiasAdds) {
  std::vector<float> row = {1.0f, 2.0f, 3.0f};
  apply_logit_bias(row.data(), 3, {{0, -100.0f}, {2, 0.5f}, {7, 1.0f}});
  EXPECT_EQ(row, (std::vector<float>{-99.0f, 2.0f, 3.5f}));
}

TEST(LogitsProcessors, LogprobsAreLogSoftmaxWithTopAlternatives) {
  const std::vector<float> row = {1.0f, 3.0f, -2.0f, 3.0f, 0.0f};
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x));
  const double lse = std::log(sum);
  std::vector<std::pair<float, int32_t>> scratch;
  const TokenLogprob lp = compute_logprobs(row.data(), 5, 4, 3, scratch);
  EXPECT_EQ(lp.token, 4);
  EXPECT_NEAR(lp.logprob, 0.0 - lse, 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // tie with 3: lower id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[0].second, 3.0 - lse, 1e-6);
  EXPECT_NEAR(lp.top[2].second, 1.0 - lse, 1e-6);
}

TEST(BlockPool, RefCountsAndLruEviction) {
  BlockPool pool(4, true);
  EXPECT_EQ(pool.num_free(), 4);
  const int32_t a = pool.allocate(), b = pool.allocate();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  pool.cache(a, 111);
  pool.cache(b, 222);
  pool.retain(a);
  EXPECT_EQ(pool.ref_count(a), 2);
  pool.release(a);
  pool.release(a);  // free but still cached: queue is 2, 3, 0
  pool.release(b);  // 2, 3, 0, 1
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.find_cached(111), a);
  pool.retain(a);  // a prefix hit takes it out of the middle of the queue
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.find_cached(222), b);
  EXPECT_EQ(pool.allocate(), 1);  // the least recently freed cached block is evicted
  EXPECT_EQ(pool.find_cached(222), -1);
  EXPECT_EQ(pool.find_cached(111), a);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_THROW(pool.allocate(), std::exception);
  pool.release(2);
  EXPECT_THROW(pool.release(2), std::exception) << "double free is caught";
}

TEST(PrefixCache, ChainedHashesDependOnThePrefix) {
  const std::vector<int32_t> x = {1, 2, 3, 4, 5, 6, 7, 8}, y = {9, 9, 9, 9, 5, 6, 7, 8};
  std::vector<uint64_t> hx, hy;
  extend_block_hashes(x, 4, 2, hx);
  extend_block_hashes(y, 4, 2, hy);
  ASSERT_EQ(hx.size(), 2u);
  EXPECT_NE(hx[0], hy[0]);
  EXPECT_NE(hx[1], hy[1]) << "same block tokens after a different prefix must differ";
  PrefixCache c;
  EXPECT_TRUE(c.insert(hx[0], 3));
  EXPECT_FALSE(c.insert(hx[0], 4));
  EXPECT_EQ(c.longest_cached_prefix(hx, 2), 1);
  c.insert(hx[1], 5);
  EXPECT_EQ(c.longest_cached_prefix(hx, 2), 2);
  EXPECT_EQ(c.longest_cached_prefix(hx, 1), 1);
  EXPECT_EQ(c.longest_cached_prefix(hy, 2), 0);
}

}  // namespace
}  // namespace inferx
