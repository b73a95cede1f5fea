// Overlapped decode steps (EngineConfig::async_decode): step N + 1 is planned and launched before step N's
// tokens reach the host, its input ids gathered from N's sampling slot. On the CPU with padded decode
// steps (INFERX_GRAPHS=pad) and a backend that samples "on the device" asynchronously
// (device_backend_fake.h), every output must equal the in-order engine's exactly: greedy and seeded
// sampling, sequences ending by length or on a stop token (the extra row they cost is dropped), n > 1,
// admissions from a waiting queue, chunked prefill, preemption, sliding windows and aborts mid-flight.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>

#include "device_backend_fake.h"
#include "engine/block_pool.h"
#include "engine/scheduler.h"
#include "engine_test_requests.h"
#include "inferx/engine.h"
#include "model/model.h"

namespace inferx {
namespace {

using testing::DeviceSamplingCpuBackend;

struct Outcome {
  std::vector<std::map<int32_t, std::vector<int32_t>>> tokens;  // per request, per sequence index
  std::vector<std::map<int32_t, FinishReason>> finish;
  EngineStats stats;
};

class AsyncDecode : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("INFERX_GRAPHS", "pad", 1);  // padded decode steps on the CPU (what CUDA graphs replay)
    dev_ = new DeviceSamplingCpuBackend();
    model_ = Model::load("dummy:tiny", *dev_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dev_;
    unsetenv("INFERX_GRAPHS");
  }
  static std::vector<int32_t> prompt(int32_t len, int32_t salt) { return testing::test_prompt(len, salt); }
  static GenerationParams greedy(int32_t max_tokens) { return testing::greedy_tokens(max_tokens); }
  static EngineConfig base_config() {
    EngineConfig c;
    c.max_model_len = 256;
    c.max_num_batched_tokens = 64;
    c.max_batch_size = 4;
    return c;
  }
  // Runs every request to its end (request i: prompt(prompt_len(i), i)); `abort_after`: steps after which
  // request `abort_id` is aborted (-1: never).
  static Outcome run(const std::vector<GenerationParams>& params, EngineConfig cfg, bool async,
                     int abort_after = -1, size_t abort_id = 0) {
    return run_on(*model_, params, cfg, async, abort_after, abort_id);
  }
  // Submits request i = prompt(prompt_len(i), i) with params[i]; its outputs collect into o.
  static void submit_all(Engine& engine, const std::vector<GenerationParams>& params, Outcome& o) {
    o.tokens.resize(params.size());
    o.finish.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EngineRequest r;
      r.id = fmt::format("r{}", i);
      r.prompt = prompt(6 + 7 * static_cast<int32_t>(i % 5), static_cast<int32_t>(i));
      r.params = params[i];
      r.on_output = [&o, i](RequestOutput&& out) {
        for (const SequenceDelta& d : out.deltas) {
          auto& t = o.tokens[i][d.index];
          t.insert(t.end(), d.token_ids.begin(), d.token_ids.end());
          if (d.finish_reason != FinishReason::None) o.finish[i][d.index] = d.finish_reason;
        }
      };
      engine.submit(std::move(r));
    }
  }
  static Outcome run_on(Model& model, const std::vector<GenerationParams>& params, EngineConfig cfg,
                        bool async, int abort_after = -1, size_t abort_id = 0) {
    cfg.async_decode = async;
    dev_->reset_slots();
    Engine engine(model, nullptr, cfg);
    Outcome o;
    submit_all(engine, params, o);
    int steps = 0;
    while (engine.step()) {
      if (++steps == abort_after) engine.abort(fmt::format("r{}", abort_id));
    }
    o.stats = engine.stats();
    return o;
  }
  static DeviceSamplingCpuBackend* dev_;
  static Model* model_;
};
DeviceSamplingCpuBackend* AsyncDecode::dev_ = nullptr;
Model* AsyncDecode::model_ = nullptr;

