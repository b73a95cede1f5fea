// Value semantics following Python's data model, since jinja2 evaluates templates with Python objects:
// truthiness (Python Language Reference 3.3.1 __bool__/__len__), equality across int/float/bool, ordering
// only between numbers, strings and sequences, and jinja2's Environment.getattr/getitem lookup order.
#include "text/jinja/value.h"

#include <fmt/format.h>

#include "core/error.h"
#include "text/jinja/builtins.h"

namespace inferx::jinja {

namespace {
thread_local StringBudget* t_budget = nullptr;
constexpr size_t kMaxStringOutsideRender = size_t{64} << 20;
}  // namespace

StringBudget::StringBudget(size_t max_string, uint64_t max_built)
    : max_string_(max_string), max_built_(max_built), previous_(t_budget) {
  t_budget = this;
}

StringBudget::~StringBudget() { t_budget = previous_; }

void StringBudget::check_size(size_t bytes, std::string_view what) {
  const size_t max = t_budget ? t_budget->max_string_ : kMaxStringOutsideRender;
  if (bytes > max) fail("{}: result exceeds {} bytes", what, max);
}

void StringBudget::charge(size_t bytes) {
  if (t_budget == nullptr) return;
  check_size(bytes, "string");
  t_budget->built_ += bytes;
  if (t_budget->built_ > t_budget->max_built_)
    fail("template built more than {} bytes of strings (a loop building huge strings?)",
         t_budget->max_built_);
}

const std::string& Value::empty_string() {
  static const std::string empty;
  return empty;
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value::Value(bool b) : kind_(Kind::Bool), b_(b), i_(b ? 1 : 0) {}
Value::Value(int64_t v) : kind_(Kind::Int), i_(v) {}
Value::Value(double v) : kind_(Kind::Float), f_(v) {}
Value::Value(std::string s) : kind_(Kind::String) {
  StringBudget::charge(s.size());
  s_ = std::make_shared<const std::string>(std::move(s));
}

struct RenderArena::Tracked {
  std::vector<std::weak_ptr<std::vector<Value>>> lists;
  std::vector<std::weak_ptr<DictData>> dicts;
  std::vector<std::weak_ptr<Function>> functions;
};

namespace {
thread_local RenderArena::Tracked* t_arena = nullptr;
thread_local RenderArena* t_arena_owner = nullptr;
}  // namespace

RenderArena::RenderArena() : tracked_(std::make_unique<Tracked>()), previous_(t_arena_owner) {
  t_arena_owner = this;
  t_arena = tracked_.get();
}

RenderArena::~RenderArena() {
  t_arena_owner = previous_;
  t_arena = previous_ ? previous_->tracked_.get() : nullptr;
  // Hold every survivor first, then empty them: emptying one may drop the last outside reference to
  // another, which must not be destroyed while we still walk the lists.
  std::vector<std::shared_ptr<std::vector<Value>>> lists;
  std::vector<std::shared_ptr<DictData>> dicts;
  std::vector<std::shared_ptr<Function>> functions;
  for (auto& w : tracked_->lists)
    if (auto p = w.lock()) lists.push_back(std::move(p));
  for (auto& w : tracked_->dicts)
    if (auto p = w.lock()) dicts.push_back(std::move(p));
  for (auto& w : tracked_->functions)
    if (auto p = w.lock()) functions.push_back(std::move(p));
  for (auto& l : lists) std::vector<Value>().swap(*l);
  for (auto& d : dicts) std::vector<std::pair<Value, Value>>().swap(d->entries);
  for (auto& f : functions) Function().swap(*f);
}

Value Value::list(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::List;
  v.list_ = std::make_shared<std::vector<Value>>(std::move(items));
  if (t_arena) t_arena->lists.push_back(v.list_);
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::Tuple;
  return v;
}

Value Value::dict() {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<DictData>();
  if (t_arena) t_arena->dicts.push_back(v.dict_);
  return v;
}

Value Value::namespace_() {
  Value v = dict();
  v.kind_ = Kind::Namespace;
  return v;
}

Value Value::callable(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::Callable;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<Function>(std::move(fn));
  if (t_arena) t_arena->functions.push_back(v.fn_);
  return v;
}

Value Value::from_json(const nlohmann::json& j) { return from_json(nlohmann::ordered_json(j)); }

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      // JSON object keys are unique (nlohmann's parsers keep the last of repeated ones), so the entries are
      // appended without DictData::set's linear search (quadratic in the keys: a tool schema of 200k
      // properties).
      Value d = dict();
      d.dict_->entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict_->entries.emplace_back(Value(it.key()), from_json(it.value()));
      return d;
    }
    default:
      fail("unsupported JSON value of type {}", j.type_name());
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b_;
    case Kind::Int:
      return i_ != 0;
    case Kind::Float:
      return f_ != 0.0;
    case Kind::String:
      return !str().empty();
    case Kind::List:
    case Kind::Tuple:
      return !list_->empty();
    case Kind::Dict:
      return !dict_->entries.empty();
    case Kind::Namespace:
    case Kind::Callable:
      return true;
  }
  return false;
}

