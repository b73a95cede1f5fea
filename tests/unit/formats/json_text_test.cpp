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

}  // namespace
}  // namespace inferx
