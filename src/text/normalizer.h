#pragma once
// Normalizers of Hugging Face tokenizers (tokenizers/src/normalizers): NFC/NFD/NFKC/NFKD (utf8proc),
// Lowercase, Prepend, Replace (literal or regex), Strip, Sequence. Applied to each stretch of text
// between added tokens, before pre-tokenization.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace inferx {

class Normalizer {
 public:
  Normalizer();
  ~Normalizer();
  Normalizer(Normalizer&&) noexcept;
  Normalizer& operator=(Normalizer&&) noexcept;

  // From a tokenizer.json "normalizer" value (null: identity). Throws inferx::Error naming `source` and
  // the unsupported type.
  static Normalizer from_json(const nlohmann::json& j, const std::string& source);

  bool empty() const { return steps_.empty(); }
  // Normalizes valid UTF-8 text.
  std::string apply(std::string_view text) const;

 private:
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace inferx
