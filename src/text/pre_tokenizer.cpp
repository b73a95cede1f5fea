// Pre-tokenizers of Hugging Face tokenizers (see pre_tokenizer.h), on PCRE2 with JIT.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pre_tokenizer.h"

#include <pcre2.h>

#include <algorithm>

#include "core/error.h"
#include "text/unicode.h"

namespace inferx {

// ---------------------------------------------------------------------------------------------- Regex

namespace {

// Per-thread match state: PCRE2 needs match data and, for JIT, a stack. The default 32 KiB JIT stack is
// too small for patterns such as \s+(?!\S) over long whitespace runs, so each thread gets up to 8 MiB.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view what) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("{}: regular expression '{}' does not compile at offset {}: {}", what, pattern, offset,
         reinterpret_cast<const char*>(message));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::find(std::string_view subject, size_t start, size_t& begin, size_t& end) const {
  MatchState& st = match_state();
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const int rc = jit_ ? pcre2_jit_match(code, s, subject.size(), start, 0, st.data, st.context)
                      : pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    fail("regular expression match failed: {}", reinterpret_cast<const char*>(message));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  begin = ov[0];
  end = ov[1];
  return true;
}

// ------------------------------------------------------------------------------------ byte-to-unicode

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      unicode::append_utf8(printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++), t[b]);
    }
    return t;
  }();
  return table;
}

