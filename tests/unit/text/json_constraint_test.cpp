// JSON mode (text/json_constraint.h): the byte automaton against nlohmann's parser, the trie walk against
// stepping every token by hand, and random constrained generations that must end as JSON objects.
#include "text/json_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

namespace inferx {
namespace {

using nlohmann::json;

bool accepts(const std::string& text, JsonCursor* out = nullptr) {
  JsonCursor c;
  for (unsigned char b : text)
    if (!c.step(b)) return false;
  if (out) *out = c;
  return true;
}

bool complete(const std::string& text) {
  JsonCursor c;
  return accepts(text, &c) && c.complete();
}

TEST(JsonCursor, ValidObjectsAndEveryPrefix) {
  const std::vector<std::string> valid = {
      "{}",
      R"({"a": 1})",
      R"({"a":-0.5e+10,"b":[true,false,null,[],{}],"c":"x\"\\\/\b\f\n\r\t\u00e9"})",
      "{\n  \"k\": [\n    1,\n    2\n  ]\n}",
      R"({"nested": {"deep": [[[{"x": 0}]]]}, "n": -12.25E-3, "s": "caf\u00C9 ☕"})",
      R"( {"leading": "space"})",
  };
  for (const std::string& v : valid) {
    EXPECT_TRUE(json::accept(v)) << v;  // the cases are JSON
    EXPECT_TRUE(complete(v)) << v;
    for (size_t n = 0; n < v.size(); ++n) {
      JsonCursor c;
      EXPECT_TRUE(accepts(v.substr(0, n), &c)) << v.substr(0, n);
      EXPECT_FALSE(c.complete()) << v.substr(0, n);
    }
  }
}

TEST(JsonCursor, RejectsWhatIsNotAJsonObject) {
  for (const char* bad : {"[]",
                          "1",
                          "\"s\"",
                          "true",
                          "{,}",
                          R"({"a" 1})",
                          R"({"a": 01})",
                          R"({"a": 1.})",
                          R"({"a": .5})",
                          R"({"a": +1})",
                          R"({"a": tru})",
                          R"({"a": "\x"})",
                          R"({"a": "\u12G4"})",
                          "{\"a\": \"tab\there\"}",
                          R"({"a": 1,})",
                          R"({"a": [1,]})",
                          R"({"a": 1}})",
                          R"({"a": 1} x)",
                          R"({'a': 1})",
                          R"({"a": 1] )",
                          R"({"a": [1}})",
                          "{}\n",
                          "{  }",
                          "{\n\n}"}) {
    EXPECT_FALSE(complete(bad)) << bad;
  }
}

TEST(JsonCursor, DepthAndWhitespaceAreBounded) {
  std::string deep = "{\"a\":";
  for (int i = 1; i < kMaxJsonDepth; ++i) deep += "[";
  EXPECT_TRUE(accepts(deep));
  EXPECT_FALSE(accepts(deep + "["));
  EXPECT_TRUE(accepts("{\n" + std::string(kMaxIndent, ' ')));
  EXPECT_FALSE(accepts("{\n" + std::string(kMaxIndent + 1, ' ')));
  EXPECT_FALSE(accepts("{  "));
  EXPECT_FALSE(accepts("{\n\n"));
}