double Value::number() const {
  if (kind_ == Kind::Float) return f_;
  return static_cast<double>(i_);
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Tuple:
      return "tuple";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Callable:
      return "function";
  }
  return "object";
}

size_t Value::length() const {
  switch (kind_) {
    case Kind::Undefined:
      return 0;  // jinja2's Undefined.__len__
    case Kind::String:
      return utf8_length(str());
    case Kind::List:
    case Kind::Tuple:
      return list_->size();
    case Kind::Dict:
      return dict_->entries.size();
    default:
      fail("object of type '{}' has no len()", type_name());
  }
}

std::vector<Value> Value::iterate() const {
  switch (kind_) {
    case Kind::Undefined:
      return {};
    case Kind::List:
    case Kind::Tuple:
      return *list_;
    case Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(dict_->entries.size());
      for (const auto& [k, v] : dict_->entries) keys.push_back(k);
      return keys;
    }
    case Kind::String: {
      // One Value (~100 bytes) per character: a string of tens of millions of characters (well under the
      // 64 MB output cap) would take gigabytes here (found by fuzz_jinja). No chat template iterates a
      // string that long character by character.
      static constexpr size_t kMaxIteratedChars = size_t{1} << 20;
      // Cheap first: a code point takes at most 4 bytes (an invalid byte decodes to one U+FFFD).
      const auto too_long = [](size_t n) {
        fail("cannot iterate over a string of {} characters or more (at most {})", n, kMaxIteratedChars);
      };
      if (str().size() > 4 * kMaxIteratedChars) too_long(str().size() / 4);
      auto cps = utf8_decode(str());
      if (cps.size() > kMaxIteratedChars) too_long(cps.size());
      std::vector<Value> chars;
      chars.reserve(cps.size());
      for (size_t i = 0; i < cps.size(); ++i) chars.emplace_back(utf8_encode(cps, i, i + 1));
      return chars;
    }
    default:
      fail("'{}' object is not iterable", type_name());
  }
}

