// Python methods reachable from templates (Library Reference "String Methods", "Mapping Types",
// "Sequence Types"). jinja2's ImmutableSandboxedEnvironment refuses the mutating ones (sandbox.py
// modifies_known_mutable), and so do we: transformers renders with that sandbox.
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "text/jinja/builtins.h"

namespace inferx::jinja {

bool py_isspace(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 28 && cp <= 32) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

namespace {

uint32_t upper_cp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) ||
      (c >= 0x430 && c <= 0x44F))
    return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

uint32_t lower_cp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) ||
      (c >= 0x410 && c <= 0x42F))
    return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

std::string map_cps(const std::string& s, uint32_t (*f)(uint32_t)) {
  std::string out;
  for (uint32_t c : utf8_decode(s)) utf8_append(out, f(c));
  return out;
}

std::string want_str(const Value& v, std::string_view what) {
  if (!v.is_string()) fail("{} must be str, not {}", what, v.type_name());
  return v.str();
}

bool affix_match(const Value& self, const Value& arg, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& s = self.str();
    std::string x = want_str(a, prefix ? "startswith first arg" : "endswith first arg");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (arg.kind() == Kind::Tuple) {
    for (const auto& a : arg.items())
      if (one(a)) return true;
    return false;
  }
  return one(arg);
}

