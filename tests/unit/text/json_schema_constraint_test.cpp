// Structured output with a schema (text/json_schema_constraint.h): what compiles and what is refused, the
// automaton against instances written by hand and generated at random, and random constrained walks whose
// finished values must validate with an independent validator written here.
#include "text/json_schema_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

namespace inferx {
namespace {

using ojson = nlohmann::ordered_json;

// A Pydantic-style schema: nested model through $defs, Optional (anyOf with null), enum, integer, list.
const ojson kPerson = ojson::parse(R"({
  "$defs": {
    "Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "age": {"type": "integer"}},
            "required": ["kind", "age"], "additionalProperties": false, "title": "Pet"}
  },
  "type": "object",
  "title": "Person",
  "properties": {
    "name": {"type": "string", "description": "full name"},
    "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
    "height": {"type": "number"},
    "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}},
    "admin": {"type": "boolean"},
    "extra": {}
  },
  "required": ["name", "height", "pets", "admin"],
  "additionalProperties": false
})");

// An independent validator for the subset (keys in any order here: order is the generator's business).
bool validates(const ojson& schema, const ojson& v, const ojson& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string r = schema["$ref"];
    const std::string name = r.substr(r.rfind('/') + 1);
    return validates(root[r.find("$defs") != std::string::npos ? "$defs" : "definitions"][name], v, root);
  }
  if (schema.contains("enum")) {
    for (const auto& e : schema["enum"])
      if (e == v) return true;
    return false;
  }
  if (schema.contains("const")) return schema["const"] == v;
  for (const char* k : {"anyOf", "oneOf"})
    if (schema.contains(k)) {
      for (const auto& o : schema[k])
        if (validates(o, v, root)) return true;
      return false;
    }
  if (!schema.contains("type")) return true;
  const ojson types = schema["type"].is_array() ? schema["type"] : ojson::array({schema["type"]});
  for (const auto& t : types) {
    const std::string type = t;
    if (type == "string" && v.is_string()) return true;
    if (type == "integer" && v.is_number_integer()) return true;
    if (type == "number" && v.is_number()) return true;
    if (type == "boolean" && v.is_boolean()) return true;
    if (type == "null" && v.is_null()) return true;
    if (type == "array" && v.is_array()) {
      bool ok = true;
      if (schema.contains("items"))
        for (const auto& x : v) ok = ok && validates(schema["items"], x, root);
      if (ok) return true;
    }
    if (type == "object" && v.is_object()) {
      if (!schema.contains("properties")) return true;
      bool ok = true;
      for (const auto& [k, x] : v.items())
        ok = ok && schema["properties"].contains(k) && validates(schema["properties"][k], x, root);
      if (schema.contains("required"))
        for (const auto& r : schema["required"]) ok = ok && v.contains(r.get<std::string>());
      if (ok) return true;
    }
  }
  return false;
}

TEST(JsonSchema, RefusesWhatItCannotEnforce) {
  for (const char* bad :
       {R"({"type": "string", "pattern": "^a"})", R"({"type": "string", "format": "date"})",
        R"({"type": "integer", "minimum": 0})", R"({"type": "array", "minItems": 1})",
        R"({"$ref": "#/$defs/Missing"})", R"({"type": "object", "properties": {"a": {}},
                              "required": ["b"]})",
        R"({"type": "thing"})", R"({"not": {}})", R"(false)", R"({"$ref": "#/x", "type": "string"})",
        R"({"properties": {"a": {}}})", R"(3)", R"({"$ref": "#"})",
        R"({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}, "$ref": "#/$defs/A"})"}) {
    EXPECT_THROW(CompiledSchema::compile(ojson::parse(bad)), SchemaError) << bad;
  }
  EXPECT_NO_THROW(CompiledSchema::compile(kPerson));
  EXPECT_NO_THROW(CompiledSchema::compile(ojson::parse("{}")));
  EXPECT_NO_THROW(CompiledSchema::compile(ojson::parse("true")));
}

