// The request-body JSON parser (server/openai/json_body.h): the same documents as nlohmann's ordered_json
// parser, in the same key order and with the same errors, but linear in the number of keys and bounded in
// depth (a 200k-key object outlasted a 30 s client timeout; a body nested 100k levels crashed the server).
#include "server/openai/json_body.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "server/openai/api_error.h"
#include "server/openai/request.h"

namespace inferx::server {
namespace {

using json = nlohmann::ordered_json;

// A random document of objects (unique keys), arrays, strings with escapes, numbers of every kind.
json random_json(std::mt19937& rng, int depth) {
  const int kind = static_cast<int>(rng() % (depth > 4 ? 6 : 8));
  switch (kind) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return static_cast<int64_t>(rng()) - (int64_t{1} << 31);
    case 3:
      return static_cast<uint64_t>(rng()) << 32;
    case 4:
      return std::ldexp(static_cast<double>(rng()), static_cast<int>(rng() % 80) - 60);
    case 5: {
      std::string s;
      static const char* const kPieces[] = {"a",        "b", "\"",           "\\",  "\n",
                                            "\xc3\xa9", " ", "\xe6\x97\xa5", "\x01"};
      for (int i = static_cast<int>(rng() % 12); i > 0; --i) s += kPieces[rng() % 9];
      return s;
    }
    case 6: {
      json a = json::array();
      for (int i = static_cast<int>(rng() % 5); i > 0; --i) a.push_back(random_json(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int i = static_cast<int>(rng() % 6); i > 0; --i)
        o["k" + std::to_string(rng() % 1000)] = random_json(rng, depth + 1);
      return o;
    }
  }
}

TEST(JsonBody, SameDocumentsAsNlohmann) {
  std::mt19937 rng(7);
  for (int i = 0; i < 500; ++i) {
    const std::string text = random_json(rng, 0).dump(i % 2 == 0 ? -1 : 2);
    const json ours = parse_json_body(text, 64), theirs = json::parse(text);
    ASSERT_EQ(ours, theirs) << text;
    ASSERT_EQ(ours.dump(), theirs.dump()) << text;  // key order as well as values
  }
}

TEST(JsonBody, RepeatedKeysKeepTheFirstPlaceAndTheLastValue) {
  const std::string text = R"({"b": 1, "a": {"x": 1, "y": 2, "x": 3}, "b": [4], "c": null})";
  EXPECT_EQ(parse_json_body(text, 8).dump(), json::parse(text).dump());
  EXPECT_EQ(parse_json_body(text, 8).dump(), R"({"b":[4],"a":{"x":3,"y":2},"c":null})");
}

TEST(JsonBody, ErrorsAreNlohmanns) {
  for (const std::string text :
       {R"({"a": 1e999})", R"({"a": )", "{\"a\": \"\xff\"}", "", "[1] x", "{'a': 1}"}) {
    std::string theirs = "(none)", ours = "(none)";
    try {
      const json j = json::parse(text);
      ADD_FAILURE() << "nlohmann accepted " << j.dump();
    } catch (const nlohmann::json::exception& e) {
      theirs = e.what();
    }
    try {
      const json j = parse_json_body(text, 8);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const nlohmann::json::exception& e) {
      ours = e.what();
    }
    EXPECT_EQ(ours, theirs) << text;
    EXPECT_NE(ours, "(none)") << text;
  }
}

TEST(JsonBody, DepthIsBounded) {
  const auto nested = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_EQ(parse_json_body(nested(8), 8), json::parse(nested(8)));
  EXPECT_THROW(parse_json_body(nested(9), 8), JsonTooDeep);
  EXPECT_THROW(parse_json_body("{\"a\":" + nested(100000) + "}", 128), JsonTooDeep);
  try {
    parse_request_body(R"({"model": "m", "tools": )" + nested(100000) + "}");
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_json");
    EXPECT_NE(std::string(e.what()).find("deeper than 128 levels"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(parse_request_body(R"({"model": "m", "x": )" + nested(kMaxJsonDepth - 1) + "}"));
}

// 300k keys in one object: linear (nlohmann's ordered_json parser searches the keys for every insert: 16k
// keys took 0.23 s in the server on the dev CPU, growing with the square), and every key kept in order.
TEST(JsonBody, ManyKeysParseInLinearTime) {
  std::string text = "{";
  for (int i = 0; i < 300000; ++i) text += (i ? ",\"" : "\"") + std::to_string(i) + "\":" + std::to_string(i);
  text += "}";
  const json j = parse_json_body(text, 8);
  ASSERT_EQ(j.size(), 300000u);
  int i = 0;
  for (auto it = j.begin(); it != j.end(); ++it, ++i) {
    ASSERT_EQ(it.key(), std::to_string(i));
    ASSERT_EQ(it.value(), i);
  }
}

}  // namespace
}  // namespace inferx::server
