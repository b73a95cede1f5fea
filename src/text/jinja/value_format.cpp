// Printing values exactly as Python does: str()/repr() (Objects/listobject.c, dictobject.c list_repr /
// dict_repr: ", " and ": " separators, reprs of items), float repr (the shortest round-tripping digits,
// scientific notation when the decimal exponent is < -4 or >= 16, Python/pystrtod.c), str repr (quote
// choice and escapes of Objects/unicodeobject.c unicode_repr), and json.dumps (Lib/json/encoder.py).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "text/jinja/value.h"
#include "text/unicode.h"

namespace inferx::jinja {

std::vector<uint32_t> utf8_decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) {  // invalid byte: keep it as U+FFFD-free raw code (Latin-1 style)
      out.push_back(0xDC00u + c);      // lone surrogate escape, like Python's surrogateescape
      ++i;
      continue;
    }
    uint32_t cp = n == 1 ? c : (c & (0xFFu >> (n + 1)));
    bool ok = true;
    for (int k = 1; k < n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out.push_back(0xDC00u + c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp >= 0xDC80u && cp <= 0xDCFFu) {  // a raw byte carried through decode
    out.push_back(static_cast<char>(cp - 0xDC00u));
  } else {
    unicode::append_utf8(static_cast<char32_t>(cp), out);
  }
}

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) utf8_append(out, cps[i]);
  return out;
}

size_t utf8_length(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  return ascii ? s.size() : utf8_decode(s).size();
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-1.2345e+16": the shortest round-tripping digits
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  int exp10 = std::stoi(sci.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (decpt > 16 || decpt < -3) {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  } else if (decpt <= 0) {
    out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (decpt < n) {
    out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  } else {
    out = digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
  }
  return sign + out;
}

namespace {

// str.isprintable() for the code points that occur in practice: C0/C1 controls, the non-space
// separators and the common format characters are not printable.
bool printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F))
    return false;
  if (cp == 0x3000 || cp == 0xFEFF || cp == 0x1680 || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  if ((cp >= 0xE000 && cp <= 0xF8FF) || (cp & 0xFFFE) == 0xFFFE) return false;
  return true;
}

void append_hex(std::string& out, const char* prefix, uint32_t v, int width) {
  char b[16];
  std::snprintf(b, sizeof b, "%s%0*x", prefix, width, v);
  out += b;
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (uint32_t cp : utf8_decode(s)) {
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
      if (cp >= 0x10000 && !(cp >= 0xDC80 && cp <= 0xDCFF)) {
        uint32_t v = cp - 0x10000;
        append_hex(out, "\\u", 0xD800 + (v >> 10), 4);
        append_hex(out, "\\u", 0xDC00 + (v & 0x3FF), 4);
      } else {
        append_hex(out, "\\u", cp, 4);
      }
    } else {
      utf8_append(out, cp);
    }
  }
  out.push_back('"');
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Kind::String:
      return k.str();
    case Kind::Bool:
      return k.as_bool() ? "true" : "false";
    case Kind::Int:
      return std::to_string(k.as_int());
    case Kind::Float:
      return python_float_repr(k.as_float());
    case Kind::None:
      return "null";
    default:
      fail("keys must be str, int, float, bool or None, not {}", k.type_name());
  }
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level) {
  auto newline = [&](int lv) {
    out.push_back('\n');
    for (int i = 0; i < lv; ++i) out += o.indent;
  };
  switch (v.kind()) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Kind::Float: {
      double f = v.as_float();
      if (std::isnan(f))
        out += "NaN";
      else if (std::isinf(f))
        out += f < 0 ? "-Infinity" : "Infinity";
      else
        out += python_float_repr(f);
      return;
    }
    case Kind::String:
      json_string(out, v.str(), o.ensure_ascii);
      return;
    case Kind::List:
    case Kind::Tuple: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      INFERX_CHECK(level < kMaxValueDepth, "tojson: nesting too deep");
      out.push_back('[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out += o.item_sep;
        if (o.has_indent) newline(level + 1);
        json_value(out, v.items()[i], o, level + 1);
        StringBudget::check_size(out.size(), "tojson");
      }
      if (o.has_indent) newline(level);
      out.push_back(']');
      return;
    }
    case Kind::Dict: {
      const auto& entries = v.dict_data().entries;
      if (entries.empty()) {
        out += "{}";
        return;
      }
      INFERX_CHECK(level < kMaxValueDepth, "tojson: nesting too deep");
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, val] : entries) items.emplace_back(json_key(k), &val);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += o.item_sep;
        if (o.has_indent) newline(level + 1);
        json_string(out, items[i].first, o.ensure_ascii);
        out += o.key_sep;
        json_value(out, *items[i].second, o, level + 1);
        StringBudget::check_size(out.size(), "tojson");
      }
      if (o.has_indent) newline(level);
      out.push_back('}');
      return;
    }
    default:
      fail("Object of type {} is not JSON serializable", v.type_name());
  }
}

void container_repr(std::string& out, const Value& v, int depth);

void repr_into(std::string& out, const Value& v, int depth) {
  if (v.is_string())
    out += python_string_repr(v.str());
  else if (v.kind() == Kind::Undefined)
    out += "Undefined";
  else
    container_repr(out, v, depth);
}

void container_repr(std::string& out, const Value& v, int depth) {
  INFERX_CHECK(depth < kMaxValueDepth, "value nested too deeply to print");
  switch (v.kind()) {
    case Kind::Undefined:
      return;
    case Kind::None:
      out += "None";
      return;
    case Kind::Bool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Kind::Float:
      out += python_float_repr(v.as_float());
      return;
    case Kind::String:
      out += v.str();
      return;
    case Kind::List:
    case Kind::Tuple: {
      bool tuple = v.kind() == Kind::Tuple;
      out.push_back(tuple ? '(' : '[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out += ", ";
        repr_into(out, v.items()[i], depth + 1);
        StringBudget::check_size(out.size(), "str()");
      }
      if (tuple && v.items().size() == 1) out.push_back(',');
      out.push_back(tuple ? ')' : ']');
      return;
    }
    case Kind::Dict:
    case Kind::Namespace: {
      if (v.kind() == Kind::Namespace) out += "<Namespace ";
      out.push_back('{');
      bool first = true;
      for (const auto& [k, val] : v.dict_data().entries) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, k, depth + 1);
        out += ": ";
        repr_into(out, val, depth + 1);
        StringBudget::check_size(out.size(), "str()");
      }
      out.push_back('}');
      if (v.kind() == Kind::Namespace) out.push_back('>');
      return;
    }
    case Kind::Callable:
      out += "<function " + v.str() + ">";
      return;
  }
}

}  // namespace

std::string python_string_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : utf8_decode(s)) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (printable(cp)) {
      utf8_append(out, cp);
    } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
      append_hex(out, "\\udc", cp & 0xFF, 2);
    } else if (cp < 0x100) {
      append_hex(out, "\\x", cp, 2);
    } else if (cp < 0x10000) {
      append_hex(out, "\\u", cp, 4);
    } else {
      append_hex(out, "\\U", cp, 8);
    }
  }
  out.push_back(quote);
  return out;
}

std::string json_dumps(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(out, v, opt, 0);
  return out;
}

std::string Value::to_string() const {
  if (kind_ == Kind::String) return str();
  std::string out;
  container_repr(out, *this, 0);
  return out;
}

std::string Value::repr() const {
  std::string out;
  repr_into(out, *this, 0);
  return out;
}

}  // namespace inferx::jinja