namespace {
// Code point -> byte for the 256 chars of the table; -1 elsewhere. The chars are all below U+0144.
const std::array<int16_t, 0x144>& unicode_to_byte() {
  static const std::array<int16_t, 0x144> table = [] {
    std::array<int16_t, 0x144> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) {
      size_t pos = 0;
      t[unicode::next_code_point(byte_to_unicode()[b], pos)] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}
}  // namespace

bool byte_level_decode(std::string_view mapped, std::string& out) {
  const auto& table = unicode_to_byte();
  for (size_t pos = 0; pos < mapped.size();) {
    if (unicode::sequence_length(mapped, pos) == 0) return false;
    const char32_t cp = unicode::next_code_point(mapped, pos);
    if (cp >= table.size() || table[cp] < 0) return false;
    out.push_back(static_cast<char>(table[cp]));
  }
  return true;
}

// ------------------------------------------------------------------------------------------ the steps

namespace {

// tokenizers' SplitDelimiterBehavior (tokenizers/src/tokenizer/normalizer.rs).
enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
enum class CharClass { Numeric, Punctuation, Whitespace };
enum class Prepend { Always, First, Never };

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Part {
  uint32_t begin, end;
  bool match;
};

bool char_in_class(char32_t c, CharClass k) {
  switch (k) {
    case CharClass::Numeric:
      return unicode::is_numeric(c);
    case CharClass::Punctuation:
      return unicode::is_punctuation(c);
    case CharClass::Whitespace:
      return unicode::is_whitespace(c);
  }
  return false;
}

Behavior parse_behavior(const nlohmann::json& j, const std::string& source) {
  const std::string b = j.is_string() ? j.get<std::string>() : std::string("Isolated");
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail(
      "{}: pre_tokenizer split behavior '{}' is not one of Removed, Isolated, MergedWithPrevious, "
      "MergedWithNext, Contiguous",
      source, b);
}

// Escapes a literal for use inside a PCRE2 pattern (Split with a String pattern matches it verbatim).
std::string quote_literal(std::string_view s) {
  std::string out = "\\Q";
  for (size_t pos = 0;;) {
    const size_t hit = s.find("\\E", pos);
    if (hit == std::string_view::npos) {
      out.append(s.substr(pos));
      break;
    }
    out.append(s.substr(pos, hit - pos));
    out.append("\\E\\\\E\\Q");
    pos = hit + 2;
  }
  return out + "\\E";
}

}  // namespace

struct PreTokenizer::Step {
  enum class Kind { Split, Chars, ByteLevel, Metaspace } kind = Kind::Split;
  std::unique_ptr<Regex> regex;  // Split; ByteLevel with use_regex
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  CharClass chars = CharClass::Numeric;
  bool add_prefix_space = false;      // ByteLevel
  std::string replacement;            // Metaspace
  Prepend prepend = Prepend::Always;  // Metaspace
  bool metaspace_split = true;        // Metaspace
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

namespace {

// Collects the match/non-match parts of [b, e) for one splitting step (tokenizers' Pattern::find_matches
// for a regex or a char predicate: every matching char is its own part, non-matches are grouped).
void find_parts(const PreTokenizer::Step& step, std::string_view text, uint32_t b, uint32_t e,
                std::vector<Part>& parts) {
  parts.clear();
  const std::string_view sub = text.substr(b, e - b);
  uint32_t prev = 0;
  if (step.regex) {
    size_t pos = 0, mb = 0, me = 0;
    while (pos <= sub.size() && step.regex->find(sub, pos, mb, me)) {
      if (prev != mb) parts.push_back({b + prev, b + static_cast<uint32_t>(mb), false});
      parts.push_back({b + static_cast<uint32_t>(mb), b + static_cast<uint32_t>(me), true});
      prev = static_cast<uint32_t>(me);
      if (me == mb) {  // an empty match: step over one character, as find_iter does
        if (me >= sub.size()) break;
        pos = me + std::max<size_t>(1, unicode::sequence_length(sub, me));
      } else {
        pos = me;
      }
    }
  } else {
    for (size_t pos = 0; pos < sub.size();) {
      const size_t start = pos;
      const char32_t c = unicode::next_code_point(sub, pos);
      if (!char_in_class(c, step.chars)) continue;
      if (prev != start) parts.push_back({b + prev, b + static_cast<uint32_t>(start), false});
      parts.push_back({b + static_cast<uint32_t>(start), b + static_cast<uint32_t>(pos), true});
      prev = static_cast<uint32_t>(pos);
    }
  }
  if (prev != sub.size()) parts.push_back({b + prev, e, false});
  if (step.invert)
    for (Part& p : parts) p.match = !p.match;
}

// Applies a split behavior to the parts of one span (tokenizers' NormalizedString::split) and appends
// the non-empty results.
void apply_behavior(Behavior behavior, std::vector<Part>& parts,
                    std::vector<std::pair<uint32_t, uint32_t>>& out) {
  const size_t first = out.size();
  bool previous_match = false;
  switch (behavior) {
    case Behavior::Removed:
      for (const Part& p : parts)
        if (!p.match) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::Isolated:
      for (const Part& p : parts) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::MergedWithPrevious:
      for (const Part& p : parts) {
        if (p.match && !previous_match && out.size() > first) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_match = p.match;
      }
      break;
    case Behavior::MergedWithNext:
      // Walks backwards: a match joins the part after it.
      for (size_t i = parts.size(); i-- > 0;) {
        const Part& p = parts[i];
        if (p.match && !previous_match && out.size() > first) {
          out.back().first = p.begin;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_match = p.match;
      }
      std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
      break;
    case Behavior::Contiguous:
      for (const Part& p : parts) {
        if (p.match == previous_match && out.size() > first) {
          out.back().second = p.end;
        } else {
          out.emplace_back(p.begin, p.end);
        }
        previous_match = p.match;
      }
      break;
  }
  // Drop empty parts of this span only (the vector holds every span so far).
  out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                           [](const auto& s) { return s.first == s.second; }),
            out.end());
}

}  // namespace

void PreTokenizer::split(std::string_view text, bool at_start, PreTokenized& out) const {
  out.text.assign(text);
  out.spans.clear();
  if (!text.empty()) out.spans.emplace_back(0, static_cast<uint32_t>(text.size()));
  thread_local std::vector<Part> parts;
  thread_local std::vector<std::pair<uint32_t, uint32_t>> spans;
  thread_local std::string rebuilt;
  bool mapped = false;

  // Rewrites every span through `edit(span_text, index, rebuilt)` into a new text.
  const auto rewrite = [&](auto&& edit) {
    rebuilt.clear();
    spans.clear();
    for (size_t i = 0; i < out.spans.size(); ++i) {
      const auto [b, e] = out.spans[i];
      const auto start = static_cast<uint32_t>(rebuilt.size());
      edit(std::string_view(out.text).substr(b, e - b), i, rebuilt);
      spans.emplace_back(start, static_cast<uint32_t>(rebuilt.size()));
    }
    out.text.swap(rebuilt);
    out.spans.swap(spans);
  };
  const auto split_all = [&](const Step& step, Behavior behavior) {
    spans.clear();
    for (const auto& [b, e] : out.spans) {
      find_parts(step, out.text, b, e, parts);
      apply_behavior(behavior, parts, spans);
    }
    out.spans.swap(spans);
  };

  for (size_t k = 0; k < steps_.size(); ++k) {
    const Step& step = *steps_[k];
    switch (step.kind) {
      case Step::Kind::Split:
      case Step::Kind::Chars:
        split_all(step, step.behavior);
        break;
      case Step::Kind::ByteLevel:
        if (step.add_prefix_space) {
          rewrite([](std::string_view s, size_t, std::string& dst) {
            if (s.empty() || s[0] != ' ') dst.push_back(' ');
            dst.append(s);
          });
        }
        if (step.regex) split_all(step, Behavior::Isolated);
        if (k == map_from_) {  // later steps see the mapped text, as in tokenizers
          const auto& table = byte_to_unicode();
          rewrite([&](std::string_view s, size_t, std::string& dst) {
            for (char c : s) dst.append(table[static_cast<uint8_t>(c)]);
          });
          mapped = true;
        }
        break;
      case Step::Kind::Metaspace: {
        rewrite([&](std::string_view s, size_t i, std::string& dst) {
          const bool prepend =
              step.prepend == Prepend::Always ||
              (step.prepend == Prepend::First && at_start && i == 0 && out.spans[0].first == 0);
          // Spaces are replaced first, so a leading space already counts as the prefix.
          if (prepend && !s.starts_with(' ') && !s.starts_with(step.replacement))
            dst.append(step.replacement);
          for (char c : s) {
            if (c == ' ') {
              dst.append(step.replacement);
            } else {
              dst.push_back(c);
            }
          }
        });
        if (step.metaspace_split) split_all(step, Behavior::MergedWithNext);
        break;
      }
    }
  }
  if (mapped) {
    rewrite([&](std::string_view s, size_t, std::string& dst) {
      if (!byte_level_decode(s, dst)) dst.append(s);  // cannot happen: every char came from the table
    });
  }
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& source) {
  PreTokenizer p;
  if (j.is_null()) return p;
  std::vector<const nlohmann::json*> flat;
  const auto flatten = [&](const nlohmann::json& node, auto&& self) -> void {
    INFERX_CHECK(node.is_object() && node.contains("type"),
                 "{}: pre_tokenizer entry must be an object with a type", source);
    if (node["type"] == "Sequence") {
      INFERX_CHECK(node.contains("pretokenizers") && node["pretokenizers"].is_array(),
                   "{}: pre_tokenizer Sequence needs a 'pretokenizers' array", source);
      for (const auto& child : node["pretokenizers"]) self(child, self);
    } else {
      flat.push_back(&node);
    }
  };
  flatten(j, flatten);

  const auto add_chars = [&](CharClass c, Behavior b) {
    auto s = std::make_unique<Step>();
    s->kind = Step::Kind::Chars;
    s->chars = c;
    s->behavior = b;
    p.steps_.push_back(std::move(s));
  };
  for (const nlohmann::json* node : flat) {
    const std::string type = (*node)["type"].get<std::string>();
    auto step = std::make_unique<Step>();
    if (type == "Split") {
      const auto& pattern = node->value("pattern", nlohmann::json());
      if (pattern.contains("Regex")) {
        step->regex =
            std::make_unique<Regex>(pattern["Regex"].get<std::string>(), source + ": pre_tokenizer Split");
      } else if (pattern.contains("String")) {
        step->regex = std::make_unique<Regex>(quote_literal(pattern["String"].get<std::string>()),
                                              source + ": pre_tokenizer Split");
      } else {
        fail("{}: pre_tokenizer Split needs a pattern {{\"Regex\": ...}} or {{\"String\": ...}}", source);
      }
      step->behavior = parse_behavior(node->value("behavior", nlohmann::json()), source);
      step->invert = node->value("invert", false);
    } else if (type == "ByteLevel") {
      step->kind = Step::Kind::ByteLevel;
      step->add_prefix_space = node->value("add_prefix_space", true);
      if (node->value("use_regex", true)) step->regex = std::make_unique<Regex>(kGpt2Pattern, source);
      INFERX_CHECK(!p.byte_level_, "{}: pre_tokenizer has two ByteLevel steps", source);
      p.byte_level_ = true;
      if (node != flat.back()) p.map_from_ = p.steps_.size();
    } else if (type == "Digits") {
      add_chars(CharClass::Numeric,
                node->value("individual_digits", false) ? Behavior::Isolated : Behavior::Contiguous);
      continue;
    } else if (type == "Punctuation") {
      add_chars(CharClass::Punctuation, parse_behavior(node->value("behavior", nlohmann::json()), source));
      continue;
    } else if (type == "WhitespaceSplit") {
      add_chars(CharClass::Whitespace, Behavior::Removed);
      continue;
    } else if (type == "BertPreTokenizer") {
      add_chars(CharClass::Whitespace, Behavior::Removed);
      add_chars(CharClass::Punctuation, Behavior::Isolated);
      continue;
    } else if (type == "Whitespace") {
      step->regex = std::make_unique<Regex>(R"(\w+|[^\w\s]+)", source);
      step->behavior = Behavior::Removed;
      step->invert = true;
    } else if (type == "Metaspace") {
      step->kind = Step::Kind::Metaspace;
      step->replacement = node->value("replacement", std::string("\xE2\x96\x81"));
      INFERX_CHECK(!step->replacement.empty(), "{}: pre_tokenizer Metaspace replacement is empty", source);
      std::string scheme = node->value("prepend_scheme", std::string());
      if (scheme.empty()) scheme = node->value("add_prefix_space", true) ? "always" : "never";
      if (scheme == "always") {
        step->prepend = Prepend::Always;
      } else if (scheme == "first") {
        step->prepend = Prepend::First;
      } else if (scheme == "never") {
        step->prepend = Prepend::Never;
      } else {
        fail("{}: pre_tokenizer Metaspace prepend_scheme '{}' is not always, first or never", source, scheme);
      }
      step->metaspace_split = node->value("split", true);
      step->regex = std::make_unique<Regex>(quote_literal(step->replacement), source);
      step->behavior = Behavior::MergedWithNext;
    } else {
      fail(
          "{}: pre_tokenizer type '{}' is not supported (supported: Sequence, Split, ByteLevel, Digits, "
          "Punctuation, Metaspace, Whitespace, WhitespaceSplit, BertPreTokenizer)",
          source, type);
    }
    p.steps_.push_back(std::move(step));
  }
  return p;
}

}  // namespace inferx
