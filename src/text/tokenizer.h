#pragma once
// Text <-> token ids. This is the interface every tokenizer kind implements (SentencePiece-style BPE
// now; byte-level BPE comes with the tokenizer issue).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace inferx {

class GgufFile;

enum class TokenType : uint8_t {
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes text; add_bos prepends BOS when the vocabulary has one.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;
  // The raw bytes a token stands for when decoded (SentencePiece "▁" -> ' ', byte tokens <0xNN> -> the
  // byte, control tokens -> "" ). A leading space of the first piece after BOS is kept here; decode()
  // applies the SentencePiece rule of dropping it.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  virtual int32_t eos_id() const = 0;  // -1 when none
  virtual TokenType token_type(int32_t id) const = 0;
  virtual const std::string& piece(int32_t id) const = 0;  // the vocabulary string
};

// From GGUF tokenizer.ggml.* metadata. Throws inferx::Error naming the file for an unsupported
// tokenizer.ggml.model (with the name) or inconsistent arrays.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& gguf);
// From a llama2.c tokenizer.bin (tok512.bin); bos=1, eos=2 as llama2.c assumes.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t vocab_size);

// Streams text token by token without ever emitting a partial UTF-8 sequence: bytes that do not yet
// form a complete character are held until the next token completes them (or flush()).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);  // text that became complete with this token (maybe empty)
  std::string flush();           // whatever is left, invalid bytes replaced by U+FFFD

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace inferx
