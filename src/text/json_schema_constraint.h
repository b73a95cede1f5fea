#pragma once
// Structured output with a schema (OpenAI `response_format: {"type": "json_schema", "json_schema": {"schema":
// ...}}`): a TokenConstraint that lets a sequence generate only JSON that validates against the schema, and
// end only once that value is complete. The vocabulary walk is JSON mode's (text/json_constraint.h: the
// byte trie, masks cached per state); the automaton follows the compiled schema instead of plain JSON.
//
// The schema subset (what OpenAI's strict mode and Pydantic models produce): "type" (one name or a list:
// object, array, string, number, integer, boolean, null), "properties" + "required" (members are written in
// the schema's property order; optional ones may be left out; no others), "additionalProperties" false or
// absent, "items", "enum", "const", "anyOf" / "oneOf" (oneOf as anyOf), "$ref" to "#/$defs/..." or
// "#/definitions/..." (recursion included), an empty schema (any JSON value), and the annotations
// "title", "description", "default", "examples", "$schema", "$id", "$comment", "strict". Any other keyword
// (pattern, format, minLength, minimum, minItems, ...) throws SchemaError naming it: a schema is enforced
// whole or refused, never half-enforced.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "inferx/engine.h"
#include "text/json_constraint.h"

namespace inferx {

class SchemaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SchemaNode {
  enum Kind : uint8_t { Any, AnyObject, Object, Array, String, Number, Integer, Literals, AnyOf, Sequence };
  Kind kind = Any;
  std::vector<std::string> keys;      // Object: each property's key as JSON text ("\"name\""), schema order
  std::vector<int32_t> values;        // Object: each property's node
  std::vector<uint8_t> required;      // Object: 1 if the property must be written
  int32_t items = -1;                 // Array: the items' node (-1: any value)
  std::vector<std::string> literals;  // Literals: the JSON texts allowed (enum, const, true/false, null)
  std::vector<int32_t> options;       // AnyOf; Sequence: values written one after the other
};

// A schema as a graph of nodes ($ref makes it cyclic). Throws SchemaError for what it cannot enforce.
struct CompiledSchema {
  std::vector<SchemaNode> nodes;
  int32_t root = 0;
  static CompiledSchema compile(const nlohmann::ordered_json& schema);
  // The same value written between two fixed texts (a tool call's markers: "<tool_call>\n" ...
  // "\n</tool_call>").
  static CompiledSchema wrap(CompiledSchema inner, const std::string& prefix, const std::string& suffix);
};

// Whether `text` is a complete value of the schema (tests and the fuzzer: the automaton alone, no trie).
bool schema_accepts(const CompiledSchema& schema, const std::string& text);
// Whether `text` can still be continued into a value of the schema.
bool schema_accepts_prefix(const CompiledSchema& schema, const std::string& text);

// The request's prototype; start() gives each sequence its own state.
std::shared_ptr<const TokenConstraint> make_json_schema_constraint(
    std::shared_ptr<const TokenTrie> trie, std::shared_ptr<const CompiledSchema> schema);

}  // namespace inferx
