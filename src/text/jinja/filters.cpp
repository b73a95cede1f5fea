// Builtin filters, behaving as jinja2/filters.py (3.1) does, plus transformers' own `tojson`
// (transformers/utils/chat_template_utils.py: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), which replaces jinja2's HTML-escaping one).
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/evaluator.h"

namespace inferx::jinja {

namespace {

using FilterFn = Value (*)(Evaluator&, const Value&, CallArgs&);

const Value* arg(const CallArgs& a, size_t pos, std::string_view name) { return a.get(pos, name); }
bool flag(const CallArgs& a, size_t pos, std::string_view name, bool dflt = false) {
  const Value* v = a.get(pos, name);
  return v != nullptr ? v->truthy() : dflt;
}

// jinja2's make_attrgetter: "a.b.0" looked up item-first at each step.
Value get_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return item.getitem(attribute);
  Value cur = item;
  size_t start = 0;
  const std::string& path = attribute.str();
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits && part.size() < 18 ? cur.getitem(Value(static_cast<int64_t>(std::stoll(part))))
                                     : cur.getitem(Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(py_lower(v.str())) : v;
}

// select / reject / selectattr / rejectattr share jinja2's select_or_reject.
Value select_or_reject(Evaluator& ev, const Value& seq, CallArgs& a, bool with_attr, bool select) {
  size_t first = 0;
  Value attr;
  if (with_attr) {
    INFERX_CHECK(!a.args.empty(), "Missing parameter for attribute name");
    attr = a.args[0];
    first = 1;
  }
  std::string test;
  CallArgs test_args;
  if (a.args.size() > first) {
    test = a.args[first].to_string();
    test_args.args.assign(a.args.begin() + static_cast<std::ptrdiff_t>(first) + 1, a.args.end());
    test_args.kwargs = a.kwargs;
  }
  std::vector<Value> out;
  for (const auto& item : seq.iterate()) {
    ev.step();
    Value v = with_attr ? get_path(item, attr) : item;
    bool ok = test.empty() ? v.truthy() : apply_test(ev, test, v, test_args);
    if (ok == select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_tojson(Evaluator&, const Value& v, CallArgs& a) {
  a.check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = flag(a, 0, "ensure_ascii", false);
  if (const Value* ind = arg(a, 1, "indent"); ind != nullptr && !ind->is_none()) {
    o.has_indent = true;
    if (ind->is_string()) {
      o.indent = ind->str();
    } else {
      INFERX_CHECK(ind->kind() == Kind::Int || ind->kind() == Kind::Bool,
                   "tojson: indent must be an int or str");
      INFERX_CHECK(ind->as_int() <= 1024, "tojson: indent too large");
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, ind->as_int())), ' ');
    }
    o.item_sep = ",";
  }
  if (const Value* sep = arg(a, 2, "separators"); sep != nullptr && !sep->is_none()) {
    INFERX_CHECK(sep->is_sequence() && sep->items().size() == 2 && sep->items()[0].is_string() &&
                     sep->items()[1].is_string(),
                 "tojson: separators must be a (item_separator, key_separator) pair of strings");
    o.item_sep = sep->items()[0].str();
    o.key_sep = sep->items()[1].str();
  }
  o.sort_keys = flag(a, 3, "sort_keys", false);
  std::string s = json_dumps(v, o);
  return Value(std::move(s));
}

Value f_indent(Evaluator& ev, const Value& v, CallArgs& a) {
  a.check("indent", 3, {"width", "first", "blank"});
  std::string ind = "    ";
  if (const Value* w = arg(a, 0, "width")) {
    if (w->is_string()) {
      ind = w->str();
    } else {
      INFERX_CHECK(w->is_number() && w->as_int() <= 4096, "indent: width must be an int or str");
      ind = std::string(static_cast<size_t>(std::max<int64_t>(0, w->as_int())), ' ');
    }
  }
  std::vector<std::string> lines = py_splitlines(v.to_string() + "\n");
  std::string rv;
  if (flag(a, 2, "blank")) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind) + lines[i];
  }
  if (flag(a, 1, "first")) rv = ind + rv;
  ev.check_size(rv.size());
  return Value(std::move(rv));
}

Value f_default(Evaluator&, const Value& v, CallArgs& a) {
  a.check("default", 2, {"default_value", "boolean"});
  const Value* d = arg(a, 0, "default_value");
  if (v.is_undefined() || (flag(a, 1, "boolean") && !v.truthy())) return d != nullptr ? *d : Value("");
  return v;
}

