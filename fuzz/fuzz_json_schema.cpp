// libFuzzer target for structured output's schema automaton (text/json_schema_constraint.h). The first byte
// picks one of a few fixed schemas (objects with required and optional members, enums, integers, nested
// arrays through $ref, anyOf with null, an unconstrained member); the rest is a candidate reply. Soundness:
// a reply the automaton accepts whole is JSON (nlohmann parses it, for well-formed UTF-8, no surrogate
// escapes and numbers within double's range) with the schema's members in order, of the right types; and
// an accepted prefix of it is accepted as a prefix. Seeds: fuzz/seeds/json_schema/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_utf8.h"
#include "text/json_schema_constraint.h"

namespace {

using ojson = nlohmann::ordered_json;

void require(bool ok) {
  if (!ok) std::abort();
}

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", 1, null]},
        "c": {"type": ["string", "null"]}}, "required": ["a", "c"]})",
    R"({"$defs": {"N": {"type": "object", "properties": {"v": {"type": "number"}, "k": {"type": "array",
        "items": {"$ref": "#/$defs/N"}}}, "required": ["v"]}}, "$ref": "#/$defs/N"})",
    R"({"type": "object", "properties": {"any": {}, "flag": {"type": "boolean"},
        "o": {"anyOf": [{"type": "object", "properties": {"z": {"const": "q"}}, "required": ["z"]},
                        {"type": "array", "items": {"type": "integer"}}]}}, "required": ["flag"]})",
};

// The instance's shape against schema 0 and 2 (members in schema order, types); schema 1 by recursion.
bool shape_ok(size_t which, const ojson& v) {
  if (which == 1) {
    if (!v.is_object() || !v.contains("v") || !v["v"].is_number()) return false;
    for (const auto& [k, x] : v.items()) {
      if (k == "v") continue;
      if (k != "k" || !x.is_array()) return false;
      for (const auto& c : x)
        if (!shape_ok(1, c)) return false;
    }
    return true;
  }
  if (!v.is_object()) return false;
  const std::vector<std::string> order =
      which == 0 ? std::vector<std::string>{"a", "b", "c"} : std::vector<std::string>{"any", "flag", "o"};
  size_t at = 0;
  for (const auto& [k, x] : v.items()) {
    while (at < order.size() && order[at] != k) ++at;
    if (at == order.size()) return false;  // unknown or out of order
    if (which == 0 && k == "a" && !x.is_number_integer()) return false;
    if (which == 0 && k == "b" && !(x == "x" || x == 1 || x.is_null())) return false;
    if (which == 0 && k == "c" && !(x.is_string() || x.is_null())) return false;
    if (which == 2 && k == "flag" && !x.is_boolean()) return false;
    if (which == 2 && k == "o") {
      const bool obj = x.is_object() && x.size() == 1 && x.contains("z") && x["z"] == "q";
      bool ints = x.is_array();
      if (ints)
        for (const auto& i : x) ints = ints && i.is_number_integer();
      if (!obj && !ints) return false;
    }
  }
  if (which == 0) return v.contains("a") && v.contains("c");
  return v.contains("flag");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<inferx::CompiledSchema> schemas = [] {
    std::vector<inferx::CompiledSchema> s;
    for (const char* text : kSchemas) s.push_back(inferx::CompiledSchema::compile(ojson::parse(text)));
    return s;
  }();
  if (size < 1) return 0;
  const size_t which = data[0] % 3;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (!inferx::schema_accepts(schemas[which], text)) return 0;
  require(inferx::schema_accepts_prefix(schemas[which], text.substr(0, text.size() / 2)));
  if (!fuzz::json_text_is_unicode(text)) return 0;
  try {
    require(shape_ok(which, ojson::parse(text)));
  } catch (const ojson::out_of_range&) {
    // a number past double's range
  } catch (const ojson::exception&) {
    require(false);
  }
  return 0;
}
