// The serving engine end to end on the real CPU backend with dummy:tiny (random weights, real forward
// pass): batch invariance against SequenceRunner, seeds, preemption, prefix caching, n > 1, logprobs,
// limits, aborts and thread safety.
#include "inferx/engine.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "backend/backend.h"
#include "core/error.h"
#include "engine_test_requests.h"
#include "model/model.h"

namespace inferx {
namespace {

struct Collected {
  std::map<int32_t, std::vector<int32_t>> tokens;
  std::map<int32_t, std::vector<TokenLogprob>> logprobs;
  std::map<int32_t, FinishReason> finish;
  RequestOutput last;
  int outputs = 0;
  bool finished = false;
};

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend({2}).release();
    model_ = Model::load("dummy:tiny", *backend_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
  }

  // A request whose outputs land in `c` (engine thread or step() caller).
  static EngineRequest request(const std::string& id, std::vector<int32_t> prompt, GenerationParams p,
                               Collected& c) {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.params = std::move(p);
    r.on_output = [&c](RequestOutput&& o) {
      EXPECT_FALSE(c.finished) << "output after the final one";
      for (SequenceDelta& d : o.deltas) {
        auto& t = c.tokens[d.index];
        t.insert(t.end(), d.token_ids.begin(), d.token_ids.end());
        auto& l = c.logprobs[d.index];
        l.insert(l.end(), d.logprobs.begin(), d.logprobs.end());
        if (d.finish_reason != FinishReason::None) c.finish[d.index] = d.finish_reason;
      }
      ++c.outputs;
      c.finished = o.finished;
      c.last = std::move(o);
    };
    return r;
  }

  static std::vector<int32_t> prompt(int32_t len, int32_t salt) { return testing::test_prompt(len, salt); }

  // Greedy reference: SequenceRunner + argmax, one sequence alone.
  static std::vector<int32_t> runner_greedy(const std::vector<int32_t>& p, int32_t n) {
    SequenceRunner runner(*model_, static_cast<int64_t>(p.size()) + n + 1);
    std::vector<int32_t> out;
    std::vector<float> logits = runner.step(p);
    for (int32_t i = 0; i < n; ++i) {
      const auto t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(t);
      if (i + 1 < n) logits = runner.step({t});
    }
    return out;
  }

  static GenerationParams greedy(int32_t max_tokens) { return testing::greedy_tokens(max_tokens); }

  static Backend* backend_;
  static Model* model_;
};
Backend* EngineTest::backend_ = nullptr;
Model* EngineTest::model_ = nullptr;

TEST_F(EngineTest, GreedyBatchEqualsSequenceRunner) {
  EngineConfig cfg;
  cfg.max_num_batched_tokens = 64;  // prompts are chunked and mixed with decodes
  cfg.max_model_len = 256;
  Engine engine(*model_, nullptr, cfg);
  std::vector<Collected> c(6);
  for (int i = 0; i < 6; ++i) {
    engine.submit(
        request(fmt::format("r{}", i), prompt(20 + 17 * i, i), greedy(12), c[static_cast<size_t>(i)]));
  }
  engine.run_until_idle();
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    const Collected& r = c[static_cast<size_t>(i)];
    ASSERT_TRUE(r.finished);
    EXPECT_EQ(r.tokens.at(0), runner_greedy(prompt(20 + 17 * i, i), 12));
    EXPECT_EQ(r.finish.at(0), FinishReason::Length);
    EXPECT_EQ(r.last.completion_tokens, 12);
    EXPECT_EQ(r.last.prompt_tokens, 20 + 17 * i);
  }
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, SameSeedSameTokensWhateverTheBatch) {
  GenerationParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 1234;
  p.max_tokens = 16;
  p.ignore_eos = true;
  EngineConfig cfg;
  cfg.max_model_len = 256;
  std::vector<int32_t> alone;
  {
    Engine engine(*model_, nullptr, cfg);
    Collected c;
    engine.submit(request("a", prompt(30, 1), p, c));
    engine.run_until_idle();
    alone = c.tokens.at(0);
  }
  Engine engine(*model_, nullptr, cfg);
  std::vector<Collected> others(5);
  for (int i = 0; i < 5; ++i) {
    GenerationParams q = p;
    q.seed.reset();  // unseeded neighbours draw differently every run
    engine.submit(
        request(fmt::format("o{}", i), prompt(10 + i * 9, i + 7), q, others[static_cast<size_t>(i)]));
  }
  engine.step();
  Collected c;
  engine.submit(request("a", prompt(30, 1), p, c));
  engine.run_until_idle();
  EXPECT_EQ(c.tokens.at(0), alone);
  EXPECT_EQ(alone.size(), 16u);
}

