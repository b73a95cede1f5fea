// Global functions of the template environment: jinja2's defaults (range, dict, namespace, cycler,
// joiner; jinja2/defaults.py DEFAULT_NAMESPACE) with the sandbox's range cap (sandbox.py MAX_RANGE), and
// the two transformers adds (raise_exception, strftime_now).
#include <cmath>
#include <ctime>

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/evaluator.h"

namespace inferx::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

int64_t int_arg(const Value& v, std::string_view what) {
  INFERX_CHECK(v.kind() == Kind::Int || v.kind() == Kind::Bool,
               "{}: '{}' object cannot be interpreted as an integer", what, v.type_name());
  return v.as_int();
}

Value range_fn(CallArgs& a) {
  INFERX_CHECK(!a.args.empty() && a.args.size() <= 3 && a.kwargs.empty(),
               "range expected 1 to 3 integer arguments");
  int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) {
    stop = int_arg(a.args[0], "range");
  } else {
    start = int_arg(a.args[0], "range");
    stop = int_arg(a.args[1], "range");
    if (a.args.size() == 3) step = int_arg(a.args[2], "range");
  }
  INFERX_CHECK(step != 0, "range() arg 3 must not be zero");
  long double count =
      step > 0 ? std::ceil((static_cast<long double>(stop) - start) / step)
               : std::ceil((static_cast<long double>(start) - stop) / -static_cast<long double>(step));
  if (count < 0) count = 0;
  INFERX_CHECK(count <= kMaxRange, "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).",
               kMaxRange);
  std::vector<Value> out;
  for (int64_t i = 0, v = start; i < static_cast<int64_t>(count); ++i, v += step) out.emplace_back(v);
  return Value::list(std::move(out));
}

void fill_from(Value& target, CallArgs& a, std::string_view func) {
  INFERX_CHECK(a.args.size() <= 1, "{} expected at most 1 positional argument", func);
  if (!a.args.empty()) {
    const Value& init = a.args[0];
    if (init.kind() == Kind::Dict) {
      for (const auto& [k, v] : init.dict_data().entries) target.dict_data().set(k, v);
    } else {
      for (const auto& pair : init.iterate()) {
        INFERX_CHECK(pair.is_sequence() && pair.items().size() == 2,
                     "{}: sequence elements must be key/value pairs", func);
        target.dict_data().set(pair.items()[0], pair.items()[1]);
      }
    }
  }
  for (auto& [k, v] : a.kwargs) target.dict_data().set(Value(k), v);
}

}  // namespace

std::vector<std::pair<std::string, Value>> global_functions(Evaluator& ev) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::callable("range", range_fn));
  g.emplace_back("dict", Value::callable("dict", [](CallArgs& a) {
                   Value d = Value::dict();
                   fill_from(d, a, "dict");
                   return d;
                 }));
  g.emplace_back("namespace", Value::callable("namespace", [](CallArgs& a) {
                   Value ns = Value::namespace_();
                   fill_from(ns, a, "namespace");
                   return ns;
                 }));
  g.emplace_back("raise_exception", Value::callable("raise_exception", [](CallArgs& a) -> Value {
                   fail("{}",
                        a.args.empty() ? std::string("raise_exception() called") : a.args[0].to_string());
                 }));
  const int64_t now = ev.options().now_unix;
  g.emplace_back("strftime_now", Value::callable("strftime_now", [now](CallArgs& a) -> Value {
                   INFERX_CHECK(a.args.size() == 1 && a.args[0].is_string(),
                                "strftime_now expects a format string");
                   const std::string& fmt = a.args[0].str();
                   INFERX_CHECK(fmt.size() <= 256, "strftime_now: format too long");
                   std::time_t t = now >= 0 ? static_cast<std::time_t>(now) : std::time(nullptr);
                   std::tm tm{};
                   if (now >= 0)
                     gmtime_r(&t, &tm);
                   else
                     localtime_r(&t, &tm);
                   char buf[4096];
                   size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
                   return Value(std::string(buf, n));
                 }));
  g.emplace_back("cycler", Value::callable("cycler", [](CallArgs& a) {
                   // A cycler needs mutable state; exposed as its first item and list of items.
                   Value ns = Value::namespace_();
                   ns.dict_data().set(Value("items"), Value::list(a.args));
                   ns.dict_data().set(Value("current"), a.args.empty() ? Value::none() : a.args[0]);
                   return ns;
                 }));
  g.emplace_back("joiner", Value::callable("joiner", [](CallArgs& a) {
                   std::string sep = a.args.empty() ? ", " : a.args[0].to_string();
                   auto used = std::make_shared<bool>(false);
                   return Value::callable("joiner", [sep, used](CallArgs&) {
                     if (!*used) {
                       *used = true;
                       return Value("");
                     }
                     return Value(sep);
                   });
                 }));
  return g;
}

}  // namespace inferx::jinja
