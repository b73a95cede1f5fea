// Python arithmetic, slicing and printf-style formatting for the values of templates (Python Language
// Reference 6.6-6.7: `/` always gives a float, `//` and `%` floor toward negative infinity and take the
// divisor's sign, str/list repetition by int; Library Reference "printf-style String Formatting").
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "core/error.h"
#include "text/jinja/builtins.h"

namespace inferx::jinja {

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

Value repeat(const Value& seq, int64_t n, size_t max_size) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    INFERX_CHECK(seq.str().empty() || static_cast<uint64_t>(n) <= max_size / seq.str().size(),
                 "string repetition result too large");
    // By doubling: 'x' * 60000000 in ~26 appends, not 60 million.
    const size_t total = seq.str().size() * static_cast<size_t>(n);
    std::string out = n > 0 ? seq.str() : std::string();
    out.reserve(total);
    while (!out.empty() && out.size() * 2 <= total) out += out;
    out.append(out.data(), total - out.size());
    return Value(std::move(out));
  }
  INFERX_CHECK(seq.items().empty() || static_cast<uint64_t>(n) <= (max_size / 16) / seq.items().size(),
               "list repetition result too large");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.kind() == Kind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b, size_t max_size) {
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && a.kind() != Kind::Float && b.kind() != Kind::Float;
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) fail("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.number() + b.number());
    if (a.is_string() && b.is_string()) {
      INFERX_CHECK(a.str().size() + b.str().size() <= max_size, "string too large");
      return Value(a.str() + b.str());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      INFERX_CHECK(a.items().size() + b.items().size() <= max_size / 16, "list too large");
      std::vector<Value> out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return a.kind() == Kind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
    if (a.is_string() && !b.is_undefined())
      fail("can only concatenate str (not \"{}\") to str", b.type_name());
    if (a.is_undefined() || b.is_undefined())
      fail("{}", a.is_undefined() && !a.str().empty() ? a.str()
                 : b.str().empty()                    ? "value is undefined"
                                                      : b.str());
    unsupported(op, a, b);
  }
  if (a.is_undefined() || b.is_undefined())
    fail("{}", a.is_undefined() && !a.str().empty() ? a.str()
               : b.str().empty()                    ? "value is undefined"
                                                    : b.str());
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) fail("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.number() - b.number());
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) fail("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.number() * b.number());
    if ((a.is_string() || a.is_sequence()) && (b.kind() == Kind::Int || b.kind() == Kind::Bool))
      return repeat(a, b.as_int(), max_size);
    if ((b.is_string() || b.is_sequence()) && (a.kind() == Kind::Int || a.kind() == Kind::Bool))
      return repeat(b, a.as_int(), max_size);
    unsupported(op, a, b);
  }
  if (op == "/") {
    if (!nums) unsupported(op, a, b);
    if (b.number() == 0) fail("division by zero");
    return Value(a.number() / b.number());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value(python_percent_format(a.str(), b));
    if (!nums) unsupported(op, a, b);
    if (b.number() == 0) fail("{} by zero", op == "%" ? "modulo" : "integer division or modulo");
    if (ints) {
      if (a.as_int() == INT64_MIN && b.as_int() == -1) fail("integer overflow");
      int64_t q = floordiv(a.as_int(), b.as_int());
      return op == "//" ? Value(q) : Value(a.as_int() - q * b.as_int());
    }
    double x = a.number(), y = b.number();
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    if (op == "%") return Value(m);
    return Value(std::floor((x - m) / y));
  }
  if (op == "**") {
    if (!nums) unsupported(op, a, b);
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), r = 1;
      for (int64_t e = b.as_int(); e > 0; --e) {
        if (__builtin_mul_overflow(r, base, &r)) fail("integer overflow");
        if (r == 0 || r == 1) break;
        if (r == -1) {
          r = (e % 2 == 1) ? -1 : 1;
          break;
        }
      }
      return Value(r);
    }
    if (a.number() == 0 && b.number() < 0) fail("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.number(), b.number()));
  }
  fail("unknown operator {}", op);
}

Value python_slice(const Value& v, const Value* start, const Value* stop, const Value* step) {
  auto as_index = [](const Value* x) -> std::optional<int64_t> {
    if (x == nullptr || x->is_none()) return std::nullopt;
    if (x->kind() != Kind::Int && x->kind() != Kind::Bool)
      fail("slice indices must be integers or None, not {}", x->type_name());
    return x->as_int();
  };
  if (!v.is_string() && !v.is_sequence()) fail("'{}' object is not subscriptable", v.type_name());
  std::vector<uint32_t> cps;
  int64_t n;
  if (v.is_string()) {
    cps = utf8_decode(v.str());
    n = static_cast<int64_t>(cps.size());
  } else {
    n = static_cast<int64_t>(v.items().size());
  }
  int64_t st = as_index(step).value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t i = *x;
    if (i < 0) i = std::max<int64_t>(i + n, st < 0 ? -1 : 0);
    if (i > n) i = st < 0 ? n - 1 : n;
    if (st < 0 && i >= n) i = n - 1;
    return i;
  };
  int64_t b = clamp(as_index(start), st > 0 ? 0 : n - 1);
  int64_t e = clamp(as_index(stop), st > 0 ? n : -1);
  std::vector<size_t> idx;
  if (st > 0)
    for (int64_t i = b; i < e; i += st) idx.push_back(static_cast<size_t>(i));
  else
    for (int64_t i = b; i > e; i += st) idx.push_back(static_cast<size_t>(i));
  if (v.is_string()) {
    std::string out;
    for (size_t i : idx) utf8_append(out, cps[i]);
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (size_t i : idx) out.push_back(v.items()[i]);
  return v.kind() == Kind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

namespace {

// One conversion's flags, width and precision (-1: none) of printf-style formatting.
struct PercentSpec {
  bool left = false, plus = false, space = false, alt = false, zero = false;
  int64_t width = 0, precision = -1;
};

// Widths and precisions past this are refused: the C library would build (and glibc allocate) them whole.
constexpr int64_t kMaxPercentField = int64_t{1} << 20;

int64_t field_number(const std::string& fmt, size_t& j) {
  int64_t n = 0;
  for (; j < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[j])); ++j) {
    n = n * 10 + (fmt[j] - '0');
    INFERX_CHECK(n <= kMaxPercentField, "format width or precision too large (at most {})", kMaxPercentField);
  }
  return n;
}

