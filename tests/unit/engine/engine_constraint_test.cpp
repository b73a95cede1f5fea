// Structured output through the engine (GenerationParams::constraint, here JSON mode from
// text/json_constraint.h) on the real CPU backend with dummy:tiny: every reply, sampled or greedy, alone or
// beside unconstrained requests, is a valid JSON prefix whose bytes the constraint allowed, and a reply
// that ends on its end token is a complete JSON object.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "engine_test_requests.h"
#include "inferx/engine.h"
#include "model/model.h"
#include "text/json_constraint.h"

namespace inferx {
namespace {

TEST(EngineConstraint, RepliesAreJsonPrefixesAndCompleteWhenEnded) {
  auto backend = make_cpu_backend({2});
  auto model = Model::load("dummy:tiny", *backend);
  const int64_t V = model->config().vocab_size;
  const std::vector<std::string> bytes = testing::json_pieces_vocab(V);
  const auto end = static_cast<int32_t>(V - 1);
  auto json_mode = make_json_object_constraint(std::make_shared<TokenTrie>(bytes));

  std::vector<GenerationParams> params;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    GenerationParams p;
    p.max_tokens = 48;
    p.ignore_eos = true;
    p.stop_token_ids = {end};
    if (i % 4 != 3) p.constraint = json_mode;  // every fourth request is unconstrained, in the same batches
    p.temperature = i % 3 == 0 ? 0.0f : 1.0f;
    p.seed = 100 + i;
    // Push towards closing tokens, so that some replies finish their object within max_tokens.
    for (int32_t t = 0; t + 1 < V; ++t) {
      const std::string& b = bytes[static_cast<size_t>(t)];
      if (b == "}" || b == "\"}" || b == "\"") p.logit_bias.emplace_back(t, 4.0f);
    }
    p.logit_bias.emplace_back(end, 6.0f);
    params.push_back(p);
    prompts.push_back(testing::test_prompt(10 + 3 * i, i));
  }
  EngineConfig cfg;
  cfg.max_model_len = 256;
  cfg.max_num_batched_tokens = 64;
  const auto out = testing::run_requests(*model, cfg, prompts, params);
  int completed = 0, unconstrained_invalid = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    std::string text;
    bool ended = false;
    for (int32_t t : out[i]) {
      ASSERT_FALSE(ended) << "a token after the end token";
      if (t == end) {
        ended = true;
        continue;
      }
      text += bytes[static_cast<size_t>(t)];
    }
    JsonCursor cursor;
    bool prefix = true;
    for (unsigned char c : text) prefix = prefix && cursor.step(c);
    if (!params[i].constraint) {
      unconstrained_invalid += prefix ? 0 : 1;
      continue;
    }
    SCOPED_TRACE(fmt::format("request {}: {}", i, nlohmann::json(text).dump()));
    EXPECT_TRUE(prefix);
    if (ended) {
      EXPECT_TRUE(cursor.complete());
      EXPECT_TRUE(nlohmann::json::parse(text).is_object());
      ++completed;
    } else {
      EXPECT_EQ(out[i].size(), 48u);  // only max_tokens stops a constrained reply short of its object
    }
  }
  EXPECT_GE(completed, 3);
  EXPECT_GE(unconstrained_invalid, 1);  // the constraint, not the bias, is what keeps replies valid
}

}  // namespace
}  // namespace inferx
