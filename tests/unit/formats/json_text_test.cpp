// formats/json_text.h: model JSON files parsed with a nesting bound and errors that name the file.
#include "formats/json_text.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace inferx {
namespace {

std::string error_of(const std::string& text, int max_depth = kMaxModelJsonDepth) {
  try {
    (void)parse_json_text(text, "m/config.json", max_depth);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::string arrays(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

TEST(JsonText, NestingIsBoundedExactly) {
  EXPECT_EQ(error_of(arrays(kMaxModelJsonDepth)), "no error");
  EXPECT_EQ(error_of(arrays(kMaxModelJsonDepth + 1)), "m/config.json: JSON nested deeper than 64 levels");
  EXPECT_EQ(error_of(arrays(1000000)), "m/config.json: JSON nested deeper than 64 levels");
  // Objects count as arrays do, and nesting after shallow siblings is still found.
  std::string objects = "1";
  for (int i = 0; i < 5; ++i) objects = R"({"a": 0, "b": )" + objects + "}";
  EXPECT_EQ(error_of(objects, 5), "no error");
  EXPECT_EQ(error_of(R"({"x": 1, "y": )" + objects + "}", 5),
            "m/config.json: JSON nested deeper than 5 levels");
}

TEST(JsonText, SyntaxErrorsNameTheFile) {
  EXPECT_EQ(error_of("{\"a\": ").rfind("m/config.json: not valid JSON: ", 0), 0u) << error_of("{\"a\": ");
  EXPECT_EQ(error_of("").rfind("m/config.json: not valid JSON: ", 0), 0u);
  EXPECT_EQ(error_of(R"({"a": 1e999})").rfind("m/config.json: not valid JSON: ", 0), 0u);  // out of range
  EXPECT_EQ(error_of("{\"\xff\": 1}").rfind("m/config.json: not valid JSON: ", 0), 0u);    // bad UTF-8
}

TEST(JsonText, ValuesAndKeyOrderAreKept) {
  const auto j = parse_json_text(R"({"b": [1, 2.5, "x", null, true], "a": {"c": {}}})", "t");
  EXPECT_EQ(j.dump(), R"({"a":{"c":{}},"b":[1,2.5,"x",null,true]})");
  const auto o = parse_ordered_json_text(R"({"z": 1, "a": 2, "m": 3})", "t");
  EXPECT_EQ(o.dump(), R"({"z":1,"a":2,"m":3})");
}

TEST(JsonText, IntegerFieldsAreCheckedNotCast) {
  using nlohmann::json;
  const auto error = [](const json& v, int64_t lo, int64_t hi) -> std::string {
    try {
      return std::to_string(json_integer(v, "f", "c.json", lo, hi));
    } catch (const Error& e) {
      return e.what();
    }
  };
  EXPECT_EQ(error(json(7), 0, 10), "7");
  EXPECT_EQ(error(json(-7), -10, 10), "-7");
  EXPECT_EQ(error(json(uint64_t{9223372036854775807u}), 0, INT64_MAX), "9223372036854775807");
  EXPECT_EQ(error(json(11), 0, 10), "c.json: f must be an integer in [0, 10], got 11");
  EXPECT_EQ(error(json(-1), 0, 10), "c.json: f must be an integer in [0, 10], got -1");
  EXPECT_EQ(error(json(uint64_t{18446744073709551615u}), 0, INT64_MAX),
            "c.json: f must be an integer in [0, 9223372036854775807], got 18446744073709551615");
  EXPECT_EQ(error(json(uint64_t{5}), -10, -1), "c.json: f must be an integer in [-10, -1], got 5");
  EXPECT_EQ(error(json(9.6e115), 0, 10), "c.json: f must be an integer in [0, 10], got 9.6e+115");
  EXPECT_EQ(error(json(2.0), 0, 10), "c.json: f must be an integer in [0, 10], got 2.0");
  EXPECT_EQ(error(json("3"), 0, 10), "c.json: f must be an integer in [0, 10], got \"3\"");
  EXPECT_EQ(error(json(std::string(100, 'x')), 0, 10),
            "c.json: f must be an integer in [0, 10], got \"" + std::string(36, 'x') + "...");
  EXPECT_EQ(error(json(nullptr), 0, 10), "c.json: f must be an integer in [0, 10], got null");
  const nlohmann::ordered_json o = 3;
  EXPECT_EQ(json_integer(o, "f", "c.json", 0, 10), 3);
}

}  // namespace
}  // namespace inferx