Value str_method(const Value& self, const std::string& name) {
  auto bind = [&](auto fn) {
    return Value::callable(name, [self, fn](CallArgs& a) -> Value { return fn(self, a); });
  };
  const Value none = Value::none();
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return bind([name](const Value& s, CallArgs& a) {
      a.check(name, 1, {});
      return Value(py_strip(s.str(), a.get(0, ""), name != "rstrip", name != "lstrip"));
    });
  if (name == "upper") return bind([](const Value& s, CallArgs&) { return Value(py_upper(s.str())); });
  if (name == "lower") return bind([](const Value& s, CallArgs&) { return Value(py_lower(s.str())); });
  if (name == "capitalize")
    return bind([](const Value& s, CallArgs&) { return Value(py_capitalize(s.str())); });
  if (name == "title")
    return bind([](const Value& s, CallArgs&) {
      std::string out;
      bool prev_cased = false;
      for (uint32_t c : utf8_decode(s.str())) {
        bool cased = upper_cp(c) != c || lower_cp(c) != c;
        utf8_append(out, cased ? (prev_cased ? lower_cp(c) : upper_cp(c)) : c);
        prev_cased = cased;
      }
      return Value(out);
    });
  if (name == "startswith" || name == "endswith")
    return bind([name](const Value& s, CallArgs& a) {
      INFERX_CHECK(a.args.size() == 1, "{}() takes exactly one argument", name);
      return Value(affix_match(s, a.args[0], name == "startswith"));
    });
  if (name == "split" || name == "rsplit")
    return bind([name](const Value& s, CallArgs& a) {
      a.check(name, 2, {"sep", "maxsplit"});
      const Value* sep = a.get(0, "sep");
      const Value* mx = a.get(1, "maxsplit");
      int64_t maxsplit = mx != nullptr && mx->is_number() ? mx->as_int() : -1;
      std::vector<std::string> parts;
      if (name == "rsplit" && maxsplit >= 0) {
        // rsplit with a limit splits from the right: reverse, split, reverse back (ASCII-safe via cps).
        auto cps = utf8_decode(s.str());
        std::reverse(cps.begin(), cps.end());
        Value rsep;
        if (sep != nullptr && sep->is_string()) {
          auto sc = utf8_decode(sep->str());
          std::reverse(sc.begin(), sc.end());
          rsep = Value(utf8_encode(sc, 0, sc.size()));
        }
        parts = py_split(utf8_encode(cps, 0, cps.size()),
                         sep != nullptr && sep->is_string() ? &rsep : nullptr, maxsplit);
        for (auto& p : parts) {
          auto pc = utf8_decode(p);
          std::reverse(pc.begin(), pc.end());
          p = utf8_encode(pc, 0, pc.size());
        }
        std::reverse(parts.begin(), parts.end());
      } else {
        parts = py_split(s.str(), sep, maxsplit);
      }
      std::vector<Value> out;
      for (auto& p : parts) out.emplace_back(std::move(p));
      return Value::list(std::move(out));
    });
  if (name == "splitlines")
    return bind([](const Value& s, CallArgs&) {
      std::vector<Value> out;
      for (auto& p : py_splitlines(s.str())) out.emplace_back(std::move(p));
      return Value::list(std::move(out));
    });
  if (name == "replace")
    return bind([](const Value& s, CallArgs& a) {
      INFERX_CHECK(a.args.size() >= 2, "replace() takes at least 2 arguments");
      const Value* c = a.get(2, "count");
      return Value(py_replace(s.str(), want_str(a.args[0], "replace() argument 1"),
                              want_str(a.args[1], "replace() argument 2"), c != nullptr ? c->as_int() : -1));
    });
  if (name == "find" || name == "rfind" || name == "count" || name == "index")
    return bind([name](const Value& s, CallArgs& a) {
      INFERX_CHECK(a.args.size() == 1, "{}() takes exactly one argument", name);
      std::string x = want_str(a.args[0], name + "() argument");
      const std::string& str = s.str();
      if (name == "count") {
        if (x.empty()) return Value(static_cast<int64_t>(utf8_length(str) + 1));
        int64_t n = 0;
        for (size_t p = str.find(x); p != std::string::npos; p = str.find(x, p + x.size())) ++n;
        return Value(n);
      }
      size_t p = name == "rfind" ? str.rfind(x) : str.find(x);
      if (p == std::string::npos) {
        if (name == "index") fail("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(utf8_length(str.substr(0, p))));
    });
  if (name == "join")
    return bind([](const Value& s, CallArgs& a) {
      INFERX_CHECK(a.args.size() == 1, "join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const auto& v : a.args[0].iterate()) {
        if (!first) out += s.str();
        first = false;
        out += want_str(v, "sequence item");
        StringBudget::check_size(out.size(), "join()");
      }
      return Value(out);
    });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower")
    return bind([name](const Value& s, CallArgs&) {
      auto cps = utf8_decode(s.str());
      if (cps.empty()) return Value(false);
      bool any_cased = false;
      for (uint32_t c : cps) {
        bool digit = c >= '0' && c <= '9';
        bool alpha = upper_cp(c) != c || lower_cp(c) != c || c >= 0x4E00;
        if (name == "isdigit" && !digit) return Value(false);
        if (name == "isalpha" && !alpha) return Value(false);
        if (name == "isalnum" && !alpha && !digit) return Value(false);
        if (name == "isspace" && !py_isspace(c)) return Value(false);
        if (name == "isupper" && lower_cp(c) != c) any_cased = true;
        if (name == "isupper" && upper_cp(c) != c) return Value(false);
        if (name == "islower" && upper_cp(c) != c) any_cased = true;
        if (name == "islower" && lower_cp(c) != c) return Value(false);
      }
      return Value(name == "isupper" || name == "islower" ? any_cased : true);
    });
  if (name == "removeprefix" || name == "removesuffix")
    return bind([name](const Value& s, CallArgs& a) {
      INFERX_CHECK(a.args.size() == 1, "{}() takes exactly one argument", name);
      std::string x = want_str(a.args[0], name + "() argument");
      const std::string& str = s.str();
      if (name == "removeprefix" && str.compare(0, x.size(), x) == 0) return Value(str.substr(x.size()));
      if (name == "removesuffix" && x.size() <= str.size() && !x.empty() &&
          str.compare(str.size() - x.size(), x.size(), x) == 0)
        return Value(str.substr(0, str.size() - x.size()));
      return s;
    });
  (void)none;
  return Value::undefined(fmt::format("'str object' has no attribute '{}'", name));
}

Value dict_method(const Value& self, const std::string& name) {
  auto bind = [&](auto fn) {
    return Value::callable(name, [self, fn](CallArgs& a) -> Value { return fn(self, a); });
  };
  if (name == "items" || name == "keys" || name == "values")
    return bind([name](const Value& d, CallArgs&) {
      std::vector<Value> out;
      for (const auto& [k, v] : d.dict_data().entries)
        out.push_back(name == "items" ? Value::tuple({k, v}) : name == "keys" ? k : v);
      return Value::list(std::move(out));
    });
  if (name == "get")
    return bind([](const Value& d, CallArgs& a) {
      INFERX_CHECK(!a.args.empty() && a.args.size() <= 2, "get expected 1 or 2 arguments");
      const Value* v = d.dict_data().find(a.args[0]);
      if (v != nullptr) return *v;
      return a.args.size() == 2 ? a.args[1] : Value::none();
    });
  if (name == "copy")
    return bind([](const Value& d, CallArgs&) {
      Value c = Value::dict();
      c.dict_data().entries = d.dict_data().entries;
      return c;
    });
  static const char* const kMutating[] = {"pop", "popitem", "setdefault", "update", "clear"};
  for (const char* m : kMutating)
    if (name == m) fail("access to attribute '{}' of 'dict' object is unsafe.", name);
  return Value::undefined();
}

Value list_method(const Value& self, const std::string& name) {
  auto bind = [&](auto fn) {
    return Value::callable(name, [self, fn](CallArgs& a) -> Value { return fn(self, a); });
  };
  if (name == "index" || name == "count")
    return bind([name](const Value& l, CallArgs& a) {
      INFERX_CHECK(a.args.size() == 1, "{}() takes exactly one argument", name);
      int64_t n = 0;
      for (size_t i = 0; i < l.items().size(); ++i)
        if (values_equal(l.items()[i], a.args[0])) {
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
      if (name == "index") fail("{} is not in list", a.args[0].repr());
      return Value(n);
    });
  if (name == "copy" && self.kind() == Kind::List)
    return bind([](const Value& l, CallArgs&) { return Value::list(l.items()); });
  static const char* const kMutating[] = {"append", "extend",  "insert", "pop",
                                          "remove", "reverse", "sort",   "clear"};
  if (self.kind() == Kind::List)
    for (const char* m : kMutating)
      if (name == m) fail("access to attribute '{}' of 'list' object is unsafe.", name);
  return Value::undefined();
}

}  // namespace

Value bound_method(const Value& self, const std::string& name) {
  switch (self.kind()) {
    case Kind::String: {
      Value m = str_method(self, name);
      return m;
    }
    case Kind::Dict:
      return dict_method(self, name);
    case Kind::List:
    case Kind::Tuple:
      return list_method(self, name);
    default:
      return Value::undefined();
  }
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto cps = utf8_decode(s);
  std::vector<uint32_t> set;
  bool ws = chars == nullptr || chars->is_none();
  if (!ws) set = utf8_decode(want_str(*chars, "strip arg"));
  auto strip_it = [&](uint32_t c) {
    return ws ? py_isspace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode(cps, b, e);
}

std::string py_upper(const std::string& s) { return map_cps(s, upper_cp); }
std::string py_lower(const std::string& s) { return map_cps(s, lower_cp); }

std::string py_capitalize(const std::string& s) {
  auto cps = utf8_decode(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) utf8_append(out, i == 0 ? upper_cp(cps[i]) : lower_cp(cps[i]));
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> out;
  auto cps = utf8_decode(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    uint32_t c = cps[i];
    bool br = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
              c == 0x2028 || c == 0x2029;
    if (!br) continue;
    out.push_back(utf8_encode(cps, start, i));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) out.push_back(utf8_encode(cps, start, cps.size()));
  return out;
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep == nullptr || sep->is_none()) {
    auto cps = utf8_decode(s);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && py_isspace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        size_t e = cps.size();
        while (e > i && py_isspace(cps[e - 1])) --e;
        out.push_back(utf8_encode(cps, i, e));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !py_isspace(cps[j])) ++j;
      out.push_back(utf8_encode(cps, i, j));
      i = j;
    }
    return out;
  }
  std::string d = want_str(*sep, "split separator");
  INFERX_CHECK(!d.empty(), "empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) break;
    size_t p = s.find(d, start);
    if (p == std::string::npos) break;
    out.push_back(s.substr(start, p - start));
    start = p + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` between every character and at both ends
    auto cps = utf8_decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
      StringBudget::check_size(out.size(), "replace()");
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += repl;
    StringBudget::check_size(out.size(), "replace()");
    start = p + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

}  // namespace inferx::jinja