// Python pads to the width in characters: spaces before (or after, with '-'), or zeros between the sign /
// base prefix and the digits with '0' (numbers only).
std::string pad_field(const std::string& prefix, const std::string& body, const PercentSpec& sp,
                      bool number) {
  const size_t n = utf8_length(prefix) + utf8_length(body);
  if (sp.width <= static_cast<int64_t>(n)) return prefix + body;
  const size_t fill = static_cast<size_t>(sp.width) - n;
  if (sp.left) return prefix + body + std::string(fill, ' ');
  if (sp.zero && number) return prefix + std::string(fill, '0') + body;
  return std::string(fill, ' ') + prefix + body;
}

std::string format_int(long long x, char conv, const PercentSpec& sp) {
  const unsigned long long mag =
      x < 0 ? 0ULL - static_cast<unsigned long long>(x) : static_cast<unsigned long long>(x);
  char buf[32];
  std::snprintf(buf, sizeof buf,
                conv == 'x'   ? "%llx"
                : conv == 'X' ? "%llX"
                : conv == 'o' ? "%llo"
                              : "%llu",
                mag);
  std::string digits = buf;
  if (sp.precision > static_cast<int64_t>(digits.size()))
    digits.insert(0, static_cast<size_t>(sp.precision) - digits.size(), '0');
  std::string prefix = x < 0 ? "-" : sp.plus ? "+" : sp.space ? " " : "";
  if (sp.alt) prefix += conv == 'x' ? "0x" : conv == 'X' ? "0X" : conv == 'o' ? "0o" : "";
  return pad_field(prefix, digits, sp, true);
}

std::string format_float(double x, char conv, const PercentSpec& sp) {
  std::string spec = "%";
  if (sp.left) spec += '-';
  if (sp.plus) spec += '+';
  if (sp.space) spec += ' ';
  if (sp.alt) spec += '#';
  if (sp.zero) spec += '0';
  if (sp.width > 0) spec += std::to_string(sp.width);
  spec += '.' + std::to_string(sp.precision >= 0 ? sp.precision : 6);
  spec += conv;
  const int n = std::snprintf(nullptr, 0, spec.c_str(), x);
  INFERX_CHECK(n >= 0, "cannot format {} with %{}", x, conv);
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, spec.c_str(), x);
  return out;
}

std::string format_str(const std::string& s, const PercentSpec& sp) {
  if (sp.precision < 0) return pad_field("", s, sp, false);
  auto cps = utf8_decode(s);
  return pad_field("", utf8_encode(cps, 0, std::min(cps.size(), static_cast<size_t>(sp.precision))), sp,
                   false);
}

}  // namespace

std::string python_percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> values = args.kind() == Kind::Tuple ? args.items() : std::vector<Value>{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    INFERX_CHECK(i + 1 < fmt.size(), "incomplete format");
    size_t j = i + 1;
    PercentSpec sp;
    for (; j < fmt.size() && std::string_view("-+ #0").find(fmt[j]) != std::string_view::npos; ++j) {
      sp.left |= fmt[j] == '-';
      sp.plus |= fmt[j] == '+';
      sp.space |= fmt[j] == ' ';
      sp.alt |= fmt[j] == '#';
      sp.zero |= fmt[j] == '0';
    }
    sp.width = field_number(fmt, j);
    if (j < fmt.size() && fmt[j] == '.') {
      ++j;
      sp.precision = field_number(fmt, j);
    }
    INFERX_CHECK(j < fmt.size(), "incomplete format");
    char conv = fmt[j];
    i = j;
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    INFERX_CHECK(next < values.size(), "not enough arguments for format string");
    const Value& v = values[next++];
    switch (conv) {
      case 's':
      case 'r':
        out += format_str(conv == 's' ? v.to_string() : v.repr(), sp);
        break;
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        INFERX_CHECK(v.is_number(), "%{} format: a real number is required, not {}", conv, v.type_name());
        // Python: %x / %X / %o take integers only (bool included); %d / %i / %u truncate floats.
        INFERX_CHECK(v.kind() != Kind::Float || conv == 'd' || conv == 'i' || conv == 'u',
                     "%{} format: an integer is required, not float", conv);
        const double f = v.number();
        INFERX_CHECK(v.kind() != Kind::Float || (std::isfinite(f) && std::fabs(f) < 9.2e18),
                     "cannot convert float {} to integer", f);
        const long long x = v.kind() == Kind::Float ? static_cast<long long>(f) : v.as_int();
        out += format_int(x, conv == 'i' || conv == 'u' ? 'd' : conv, sp);
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        INFERX_CHECK(v.is_number(), "must be real number, not {}", v.type_name());
        out += format_float(v.number(), conv, sp);
        break;
      default:
        fail("unsupported format character '{}'", conv);
    }
    StringBudget::check_size(out.size(), "% formatting");
  }
  INFERX_CHECK(next >= values.size() || args.kind() != Kind::Tuple,
               "not all arguments converted during string formatting");
  return out;
}

}  // namespace inferx::jinja