TEST_F(EngineTest, PreemptionAndResumptionGiveIdenticalOutput) {
  GenerationParams p = greedy(40);
  GenerationParams s;
  s.temperature = 0.8f;
  s.seed = 99;
  s.max_tokens = 40;
  s.ignore_eos = true;
  auto run = [&](int64_t kv_bytes, EngineStats* stats) {
    EngineConfig cfg;
    cfg.max_model_len = 128;
    cfg.block_size = 16;
    cfg.kv_cache_bytes = kv_bytes;
    cfg.enable_prefix_caching = false;
    Engine engine(*model_, nullptr, cfg);
    std::vector<Collected> c(8);
    for (int i = 0; i < 8; ++i) {
      engine.submit(
          request(fmt::format("r{}", i), prompt(30 + i, i), i % 2 ? s : p, c[static_cast<size_t>(i)]));
    }
    engine.run_until_idle();
    if (stats) *stats = engine.stats();
    std::vector<std::vector<int32_t>> out;
    for (auto& x : c) {
      EXPECT_TRUE(x.finished);
      out.push_back(x.tokens.at(0));
    }
    return out;
  };
  const int64_t block_bytes = KvCache::bytes_per_block(model_->config(), 16);
  EngineStats big_stats, small_stats;
  const auto big = run(block_bytes * 1000, &big_stats);
  const auto small = run(block_bytes * 10, &small_stats);  // 8 sequences of up to 5 blocks in 10 blocks
  EXPECT_EQ(big_stats.preemptions, 0);
  EXPECT_GT(small_stats.preemptions, 0);
  EXPECT_EQ(small, big);
  EXPECT_EQ(small_stats.kv_blocks_used, 0);
}

TEST_F(EngineTest, PrefixCacheHitSkipsComputeAndKeepsOutput) {
  EngineConfig cfg;
  cfg.max_model_len = 256;
  Engine engine(*model_, nullptr, cfg);
  const std::vector<int32_t> shared = prompt(70, 3);
  Collected a, b;
  engine.submit(request("a", shared, greedy(5), a));
  engine.run_until_idle();
  std::vector<int32_t> longer = shared;
  longer.push_back(11);
  longer.push_back(12);
  engine.submit(request("b", longer, greedy(5), b));
  engine.run_until_idle();
  EXPECT_EQ(a.last.cached_prompt_tokens, 0);
  EXPECT_EQ(b.last.cached_prompt_tokens, 64);  // 4 full blocks of 16
  EXPECT_EQ(engine.stats().prefix_cache_hits, 64);
  EXPECT_EQ(b.tokens.at(0), runner_greedy(longer, 5));
}

TEST_F(EngineTest, NSequencesShareThePromptAndMatchSeeds) {
  EngineConfig cfg;
  cfg.max_model_len = 256;
  GenerationParams p;
  p.seed = 5;
  p.max_tokens = 10;
  p.ignore_eos = true;
  p.n = 3;
  Engine engine(*model_, nullptr, cfg);
  Collected c;
  engine.submit(request("n3", prompt(50, 2), p, c));
  engine.run_until_idle();
  ASSERT_TRUE(c.finished);
  ASSERT_EQ(c.tokens.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.tokens.at(i).size(), 10u);
  EXPECT_NE(c.tokens.at(0), c.tokens.at(1));
  EXPECT_EQ(c.last.completion_tokens, 30);
  // Sequence 0 of n = 3 is the n = 1 request with the same seed.
  p.n = 1;
  Collected one;
  engine.submit(request("n1", prompt(50, 2), p, one));
  engine.run_until_idle();
  EXPECT_EQ(one.tokens.at(0), c.tokens.at(0));
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, LogprobsMatchLogSoftmaxOfTheModel) {
  EngineConfig cfg;
  cfg.max_model_len = 256;
  Engine engine(*model_, nullptr, cfg);
  GenerationParams p = greedy(3);
  p.logprobs = 4;
  p.logit_bias = {{5, 3.0f}};  // processing must not change the reported (raw) logprobs
  Collected c;
  const std::vector<int32_t> pr = prompt(25, 9);
  engine.submit(request("lp", pr, p, c));
  engine.run_until_idle();
  ASSERT_EQ(c.logprobs.at(0).size(), 3u);
  SequenceRunner runner(*model_, 64);
  std::vector<float> logits = runner.step(pr);
  for (int k = 0; k < 3; ++k) {
    const TokenLogprob& lp = c.logprobs.at(0)[static_cast<size_t>(k)];
    double m = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (float x : logits) sum += std::exp(x - m);
    const double lse = m + std::log(sum);
    EXPECT_EQ(lp.token, c.tokens.at(0)[static_cast<size_t>(k)]);
    EXPECT_NEAR(lp.logprob, logits[static_cast<size_t>(lp.token)] - lse, 1e-4);
    ASSERT_EQ(lp.top.size(), 4u);
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(lp.top[static_cast<size_t>(j)].first, order[static_cast<size_t>(j)]);
      EXPECT_NEAR(lp.top[static_cast<size_t>(j)].second, logits[order[static_cast<size_t>(j)]] - lse, 1e-4);
    }
    logits = runner.step({lp.token});
  }
}