TEST(JsonSchema, AcceptsInstancesAndRejectsTheRest) {
  const CompiledSchema s = CompiledSchema::compile(kPerson);
  const char* good[] = {
      R"({"name": "Ada", "height": 1.65, "pets": [], "admin": false})",
      R"({"name":"Ada","nick":null,"height":-2e3,"pets":[{"kind":"cat","age":3},{"kind":"dog","age":0}],"admin":true,"extra":[1,{"x":"y"}]})",
      "{\n  \"name\": \"A\\u00e9\\\"\",\n  \"nick\": \"a\",\n  \"height\": 0,\n  \"pets\": [],\n  \"admin\": "
      "true\n}",
      R"({"name": "x", "height": 1, "pets": [], "admin": true, "extra": 7})",
  };
  for (const char* g : good) {
    EXPECT_TRUE(validates(kPerson, ojson::parse(g), kPerson)) << g;  // the cases are right
    EXPECT_TRUE(schema_accepts(s, g)) << g;
  }
  const char* bad[] = {
      R"({"name": "Ada", "height": 1.65, "pets": []})",                    // admin missing
      R"({"name": "Ada", "height": "tall", "pets": [], "admin": false})",  // wrong type
      R"({"name": "Ada", "height": 1, "pets": [{"kind": "cow", "age": 1}], "admin": false})",  // not in enum
      R"({"name": "Ada", "height": 1, "pets": [{"kind": "cat", "age": 1.5}], "admin": false})",  // not
                                                                                                 // integer
      R"({"name": "Ada", "height": 1, "pets": [], "admin": false, "boss": 1})",  // no such property
      R"({"height": 1, "name": "Ada", "pets": [], "admin": false})",             // out of schema order
      R"({"name": "Ada", "height": 1, "pets": [], "admin": false} )",            // after the value
      R"(["name"])",
  };
  for (const char* b : bad) EXPECT_FALSE(schema_accepts(s, b)) << b;
  EXPECT_TRUE(schema_accepts_prefix(s, R"({"name": "Ada", "hei)"));
  EXPECT_FALSE(schema_accepts_prefix(s, R"({"name": "Ada", "boss)"));
  // Top-level scalars, and a recursive schema.
  EXPECT_TRUE(schema_accepts(CompiledSchema::compile(ojson::parse(R"({"type": "integer"})")), "-12"));
  EXPECT_FALSE(schema_accepts(CompiledSchema::compile(ojson::parse(R"({"type": "integer"})")), "1.5"));
  const ojson tree =
      ojson::parse(R"({"$defs": {"N": {"type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/N"}}}, "required": ["v", "kids"]}}, "$ref": "#/$defs/N"})");
  EXPECT_TRUE(schema_accepts(CompiledSchema::compile(tree), R"({"v": 1, "kids": [{"v": 2, "kids": []}]})"));
  EXPECT_FALSE(schema_accepts(CompiledSchema::compile(tree), R"({"v": 1, "kids": [{"v": 2}]})"));
}

// A value between fixed texts (a forced tool call's markers).
TEST(JsonSchema, WrappedBetweenFixedTexts) {
  const ojson call = ojson::parse(R"({"type": "object", "properties": {"name": {"const": "f"},
      "arguments": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
      "required": ["name", "arguments"]})");
  const CompiledSchema s =
      CompiledSchema::wrap(CompiledSchema::compile(call), "<tool_call>\n", "\n</tool_call>");
  EXPECT_TRUE(schema_accepts(s, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 12}}\n</tool_call>"));
  EXPECT_FALSE(schema_accepts(s, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 12}}"));
  EXPECT_FALSE(schema_accepts(s, "{\"name\": \"f\", \"arguments\": {\"n\": 12}}\n</tool_call>"));
  EXPECT_FALSE(schema_accepts(s, "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"n\": 1}}\n</tool_call>"));
  // A top-level number ends at the suffix's first byte.
  const CompiledSchema n =
      CompiledSchema::wrap(CompiledSchema::compile(ojson::parse(R"({"type": "number"})")), "<", ">");
  EXPECT_TRUE(schema_accepts(n, "<-1.5e3>"));
  EXPECT_FALSE(schema_accepts(n, "<-1.5e>"));
}

// Random instances of the schema, written in its property order (compact and indented): all accepted.
TEST(JsonSchema, AcceptsRandomInstances) {
  const CompiledSchema s = CompiledSchema::compile(kPerson);
  std::mt19937 rng(5);
  auto str = [&] {
    return std::string(rng() % 6, static_cast<char>('a' + rng() % 26)) + (rng() % 4 ? "" : "\"\n");
  };
  for (int i = 0; i < 200; ++i) {
    ojson v = ojson::object();
    v["name"] = str();
    if (rng() % 2) v["nick"] = rng() % 2 ? ojson(str()) : ojson(nullptr);
    v["height"] = rng() % 2 ? ojson(static_cast<int>(rng() % 300)) : ojson(std::ldexp(rng() % 1000, -3));
    v["pets"] = ojson::array();
    for (unsigned k = rng() % 3; k > 0; --k)
      v["pets"].push_back({{"kind", rng() % 2 ? "cat" : "dog"}, {"age", static_cast<int>(rng() % 20)}});
    v["admin"] = rng() % 2 == 0;
    if (rng() % 2) v["extra"] = ojson::parse(R"({"a": [1, 2.5, "x", null]})");
    ASSERT_TRUE(validates(kPerson, v, kPerson));
    for (int indent : {-1, 2}) EXPECT_TRUE(schema_accepts(s, v.dump(indent))) << v.dump(indent);
  }
}

// Random walks through the constraint over a byte-complete vocabulary: never a dead end, and every
// finished text passes `check`.
int constrained_walks(std::shared_ptr<const CompiledSchema> schema,
                      const std::function<void(const std::string&)>& check) {
  std::vector<std::string> vocab = {"{\"",          "\":",     "\", \"", "true",        "false",
                                    "null",         "\"cat\"", "[]",     "[{",          "}]",
                                    "\"name\": \"", "\": ",    ", \"",   "<tool_call>", "</tool_call>"};
  for (char c = 0x20; c < 0x7f; ++c) vocab.emplace_back(1, c);
  vocab.emplace_back("\n  ");
  vocab.emplace_back("\n");
  vocab.emplace_back("");  // the end token
  const auto end = static_cast<int32_t>(vocab.size() - 1);
  auto proto = make_json_schema_constraint(std::make_shared<TokenTrie>(vocab), schema);
  std::mt19937 rng(11);
  int finished = 0;
  for (int run = 0; run < 300; ++run) {
    auto c = proto->start({end});
    std::string text;
    for (int step = 0; step < 400; ++step) {
      std::vector<float> row(vocab.size(), 0.0f);
      c->mask(row.data(), static_cast<int64_t>(row.size()));
      std::vector<int32_t> allowed, closing;
      for (int32_t t = 0; t <= end; ++t) {
        if (!std::isfinite(row[static_cast<size_t>(t)])) continue;
        allowed.push_back(t);
        const std::string& b = vocab[static_cast<size_t>(t)];
        if (t == end || b == "\"" || b == "}" || b == "]" || b == "}]" || b == "," || b == ":" || b == "0" ||
            b == "true" || b == "null" || b == "\"cat\"" || b == "[]" || b == "\": " || b == ", \"" ||
            b == "\n")
          closing.push_back(t);
      }
      if (allowed.empty()) {
        ADD_FAILURE() << "dead end after " << text;
        return finished;
      }
      const int32_t pick = !closing.empty() && rng() % 10 < 8 ? closing[rng() % closing.size()]
                                                              : allowed[rng() % allowed.size()];
      c->accept(pick);
      if (pick == end) {
        check(text);
        EXPECT_TRUE(schema_accepts(*schema, text)) << text;
        ++finished;
        break;
      }
      text += vocab[static_cast<size_t>(pick)];
      if (!schema_accepts_prefix(*schema, text)) {
        ADD_FAILURE() << "not a prefix: " << text;
        return finished;
      }
    }
  }
  return finished;
}

// The value in `text` as nlohmann reads it; null for a number past double's range (JSON, but not one
// nlohmann can hold).
ojson parsed(const std::string& text) {
  try {
    return ojson::parse(text);
  } catch (const ojson::out_of_range&) {
    return nullptr;
  }
}

TEST(JsonSchema, ConstrainedWalksFinishAsValidInstances) {
  auto schema = std::make_shared<CompiledSchema>(CompiledSchema::compile(kPerson));
  auto check = [](const std::string& text) {
    const ojson v = parsed(text);
    EXPECT_TRUE(v.is_null() || validates(kPerson, v, kPerson)) << text;
  };
  EXPECT_GT(constrained_walks(schema, check), 30);
}

// A forced tool call's shape: markers around {"name": ..., "arguments": ...}; the closing marker begins with
// a newline, which the walk must be able to write after the object (not take as whitespace and stall).
TEST(JsonSchema, ConstrainedWalksOfAWrappedCall) {
  const ojson call = ojson::parse(R"({"anyOf": [
      {"type": "object", "properties": {"name": {"const": "f"}, "arguments": {"type": "object",
       "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}}, "required": ["unit", "days"]}},
       "required": ["name", "arguments"]},
      {"type": "object", "properties": {"name": {"const": "now"}, "arguments": {}}, "required": ["name", "arguments"]}]})");
  auto schema = std::make_shared<CompiledSchema>(
      CompiledSchema::wrap(CompiledSchema::compile(call), "<tool_call>\n", "\n</tool_call>"));
  auto check = [&](const std::string& text) {
    const std::string open = "<tool_call>\n", close = "\n</tool_call>";
    const size_t at = text.find(open);
    ASSERT_NE(at, std::string::npos) << text;
    EXPECT_EQ(text.find_first_not_of(" \n\t"), at) << text;  // only whitespace before the marker
    ASSERT_TRUE(text.size() >= at + open.size() + close.size() &&
                text.compare(text.size() - close.size(), close.size(), close) == 0)
        << text;
    const ojson v = parsed(text.substr(at + open.size(), text.size() - at - open.size() - close.size()));
    EXPECT_TRUE(v.is_null() || validates(call, v, call)) << text;
  };
  EXPECT_GT(constrained_walks(schema, check), 30);
}

}  // namespace
}  // namespace inferx
