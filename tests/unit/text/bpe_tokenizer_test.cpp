// Byte-level and SentencePiece-style BPE beyond the id vectors (llama_cpp_vectors_test.cpp): decoding is
// lossless on the llama.cpp inputs, streaming equals full decoding, invalid UTF-8 and special tokens are
// handled as documented, and encoding is safe from several threads.
#include "text/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "formats/gguf.h"
#include "text/normalizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace inferx {
namespace {

const std::string kData = INFERX_TESTDATA_DIR;

std::vector<std::string> vector_inputs(const std::string& stem) {
  std::ifstream in(stem + ".inp", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string inp = ss.str();
  const std::string marker = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  for (size_t pos = 0, end; (end = inp.find(marker, pos)) != std::string::npos; pos = end + marker.size())
    out.push_back(inp.substr(pos, end - pos));
  return out;
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const std::string& name) {
  GgufFile gguf(kData + "/ggml-vocab/ggml-vocab-" + name + ".gguf");
  return load_gguf_tokenizer(gguf);
}

class ByteLevelVocab : public testing::TestWithParam<std::string> {};

// Byte-level BPE loses nothing: decode(encode(x)) == x (NFC(x) for vocabularies that normalize).
TEST_P(ByteLevelVocab, DecodeInvertsEncode) {
  const auto tok = gguf_tokenizer(GetParam());
  ASSERT_NE(dynamic_cast<const BpeTokenizer*>(tok.get()), nullptr);
  const Normalizer nfc = Normalizer::from_json({{"type", "NFC"}}, "test");
  const bool normalizes = GetParam() == "mpt";
  const auto inputs = vector_inputs(kData + "/ggml-vocab/ggml-vocab-" + GetParam() + ".gguf");
  ASSERT_EQ(inputs.size(), 46u);
  for (const std::string& text : inputs) {
    EXPECT_EQ(tok->decode(tok->encode(text, false)), normalizes ? nfc.apply(text) : text) << text;
  }
}

// Streaming token by token gives exactly the full decode, and never a broken UTF-8 sequence.
TEST_P(ByteLevelVocab, StreamingEqualsFullDecode) {
  const auto tok = gguf_tokenizer(GetParam());
  for (const std::string& text : vector_inputs(kData + "/ggml-vocab/ggml-vocab-" + GetParam() + ".gguf")) {
    const auto ids = tok->encode(text, false);
    IncrementalDetokenizer stream(*tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = stream.push(id);
      EXPECT_TRUE(unicode::is_valid_utf8(piece)) << text;
      streamed += piece;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, tok->decode(ids)) << text;
  }
}

INSTANTIATE_TEST_SUITE_P(Gguf, ByteLevelVocab,
                         testing::Values("gpt-2", "mpt", "falcon", "starcoder", "refact", "deepseek-coder",
                                         "deepseek-llm"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

TEST(BpeTokenizer, InvalidUtf8IsReplacedFirst) {
  const auto tok = gguf_tokenizer("gpt-2");
  // Maximal subparts: "\xE2\x82" is one U+FFFD, "\xFF" another, "\xC0\xAF" two (C0 never starts a
  // sequence), as Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(tok->encode("a\xE2\x82z\xFF", false), tok->encode("a\xEF\xBF\xBDz\xEF\xBF\xBD", false));
  EXPECT_EQ(tok->encode("\xC0\xAF", false), tok->encode("\xEF\xBF\xBD\xEF\xBF\xBD", false));
  EXPECT_EQ(unicode::to_valid_utf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(BpeTokenizer, SpecialTokensInTextAndSkipSpecial) {
  const auto tok = gguf_tokenizer("gpt-2");
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok.get());
  ASSERT_NE(bpe, nullptr);
  const int32_t eot = 50256;  // <|endoftext|>, a control token of the GGUF
  EXPECT_EQ(tok->token_type(eot), TokenType::Control);
  const auto ids = tok->encode("Hello<|endoftext|>world", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], eot);
  EXPECT_EQ(bpe->decode(ids, /*skip_special=*/true), "Helloworld");
  EXPECT_EQ(bpe->decode(ids, /*skip_special=*/false), "Hello<|endoftext|>world");
  EXPECT_EQ(tok->token_bytes(eot), "");
}

TEST(BpeTokenizer, StreamingHoldsASplitCharacter) {
  // "🦙" is four bytes; GPT-2 splits it over several byte tokens, none of which may be emitted alone.
  const auto tok = gguf_tokenizer("gpt-2");
  const auto ids = tok->encode("🦙", false);
  ASSERT_GT(ids.size(), 1u);
  IncrementalDetokenizer stream(*tok);
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(stream.push(ids[i]), "");
  EXPECT_EQ(stream.push(ids.back()), "🦙");
}

TEST(BpeTokenizer, OutOfRangeIdsThrow) {
  const auto tok = gguf_tokenizer("gpt-2");
  EXPECT_THROW(tok->decode({tok->vocab_size()}), Error);
  EXPECT_THROW(tok->token_bytes(-1), Error);
  EXPECT_THROW(tok->piece(1 << 30), Error);
}

TEST(BpeTokenizer, ConcurrentEncodingAgrees) {
  const auto tok = gguf_tokenizer("deepseek-llm");
  const auto inputs = vector_inputs(kData + "/ggml-vocab/ggml-vocab-deepseek-llm.gguf");
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : inputs) want.push_back(tok->encode(t, false));
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 20; ++round)
        for (size_t i = 0; i < inputs.size(); ++i) ok[k] += tok->encode(inputs[i], false) == want[i];
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(ok[k], static_cast<int>(20 * inputs.size()));
}

TEST(BpeTokenizer, GgufUnknownPreTokenizerIsNamed) {
  GgufFile src(kData + "/ggml-vocab/ggml-vocab-gpt-2.gguf");
  GgufWriter w;
  for (const auto& [k, v] : src.metadata())
    if (k.rfind("tokenizer.", 0) == 0 && k != "tokenizer.ggml.pre") w.set(k, v);
  w.set("tokenizer.ggml.pre", GgufValue::of_string("martian"));
  const auto bytes = w.to_bytes();
  GgufFile gguf(bytes.data(), bytes.size(), "martian.gguf");
  try {
    (void)load_gguf_tokenizer(gguf);
    FAIL() << "loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("martian.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer.ggml.pre 'martian'"), std::string::npos) << msg;
  }
}

// An added (user-defined) token that is not valid UTF-8 would match inside a character of the input and
// split it before the pre-tokenizer: the vocabulary is refused, naming the token (found by fuzz_gguf: a
// corrupt byte-level vocabulary with the lone byte 0xB6 as a user-defined token crashed
// encode("w\xc3\xb6rld") with std::out_of_range).
TEST(BpeTokenizer, AddedTokenThatIsNotUtf8IsRefused) {
  GgufFile src(kData + "/ggml-vocab/ggml-vocab-gpt-2.gguf");
  GgufWriter w;
  int64_t id = -1;
  for (const auto& [k, v] : src.metadata()) {
    if (k.rfind("tokenizer.", 0) != 0) continue;
    if (k == "tokenizer.ggml.tokens" || k == "tokenizer.ggml.token_type") {
      GgufArray a = v.as_array();  // one more token, user-defined, the lone byte 0xB6
      id = static_cast<int64_t>(a.items.size());
      a.items.push_back(k == "tokenizer.ggml.tokens" ? GgufValue::of_string("\xb6")
                                                     : GgufValue::of_int(a.items.back().type, 4));
      w.set(k, GgufValue::of_array(std::move(a)));
    } else {
      w.set(k, v);
    }
  }
  const auto bytes = w.to_bytes();
  GgufFile gguf(bytes.data(), bytes.size(), "corrupt.gguf");
  try {
    (void)load_gguf_tokenizer(gguf);
    FAIL() << "loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("corrupt.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("added token {} is not valid UTF-8", id)), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace inferx
