// Builtin tests (`x is name`), following jinja2/tests.py and the Python type checks behind them
// (`number` is numbers.Number, so it includes bool; `integer` excludes bool; `sequence` is anything with
// __len__ and __getitem__, strings and dicts included; `iterable` includes jinja2's Undefined).
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/evaluator.h"

namespace inferx::jinja {

namespace {

using TestFn = bool (*)(Evaluator&, const Value&, CallArgs&);

const Value& need(const CallArgs& a, std::string_view test) {
  INFERX_CHECK(!a.args.empty(), "test '{}' needs an argument", test);
  return a.args[0];
}

int cmp(const Value& v, CallArgs& a, std::string_view test) { return compare_values(v, need(a, test)); }

const std::unordered_map<std::string, TestFn>& table() {
  static const std::unordered_map<std::string, TestFn> t = {
      {"defined", [](Evaluator&, const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](Evaluator&, const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](Evaluator&, const Value& v, CallArgs&) { return v.is_none(); }},
      {"boolean", [](Evaluator&, const Value& v, CallArgs&) { return v.kind() == Kind::Bool; }},
      {"true", [](Evaluator&, const Value& v, CallArgs&) { return v.kind() == Kind::Bool && v.as_bool(); }},
      {"false", [](Evaluator&, const Value& v, CallArgs&) { return v.kind() == Kind::Bool && !v.as_bool(); }},
      {"integer", [](Evaluator&, const Value& v, CallArgs&) { return v.kind() == Kind::Int; }},
      {"float", [](Evaluator&, const Value& v, CallArgs&) { return v.kind() == Kind::Float; }},
      {"number", [](Evaluator&, const Value& v, CallArgs&) { return v.is_number(); }},
      {"string", [](Evaluator&, const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](Evaluator&, const Value& v, CallArgs&) { return v.kind() == Kind::Dict; }},
      {"sequence",
       [](Evaluator&, const Value& v, CallArgs&) {
         return v.is_string() || v.is_sequence() || v.kind() == Kind::Dict || v.is_undefined();
       }},
      {"iterable",
       [](Evaluator&, const Value& v, CallArgs&) {
         return v.is_string() || v.is_sequence() || v.kind() == Kind::Dict || v.is_undefined();
       }},
      {"callable", [](Evaluator&, const Value& v, CallArgs&) { return v.kind() == Kind::Callable; }},
      {"odd",
       [](Evaluator&, const Value& v, CallArgs&) {
         INFERX_CHECK(v.is_number() && v.kind() != Kind::Float, "odd: value must be an integer");
         return v.as_int() % 2 != 0;
       }},
      {"even",
       [](Evaluator&, const Value& v, CallArgs&) {
         INFERX_CHECK(v.is_number() && v.kind() != Kind::Float, "even: value must be an integer");
         return v.as_int() % 2 == 0;
       }},
      {"divisibleby",
       [](Evaluator&, const Value& v, CallArgs& a) {
         const Value& n = need(a, "divisibleby");
         INFERX_CHECK(v.is_number() && n.is_number(), "divisibleby: numbers expected");
         if (n.number() == 0) fail("integer division or modulo by zero");
         if (v.kind() == Kind::Float || n.kind() == Kind::Float)
           return std::fmod(v.number(), n.number()) == 0;
         return n.as_int() == -1 || v.as_int() % n.as_int() == 0;
       }},
      {"sameas",
       [](Evaluator&, const Value& v, CallArgs& a) {
         const Value& o = need(a, "sameas");
         if (v.kind() != o.kind()) return false;
         if (v.is_none() || v.kind() == Kind::Bool) return values_equal(v, o);
         if (v.is_mapping()) return &v.dict_data() == &o.dict_data();
         if (v.is_sequence()) return &v.items() == &o.items();
         return false;
       }},
      {"in", [](Evaluator&, const Value& v, CallArgs& a) { return need(a, "in").contains(v); }},
      {"lower",
       [](Evaluator&, const Value& v, CallArgs&) {
         std::string s = v.to_string();
         return py_lower(s) == s && py_upper(s) != s;
       }},
      {"upper",
       [](Evaluator&, const Value& v, CallArgs&) {
         std::string s = v.to_string();
         return py_upper(s) == s && py_lower(s) != s;
       }},
      {"escaped", [](Evaluator&, const Value&, CallArgs&) { return false; }},
      {"filter", [](Evaluator&, const Value& v, CallArgs&) { return v.is_string() && has_filter(v.str()); }},
      {"test", [](Evaluator&, const Value& v, CallArgs&) { return v.is_string() && has_test(v.str()); }},
      {"eq", [](Evaluator&, const Value& v, CallArgs& a) { return values_equal(v, need(a, "eq")); }},
      {"equalto",
       [](Evaluator&, const Value& v, CallArgs& a) { return values_equal(v, need(a, "equalto")); }},
      {"==", [](Evaluator&, const Value& v, CallArgs& a) { return values_equal(v, need(a, "==")); }},
      {"ne", [](Evaluator&, const Value& v, CallArgs& a) { return !values_equal(v, need(a, "ne")); }},
      {"!=", [](Evaluator&, const Value& v, CallArgs& a) { return !values_equal(v, need(a, "!=")); }},
      {"lt", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, "lt") < 0; }},
      {"lessthan", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, "lessthan") < 0; }},
      {"<", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, "<") < 0; }},
      {"le", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, "le") <= 0; }},
      {"<=", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, "<=") <= 0; }},
      {"gt", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, "gt") > 0; }},
      {"greaterthan", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, "greaterthan") > 0; }},
      {">", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, ">") > 0; }},
      {"ge", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, "ge") >= 0; }},
      {">=", [](Evaluator&, const Value& v, CallArgs& a) { return cmp(v, a, ">=") >= 0; }},
  };
  return t;
}

}  // namespace

bool has_test(const std::string& name) { return table().count(name) != 0; }

bool apply_test(Evaluator& ev, const std::string& name, const Value& input, CallArgs& args) {
  auto it = table().find(name);
  if (it == table().end()) fail("No test named '{}'.", name);
  return it->second(ev, input, args);
}

}  // namespace inferx::jinja
