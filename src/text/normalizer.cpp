// Normalizers (see normalizer.h).
#include "text/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "text/pre_tokenizer.h"
#include "text/unicode.h"

namespace inferx {

struct Normalizer::Step {
  enum class Kind { Unicode, Lowercase, Prepend, Replace, Strip } kind = Kind::Unicode;
  int utf8proc_options = 0;      // Unicode: the normal form
  std::string text;              // Prepend: the prefix; Replace: the content
  std::string literal;           // Replace with a String pattern
  std::unique_ptr<Regex> regex;  // Replace with a Regex pattern
  bool strip_left = false, strip_right = false;
};

Normalizer::Normalizer() = default;
Normalizer::~Normalizer() = default;
Normalizer::Normalizer(Normalizer&&) noexcept = default;
Normalizer& Normalizer::operator=(Normalizer&&) noexcept = default;

Normalizer Normalizer::from_json(const nlohmann::json& j, const std::string& source) {
  Normalizer n;
  if (j.is_null()) return n;
  const auto add = [&](const nlohmann::json& node, auto&& self) -> void {
    INFERX_CHECK(node.is_object() && node.contains("type"),
                 "{}: normalizer entry must be an object with a type", source);
    const std::string type = node["type"].get<std::string>();
    auto step = std::make_unique<Step>();
    if (type == "Sequence") {
      for (const auto& child : node.value("normalizers", nlohmann::json::array())) self(child, self);
      return;
    } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      step->utf8proc_options = UTF8PROC_STABLE | (type[2] == 'K' ? UTF8PROC_COMPAT : 0) |
                               (type.back() == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE);
    } else if (type == "Lowercase") {
      step->kind = Step::Kind::Lowercase;
    } else if (type == "Prepend") {
      step->kind = Step::Kind::Prepend;
      step->text = node.value("prepend", std::string());
    } else if (type == "Replace") {
      step->kind = Step::Kind::Replace;
      step->text = node.value("content", std::string());
      const auto& pattern = node.value("pattern", nlohmann::json());
      if (pattern.contains("String")) {
        step->literal = pattern["String"].get<std::string>();
        INFERX_CHECK(!step->literal.empty(), "{}: normalizer Replace has an empty pattern", source);
      } else if (pattern.contains("Regex")) {
        step->regex =
            std::make_unique<Regex>(pattern["Regex"].get<std::string>(), source + ": normalizer Replace");
      } else {
        fail("{}: normalizer Replace needs a pattern {{\"String\": ...}} or {{\"Regex\": ...}}", source);
      }
    } else if (type == "Strip") {
      step->kind = Step::Kind::Strip;
      step->strip_left = node.value("strip_left", true);
      step->strip_right = node.value("strip_right", true);
    } else {
      fail(
          "{}: normalizer type '{}' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, "
          "Prepend, Replace, Strip)",
          source, type);
    }
    n.steps_.push_back(std::move(step));
  };
  add(j, add);
  return n;
}

namespace {

std::string unicode_normalize(std::string_view s, int options) {
  // ASCII is invariant under every normal form.
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &result, static_cast<utf8proc_option_t>(options));
  if (n < 0) fail("Unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
  std::free(result);
  return out;
}

}  // namespace

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const auto& step : steps_) {
    switch (step->kind) {
      case Step::Kind::Unicode:
        s = unicode_normalize(s, step->utf8proc_options);
        break;
      case Step::Kind::Lowercase: {
        std::string out;
        out.reserve(s.size());
        for (size_t pos = 0; pos < s.size();) {
          const char32_t c = unicode::next_code_point(s, pos);
          unicode::append_utf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))),
                               out);
        }
        s.swap(out);
        break;
      }
      case Step::Kind::Prepend:
        if (!s.empty()) s.insert(0, step->text);  // tokenizers prepends only to non-empty text
        break;
      case Step::Kind::Replace: {
        std::string out;
        out.reserve(s.size());
        size_t pos = 0;
        while (pos <= s.size()) {
          size_t b = 0, e = 0;
          bool found = false;
          if (step->regex) {
            found = step->regex->find(s, pos, b, e) && e > b;
          } else {
            b = s.find(step->literal, pos);
            found = b != std::string::npos;
            e = b + step->literal.size();
          }
          if (!found) break;
          out.append(s, pos, b - pos);
          out.append(step->text);
          pos = e;
        }
        if (pos < s.size()) out.append(s, pos, std::string::npos);
        s.swap(out);
        break;
      }
      case Step::Kind::Strip: {
        size_t b = 0, e = s.size();
        if (step->strip_left) {
          for (size_t pos = 0; pos < s.size();) {
            if (!unicode::is_whitespace(unicode::next_code_point(s, pos))) break;
            b = pos;
          }
        }
        if (step->strip_right) {
          // Walk back over whole characters.
          while (e > b) {
            size_t start = e - 1;
            while (start > b && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
            size_t pos = start;
            if (!unicode::is_whitespace(unicode::next_code_point(s, pos))) break;
            e = start;
          }
        }
        s = s.substr(b, e - b);
        break;
      }
    }
  }
  return s;
}

}  // namespace inferx
