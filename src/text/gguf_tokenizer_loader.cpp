// Builds a Tokenizer from GGUF tokenizer.ggml.* metadata (key names: ggml docs/gguf.md, "Tokenizer";
// token types: llama.cpp's llama_token_type, 1 normal .. 6 byte).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "text/bpe_tokenizer.h"
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

// The pre-tokenizer and normalizer a tokenizer.ggml.pre name stands for: the "pre_tokenizer" and
// "normalizer" of that model family's own tokenizer.json (llama.cpp's convert_hf_to_gguf.py names the
// families by hashing what those tokenizers produce).
struct PreSpec {
  const char* pre_tokenizer;  // JSON
  const char* normalizer;     // JSON
  bool ignore_merges;
};

constexpr const char* kLlama3Split =
    R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
constexpr const char* kQwen2Split =
    R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]})";
constexpr const char* kGpt2 =
    R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})";
constexpr const char* kDigitsGpt2 =
    R"({"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}]})";
constexpr const char* kFalcon =
    R"({"type":"Sequence","pretokenizers":[{"type":"Punctuation","behavior":"Contiguous"},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},{"type":"Digits","individual_digits":false},{"type":"Split","pattern":{"Regex":"[0-9][0-9][0-9]"},"behavior":"Isolated","invert":false}]})";
constexpr const char* kDeepseekCoder =
    R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"[\r\n]"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"\\s?\\p{L}+"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"\\s?\\p{P}+"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"},"behavior":"Isolated","invert":false},{"type":"Digits","individual_digits":true},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
// DeepSeek LLM's letter class lists the cased-letter ranges of its tokenizer.json verbatim.
constexpr const char* kDeepseekLlm =
    R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"[\r\n]"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\ud801\udc00-\ud801\udc4f\ud801\udcb0-\ud801\udcd3\ud801\udcd8-\ud801\udcfb\ud803\udc80-\ud803\udcb2\ud803\udcc0-\ud803\udcf2\ud806\udca0-\ud806\udcdf\ud83a\udd00-\ud83a\udd43]+"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"\\s+$"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"},"behavior":"Isolated","invert":false},{"type":"Digits","individual_digits":true},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
constexpr const char* kNfc = R"({"type":"NFC"})";

PreSpec pre_spec(const std::string& pre, const std::string& source) {
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2" || pre == "olmo" || pre == "jais" ||
      pre == "poro-chat" || pre == "bloom" || pre == "gpt3-finnish")
    return {kGpt2, "null", false};
  if (pre == "mpt" || pre == "gpt-neox") return {kGpt2, kNfc, false};
  if (pre == "llama3" || pre == "llama-bpe" || pre == "dbrx" || pre == "smaug-bpe")
    return {kLlama3Split, "null", true};
  if (pre == "qwen2" || pre == "stablelm2" || pre == "deepseek-r1-qwen") return {kQwen2Split, kNfc, false};
  if (pre == "falcon") return {kFalcon, "null", false};
  if (pre == "starcoder" || pre == "refact" || pre == "smollm" || pre == "codeshell" || pre == "command-r")
    return {kDigitsGpt2, "null", false};
  if (pre == "deepseek-coder") return {kDeepseekCoder, "null", false};
  if (pre == "deepseek-llm") return {kDeepseekLlm, "null", false};
  fail(
      "{}: tokenizer.ggml.pre '{}' is not supported (known: default, gpt-2, mpt, llama-bpe, dbrx, smaug-bpe, "
      "qwen2, stablelm2, falcon, starcoder, refact, smollm, command-r, deepseek-coder, deepseek-llm, olmo, "
      "jais, poro-chat, bloom)",
      source, pre);
}

// A byte-level BPE vocabulary (tokenizer.ggml.model "gpt2"): tokens + merges; control tokens are the
// special added tokens, user-defined ones the non-special added tokens, as convert_hf_to_gguf.py writes.
std::unique_ptr<Tokenizer> load_gguf_bpe(const GgufFile& gguf) {
  BpeSpec spec;
  spec.source = gguf.path();
  spec.vocab = required_array(gguf, "tokenizer.ggml.tokens").strings();
  const size_t n = spec.vocab.size();
  INFERX_CHECK(n > 0, "{}: tokenizer.ggml.tokens is empty", gguf.path());
  for (const std::string& m : required_array(gguf, "tokenizer.ggml.merges").strings()) {
    const size_t space = m.find(' ');
    INFERX_CHECK(space != std::string::npos, "{}: tokenizer.ggml.merges entry '{}' is not 'a b'", gguf.path(),
                 m);
    spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  std::vector<int64_t> types;
  if (gguf.find_metadata("tokenizer.ggml.token_type") != nullptr) {
    types = required_array(gguf, "tokenizer.ggml.token_type").ints();
    INFERX_CHECK(types.size() == n,
                 "{}: tokenizer.ggml.tokens has {} entries but tokenizer.ggml.token_type has {}", gguf.path(),
                 n, types.size());
  }
  for (size_t i = 0; i < types.size(); ++i) {
    const auto type = static_cast<TokenType>(types[i]);
    if (type != TokenType::Control && type != TokenType::UserDefined) continue;
    AddedToken t;
    t.id = static_cast<int32_t>(i);
    t.content = spec.vocab[i];
    t.special = type == TokenType::Control;
    t.normalized = !t.special;
    spec.added_tokens.push_back(std::move(t));
  }
  const GgufValue* pre_value = gguf.find_metadata("tokenizer.ggml.pre");
  const std::string pre = pre_value != nullptr ? pre_value->as_string() : std::string("default");
  const PreSpec p = pre_spec(pre, gguf.path());
  const std::string what = gguf.path() + " (tokenizer.ggml.pre '" + pre + "')";
  spec.pre_tokenizer = PreTokenizer::from_json(nlohmann::json::parse(p.pre_tokenizer), what);
  spec.normalizer = Normalizer::from_json(nlohmann::json::parse(p.normalizer), what);
  spec.ignore_merges = p.ignore_merges;
  spec.decoder = Decoder::byte_level();
  spec.bos_id = special_id(gguf, "tokenizer.ggml.bos_token_id", -1, n);
  spec.eos_id = special_id(gguf, "tokenizer.ggml.eos_token_id", -1, n);
  if (gguf.get_bool("tokenizer.ggml.add_bos_token", false) && spec.bos_id >= 0)
    spec.prefix_ids.push_back(spec.bos_id);
  if (gguf.get_bool("tokenizer.ggml.add_eos_token", false) && spec.eos_id >= 0)
    spec.suffix_ids.push_back(spec.eos_id);
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& gguf) {
  const GgufValue* model_value = gguf.find_metadata("tokenizer.ggml.model");
  INFERX_CHECK(model_value != nullptr, "{}: tokenizer metadata 'tokenizer.ggml.model' is missing",
               gguf.path());
  const std::string& model = model_value->as_string();
  if (model == "gpt2") return load_gguf_bpe(gguf);
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