Value Value::getattr(const std::string& name) const {
  if (kind_ == Kind::Undefined) fail("{}", str().empty() ? std::string("value is undefined") : str());
  if (kind_ == Kind::Namespace) {
    if (const Value* v = dict_->find(std::string_view(name))) return *v;
    return undefined(fmt::format("'Namespace' object has no attribute '{}'", name));
  }
  Value m = bound_method(*this, name);
  if (!m.is_undefined()) return m;
  if (kind_ == Kind::Dict) {
    if (const Value* v = dict_->find(std::string_view(name))) return *v;
    return undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  return undefined(fmt::format("'{} object' has no attribute '{}'", type_name(), name));
}

Value Value::getitem(const Value& key) const {
  if (kind_ == Kind::Undefined) fail("{}", str().empty() ? std::string("value is undefined") : str());
  if (kind_ == Kind::Dict || kind_ == Kind::Namespace) {
    if (const Value* v = dict_->find(key)) return *v;
    if (kind_ == Kind::Dict && key.is_string()) {
      Value m = bound_method(*this, key.str());
      if (!m.is_undefined()) return m;
    }
    return undefined(fmt::format("'dict object' has no attribute '{}'", key.to_string()));
  }
  if ((is_sequence() || kind_ == Kind::String) && (key.kind() == Kind::Int || key.kind() == Kind::Bool)) {
    int64_t n = kind_ == Kind::String ? static_cast<int64_t>(utf8_length(str()))
                                      : static_cast<int64_t>(list_->size());
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n)
      return undefined(fmt::format("{} object has no element {}", type_name(), key.as_int()));
    if (kind_ == Kind::String) {
      auto cps = utf8_decode(str());
      return Value(utf8_encode(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
    }
    return (*list_)[static_cast<size_t>(i)];
  }
  if (key.is_string()) return getattr(key.str());
  return undefined(fmt::format("'{} object' has no element {}", type_name(), key.repr()));
}

bool Value::contains(const Value& item) const {
  switch (kind_) {
    case Kind::Undefined:
      return false;
    case Kind::String:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not {}", item.type_name());
      return str().find(item.str()) != std::string::npos;
    case Kind::List:
    case Kind::Tuple:
      for (const auto& e : *list_)
        if (values_equal(e, item)) return true;
      return false;
    case Kind::Dict:
    case Kind::Namespace:
      return dict_->find(item) != nullptr;
    default:
      fail("argument of type '{}' is not iterable", type_name());
  }
}

const Value* DictData::find(const Value& key) const {
  for (const auto& e : entries)
    if (values_equal(e.first, key)) return &e.second;
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& e : entries)
    if (e.first.is_string() && e.first.str() == key) return &e.second;
  return nullptr;
}

void DictData::set(const Value& key, Value v) {
  for (auto& e : entries)
    if (values_equal(e.first, key)) {
      e.second = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t pos, std::string_view name) const {
  if (pos < args.size()) return &args[pos];
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

void CallArgs::check(std::string_view func, size_t max_pos,
                     std::initializer_list<std::string_view> names) const {
  INFERX_CHECK(args.size() <= max_pos, "{}() takes at most {} positional arguments ({} given)", func, max_pos,
               args.size());
  for (const auto& [k, v] : kwargs) {
    bool ok = false;
    for (auto n : names) ok = ok || n == k;
    INFERX_CHECK(ok, "{}() got an unexpected keyword argument '{}'", func, k);
  }
}

namespace {
// The depth of the comparison in progress on this thread (values_equal and compare_values call each other).
thread_local int t_compare_depth = 0;

struct CompareDepth {
  CompareDepth() {
    INFERX_CHECK(t_compare_depth < kMaxValueDepth, "value nested too deeply to compare (more than {} levels)",
                 kMaxValueDepth);
    ++t_compare_depth;
  }
  ~CompareDepth() { --t_compare_depth; }
  CompareDepth(const CompareDepth&) = delete;
  CompareDepth& operator=(const CompareDepth&) = delete;
};
}  // namespace

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::Float || b.kind() == Kind::Float) return a.number() == b.number();
    return a.as_int() == b.as_int();
  }
  if (a.is_sequence() && b.is_sequence()) {
    if (a.kind() != b.kind() || a.items().size() != b.items().size()) return false;
    const CompareDepth depth;
    for (size_t i = 0; i < a.items().size(); ++i)
      if (!values_equal(a.items()[i], b.items()[i])) return false;
    return true;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.str() == b.str();
    case Kind::Dict: {
      const auto& ea = a.dict_data().entries;
      const auto& eb = b.dict_data().entries;
      if (ea.size() != eb.size()) return false;
      const CompareDepth depth;
      for (const auto& [k, v] : ea) {
        const Value* o = b.dict_data().find(k);
        if (o == nullptr || !values_equal(v, *o)) return false;
      }
      return true;
    }
    case Kind::Namespace:
      return &a.dict_data() == &b.dict_data();
    case Kind::Callable:
      return &a.function() == &b.function();
    default:
      return false;
  }
}

int compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Kind::Float && b.kind() != Kind::Float)
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    double x = a.number(), y = b.number();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order equals code point order, which is how Python compares str.
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_sequence() && b.is_sequence() && a.kind() == b.kind()) {
    const auto& x = a.items();
    const auto& y = b.items();
    const CompareDepth depth;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

}  // namespace inferx::jinja
