#pragma once
// Values of our Jinja2 engine. Chat templates are Python programs in disguise: transformers renders them
// with Python jinja2, so a value here behaves like the Python object jinja2 would hold (None, bool, int,
// float, str, list, tuple, dict (insertion-ordered), jinja2's Namespace and Undefined, callables) and
// prints, compares and tests the way Python does (str()/repr() of containers, float repr, truthiness).
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace inferx::jinja {

enum class Kind : uint8_t {
  Undefined,
  None,
  Bool,
  Int,
  Float,
  String,
  List,
  Tuple,
  Dict,
  Namespace,
  Callable
};

class Value;
struct DictData;
struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

class Value {
 public:
  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  Value(bool b);  // NOLINT: implicit conversions keep builtins short
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value dict();  // empty ordered dict
  static Value namespace_();
  static Value callable(std::string name, Function fn);
  static Value from_json(const nlohmann::ordered_json& j);  // objects keep their key order
  static Value from_json(const nlohmann::json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_sequence() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
  bool is_mapping() const { return kind_ == Kind::Dict || kind_ == Kind::Namespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_float() const { return f_; }
  // String contents; the hint of an Undefined (empty for other kinds).
  const std::string& str() const { return s_ ? *s_ : empty_string(); }
  const std::vector<Value>& items() const { return *list_; }
  DictData& dict_data() const { return *dict_; }
  const Function& function() const { return *fn_; }

  bool truthy() const;            // Python bool()
  double number() const;          // int/float/bool as double (caller checked is_number)
  std::string to_string() const;  // str() as jinja prints it: undefined -> "", None -> "None", ...
  std::string repr() const;       // Python repr()
  std::string type_name() const;  // Python type name for error messages ("dict", "str", ...)
  size_t length() const;          // len(); throws for types without one
  // Iterating as Python does: list/tuple items, dict keys, string characters, undefined -> nothing.
  std::vector<Value> iterate() const;

  // obj.name: Python attribute first (dict/str/list methods), then item; missing -> Undefined.
  Value getattr(const std::string& name) const;
  // obj[key]: item first, then attribute for string keys; missing -> Undefined.
  Value getitem(const Value& key) const;
  bool contains(const Value& item) const;  // Python `item in self`

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  static const std::string& empty_string();
  // Shared and immutable, so that copying a value (every variable lookup does) costs O(1) however long
  // the string: fuzz_jinja found a loop testing a 60 MB string 100k times that copied it each time.
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<std::vector<Value>> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<Function> fn_;
};

// Breaks reference cycles when a render ends. Python's garbage collector frees a namespace that holds
// itself (`{% set ns.me = ns %}`) or a list appended to itself; our containers are reference counted, so
// every list, dict and callable created while an arena is active on this thread is remembered (weakly),
// and the arena's destructor empties those still alive. Values made before the arena (the caller's
// inputs) are untouched. One arena per thread at a time; Evaluator::render holds one.
class RenderArena {
 public:
  RenderArena();
  ~RenderArena();
  RenderArena(const RenderArena&) = delete;
  RenderArena& operator=(const RenderArena&) = delete;

  struct Tracked;  // value.cpp

 private:
  std::unique_ptr<Tracked> tracked_;
  RenderArena* previous_;
};

// The string bounds of a render, installed for its thread by Evaluator::render: no one string past
// `max_string` bytes, and at most `max_built` bytes of string values built in all (every string value
// charges its size when it is made; copies share it). Why the total: within the step limit a loop could
// otherwise build gigabytes of 60 MB strings. Outside a render: 64 MiB per string and no total.
class StringBudget {
 public:
  StringBudget(size_t max_string, uint64_t max_built);
  ~StringBudget();
  StringBudget(const StringBudget&) = delete;
  StringBudget& operator=(const StringBudget&) = delete;
  // Throws when a string of `bytes` is past the active bound (`what` names the operation).
  static void check_size(size_t bytes, std::string_view what);
  static void charge(size_t bytes);  // a new string value of `bytes`

 private:
  size_t max_string_;
  uint64_t max_built_, built_ = 0;
  StringBudget* previous_;
};

// Insertion-ordered dict; keys are compared with Python equality (small dicts: linear search).
struct DictData {
  std::vector<std::pair<Value, Value>> entries;
  const Value* find(const Value& key) const;
  void set(const Value& key, Value v);
  const Value* find(std::string_view key) const;
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // Python-style argument binding for builtins: position `pos` or keyword `name`; nullptr when absent.
  const Value* get(size_t pos, std::string_view name) const;
  // Throws when more positional args than `max_pos` were given or a keyword is not in `names`.
  void check(std::string_view func, size_t max_pos, std::initializer_list<std::string_view> names) const;
};

// How deep printing, tojson, == and < walk nested lists and dicts (Python stops at its recursion limit,
// ~1000): a template can build a list nested 900k levels deep within its step limit, and walking it
// recursively overflowed the stack.
inline constexpr int kMaxValueDepth = 512;

bool values_equal(const Value& a, const Value& b);   // Python ==
int compare_values(const Value& a, const Value& b);  // Python <, ==, > ; throws for unorderable types

// Python formatting helpers shared with filters.
std::string python_float_repr(double v);
std::string python_string_repr(std::string_view s);
struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // per level
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
// json.dumps(value, ...) byte-for-byte (transformers' tojson filter is json.dumps with these options).
std::string json_dumps(const Value& v, const JsonOptions& opt);

// UTF-8 <-> code points (strings index and measure by code point as Python does).
std::vector<uint32_t> utf8_decode(std::string_view s);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void utf8_append(std::string& out, uint32_t cp);
size_t utf8_length(std::string_view s);

}  // namespace inferx::jinja
