#pragma once
// Internal: the builtin library of the engine (filters, tests, global functions, Python methods of
// str/dict/list), each in its own file.
#include <cstdint>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace inferx::jinja {

class Evaluator;

// obj.name for Python methods (str.strip, dict.items, list.index, ...): a callable bound to `self`, or
// Undefined when the type has no such (safe) method. Mutating methods (list.append, dict.update, ...)
// raise, as jinja2's ImmutableSandboxedEnvironment (which transformers uses) does.
Value bound_method(const Value& self, const std::string& name);

bool has_filter(const std::string& name);
Value apply_filter(Evaluator& ev, const std::string& name, const Value& input, CallArgs& args);

bool has_test(const std::string& name);
bool apply_test(Evaluator& ev, const std::string& name, const Value& input, CallArgs& args);

// range, namespace, dict, raise_exception, strftime_now, joiner, cycler.
std::vector<std::pair<std::string, Value>> global_functions(Evaluator& ev);

// Python's printf-style `fmt % args` (Library Reference, "printf-style String Formatting").
std::string python_percent_format(const std::string& fmt, const Value& args);

// Python binary operators + - * / // % ** on values (TypeError-like errors for unsupported operands);
// `max_size` caps strings and lists made by * and +.
Value binary_op(const std::string& op, const Value& a, const Value& b, size_t max_size);

// Python slicing of a str/list/tuple with optional (null = None) bounds.
Value python_slice(const Value& v, const Value* start, const Value* stop, const Value* step);

// Python str helpers (whitespace = str.isspace(); case mapping covers ASCII, Latin-1, Greek, Cyrillic).
bool py_isspace(uint32_t cp);
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_capitalize(const std::string& s);
std::vector<std::string> py_splitlines(const std::string& s);
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit);
// Python's str.replace; the result is bounded by the render's StringBudget.
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);

}  // namespace inferx::jinja
