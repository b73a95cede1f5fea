#pragma once
// The fuzzers' own UTF-8 check: an oracle written apart from text/unicode.h, so that a bug there cannot
// hide itself in the tokenizer fuzzers' invariants.
#include <cstddef>
#include <cstdint>
#include <string>

namespace fuzz {

// True when s is well-formed UTF-8 (Unicode 15 table 3-7).
inline bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
      n = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 3;
      lo = b == 0xE0 ? 0xA0 : 0x80;
      hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 4;
      lo = b == 0xF0 ? 0x90 : 0x80;
      hi = b == 0xF4 ? 0x8F : 0xBF;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return false;
    }
    i += n;
  }
  return true;
}

// True when JSON text `s` is Unicode as nlohmann's parser wants it: well-formed UTF-8, and no \uD800-\uDFFF
// escape (JSON's grammar allows a lone surrogate, nlohmann refuses it).
inline bool json_text_is_unicode(const std::string& s) {
  for (size_t i = 0; i + 3 < s.size(); ++i)
    if (s[i] == '\\' && s[i + 1] == 'u' && (s[i + 2] == 'd' || s[i + 2] == 'D') &&
        std::string("89abcdefABCDEF").find(s[i + 3]) != std::string::npos)
      return false;
  return valid_utf8(s);
}

}  // namespace fuzz