TEST_F(AsyncDecode, OverlappedStepsGiveTheInOrderEnginesOutputExactly) {
  std::vector<GenerationParams> ps;
  for (int32_t m : {24, 9, 17, 30, 12, 5, 21}) ps.push_back(greedy(m));  // more than max_batch_size 4
  GenerationParams seeded = greedy(20);
  seeded.temperature = 0.8f;
  seeded.top_k = 40;
  seeded.seed = 7;
  ps.push_back(seeded);
  GenerationParams two = greedy(14);  // n = 2: forked off the prompt at the first token
  two.n = 2;
  two.temperature = 1.0f;
  two.seed = 3;
  ps.push_back(two);
  // A request that stops on a token mid-way: the token its greedy output has at index 6.
  const Outcome probe = run(ps, base_config(), /*async=*/false);
  ASSERT_GE(probe.tokens[3].at(0).size(), 7u);
  ps[3].stop_token_ids = {probe.tokens[3].at(0)[6]};

  const Outcome in_order = run(ps, base_config(), false);
  const Outcome overlapped = run(ps, base_config(), true);
  EXPECT_EQ(overlapped.tokens, in_order.tokens);
  EXPECT_EQ(overlapped.finish, in_order.finish);
  EXPECT_EQ(in_order.finish[3].at(0), FinishReason::Stop);
  EXPECT_LE(in_order.tokens[3].at(0).size(), 7u);
  EXPECT_EQ(in_order.stats.overlapped_steps, 0);
  EXPECT_GT(overlapped.stats.overlapped_steps, 20) << "the overlapped path must actually run";
  EXPECT_EQ(overlapped.stats.generation_tokens, in_order.stats.generation_tokens);
  EXPECT_EQ(overlapped.stats.running, 0);
}

TEST_F(AsyncDecode, PreemptionChunkedPrefillAndSlidingWindowsStayExact) {
  std::vector<GenerationParams> ps;
  for (int32_t m : {40, 33, 45, 28, 38, 50}) ps.push_back(greedy(m));
  EngineConfig small = base_config();
  small.max_num_batched_tokens = 16;  // prompts in chunks
  small.max_model_len = 128;
  small.kv_cache_bytes = 10 * KvCache::bytes_per_block(*model_, small.block_size);  // 160 tokens for 4 rows
  const Outcome in_order = run(ps, small, false), overlapped = run(ps, small, true);
  EXPECT_EQ(overlapped.tokens, in_order.tokens);
  EXPECT_GT(in_order.stats.preemptions, 0) << "the pool must be short enough to preempt";
  EXPECT_GT(overlapped.stats.overlapped_steps, 0);

  EngineConfig window = base_config();
  window.sliding_window = 24;
  const Outcome w_in_order = run(ps, window, false), w_overlapped = run(ps, window, true);
  EXPECT_EQ(w_overlapped.tokens, w_in_order.tokens);
  EXPECT_GT(w_overlapped.stats.overlapped_steps, 0);
}

TEST_F(AsyncDecode, AbortWhileAStepIsInFlightEndsOnlyThatRequest) {
  const std::vector<GenerationParams> ps(3, greedy(30));
  const Outcome in_order = run(ps, base_config(), false);
  // Abort r1 after 12 steps: its steps are overlapped by then (prompts take one step).
  const Outcome aborted = run(ps, base_config(), true, /*abort_after=*/12, /*abort_id=*/1);
  EXPECT_GT(aborted.stats.overlapped_steps, 5);
  EXPECT_EQ(aborted.finish[1].at(0), FinishReason::Abort);
  EXPECT_LT(aborted.tokens[1].at(0).size(), 30u);
  const auto& full = in_order.tokens[1].at(0);
  const auto& part = aborted.tokens[1].at(0);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin())) << "the aborted text is a prefix";
  EXPECT_EQ(aborted.tokens[0], in_order.tokens[0]);
  EXPECT_EQ(aborted.tokens[2], in_order.tokens[2]);
  EXPECT_EQ(aborted.stats.kv_blocks_used, 0) << "every block is back in the pool";
}

// Aborting every running request while a step is in flight leaves a step nothing wants: the engine still
// waits for it before its slot (and, on CUDA, its host metadata copy) is used again (the fake backend
// fails a slot sampled into twice without a wait). New requests then run as an in-order engine runs them.
TEST_F(AsyncDecode, AStepLeftWithoutSequencesIsWaitedForBeforeItsSlotIsReused) {
  const std::vector<GenerationParams> later(2, greedy(20));
  EngineConfig cfg = base_config();
  const Outcome in_order = run(later, cfg, false);
  cfg.async_decode = true;
  dev_->reset_slots();
  Engine engine(*model_, nullptr, cfg);
  EngineRequest first;
  first.id = "first";
  first.prompt = prompt(9, 7);
  first.params = greedy(40);
  engine.submit(std::move(first));
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(engine.step());
  ASSERT_GT(engine.stats().overlapped_steps, 3);
  engine.abort("first");
  ASSERT_TRUE(engine.step());  // the in-flight step loses its only sequence here
  Outcome after;
  submit_all(engine, later, after);
  const int64_t overlapped_before = engine.stats().overlapped_steps;
  while (engine.step()) {
  }
  EXPECT_GT(engine.stats().overlapped_steps, overlapped_before + 5) << "the slots were used again";
  EXPECT_EQ(after.tokens, in_order.tokens);
}

