#pragma once
// Pre-tokenization: splitting normalized text into the pieces BPE runs on, as Hugging Face tokenizers'
// pre_tokenizers do (tokenizers/src/pre_tokenizers: Split, ByteLevel, Digits, Punctuation, Metaspace,
// Whitespace, WhitespaceSplit, BertPreTokenizer, Sequence). Regular expressions run on PCRE2 with JIT,
// compiled with UTF and UCP so that \s, \p{L}, \p{N} have their Unicode meaning, as in Oniguruma, the
// engine tokenizers uses.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace inferx {

// One compiled PCRE2 pattern. Matching expects valid UTF-8 (callers guarantee it).
class Regex {
 public:
  // Throws inferx::Error naming `what` and the PCRE2 message when the pattern does not compile.
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Finds the leftmost match starting at or after `start`; false when none.
  bool find(std::string_view subject, size_t start, size_t& begin, size_t& end) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// The split pieces of one text: spans over `text`. ByteLevel and Metaspace steps rewrite `text`.
struct PreTokenized {
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> spans;  // [begin, end) byte offsets into text
};

class PreTokenizer {
 public:
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // From a tokenizer.json "pre_tokenizer" value (null gives the identity). Throws inferx::Error naming
  // `source` and the unsupported type or bad field.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& source);

  // Splits `text` (one segment between added tokens; `at_start` when it begins the input, which
  // Metaspace's prepend_scheme "first" needs). Byte-level pieces come back as raw bytes: the byte-to-
  // unicode mapping of GPT-2 is undone, since the BPE model keys its vocabulary on raw bytes.
  void split(std::string_view text, bool at_start, PreTokenized& out) const;

  // True when a ByteLevel step is present: pieces are bytes and the vocabulary is byte-level encoded.
  bool byte_level() const { return byte_level_; }
  bool empty() const { return steps_.empty(); }

  struct Step;  // one pipeline step (defined in the .cpp)

 private:
  std::vector<std::unique_ptr<Step>> steps_;
  bool byte_level_ = false;
  size_t map_from_ = SIZE_MAX;  // index of the ByteLevel step when steps follow it (text is then mapped)
};

// GPT-2's byte-to-unicode table (openai/gpt-2 encoder.py bytes_to_unicode): printable Latin-1 bytes map
// to themselves, the other 68 bytes to U+0100.. in order. byte_to_unicode()[b] is the UTF-8 of the char.
const std::array<std::string, 256>& byte_to_unicode();
// Inverse mapping of a byte-level string to raw bytes; false when a char is not in the table.
bool byte_level_decode(std::string_view mapped, std::string& out);

}  // namespace inferx
