// llama2.c tokenizer.bin (tok512.bin) loader. The format is what llama2.c's tokenizer.py export() writes
// and run.c build_tokenizer() reads: int32 max_token_length, then per token float32 score, int32 byte
// length and the bytes, all little-endian, no header or count (the model's vocab_size says how many).
// export() stores pieces with "▁" replaced by a plain space and BOS/EOS as "\n<s>\n" / "\n</s>\n"; this
// loader turns them back into SentencePiece pieces so that both sources give the same vocabulary.
#include <cstring>
#include <iterator>

#include "core/error.h"
#include "core/text_file.h"
#include "text/spm_tokenizer.h"
#include "text/tokenizer.h"

namespace inferx {
namespace {

class Reader {
 public:
  Reader(const std::string& bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  template <class T>
  T read(const char* what, int32_t token) {
    T value;
    INFERX_CHECK(pos_ + sizeof(T) <= bytes_.size(), "{}: file ends inside the {} of token {} (offset {})",
                 path_, what, token, pos_);
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_bytes(size_t n, int32_t token) {
    INFERX_CHECK(n <= bytes_.size() - pos_, "{}: token {} claims {} bytes but only {} remain (offset {})",
                 path_, token, n, bytes_.size() - pos_, pos_);
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  const std::string& bytes_;
  const std::string& path_;
  size_t pos_ = 0;
};

bool is_byte_piece(const std::string& p) {
  const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return p.size() == 6 && p.compare(0, 3, "<0x") == 0 && hex(p[3]) && hex(p[4]) && p[5] == '>';
}

std::string trim_newlines(const std::string& s) {
  const size_t a = s.find_first_not_of('\n');
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of('\n');
  return s.substr(a, b - a + 1);
}

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t vocab_size) {
  INFERX_CHECK(vocab_size > 0, "{}: vocab_size must be positive, got {}", path, vocab_size);
  const std::string bytes = read_text_file(path, "the llama2.c tokenizer file");

  Reader reader(bytes, path);
  const auto max_token_length = reader.read<int32_t>("header (max_token_length)", -1);
  INFERX_CHECK(max_token_length > 0, "{}: max_token_length is {}; not a llama2.c tokenizer file", path,
               max_token_length);

  SpmVocab vocab;
  vocab.source = path;
  vocab.pieces.reserve(vocab_size);
  vocab.scores.reserve(vocab_size);
  vocab.types.reserve(vocab_size);
  for (int32_t i = 0; i < vocab_size; ++i) {
    const auto score = reader.read<float>("score", i);
    const auto len = reader.read<int32_t>("length", i);
    INFERX_CHECK(len >= 0, "{}: token {} has negative length {}", path, i, len);
    std::string raw = reader.read_bytes(static_cast<size_t>(len), i);

    TokenType type = TokenType::Normal;
    std::string piece;
    const std::string trimmed = trim_newlines(raw);
    if (trimmed == "<s>" || trimmed == "</s>") {
      type = TokenType::Control;
      piece = trimmed;
    } else if (raw == "<unk>") {
      type = TokenType::Unknown;
      piece = raw;
    } else if (is_byte_piece(raw)) {
      type = TokenType::Byte;
      piece = raw;
    } else {
      // Undo export()'s "▁" -> " " so that encoding works on SentencePiece pieces.
      for (char c : raw) {
        if (c == ' ') {
          piece += "\xE2\x96\x81";
        } else {
          piece += c;
        }
      }
    }
    vocab.pieces.push_back(std::move(piece));
    vocab.scores.push_back(score);
    vocab.types.push_back(type);
  }
  vocab.unk_id = 0;  // llama2.c / Llama 2 layout: <unk>=0, <s>=1, </s>=2
  vocab.bos_id = 1;
  vocab.eos_id = 2;
  return std::make_unique<SpmTokenizer>(std::move(vocab));
}

}  // namespace inferx