// Penalties need every token before the next step is sampled: a batch holding a penalized request runs in
// order (the same text), and overlaps again once it has ended.
TEST_F(AsyncDecode, PenalizedRowsKeepTheirStepsInOrder) {
  std::vector<GenerationParams> ps(3, greedy(30));
  ps[1].max_tokens = 10;
  ps[1].repetition_penalty = 1.4f;
  ps[1].presence_penalty = 0.6f;
  const Outcome in_order = run(ps, base_config(), false), overlapped = run(ps, base_config(), true);
  EXPECT_EQ(overlapped.tokens, in_order.tokens);
  EXPECT_GT(overlapped.stats.overlapped_steps, 5);   // after r1 ended
  EXPECT_LT(overlapped.stats.overlapped_steps, 22);  // not while r1 ran (30 steps for the longest)
}

// A device failure while a step is in flight (or in the step launched behind it) fails the requests of both
// steps with the error, not the engine: a request submitted afterwards runs to its end.
TEST_F(AsyncDecode, AFailingStepFailsItsRequestsNotTheEngine) {
  for (int fail_at : {1, 3, 8}) {  // an in-order step, the first overlapped one, one well inside the overlap
    SCOPED_TRACE(fail_at);
    Engine engine(*model_, nullptr, base_config());
    std::map<std::string, RequestOutput> last;
    const auto submit = [&](const std::string& id, int32_t salt) {
      EngineRequest r;
      r.id = id;
      r.prompt = prompt(8, salt);
      r.params = greedy(20);
      r.on_output = [&last, id](RequestOutput&& o) { last[id] = std::move(o); };
      engine.submit(std::move(r));
    };
    submit("a", 1);
    submit("b", 2);
    dev_->fail_after = fail_at;
    engine.run_until_idle();
    dev_->fail_after = 0;
    for (const char* id : {"a", "b"}) {
      ASSERT_TRUE(last.count(id));
      EXPECT_TRUE(last[id].finished) << id;
      EXPECT_NE(last[id].error.find("injected device failure"), std::string::npos)
          << id << ": " << last[id].error;
    }
    submit("c", 3);
    engine.run_until_idle();
    ASSERT_TRUE(last.count("c"));
    EXPECT_TRUE(last["c"].finished && last["c"].error.empty()) << last["c"].error;
    EXPECT_EQ(engine.stats().running, 0);
    EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  }
}

// A tensor-parallel model: the ids an overlapped step gathers into rank 0's metadata reach rank 1 with the
// step's metadata broadcast (rank 1 embeds its vocabulary rows from them; stale ids change the text).
TEST_F(AsyncDecode, TensorParallelRanksReadTheGatheredIds) {
  LoadOptions o;
  o.tensor_parallel_size = 2;
  auto tp = Model::load("dummy:tiny", *dev_, o);
  ASSERT_NE(tp->tensor_parallel(), nullptr);
  std::vector<GenerationParams> ps;
  for (int32_t m : {24, 9, 17, 30, 12}) ps.push_back(greedy(m));
  GenerationParams seeded = greedy(20);
  seeded.temperature = 0.8f;
  seeded.seed = 5;
  ps.push_back(seeded);
  const Outcome in_order = run_on(*tp, ps, base_config(), false),
                overlapped = run_on(*tp, ps, base_config(), true);
  EXPECT_EQ(overlapped.tokens, in_order.tokens);
  EXPECT_GT(overlapped.stats.overlapped_steps, 15) << "the overlapped path must actually run";
}

// An engine destroyed while a step is in flight leaves nothing behind (ASan in CI) and a new engine on the
// same model then gives the in-order output. On the CPU fake the step is done at once, so the destructor's
// wait for the device (Engine::~Engine) is not what this can catch; on a GPU it keeps the pinned id copy
// alive until it lands.
TEST_F(AsyncDecode, DestroyedWithAStepInFlight) {
  const std::vector<GenerationParams> ps(2, greedy(40));
  {
    EngineConfig cfg = base_config();
    Engine engine(*model_, nullptr, cfg);
    for (size_t i = 0; i < ps.size(); ++i) {
      EngineRequest r;
      r.id = fmt::format("r{}", i);
      r.prompt = prompt(8, static_cast<int32_t>(i));
      r.params = ps[i];
      engine.submit(std::move(r));
    }
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(engine.step());
    EXPECT_GT(engine.stats().overlapped_steps, 0);
    EXPECT_EQ(engine.num_unfinished(), 2);
  }
  EXPECT_EQ(run(ps, base_config(), true).tokens, run(ps, base_config(), false).tokens);
}

}  // namespace
}  // namespace inferx