Value f_join(Evaluator&, const Value& v, CallArgs& a) {
  a.check("join", 2, {"d", "attribute"});
  const Value* d = arg(a, 0, "d");
  const Value* attr = arg(a, 1, "attribute");
  std::string sep = d != nullptr ? d->to_string() : "";
  std::string out;
  bool first = true;
  for (const auto& item : v.iterate()) {
    if (!first) out += sep;
    first = false;
    out += (attr != nullptr ? get_path(item, *attr) : item).to_string();
    StringBudget::check_size(out.size(), "join");
  }
  return Value(std::move(out));
}

Value f_items(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list();
  INFERX_CHECK(v.kind() == Kind::Dict, "Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict_data().entries) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value f_map(Evaluator& ev, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value* attr = nullptr;
  const Value* dflt = nullptr;
  for (const auto& [k, val] : a.kwargs) {
    if (k == "attribute") attr = &val;
    if (k == "default") dflt = &val;
  }
  if (a.args.empty() && attr != nullptr) {
    for (const auto& item : v.iterate()) {
      Value r = get_path(item, *attr);
      out.push_back(r.is_undefined() && dflt != nullptr ? *dflt : r);
    }
    return Value::list(std::move(out));
  }
  INFERX_CHECK(!a.args.empty(), "map requires a filter argument");
  std::string name = a.args[0].to_string();
  CallArgs fa;
  fa.args.assign(a.args.begin() + 1, a.args.end());
  fa.kwargs = a.kwargs;
  for (const auto& item : v.iterate()) {
    ev.step();
    CallArgs copy = fa;
    out.push_back(apply_filter(ev, name, item, copy));
  }
  return Value::list(std::move(out));
}

Value f_sort(Evaluator&, const Value& v, CallArgs& a) {
  a.check("sort", 3, {"reverse", "case_sensitive", "attribute"});
  bool rev = flag(a, 0, "reverse"), cs = flag(a, 1, "case_sensitive");
  const Value* attr = arg(a, 2, "attribute");
  std::vector<Value> items = v.iterate();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(attr ? get_path(x, *attr) : x, cs), ky = sort_key(attr ? get_path(y, *attr) : y, cs);
    return rev ? compare_values(ky, kx) < 0 : compare_values(kx, ky) < 0;
  });
  return Value::list(std::move(items));
}

