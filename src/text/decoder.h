#pragma once
// Decoders of Hugging Face tokenizers (tokenizers/src/decoders): turn token strings back into text.
// Supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence of them.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace inferx {

class Decoder {
 public:
  // From a tokenizer.json "decoder" value (null: tokens joined with spaces, as tokenizers does).
  // Throws inferx::Error naming `source` and the unsupported type.
  static Decoder from_json(const nlohmann::json& j, const std::string& source);
  static Decoder byte_level();  // GPT-2 style, for GGUF byte-level vocabularies

  // The decoded text of a sequence of token strings, exactly as tokenizers' decode_chain + join.
  std::string decode(std::vector<std::string> tokens) const;
  // The raw bytes one token stands for in a stream: the per-token part of the chain (byte-level
  // mapping, Replace, <0xXX> bytes) without the lossy UTF-8 repair or the strip of a leading space.
  std::string token_bytes(std::string_view token) const;

  bool empty() const { return steps_.empty(); }

 private:
  struct Step {
    enum class Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
    std::string pattern;  // Replace: literal; Metaspace: replacement char
    std::string content;  // Replace: replacement; Strip: the char stripped
    size_t start = 0, stop = 0;
    bool strip_first = true;  // Metaspace: prepend_scheme != never
  };
  std::vector<Step> steps_;
};

}  // namespace inferx
