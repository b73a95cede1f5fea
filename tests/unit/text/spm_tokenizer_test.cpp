// SentencePiece BPE tokenizer against independent references: llama.cpp's tokenizer test vectors (ids
// made by HF transformers, see testdata/SOURCES.md), llama2.c run.c's greedy output of stories260K, and
// the same vocabulary read from its two file formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "text/tokenizer.h"

namespace inferx {
namespace {

const std::string kData = INFERX_TESTDATA_DIR;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The .inp format of llama.cpp's tests/test-tokenizer-0: every case is followed by
// "\n__ggml_vocab_test__\n"; the .out file has one line per case, each id preceded by a space.
struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<VocabCase> read_vocab_cases(const std::string& gguf_path) {
  const std::string inp = read_file(gguf_path + ".inp");
  const std::string marker = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  size_t pos = 0;
  while (pos < inp.size()) {
    const size_t end = inp.find(marker, pos);
    if (end == std::string::npos) break;
    cases.push_back({inp.substr(pos, end - pos), {}});
    pos = end + marker.size();
  }
  std::istringstream out(read_file(gguf_path + ".out"));
  std::string line;
  for (auto& c : cases) {
    EXPECT_TRUE(static_cast<bool>(std::getline(out, line))) << "missing .out line";
    std::istringstream ids(line);
    int32_t id;
    while (ids >> id) c.ids.push_back(id);
  }
  return cases;
}

void expect_vectors_pass(const Tokenizer& tok, const std::string& gguf_path) {
  const auto cases = read_vocab_cases(gguf_path);
  ASSERT_EQ(cases.size(), 46u);
  int passed = 0;
  for (const auto& c : cases) {
    const auto ids = tok.encode(c.text, /*add_bos=*/false);  // test-tokenizer-0 adds no special tokens
    EXPECT_EQ(ids, c.ids) << "text: '" << c.text << "'";
    passed += ids == c.ids;
    // SentencePiece without normalisation is lossless: decoding gives the text back.
    EXPECT_EQ(tok.decode(ids), c.text);
  }
  EXPECT_EQ(passed, 46);
}

TEST(SpmTokenizer, LlamaSpmVectors) {
  const std::string path = kData + "/ggml-vocab/ggml-vocab-llama-spm.gguf";
  GgufFile gguf(path);
  const auto tok = load_gguf_tokenizer(gguf);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  expect_vectors_pass(*tok, path);
}

TEST(SpmTokenizer, Phi3Vectors) {
  const std::string path = kData + "/ggml-vocab/ggml-vocab-phi-3.gguf";
  GgufFile gguf(path);
  const auto tok = load_gguf_tokenizer(gguf);
  EXPECT_EQ(tok->vocab_size(), 32064);
  EXPECT_EQ(tok->eos_id(), 32000);
  expect_vectors_pass(*tok, path);
}

// llama2.c's export of the same Llama 2 vocabulary must give the same tokenizer as the GGUF.
TEST(SpmTokenizer, Llama2cExportAgreesWithGguf) {
  const std::string gguf_path = kData + "/ggml-vocab/ggml-vocab-llama-spm.gguf";
  GgufFile gguf(gguf_path);
  const auto a = load_gguf_tokenizer(gguf);
  const auto b = load_llama2c_tokenizer(kData + "/llama2-tokenizer/tokenizer.bin", 32000);
  ASSERT_EQ(a->vocab_size(), b->vocab_size());
  int differ = 0;
  for (int32_t id = 0; id < a->vocab_size(); ++id) {
    differ += a->piece(id) != b->piece(id) || a->token_type(id) != b->token_type(id) ||
              a->token_bytes(id) != b->token_bytes(id);
  }
  EXPECT_EQ(differ, 0);
  expect_vectors_pass(*b, gguf_path);
}

class Stories260K : public ::testing::Test {
 protected:
  void SetUp() override {
    gguf_ = std::make_unique<GgufFile>(kData + "/stories260K.gguf");
    from_gguf_ = load_gguf_tokenizer(*gguf_);
    from_bin_ = load_llama2c_tokenizer(kData + "/tok512.bin", 512);
    greedy_ = nlohmann::json::parse(read_file(kData + "/stories260K.greedy.json"));
  }
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> from_gguf_, from_bin_;
  nlohmann::json greedy_;
};

TEST_F(Stories260K, BothFormatsGiveTheSameVocabulary) {
  ASSERT_EQ(from_gguf_->vocab_size(), 512);
  ASSERT_EQ(from_bin_->vocab_size(), 512);
  for (int32_t id = 0; id < 512; ++id) {
    EXPECT_EQ(from_gguf_->piece(id), from_bin_->piece(id)) << id;
    EXPECT_EQ(from_gguf_->token_type(id), from_bin_->token_type(id)) << id;
    EXPECT_EQ(from_gguf_->token_bytes(id), from_bin_->token_bytes(id)) << id;
  }
  EXPECT_EQ(from_bin_->token_type(0), TokenType::Unknown);
  EXPECT_EQ(from_bin_->token_type(1), TokenType::Control);
  EXPECT_EQ(from_bin_->piece(1), "<s>");
  EXPECT_EQ(from_bin_->token_type(3 + 0x0A), TokenType::Byte);
  EXPECT_EQ(from_bin_->token_bytes(3 + 0x0A), "\n");
  EXPECT_EQ(from_bin_->token_bytes(1), "");
  EXPECT_EQ(from_bin_->token_bytes(0), "<unk>");
}

TEST_F(Stories260K, EncodesThePromptAsRunC) {
  for (const auto& c : greedy_["cases"]) {
    const auto expected = c["input_ids"].get<std::vector<int32_t>>();
    const std::string prompt = c["prompt"];
    if (prompt.empty()) continue;  // run.c adds only BOS for an empty prompt
    EXPECT_EQ(from_gguf_->encode(prompt, true), expected);
    EXPECT_EQ(from_bin_->encode(prompt, true), expected);
  }
  EXPECT_EQ(from_bin_->encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(from_bin_->encode("", true), std::vector<int32_t>{1});
  EXPECT_EQ(from_bin_->encode("", false), std::vector<int32_t>{});
}

// 'text' is run.c's stdout: the prompt's pieces then the generated ones, with the leading space of the
// first piece after BOS dropped. So decode(input_ids + output_ids) must equal it exactly; for the
// empty-prompt case decode(output_ids) too (the dummy-prefix space is dropped at the start).
TEST_F(Stories260K, DecodesRunCOutputExactly) {
  ASSERT_EQ(greedy_["cases"].size(), 2u);
  for (const auto& c : greedy_["cases"]) {
    auto ids = c["input_ids"].get<std::vector<int32_t>>();
    const auto out = c["output_ids"].get<std::vector<int32_t>>();
    ids.insert(ids.end(), out.begin(), out.end());
    const std::string text = c["text"];
    EXPECT_EQ(from_gguf_->decode(ids), text) << c["name"];
    EXPECT_EQ(from_bin_->decode(ids), text) << c["name"];
    if (c["prompt"] == "") {
      EXPECT_EQ(from_bin_->decode(out), text);
    }
  }
}

TEST(SpmTokenizer, UserDefinedPiecesAreMatchedWholeAndControlPiecesAreText) {
  GgufFile gguf(kData + "/ggml-vocab/ggml-vocab-phi-3.gguf");
  const auto tok = load_gguf_tokenizer(gguf);
  ASSERT_EQ(tok->token_type(2), TokenType::UserDefined);  // Phi-3 marks "</s>" user-defined
  ASSERT_EQ(tok->token_type(32007), TokenType::Control);  // "<|end|>"
  const auto ids = tok->encode("Hi</s>there", false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);
  EXPECT_EQ(ids.front(), tok->encode("Hi", false).front());
  // A control piece written in the text is tokenized as text, never as the control id.
  const auto plain = tok->encode("<|end|>", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 32007), 0);
  EXPECT_EQ(tok->decode(plain), "<|end|>");
}

TEST(SpmTokenizer, ByteFallbackAndInvalidUtf8) {
  const auto tok = load_llama2c_tokenizer(kData + "/tok512.bin", 512);
  // The tiny vocabulary has no CJK pieces: each UTF-8 byte becomes its <0xXX> token (id = 3 + byte).
  const auto ids = tok->encode("\xE4\xBD\xA0", false);
  // The dummy prefix "▁" is a piece of its own or falls back to bytes; the CJK bytes are the last three.
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 3, ids.end()),
            (std::vector<int32_t>{3 + 0xE4, 3 + 0xBD, 3 + 0xA0}));
  EXPECT_EQ(tok->decode(ids), "\xE4\xBD\xA0");
  // Invalid UTF-8 (a lone continuation byte, a truncated sequence) still round-trips byte for byte.
  const std::string bad = "a\x80 b\xE4\xBD";
  EXPECT_EQ(tok->decode(tok->encode(bad, true)), bad);
  // Found by fuzz_tokenizer: a bogus lead byte (F5) must not swallow the following "▁" into one symbol.
  const std::string bogus_lead = std::string("Onn  uo\0\0\0\xF5 time", 16);
  EXPECT_EQ(tok->decode(tok->encode(bogus_lead, true)), bogus_lead);
  EXPECT_EQ(tok->decode(tok->encode("x\xF0\x9F\xA6 y\xED\xA0\x80z", false)), "x\xF0\x9F\xA6 y\xED\xA0\x80z");
}