Value f_dictsort(Evaluator&, const Value& v, CallArgs& a) {
  a.check("dictsort", 3, {"case_sensitive", "by", "reverse"});
  INFERX_CHECK(v.kind() == Kind::Dict, "dictsort: value must be a dict");
  bool cs = flag(a, 0, "case_sensitive"), rev = flag(a, 2, "reverse");
  const Value* by = arg(a, 1, "by");
  size_t pos = 0;
  if (by != nullptr) {
    INFERX_CHECK(by->is_string() && (by->str() == "key" || by->str() == "value"),
                 "You can only sort by either \"key\" or \"value\"");
    pos = by->str() == "value" ? 1 : 0;
  }
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict_data().entries) items.push_back(Value::tuple({k, val}));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    int c = compare_values(sort_key(x.items()[pos], cs), sort_key(y.items()[pos], cs));
    return rev ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value f_unique(Evaluator&, const Value& v, CallArgs& a) {
  a.check("unique", 2, {"case_sensitive", "attribute"});
  bool cs = flag(a, 0, "case_sensitive");
  const Value* attr = arg(a, 1, "attribute");
  std::vector<Value> out, seen;
  for (const auto& item : v.iterate()) {
    Value key = sort_key(attr ? get_path(item, *attr) : item, cs);
    bool dup = false;
    for (const auto& s : seen) dup = dup || values_equal(s, key);
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value minmax(const Value& v, CallArgs& a, bool want_max) {
  a.check(want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
  bool cs = flag(a, 0, "case_sensitive");
  const Value* attr = arg(a, 1, "attribute");
  std::vector<Value> items = v.iterate();
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare_values(sort_key(attr ? get_path(items[i], *attr) : items[i], cs),
                           sort_key(attr ? get_path(items[best], *attr) : items[best], cs));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value f_int(Evaluator&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default");
  Value dflt = d != nullptr ? *d : Value(int64_t{0});
  if (v.kind() == Kind::Int || v.kind() == Kind::Bool) return Value(v.as_int());
  if (v.kind() == Kind::Float) {
    if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) > 9.2e18) return dflt;
    return Value(static_cast<int64_t>(v.as_float()));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.str(), nullptr, true, true);
    std::string t;
    for (char c : s)
      if (c != '_') t.push_back(c);
    if (t.empty()) return dflt;
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(t.c_str(), &end, 10);
    if (*end == '\0' && errno == 0) return Value(static_cast<int64_t>(x));
    double f = std::strtod(t.c_str(), &end);
    if (*end == '\0' && std::isfinite(f) && std::fabs(f) < 9.2e18) return Value(static_cast<int64_t>(f));
  }
  return dflt;
}

Value f_float(Evaluator&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default");
  Value dflt = d != nullptr ? *d : Value(0.0);
  if (v.is_number()) return Value(v.number());
  if (v.is_string()) {
    std::string s = py_strip(v.str(), nullptr, true, true);
    if (s.empty()) return dflt;
    char* end = nullptr;
    double f = std::strtod(s.c_str(), &end);
    if (*end == '\0') return Value(f);
  }
  return dflt;
}

Value f_round(Evaluator&, const Value& v, CallArgs& a) {
  a.check("round", 2, {"precision", "method"});
  INFERX_CHECK(v.is_number(), "round: value must be a number, not {}", v.type_name());
  const Value* p = arg(a, 0, "precision");
  const Value* m = arg(a, 1, "method");
  int64_t prec = p != nullptr ? p->as_int() : 0;
  std::string method = m != nullptr ? m->to_string() : "common";
  INFERX_CHECK(method == "common" || method == "ceil" || method == "floor",
               "method must be common, ceil or floor");
  INFERX_CHECK(prec >= -308 && prec <= 308, "round: precision out of range");
  if (method == "common" && v.kind() != Kind::Float) return Value(v.as_int());  // round(int, n) stays int
  double x = v.number(), scale = std::pow(10.0, static_cast<double>(prec));
  if (method == "ceil") return Value(std::ceil(x * scale) / scale);
  if (method == "floor") return Value(std::floor(x * scale) / scale);
  // Python round(): half to even, on the correctly rounded decimal value.
  char buf[400];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::max<int64_t>(prec, 0)), x);
  double r = std::strtod(buf, nullptr);
  if (prec < 0) r = std::nearbyint(x * scale) / scale;
  return Value(r);
}

Value f_length(Evaluator&, const Value& v, CallArgs&) { return Value(static_cast<int64_t>(v.length())); }

