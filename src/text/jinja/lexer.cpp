// Jinja2 lexing as jinja2/lexer.py does it (Lexer.tokeniter and the root/block/variable/comment/raw
// rules), rewritten as a hand scanner. Token grammar: names [A-Za-z_][A-Za-z0-9_]*, integers with
// optional 0b/0o/0x prefixes and `_` separators, floats needing digits on both sides of the dot or an
// exponent, single/double quoted strings with Python escapes (decoded like "unicode-escape").
#include "text/jinja/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "text/unicode.h"

namespace inferx::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name, const LexOptions& opt) : name_(name), opt_(opt) {
    // Normalize \r\n and \r to \n, then drop one trailing newline (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    bool line_starting = true;
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, (tag == std::string::npos ? src_.size() : tag) - pos);
      if (tag == std::string::npos) {
        emit_data(text, pos);
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      size_t raw_end = kind == '%' ? match_raw_begin(tag) : std::string::npos;
      strip_before(text, sign, kind != '{', line_starting);
      emit_data(text, pos);
      size_t body = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (raw_end != std::string::npos) {
        pos = lex_raw(raw_end, line_starting);
      } else if (kind == '#') {
        pos = lex_comment(tag, body, line_starting);
      } else {
        push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, src_.substr(tag, 2), tag);
        pos = lex_expression(body, kind == '{', line_starting);
      }
    }
    push(Tok::Eof, "", src_.size());
    return std::move(toks_);
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& msg) const {
    auto [line, col] = where(at);
    fail("{}:{}:{}: {}", name_, line, col, msg);
  }

  std::pair<int, int> where(size_t at) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(at - line_starts_[line - 1] + 1)};
  }

  void push(Tok t, std::string text, size_t at) {
    Token tok{t, std::move(text)};
    std::tie(tok.line, tok.col) = where(at);
    toks_.push_back(std::move(tok));
  }

  void emit_data(const std::string& text, size_t at) {
    if (!text.empty()) push(Tok::Data, text, at);
  }

  size_t find_tag(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  // The whitespace rules applied to the text before a tag (Lexer.tokeniter, OptionalLStrip).
  void strip_before(std::string& text, char sign, bool lstrip_tag, bool line_starting) const {
    if (sign == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (sign != '+' && opt_.lstrip_blocks && lstrip_tag) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if (l_pos > 0 || line_starting) {
        bool all_ws = l_pos < text.size();
        for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_space(text[i]);
        if (all_ws) text.resize(l_pos);
      }
    }
  }

  // Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at `tag`; returns the position after it, or npos.
  size_t match_raw_begin(size_t tag) const {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return std::string::npos;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && is_space(src_[p])) ++p;
      return p;
    }
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  // Block end: `+%}`, `-%}\s*`, or `%}` plus one newline under trim_blocks. Returns the end, or npos.
  size_t match_block_end(size_t p, bool& line_starting) const {
    size_t e;
    if (src_.compare(p, 3, "+%}") == 0) {
      e = p + 3;
    } else if (src_.compare(p, 3, "-%}") == 0) {
      e = p + 3;
      while (e < src_.size() && is_space(src_[e])) ++e;
    } else if (src_.compare(p, 2, "%}") == 0) {
      e = p + 2;
      if (opt_.trim_blocks && e < src_.size() && src_[e] == '\n') ++e;
    } else {
      return std::string::npos;
    }
    line_starting = src_[e - 1] == '\n';
    return e;
  }

  size_t lex_raw(size_t p, bool& line_starting) {
    line_starting = src_[p - 1] == '\n';
    for (size_t i = src_.find("{%", p); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t q = i + 2;
      char sign = q < src_.size() ? src_[q] : '\0';
      if (sign == '-' || sign == '+') ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      size_t e = match_block_end(q, line_starting);
      if (e == std::string::npos) continue;
      std::string text = src_.substr(p, i - p);
      strip_before(text, sign, true, src_[p - 1] == '\n');
      emit_data(text, p);
      return e;
    }
    error(p, "Missing end of raw directive");
  }

  size_t lex_comment(size_t tag, size_t body, bool& line_starting) {
    size_t j = src_.find("#}", body);
    if (j == std::string::npos) error(tag, "Missing end of comment tag");
    size_t e = j + 2;
    char before = j > body ? src_[j - 1] : '\0';
    if (before == '-') {
      while (e < src_.size() && is_space(src_[e])) ++e;
    } else if (before != '+' && opt_.trim_blocks && e < src_.size() && src_[e] == '\n') {
      ++e;
    }
    line_starting = src_[e - 1] == '\n';
    return e;
  }

  size_t lex_expression(size_t p, bool variable, bool& line_starting) {
    std::vector<char> balance;
    while (true) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size())
        error(p, variable ? "unexpected end of template, expected '}}'"
                          : "unexpected end of template, expected '%}'");
      if (balance.empty()) {
        if (variable) {
          if (src_.compare(p, 3, "-}}") == 0 || src_.compare(p, 2, "}}") == 0) {
            size_t e = p + (src_[p] == '-' ? 3 : 2);
            if (src_[p] == '-')
              while (e < src_.size() && is_space(src_[e])) ++e;
            push(Tok::VarEnd, "}}", p);
            line_starting = src_[e - 1] == '\n';
            return e;
          }
        } else if (size_t e = match_block_end(p, line_starting); e != std::string::npos) {
          push(Tok::BlockEnd, "%}", p);
          return e;
        }
      }
      char c = src_[p];
      if (is_digit(c)) {
        p = lex_number(p);
      } else if (is_name_start(c)) {
        size_t e = p;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        push(Tok::Name, src_.substr(p, e - p), p);
        p = e;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (src_.compare(p, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (op == nullptr) error(p, fmt::format("unexpected char '{}'", c));
        std::string s(op);
        if (s == "(" || s == "[" || s == "{") {
          balance.push_back(s == "(" ? ')' : s == "[" ? ']' : '}');
        } else if (s == ")" || s == "]" || s == "}") {
          if (balance.empty()) error(p, fmt::format("unexpected '{}'", s));
          if (balance.back() != s[0])
            error(p, fmt::format("unexpected '{}', expected '{}'", s, balance.back()));
          balance.pop_back();
        }
        push(Tok::Op, s, p);
        p += s.size();
      }
    }
  }

  size_t lex_number(size_t p) {
    auto digits = [&](size_t q, auto pred) {  // (\d+_)*\d+ style runs
      size_t e = q;
      while (e < src_.size() &&
             (pred(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && pred(src_[e + 1]) && e > q)))
        ++e;
      return e;
    };
    auto dec = [](char ch) { return is_digit(ch); };
    if (src_[p] == '0' && p + 1 < src_.size() && std::strchr("xXoObB", src_[p + 1]) != nullptr &&
        src_[p + 1] != 0)
      return lex_prefixed_int(p);
    size_t e = digits(p, dec);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1]) && (p == 0 || src_[p - 1] != '.')) {
      e = digits(e + 1, dec);
      is_float = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        e = digits(q, dec);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = p; i < e; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    if (is_float) {
      Token t{Tok::Float, src_.substr(p, e - p)};
      std::tie(t.line, t.col) = where(p);
      t.float_value = std::strtod(text.c_str(), nullptr);
      toks_.push_back(t);
      return e;
    }
    if (text.size() > 1 && text[0] == '0') {
      for (char ch : text)
        if (ch != '0') error(p, "leading zeros in decimal integer literals are not permitted");
    }
    return push_int(p, e, text, 10);
  }

  // 0x.., 0o.., 0b.. integer literals (underscores allowed between digits).
  size_t lex_prefixed_int(size_t p) {
    char b = static_cast<char>(src_[p + 1] | 0x20);
    int base = b == 'x' ? 16 : b == 'o' ? 8 : 2;
    auto ok = [base](char ch) {
      ch = static_cast<char>(ch | 0x20);
      return base == 16 ? (is_digit(ch) || (ch >= 'a' && ch <= 'f')) : (ch >= '0' && ch < '0' + base);
    };
    size_t e = p + 2;
    while (e < src_.size() && (ok(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && ok(src_[e + 1]))))
      ++e;
    std::string text;
    for (size_t i = p + 2; i < e; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    if (text.empty()) error(p, "invalid integer literal");
    return push_int(p, e, text, base);
  }

  size_t push_int(size_t p, size_t e, const std::string& text, int base) {
    errno = 0;
    char* endp = nullptr;
    unsigned long long v = std::strtoull(text.c_str(), &endp, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
      error(p, "integer literal too large");
    Token t{Tok::Integer, src_.substr(p, e - p)};
    std::tie(t.line, t.col) = where(p);
    t.int_value = static_cast<int64_t>(v);
    toks_.push_back(t);
    return e;
  }

  static int hexval(char c) {
    if (is_digit(c)) return c - '0';
    c = static_cast<char>(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  }

  size_t lex_string(size_t p) {
    char q = src_[p];
    size_t i = p + 1;
    std::string out;
    while (true) {
      if (i >= src_.size()) error(p, "unexpected end of string");  // jinja2 reports it as an unexpected char
      char c = src_[i];
      if (c == q) break;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) error(p, "unexpected end of string");
      char n = src_[i + 1];
      i += 2;
      switch (n) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          int width = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < width; ++k) {
            int h = i < src_.size() ? hexval(src_[i]) : -1;
            if (h < 0) error(i, fmt::format("truncated \\{} escape in string", n));
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++i;
          }
          if (cp > 0x10FFFF) error(i, "illegal Unicode character in string escape");
          append_utf8(out, cp);
          break;
        }
        default:
          if (n >= '0' && n <= '7') {
            uint32_t cp = static_cast<uint32_t>(n - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
              cp = cp * 8 + static_cast<uint32_t>(src_[i] - '0');
            append_utf8(out, cp);
          } else {
            out.push_back('\\');  // unknown escapes stay as written, like Python
            out.push_back(n);
          }
      }
    }
    Token t{Tok::String, std::move(out)};
    std::tie(t.line, t.col) = where(p);
    toks_.push_back(std::move(t));
    return i + 1;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    unicode::append_utf8(static_cast<char32_t>(cp), out);
  }

  std::string src_;
  const std::string& name_;
  LexOptions opt_;
  std::vector<size_t> line_starts_;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& name, const LexOptions& opt) {
  return Lexer(source, name, opt).run();
}

}  // namespace inferx::jinja
