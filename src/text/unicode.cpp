// UTF-8 decoding and Unicode character properties (see unicode.h).
#include "text/unicode.h"

#include <utf8proc.h>

namespace inferx::unicode {

size_t sequence_length(std::string_view s, size_t pos) {
  const auto b = static_cast<uint8_t>(s[pos]);
  if (b < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b < 0xC2 || b > 0xF4) return 0;  // continuation bytes, overlong leads C0/C1, F5..FF
  if (b < 0xE0) {
    n = 2;
  } else if (b < 0xF0) {
    n = 3;
    lo = b == 0xE0 ? 0xA0 : 0x80;  // no overlongs
    hi = b == 0xED ? 0x9F : 0xBF;  // no surrogates
  } else {
    n = 4;
    lo = b == 0xF0 ? 0x90 : 0x80;
    hi = b == 0xF4 ? 0x8F : 0xBF;  // nothing past U+10FFFF
  }
  if (s.size() - pos < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<uint8_t>(s[pos + k]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
  }
  return n;
}

char32_t next_code_point(std::string_view s, size_t& pos) {
  const auto b = static_cast<uint8_t>(s[pos]);
  if (b < 0x80) {
    ++pos;
    return b;
  }
  const size_t n = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  char32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + k]) & 0x3F);
  pos += n;
  return cp;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = sequence_length(s, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const size_t n = sequence_length(s, pos);
    if (n > 0) {
      out.append(s.substr(pos, n));
      pos += n;
      continue;
    }
    // Ill-formed: the maximal subpart is the lead byte plus the continuation bytes that were still
    // valid for it (at least one byte); it becomes one U+FFFD.
    const auto b = static_cast<uint8_t>(s[pos]);
    size_t len = 1;
    if (b >= 0xC2 && b <= 0xF4) {
      const size_t want = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      const uint8_t lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
      const uint8_t hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
      while (len < want && pos + len < s.size()) {
        const auto c = static_cast<uint8_t>(s[pos + len]);
        if (c < (len == 1 ? lo : 0x80) || c > (len == 1 ? hi : 0xBF)) break;
        ++len;
      }
    }
    out.append("\xEF\xBF\xBD");
    pos += len;
  }
  return out;
}

namespace {
utf8proc_category_t category(char32_t c) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}
}  // namespace

bool is_whitespace(char32_t c) {
  // The White_Space property list (Unicode PropList.txt); utf8proc has no direct accessor for it.
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_numeric(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool is_alphanumeric(char32_t c) {
  const auto k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || is_numeric(c);
}

bool is_punctuation(char32_t c) {
  if (c < 0x80)
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

}  // namespace inferx::unicode