Value f_first(Evaluator&, const Value& v, CallArgs&) {
  auto items = v.iterate();
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Evaluator&, const Value& v, CallArgs&) {
  auto items = v.iterate();
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_reverse(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = utf8_decode(v.str());
    std::reverse(cps.begin(), cps.end());
    return Value(utf8_encode(cps, 0, cps.size()));
  }
  auto items = v.iterate();
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_sum(Evaluator&, const Value& v, CallArgs& a) {
  const Value* attr = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  Value acc = start != nullptr ? *start : Value(int64_t{0});
  for (const auto& item : v.iterate())
    acc = binary_op("+", acc, attr ? get_path(item, *attr) : item, size_t{64} << 20);
  return acc;
}

Value f_escape(Evaluator&, const Value& v, CallArgs&) {
  std::string out;
  for (char c : v.to_string()) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value(out);
}

Value f_wordcount(Evaluator&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t c : utf8_decode(v.to_string())) {
    bool w =
        (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0xAA;
    w = w && !py_isspace(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_center(Evaluator& ev, const Value& v, CallArgs& a) {
  const Value* w = arg(a, 0, "width");
  int64_t width = w != nullptr ? w->as_int() : 80;
  std::string s = v.to_string();
  int64_t len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return Value(s);
  ev.check_size(static_cast<size_t>(width));
  int64_t total = width - len, left = total / 2 + (total & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + s +
               std::string(static_cast<size_t>(total - left), ' '));
}

const std::unordered_map<std::string, FilterFn>& table() {
  static const std::unordered_map<std::string, FilterFn> t = {
      {"tojson", f_tojson},
      {"indent", f_indent},
      {"default", f_default},
      {"d", f_default},
      {"join", f_join},
      {"items", f_items},
      {"map", f_map},
      {"sort", f_sort},
      {"dictsort", f_dictsort},
      {"unique", f_unique},
      {"int", f_int},
      {"float", f_float},
      {"round", f_round},
      {"length", f_length},
      {"count", f_length},
      {"first", f_first},
      {"last", f_last},
      {"reverse", f_reverse},
      {"sum", f_sum},
      {"escape", f_escape},
      {"e", f_escape},
      {"forceescape", f_escape},
      {"wordcount", f_wordcount},
      {"center", f_center},
      {"select",
       [](Evaluator& ev, const Value& v, CallArgs& a) { return select_or_reject(ev, v, a, false, true); }},
      {"reject",
       [](Evaluator& ev, const Value& v, CallArgs& a) { return select_or_reject(ev, v, a, false, false); }},
      {"selectattr",
       [](Evaluator& ev, const Value& v, CallArgs& a) { return select_or_reject(ev, v, a, true, true); }},
      {"rejectattr",
       [](Evaluator& ev, const Value& v, CallArgs& a) { return select_or_reject(ev, v, a, true, false); }},
      {"max", [](Evaluator&, const Value& v, CallArgs& a) { return minmax(v, a, true); }},
      {"min", [](Evaluator&, const Value& v, CallArgs& a) { return minmax(v, a, false); }},
      {"trim", [](Evaluator&, const Value& v,
                  CallArgs& a) { return Value(py_strip(v.to_string(), arg(a, 0, "chars"), true, true)); }},
      {"string", [](Evaluator&, const Value& v, CallArgs&) { return Value(v.to_string()); }},
      {"safe", [](Evaluator&, const Value& v, CallArgs&) { return v; }},
      {"list", [](Evaluator&, const Value& v, CallArgs&) { return Value::list(v.iterate()); }},
      {"upper", [](Evaluator&, const Value& v, CallArgs&) { return Value(py_upper(v.to_string())); }},
      {"lower", [](Evaluator&, const Value& v, CallArgs&) { return Value(py_lower(v.to_string())); }},
      {"capitalize",
       [](Evaluator&, const Value& v, CallArgs&) { return Value(py_capitalize(v.to_string())); }},
      {"title",
       [](Evaluator&, const Value& v, CallArgs&) {
         // jinja2 do_title: capitalize each piece split at runs of [-\s({\[<].
         std::string out;
         bool at_start = true;
         for (uint32_t c : utf8_decode(v.to_string())) {
           bool sep = c == '-' || py_isspace(c) || c == '(' || c == '{' || c == '[' || c == '<';
           std::string ch;
           utf8_append(ch, c);
           out += sep ? ch : (at_start ? py_upper(ch) : py_lower(ch));
           at_start = sep;
         }
         return Value(out);
       }},
      {"replace",
       [](Evaluator& ev, const Value& v, CallArgs& a) {
         INFERX_CHECK(a.args.size() >= 2, "replace expects old and new");
         const Value* c = arg(a, 2, "count");
         return Value(py_replace(v.to_string(), a.args[0].to_string(), a.args[1].to_string(),
                                 c != nullptr && !c->is_none() ? c->as_int() : -1));
       }},
      {"abs",
       [](Evaluator&, const Value& v, CallArgs&) {
         INFERX_CHECK(v.is_number(), "bad operand type for abs(): '{}'", v.type_name());
         if (v.kind() == Kind::Float) return Value(std::fabs(v.as_float()));
         INFERX_CHECK(v.as_int() != INT64_MIN, "integer overflow");
         return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
       }},
      {"attr",
       [](Evaluator&, const Value& v, CallArgs& a) {
         INFERX_CHECK(a.args.size() == 1, "attr expects one argument");
         return v.getattr(a.args[0].to_string());
       }},
      {"format",
       [](Evaluator&, const Value& v, CallArgs& a) {
         return Value(python_percent_format(v.to_string(), Value::tuple(a.args)));
       }},
  };
  return t;
}

}  // namespace

bool has_filter(const std::string& name) { return table().count(name) != 0; }

Value apply_filter(Evaluator& ev, const std::string& name, const Value& input, CallArgs& args) {
  auto it = table().find(name);
  if (it == table().end()) fail("No filter named '{}'.", name);
  return it->second(ev, input, args);
}

}  // namespace inferx::jinja
