// Streaming detokenization: emits only complete UTF-8 characters and replaces ill-formed bytes with
// U+FFFD using the Unicode "maximal subpart" practice (Unicode 15, section 3.9, "U+FFFD Substitution of
// Maximal Subparts"; also what WHATWG's UTF-8 decoder and Python's errors="replace" do). Because that
// practice decides left to right and never looks past the first byte that breaks a sequence, holding back
// a trailing prefix that may still complete gives the same output as sanitising the whole text at once.
#include <string_view>
#include <utility>

#include "text/tokenizer.h"

namespace inferx {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Well-formed UTF-8 byte sequences (Unicode 15, table 3-7): the lead byte fixes the length and the range
// of the second byte (which excludes overlongs, surrogates and code points past U+10FFFF).
struct LeadInfo {
  int length;  // 0: the byte cannot start a sequence
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};  // continuation bytes and the overlong leads C0, C1
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing past U+10FFFF
  return {0, 0, 0};
}

// Appends to `out` every character of `bytes` that is decided, and returns how many bytes at the end
// were held back because they are a well-formed prefix that more bytes could complete. With
// `final` set nothing is held: an incomplete tail becomes one U+FFFD.
size_t sanitize_utf8(std::string_view bytes, bool final, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<uint8_t>(bytes[i]);
    const LeadInfo info = lead_info(lead);
    if (info.length == 1) {
      out.push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    if (info.length == 0) {
      out.append(kReplacement);
      ++i;
      continue;
    }
    // Count how many bytes of the announced sequence are valid (the maximal subpart).
    size_t valid = 1;
    while (valid < static_cast<size_t>(info.length) && i + valid < bytes.size()) {
      const auto b = static_cast<uint8_t>(bytes[i + valid]);
      const bool ok = valid == 1 ? (b >= info.second_lo && b <= info.second_hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++valid;
    }
    if (valid == static_cast<size_t>(info.length)) {
      out.append(bytes.substr(i, valid));
    } else if (i + valid == bytes.size() && !final) {
      return valid;  // may still complete: hold
    } else {
      out.append(kReplacement);  // one U+FFFD for the maximal subpart
    }
    i += valid;
  }
  return 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  std::string bytes = tokenizer_.token_bytes(id);  // throws for an id out of range
  if (bytes.empty()) {
    // Control tokens have no bytes; without skip_special they are shown as their piece ("</s>") and, like
    // BOS in decode(), do not end the "start of text" state that strips the dummy space prefix.
    if (skip_special_ || tokenizer_.token_type(id) != TokenType::Control) return {};
    bytes = tokenizer_.piece(id);
  } else if (first_) {
    // The first piece of text follows the tokenizer's own leading-space rule (SentencePiece's dummy
    // prefix, HF's Strip decoder): when decode() of this token alone drops the leading space, so does the
    // stream. Only that rule is taken from decode(), which would turn a first token holding part of a
    // multi-byte character into U+FFFD; the bytes themselves stay raw so they can still be completed.
    if (bytes[0] == ' ') {
      const std::string alone = tokenizer_.decode({id});
      if (std::string_view(alone) == std::string_view(bytes).substr(1)) bytes.erase(0, 1);
    }
    first_ = false;
  }
  pending_ += bytes;
  std::string out;
  const size_t held = sanitize_utf8(pending_, /*final=*/false, out);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  sanitize_utf8(pending_, /*final=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace inferx
