// Stop strings: the checker alone over hand-made splits, then through the engine with a real tokenizer
// (stories260K) where the stop string spans token boundaries of real greedy output.
#include "engine/stop_checker.h"

#include <gtest/gtest.h>

#include <memory>

#include "backend/backend.h"
#include "formats/gguf.h"
#include "inferx/engine.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace inferx {
namespace {

// Feeds `pieces` one by one; returns what was streamed and whether a stop matched.
std::pair<std::string, bool> feed(StopChecker& c, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += c.push(p);
  return {out, c.matched()};
}

TEST(StopChecker, MatchesAcrossPiecesAndNeverStreamsTheStop) {
  StopChecker c({"END"});
  EXPECT_EQ(c.push("hello E"), "hello ");  // "E" could start END: held
  EXPECT_EQ(c.push("N"), "");
  EXPECT_EQ(c.push("D and more"), "");
  EXPECT_TRUE(c.matched());
  EXPECT_EQ(c.matched_stop(), "END");
  EXPECT_EQ(c.push("later"), "");
  EXPECT_EQ(c.flush(), "");
}

TEST(StopChecker, ReleasesHeldTextWhenItCannotMatch) {
  StopChecker c({"END"});
  EXPECT_EQ(c.push("EN"), "");
  EXPECT_EQ(c.push("x"), "ENx");
  EXPECT_EQ(c.push("E"), "");
  EXPECT_EQ(c.flush(), "E");
  EXPECT_FALSE(c.matched());
}

TEST(StopChecker, EarliestStopWinsAndOverlapsAreFound) {
  StopChecker c({"bc", "abcd", "x"});
  auto [out, matched] = feed(c, {"zza", "b", "cd"});
  EXPECT_TRUE(matched);
  EXPECT_EQ(out, "zz");  // "cd" completes both; "abcd" starts first, so no stop text is streamed
  EXPECT_EQ(c.matched_stop(), "abcd");
  StopChecker e({"bc", "abcd"});
  auto [out3, m3] = feed(e, {"zza", "bc", "d"});
  EXPECT_TRUE(m3);
  EXPECT_EQ(out3, "zza");  // "bc" completes a token before "abcd" could
  EXPECT_EQ(e.matched_stop(), "bc");
  StopChecker d({"aab"});
  auto [out2, m2] = feed(d, {"a", "a", "a", "b", "!"});
  EXPECT_TRUE(m2);
  EXPECT_EQ(out2, "a");  // "aaab": the match starts at the second a
}

TEST(StopChecker, NoStopsPassesThroughAndEmptyStopsAreIgnored) {
  StopChecker c({""});
  EXPECT_EQ(c.push("abc"), "abc");
  EXPECT_FALSE(c.matched());
  StopChecker u({"é!"});
  EXPECT_EQ(u.push("caf\xC3\xA9"), "caf");  // the held tail is a whole character
  EXPECT_EQ(u.push("!"), "");
  EXPECT_TRUE(u.matched());
}

class StopStringsEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = std::string(INFERX_TESTDATA_DIR) + "/stories260K.gguf";
    gguf_ = std::make_unique<GgufFile>(path);
    tok_ = load_gguf_tokenizer(*gguf_);
    backend_ = make_cpu_backend({2});
    model_ = Model::load(path, *backend_);
  }
  // Runs one greedy request; returns (streamed text, final delta).
  std::pair<std::string, SequenceDelta> run(const std::vector<std::string>& stop, int32_t max_tokens) {
    EngineConfig cfg;
    cfg.max_model_len = 256;
    cfg.max_num_batched_tokens = 8;  // chunked prompt too
    Engine engine(*model_, tok_.get(), cfg);
    std::string text;
    SequenceDelta last;
    EngineRequest r;
    r.id = "s";
    r.prompt = tok_->encode("Once upon a time", true);
    r.params.temperature = 0.0f;
    r.params.max_tokens = max_tokens;
    r.params.stop = stop;
    r.on_output = [&](RequestOutput&& o) {
      for (auto& d : o.deltas) {
        text += d.text;
        if (d.finish_reason != FinishReason::None) last = d;
      }
    };
    engine.submit(std::move(r));
    engine.run_until_idle();
    return {text, last};
  }
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(StopStringsEngine, StopStringAcrossTokenBoundaries) {
  const auto [full, full_last] = run({}, 60);
  ASSERT_GT(full.size(), 40u) << full;
  // A stop string made of the end of one token's text and the start of later ones: pick a 5-byte span in
  // the middle of the text (token pieces of this tiny vocabulary are short, so it crosses boundaries).
  const std::string stop = full.substr(20, 5);
  const size_t first = full.find(stop);
  const auto [text, last] = run({stop, "never-appears"}, 60);
  EXPECT_EQ(text, full.substr(0, first));
  EXPECT_EQ(last.finish_reason, FinishReason::Stop);
  EXPECT_EQ(last.stop_reason, stop);
  EXPECT_EQ(text.find(stop), std::string::npos);
  // Without a match the held-back text is released at the end: nothing lost.
  const auto [same, same_last] = run({"never-appears"}, 60);
  EXPECT_EQ(same, full);
  EXPECT_EQ(same_last.finish_reason, full_last.finish_reason);
}

}  // namespace
}  // namespace inferx