// nlohmann's own dumps, compact and indented, of random documents: every one is accepted whole.
TEST(JsonCursor, AcceptsRandomDocuments) {
  std::mt19937 rng(7);
  std::function<json(int)> value = [&](int depth) -> json {
    switch (rng() % (depth > 4 ? 4 : 6)) {
      case 0:
        return static_cast<int>(rng() % 2000) - 1000;
      case 1:
        return std::ldexp(static_cast<double>(rng() % 100000) - 50000, static_cast<int>(rng() % 40) - 20);
      case 2:
        return std::string(1 + rng() % 5, static_cast<char>('a' + rng() % 26)) + "\"\\\n\t/é";
      case 3:
        return rng() % 3 == 0 ? json(nullptr) : json(rng() % 2 == 0);
      case 4: {
        json a = json::array();
        for (unsigned i = rng() % 4; i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (unsigned i = rng() % 4; i > 0; --i)
          o[std::string(1, static_cast<char>('k' + i))] = value(depth + 1);
        return o;
      }
    }
  };
  for (int i = 0; i < 300; ++i) {
    json doc = json::object();
    doc["v"] = value(1);
    for (int indent : {-1, 2}) {
      const std::string text = doc.dump(indent);
      EXPECT_TRUE(complete(text)) << text;
    }
  }
}

// A small vocabulary with multi-byte and structural pieces, then every printable ASCII byte and newline
// (as real vocabularies have every byte, so no valid prefix is a dead end); the last id is the end token.
std::vector<std::string> test_vocab() {
  std::vector<std::string> v = {"{", "}", "\"",     "\"a",  "b",  ":", ",",  " ",   "1", "-",   "true",
                                "[", "]", "\"k\":", "\n  ", "\\", "n", "},", "\"}", "x", "0.5", "e"};
  for (char c = 0x20; c < 0x7f; ++c) v.emplace_back(1, c);
  v.emplace_back("\n");
  v.emplace_back("");
  return v;
}

std::vector<float> masked(TokenConstraint& c, int64_t vocab) {
  std::vector<float> row(static_cast<size_t>(vocab), 0.0f);
  c.mask(row.data(), vocab);
  return row;
}

TEST(JsonConstraint, MaskIsExactlyTheTokensThatContinueTheText) {
  const std::vector<std::string> vocab = test_vocab();
  const auto V = static_cast<int64_t>(vocab.size());
  const int32_t end = static_cast<int32_t>(V - 1);
  auto trie = std::make_shared<TokenTrie>(vocab);
  EXPECT_EQ(trie->bytes(3), "\"a");
  auto proto = make_json_object_constraint(trie);
  std::mt19937 rng(3);
  int completed = 0;
  for (int run = 0; run < 200; ++run) {
    auto c = proto->start({end});
    std::string text;
    for (int step = 0; step < 60; ++step) {
      const std::vector<float> row = masked(*c, V);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < V; ++t) {
        // Brute force: the token's bytes continue the text; the end token only once it is complete.
        const bool want =
            t == end ? complete(text) : accepts(text + vocab[static_cast<size_t>(t)]) && !complete(text);
        EXPECT_EQ(std::isfinite(row[static_cast<size_t>(t)]), want) << "text " << text << " token " << t;
        if (want) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << "dead end after: " << json(text).dump();
      // Half the time a closing token where one is allowed, so that many walks complete their object.
      std::vector<int32_t> closing;
      for (int32_t t : allowed) {
        const std::string& b = vocab[static_cast<size_t>(t)];
        if (t == end || b == "}" || b == "\"" || b == "]" || b == "\"}") closing.push_back(t);
      }
      const int32_t pick =
          !closing.empty() && rng() % 2 ? closing[rng() % closing.size()] : allowed[rng() % allowed.size()];
      c->accept(pick);
      if (pick == end) {
        EXPECT_TRUE(json::parse(text).is_object()) << text;
        ++completed;
        break;
      }
      text += vocab[static_cast<size_t>(pick)];
    }
  }
  EXPECT_GT(completed, 50);
}

TEST(JsonConstraint, RowsPastTheVocabularyAndStrayTokens) {
  auto trie = std::make_shared<TokenTrie>(test_vocab());
  const int64_t V = trie->vocab_size() + 5;  // the model's rows past the tokenizer's (padding)
  auto c = make_json_object_constraint(trie)->start({static_cast<int32_t>(V - 1)});
  std::vector<float> row = masked(*c, V);
  EXPECT_TRUE(std::isfinite(row[0]));   // "{"
  EXPECT_FALSE(std::isfinite(row[1]));  // "}"
  for (int64_t t = trie->vocab_size(); t < V; ++t) EXPECT_FALSE(std::isfinite(row[static_cast<size_t>(t)]));
  c->accept(0);  // "{"
  c->accept(1);  // "}": complete, so only the end token (past the vocabulary here) may follow
  row = masked(*c, V);
  for (int64_t t = 0; t < V - 1; ++t) EXPECT_FALSE(std::isfinite(row[static_cast<size_t>(t)])) << t;
  EXPECT_TRUE(std::isfinite(row[static_cast<size_t>(V - 1)]));
  // A token the mask would not allow (forced past the sampler) leaves only the end token.
  auto d = make_json_object_constraint(trie)->start({static_cast<int32_t>(V - 1)});
  d->accept(1);  // "}" first
  row = masked(*d, V);
  for (int64_t t = 0; t < V - 1; ++t) EXPECT_FALSE(std::isfinite(row[static_cast<size_t>(t)])) << t;
}

// Sequences of one prototype share its masks (the engine samples rows on several threads at once): walks
// on four threads at the same time all end as JSON objects, whatever the other threads put in the cache.
TEST(JsonConstraint, SequencesShareMasksAcrossThreads) {
  const std::vector<std::string> vocab = test_vocab();
  const auto V = static_cast<int64_t>(vocab.size());
  const int32_t end = static_cast<int32_t>(V - 1);
  auto proto = make_json_object_constraint(std::make_shared<TokenTrie>(vocab));
  std::vector<int> completed(4, 0), invalid(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      std::mt19937 rng(100 + w);
      for (int run = 0; run < 60; ++run) {
        auto c = proto->start({end});
        std::string text;
        for (int step = 0; step < 80; ++step) {
          const std::vector<float> row = masked(*c, V);
          std::vector<int32_t> allowed, closing;
          for (int32_t t = 0; t < V; ++t) {
            if (!std::isfinite(row[static_cast<size_t>(t)])) continue;
            allowed.push_back(t);
            const std::string& b = vocab[static_cast<size_t>(t)];
            if (t == end || b == "}" || b == "\"" || b == "]") closing.push_back(t);
          }
          if (allowed.empty()) break;
          const int32_t pick = !closing.empty() && rng() % 2 ? closing[rng() % closing.size()]
                                                             : allowed[rng() % allowed.size()];
          c->accept(pick);
          if (pick == end) {
            if (json::accept(text) && json::parse(text).is_object())
              ++completed[static_cast<size_t>(w)];
            else
              ++invalid[static_cast<size_t>(w)];
            break;
          }
          text += vocab[static_cast<size_t>(pick)];
          if (!accepts(text)) {
            ++invalid[static_cast<size_t>(w)];
            break;
          }
        }
      }
    });
  for (auto& t : threads) t.join();
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(invalid[static_cast<size_t>(w)], 0) << w;
    EXPECT_GT(completed[static_cast<size_t>(w)], 10) << w;
  }
}

}  // namespace
}  // namespace inferx