TEST(SpmTokenizer, OutOfRangeIdsThrow) {
  const auto tok = load_llama2c_tokenizer(kData + "/tok512.bin", 512);
  EXPECT_THROW(tok->decode({1, 512}), Error);
  EXPECT_THROW(tok->token_bytes(-1), Error);
  EXPECT_THROW(tok->piece(100000), Error);
}

// --- loader errors ------------------------------------------------------------------------------------

GgufValue string_array(std::vector<std::string> v) {
  GgufArray a;
  a.element_type = GgufType::STRING;
  for (auto& s : v) a.items.push_back(GgufValue::of_string(std::move(s)));
  return GgufValue::of_array(std::move(a));
}

GgufValue float_array(std::vector<double> v) {
  GgufArray a;
  a.element_type = GgufType::FLOAT32;
  for (double x : v) a.items.push_back(GgufValue::of_float(GgufType::FLOAT32, x));
  return GgufValue::of_array(std::move(a));
}

std::string load_error(GgufWriter& w, const std::string& name) {
  const auto bytes = w.to_bytes();
  GgufFile f(bytes.data(), bytes.size(), name);
  try {
    load_gguf_tokenizer(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(GgufTokenizerLoader, RejectsUnsupportedModels) {
  for (const char* model : {"bert", "t5"}) {  // gpt2 (byte-level BPE) is supported: bpe tests
    GgufWriter w;
    w.set("tokenizer.ggml.model", GgufValue::of_string(model));
    w.set("tokenizer.ggml.tokens", string_array({"a", "b"}));
    const std::string msg = load_error(w, "vocab.gguf");
    EXPECT_NE(msg.find("vocab.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("tokenizer.ggml.model '") + model + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
  }
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::of_string("bert"));
  EXPECT_NE(load_error(w, "x.gguf").find("(WordPiece)"), std::string::npos);
  // A byte-level vocabulary without its merges names the missing key.
  GgufWriter w2;
  w2.set("tokenizer.ggml.model", GgufValue::of_string("gpt2"));
  w2.set("tokenizer.ggml.tokens", string_array({"a", "b"}));
  EXPECT_NE(load_error(w2, "x.gguf").find("tokenizer.ggml.merges"), std::string::npos);
}

TEST(GgufTokenizerLoader, RejectsMismatchedArrays) {
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::of_string("llama"));
  w.set("tokenizer.ggml.tokens", string_array({"<unk>", "<s>", "</s>"}));
  w.set("tokenizer.ggml.scores", float_array({0, 0}));
  const std::string msg = load_error(w, "bad.gguf");
  EXPECT_NE(msg.find("bad.gguf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tokenizer.ggml.scores"), std::string::npos) << msg;

  GgufWriter w2;
  w2.set("tokenizer.ggml.model", GgufValue::of_string("llama"));
  w2.set("tokenizer.ggml.tokens", string_array({"<unk>", "<s>", "</s>"}));
  w2.set("tokenizer.ggml.scores", float_array({0, 0, 0}));
  GgufArray types;
  types.element_type = GgufType::INT32;
  types.items.push_back(GgufValue::of_int(GgufType::INT32, 2));
  w2.set("tokenizer.ggml.token_type", GgufValue::of_array(types));
  EXPECT_NE(load_error(w2, "bad.gguf").find("tokenizer.ggml.token_type"), std::string::npos);

  GgufWriter w3;  // no tokenizer at all
  EXPECT_NE(load_error(w3, "empty.gguf").find("tokenizer.ggml.model"), std::string::npos);
}

TEST(Llama2cTokenizerLoader, RejectsTruncatedFiles) {
  const std::string bytes = read_file(kData + "/tok512.bin");
  const std::string path = testing::TempDir() + "/tok_truncated.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  try {
    load_llama2c_tokenizer(path, 512);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_llama2c_tokenizer(path + ".missing", 512), Error);
  EXPECT_THROW(load_llama2c_tokenizer(kData + "/tok512.bin", 0), Error);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace inferx
