// libFuzzer target: byte-level BPE encode of arbitrary bytes (invalid UTF-8 included) with the Hugging Face
// tokenizers a served model brings (prompts are client text), then decode and streaming detokenization.
// The first byte picks the tokenizer, the rest is the text:
//   even: Llama 3.2's vocabulary and merges with its split regex (PCRE2) and ignore_merges;
//   odd:  GPT-NeoX-20B's tokenizer.json (NFC normalizer, added tokens matched before the BPE, some special).
// Invariants for every input: every id is in range; the streamed text is valid UTF-8 and equals decode()
// (specials kept) with invalid bytes replaced; for valid UTF-8 text byte-level BPE is lossless, so
// decode(encode(text)) is the text (NeoX: its NFC form). Files from $INFERX_TESTDATA_DIR (default
// ../shared/testdata, relative to the working directory).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_utf8.h"
#include "text/hf_tokenizer_json.h"
#include "text/normalizer.h"
#include "text/tokenizer.h"

namespace {

std::string data_dir() {
  const char* dir = std::getenv("INFERX_TESTDATA_DIR");
  return std::string(dir != nullptr ? dir : "../shared/testdata") + "/hf-tokenizers";
}

template <class F>
std::unique_ptr<inferx::BpeTokenizer> load_or_abort(F&& load) {
  try {
    return load();
  } catch (const inferx::Error& e) {
    std::fprintf(stderr, "fuzz_bpe_tokenizer: %s (set INFERX_TESTDATA_DIR)\n", e.what());
    std::abort();
  }
}

const inferx::BpeTokenizer& llama3() {
  static const std::unique_ptr<inferx::BpeTokenizer> tok = load_or_abort([] {
    // The pre-tokenizer of Llama 3's tokenizer.json (as tests/unit/text/llama_cpp_vectors_test.cpp).
    const auto pre = nlohmann::json::parse(R"({"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       "behavior":"Isolated","invert":false},
      {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})");
    const std::string dir = data_dir() + "/llama3.2";
    return inferx::load_hf_vocab_merges(dir + "/encoder.json", dir + "/vocab.bpe", pre, true);
  });
  return *tok;
}

const inferx::BpeTokenizer& neox() {
  static const std::unique_ptr<inferx::BpeTokenizer> tok = load_or_abort(
      [] { return inferx::load_hf_tokenizer_json(data_dir() + "/gpt-neox-20b/20B_tokenizer.json"); });
  return *tok;
}

const inferx::Normalizer& nfc() {
  static const inferx::Normalizer n = inferx::Normalizer::from_json({{"type", "NFC"}}, "fuzz");
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool is_neox = (data[0] & 1) != 0, add_bos = (data[0] & 2) != 0;
  const inferx::BpeTokenizer& tok = is_neox ? neox() : llama3();
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  const std::vector<int32_t> ids = tok.encode(text, add_bos);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  const std::string decoded = tok.decode(ids, /*skip_special=*/false);
  // Lossless for valid UTF-8 (without the post-processor's tokens, whose text is not the input's).
  if (fuzz::valid_utf8(text)) {
    const std::string plain = add_bos ? tok.decode(tok.encode(text, false), false) : decoded;
    if (plain != (is_neox ? nfc().apply(text) : text)) std::abort();
  }

  inferx::IncrementalDetokenizer detok(tok, /*skip_special=*/false);
  std::string streamed;
  for (int32_t id : ids) streamed += detok.push(id);
  streamed += detok.flush();
  if (!fuzz::valid_utf8(streamed)) std::abort();
  if (fuzz::valid_utf8(decoded) && streamed != decoded) std::abort();
  return 0;
}