TEST_F(EngineTest, RejectsBadRequestsWithClearErrors) {
  EngineConfig cfg;
  cfg.max_model_len = 64;
  Engine engine(*model_, nullptr, cfg);
  Collected c;
  try {
    engine.submit(request("long", prompt(65, 1), greedy(4), c));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len 64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine.submit(request("vocab", {1, 2, 999}, greedy(4), c)), Error);
  GenerationParams bad = greedy(4);
  bad.top_p = 0.0f;
  EXPECT_THROW(engine.submit(request("topp", {1, 2}, bad, c)), Error);
  bad = greedy(0);
  EXPECT_THROW(engine.submit(request("max", {1, 2}, bad, c)), Error);
  engine.submit(request("dup", {1, 2}, greedy(2), c));
  EXPECT_THROW(engine.submit(request("dup", {1, 2}, greedy(2), c)), Error);
  EXPECT_EQ(engine.num_unfinished(), 1);
}

TEST_F(EngineTest, StopsAtMaxModelLen) {
  EngineConfig cfg;
  cfg.max_model_len = 40;
  Engine engine(*model_, nullptr, cfg);
  Collected c;
  engine.submit(request("r", prompt(35, 1), greedy(100), c));
  engine.run_until_idle();
  EXPECT_EQ(c.tokens.at(0).size(), 5u);
  EXPECT_EQ(c.finish.at(0), FinishReason::Length);
}

TEST_F(EngineTest, StopTokenIds) {
  EngineConfig cfg;
  cfg.max_model_len = 256;
  Engine engine(*model_, nullptr, cfg);
  const auto ref = runner_greedy(prompt(20, 4), 8);
  GenerationParams p = greedy(8);
  p.stop_token_ids = {ref[3]};
  Collected c;
  engine.submit(request("r", prompt(20, 4), p, c));
  engine.run_until_idle();
  const auto first = std::find(ref.begin(), ref.end(), ref[3]);
  EXPECT_EQ(c.tokens.at(0), std::vector<int32_t>(ref.begin(), first + 1));
  EXPECT_EQ(c.finish.at(0), FinishReason::Stop);
  EXPECT_EQ(c.last.deltas.back().stop_reason, std::to_string(ref[3]));
}

TEST_F(EngineTest, AbortFreesBlocksAndReportsAbort) {
  EngineConfig cfg;
  cfg.max_model_len = 256;
  Engine engine(*model_, nullptr, cfg);
  Collected c;
  engine.submit(request("r", prompt(100, 1), greedy(50), c));
  engine.step();
  engine.step();
  EXPECT_GT(engine.stats().kv_blocks_used, 0);
  engine.abort("r");
  engine.abort("unknown");  // ignored
  engine.step();
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.finish.at(0), FinishReason::Abort);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  EXPECT_EQ(engine.num_unfinished(), 0);
}

TEST_F(EngineTest, SlidingWindowRunsAndFreesBlocks) {
  EngineConfig cfg;
  cfg.max_model_len = 512;
  cfg.sliding_window = 32;
  cfg.enable_prefix_caching = false;
  auto backend = make_cpu_backend({2});
  auto model = Model::load("dummy:tiny", *backend);
  Engine engine(*model, nullptr, cfg);
  Collected c;
  engine.submit(request("r", prompt(200, 1), greedy(60), c));
  int64_t max_used = 0;
  while (engine.step()) max_used = std::max(max_used, engine.stats().kv_blocks_used);
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.tokens.at(0).size(), 60u);
  // The 200-token prompt is prefilled in one chunk (13 blocks); afterwards at most 32/16 + 2 stay live.
  EXPECT_LE(max_used, 13);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, ThreadedSubmitAbortAndStats) {
  EngineConfig cfg;
  cfg.max_model_len = 256;
  Engine engine(*model_, nullptr, cfg);
  engine.start();
  std::mutex mu;
  std::map<std::string, Collected> results;
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        const std::string id = fmt::format("t{}_{}", t, i);
        EngineRequest r;
        r.id = id;
        r.prompt = prompt(10 + i, t);
        r.params = greedy(6);
        r.on_output = [&, id](RequestOutput&& o) {
          std::lock_guard<std::mutex> lock(mu);
          Collected& c = results[id];
          for (auto& d : o.deltas)
            c.tokens[d.index].insert(c.tokens[d.index].end(), d.token_ids.begin(), d.token_ids.end());
          if (o.finished) {
            c.finished = true;
            ++done;
          }
        };
        engine.submit(std::move(r));
        if (i % 3 == 2) engine.abort(id);
        (void)engine.stats();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 2000 && done.load() < 32; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  engine.stop();
  EXPECT_EQ(done.load(), 32);
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  for (int t = 0; t < 4; ++t) {
    const Collected& c = results[fmt::format("t{}_0", t)];
    EXPECT_EQ(c.tokens.at(0), runner_greedy(prompt(10, t), 6));
  }
}

}  // namespace
}  // namespace inferx
