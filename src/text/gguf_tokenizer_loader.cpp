// Builds a Tokenizer from GGUF tokenizer.ggml.* metadata (key names: ggml docs/gguf.md, "Tokenizer";
// token types: llama.cpp's llama_token_type, 1 normal .. 6 byte).
#include <fmt/format.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "text/spm_tokenizer.h"
#include "text/tokenizer.h"

namespace inferx {
namespace {

const GgufArray& required_array(const GgufFile& gguf, std::string_view key) {
  const GgufValue* v = gguf.find_metadata(key);
  INFERX_CHECK(v != nullptr, "{}: tokenizer metadata '{}' is missing", gguf.path(), key);
  INFERX_CHECK(v->type == GgufType::ARRAY, "{}: tokenizer metadata '{}' must be an array", gguf.path(), key);
  return v->as_array();
}

// Special token ids: absent, -1 or 0xFFFFFFFF (what converters write for "none") mean no such token.
int32_t special_id(const GgufFile& gguf, std::string_view key, int32_t fallback, size_t n_tokens) {
  const GgufValue* v = gguf.find_metadata(key);
  if (v == nullptr) return fallback;
  const int64_t id = v->as_int();
  if (id == -1 || id == 0xFFFFFFFFLL) return -1;
  INFERX_CHECK(id >= 0 && static_cast<uint64_t>(id) < n_tokens,
               "{}: {} is {} but the vocabulary has {} tokens", gguf.path(), key, id, n_tokens);
  return static_cast<int32_t>(id);
}

std::string_view describe_model(std::string_view model) {
  if (model == "gpt2") return " (byte-level BPE)";
  if (model == "bert") return " (WordPiece)";
  if (model == "t5") return " (SentencePiece Unigram)";
  if (model == "rwkv") return " (RWKV trie)";
  return "";
}

}  // namespace

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& gguf) {
  const GgufValue* model_value = gguf.find_metadata("tokenizer.ggml.model");
  INFERX_CHECK(model_value != nullptr, "{}: tokenizer metadata 'tokenizer.ggml.model' is missing",
               gguf.path());
  const std::string& model = model_value->as_string();
  if (model != "llama") {
    fail("{}: tokenizer.ggml.model '{}'{} is not supported yet", gguf.path(), model, describe_model(model));
  }

  SpmVocab vocab;
  vocab.source = gguf.path();
  vocab.pieces = required_array(gguf, "tokenizer.ggml.tokens").strings();
  const size_t n = vocab.pieces.size();
  INFERX_CHECK(n > 0, "{}: tokenizer.ggml.tokens is empty", gguf.path());

  // Scores decide the merge order; a vocabulary without them cannot be encoded the SentencePiece way.
  vocab.scores = required_array(gguf, "tokenizer.ggml.scores").floats();
  INFERX_CHECK(vocab.scores.size() == n,
               "{}: tokenizer.ggml.tokens has {} entries but tokenizer.ggml.scores has {}; they must agree",
               gguf.path(), n, vocab.scores.size());

  if (gguf.find_metadata("tokenizer.ggml.token_type") != nullptr) {
    const std::vector<int64_t> types = required_array(gguf, "tokenizer.ggml.token_type").ints();
    INFERX_CHECK(types.size() == n,
                 "{}: tokenizer.ggml.tokens has {} entries but tokenizer.ggml.token_type has {}; they must "
                 "agree",
                 gguf.path(), n, types.size());
    vocab.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      INFERX_CHECK(types[i] >= 1 && types[i] <= 6,
                   "{}: tokenizer.ggml.token_type[{}] is {}; expected 1 (normal) to 6 (byte)", gguf.path(), i,
                   types[i]);
      vocab.types.push_back(static_cast<TokenType>(types[i]));
    }
  } else {
    vocab.types.assign(n, TokenType::Normal);  // older files: every token is normal
  }

  vocab.bos_id = special_id(gguf, "tokenizer.ggml.bos_token_id", 1, n);
  vocab.eos_id = special_id(gguf, "tokenizer.ggml.eos_token_id", 2, n);
  vocab.unk_id = special_id(gguf, "tokenizer.ggml.unknown_token_id", 0, n);
  vocab.pad_id = special_id(gguf, "tokenizer.ggml.padding_token_id", -1, n);
  vocab.add_bos = gguf.get_bool("tokenizer.ggml.add_bos_token", true);
  vocab.add_space_prefix = gguf.get_bool("tokenizer.ggml.add_space_prefix", true);
  return std::make_unique<SpmTokenizer>(std::move(vocab));
}

}  // namespace inferx
