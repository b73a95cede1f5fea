// tokenizer.json and Hugging Face folders: the real files in testdata against llama.cpp's vectors (ids from
// HF transformers), the transformers config files (BOS/EOS, add_bos/eos_token, chat_template forms) and
// clear errors for components we do not implement.
#include "text/hf_tokenizer_json.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/tokenizer_loader.h"

namespace inferx {
namespace {

using nlohmann::json;
const std::string kData = INFERX_TESTDATA_DIR;
const std::string kTiny = kData + "/hf-tokenizers/tinyllama-1.1b-chat-v1.0";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int count_vectors(const Tokenizer& tok, const std::string& stem) {
  const std::string inp = slurp(stem + ".inp");
  std::istringstream out(slurp(stem + ".out"));
  const std::string marker = "\n__ggml_vocab_test__\n";
  int passed = 0, total = 0;
  for (size_t pos = 0, end; (end = inp.find(marker, pos)) != std::string::npos; pos = end + marker.size()) {
    std::string line;
    std::getline(out, line);
    std::istringstream ids(line);
    std::vector<int32_t> want;
    for (int32_t id; ids >> id;) want.push_back(id);
    const auto got = tok.encode(inp.substr(pos, end - pos), false);
    EXPECT_EQ(got, want) << inp.substr(pos, end - pos);
    passed += got == want;
    ++total;
  }
  EXPECT_EQ(total, 46);
  return passed;
}

// TinyLlama's tokenizer.json has three "a b" merges whose tokens contain a space, which tokenizers 0.23
// refuses to read (see SOURCES.md "Quirk"); written as [a, b] pairs they load. Pairs are chosen so that
// both halves and their concatenation are tokens.
json tinyllama_with_pair_merges() {
  json doc = json::parse(slurp(kTiny + "/tokenizer.json"));
  const json& vocab = doc["model"]["vocab"];
  for (json& m : doc["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != ' ') continue;
      const std::string a = s.substr(0, i), b = s.substr(i + 1);
      if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) {
        m = json::array({a, b});
        break;
      }
    }
  }
  return doc;
}

TEST(HfTokenizerJson, NeoX20BGivesTheMptVectors) {
  // Same vocabulary and merges as ggml-vocab-mpt.gguf; NFC and the whitespace added tokens from the file.
  const auto tok = load_hf_tokenizer_json(kData + "/hf-tokenizers/gpt-neox-20b/20B_tokenizer.json");
  EXPECT_EQ(count_vectors(*tok, kData + "/ggml-vocab/ggml-vocab-mpt.gguf"), 46);
  EXPECT_EQ(tok->token_type(0), TokenType::Control);          // <|endoftext|>
  EXPECT_EQ(tok->token_type(50254), TokenType::UserDefined);  // a run of spaces, not special
}

TEST(HfTokenizerJson, TinyLlamaGivesTheLlamaSpmVectors) {
  // SentencePiece-style BPE with merge ranks and byte fallback reproduces the Llama 2 SentencePiece ids.
  const auto tok = parse_hf_tokenizer_json(tinyllama_with_pair_merges(), "tinyllama");
  EXPECT_EQ(count_vectors(*tok, kData + "/ggml-vocab/ggml-vocab-llama-spm.gguf"), 46);
  EXPECT_EQ(tok->encode("Hi", true).front(), 1);  // the TemplateProcessing post-processor adds <s>
  EXPECT_EQ(tok->decode(tok->encode(" Hello  world\n", true)), " Hello  world\n");
  EXPECT_EQ(tok->token_type(3), TokenType::Byte);  // <0x00>
  EXPECT_EQ(tok->token_bytes(13), "\n");           // <0x0A>
}

TEST(HfTokenizerJson, TinyLlamaAsShippedIsRefusedLikeTokenizers) {
  try {
    (void)load_hf_tokenizer_json(kTiny + "/tokenizer.json");
    FAIL() << "loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.merges[18917]"), std::string::npos) << msg;
  }
}

class TempFolder : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("inferx_hf_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    write("tokenizer.json", tinyllama_with_pair_merges().dump());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::filesystem::path dir_;
};

TEST_F(TempFolder, ConfigFilesGiveBosEosAndTheChatTemplate) {
  write("tokenizer_config.json", slurp(kTiny + "/tokenizer_config.json"));
  const HfFolderText text = load_hf_folder_text(dir_.string());
  EXPECT_EQ(text.tokenizer->bos_id(), 1);
  EXPECT_EQ(text.tokenizer->eos_id(), 2);
  ASSERT_TRUE(text.chat_template.has_value());
  EXPECT_EQ(*text.chat_template, json::parse(slurp(kTiny + "/tokenizer_config.json"))["chat_template"]);
  const ModelText mt = load_model_text(dir_.string(), nullptr);
  EXPECT_TRUE(mt.add_bos);
  ASSERT_NE(mt.tokenizer, nullptr);
}

TEST_F(TempFolder, AddBosAndEosTokenRebuildTheTemplate) {
  write("tokenizer_config.json",
        R"({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
            "add_bos_token": false, "add_eos_token": true})");
  const auto tok = load_hf_folder_text(dir_.string()).tokenizer;
  const auto ids = tok->encode("Hi", true);
  EXPECT_NE(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_FALSE(load_model_text(dir_.string(), nullptr).add_bos);
}

TEST_F(TempFolder, ChatTemplateListAndGenerationConfig) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  write("generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 0]})");
  const HfFolderText text = load_hf_folder_text(dir_.string());
  EXPECT_EQ(text.chat_template.value_or(""), "D");
  EXPECT_EQ(text.tokenizer->bos_id(), 1);
  EXPECT_EQ(text.tokenizer->eos_id(), 2);
}

TEST_F(TempFolder, SpecialTokensMapFillsIn) {
  write("special_tokens_map.json", R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}})");
  const auto tok = load_hf_folder_text(dir_.string()).tokenizer;
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
}

// Every JSON file of a tokenizer folder is read with formats/json_text.h's nesting bound: a tokenizer.json
// whose normalizer was a Sequence nested 100k levels deep crashed the loader (the copy of a value and the
// Sequence readers recurse per level); now each is a load error naming the file.
TEST_F(TempFolder, DeeplyNestedFilesAreRefused) {
  const auto nested_sequences = [](int levels) {
    std::string s = R"({"type": "Lowercase"})";
    for (int i = 0; i < levels; ++i) s = R"({"type": "Sequence", "normalizers": [)" + s + "]}";
    return s;
  };
  json doc = tinyllama_with_pair_merges();
  doc["normalizer"] = json::parse(nested_sequences(3));  // nested Sequences still load
  write("tokenizer.json", doc.dump());
  EXPECT_EQ(load_hf_folder_text(dir_.string()).tokenizer->encode("Hi", false),
            load_hf_folder_text(dir_.string()).tokenizer->encode("hi", false));

  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string deep_normalizer =
      R"({"model": {}, "normalizer": )" + std::string(50000, '[') + std::string(50000, ']') + "}";
  for (const auto& [file, text] : std::vector<std::pair<std::string, std::string>>{
           {"tokenizer.json", deep_normalizer},
           {"tokenizer_config.json", R"({"chat_template": )" + deep + "}"},
           {"special_tokens_map.json", deep},
           {"generation_config.json", R"({"eos_token_id": )" + deep + "}"}}) {
    TearDown();  // a fresh folder with only a valid tokenizer.json
    SetUp();
    write(file, text);
    std::string msg = "no error";
    try {
      (void)load_hf_folder_text(dir_.string());
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(file + ": JSON nested deeper than 64 levels"), std::string::npos)
        << file << ": " << msg;
  }
}

TEST(HfTokenizerJson, Gpt2FolderWithVocabAndMerges) {
  const ModelText mt = load_model_text(kData + "/hf-tokenizers/gpt2", nullptr);
  ASSERT_NE(mt.tokenizer, nullptr);
  EXPECT_FALSE(mt.add_bos);
  EXPECT_EQ(mt.tokenizer->bos_id(), 50256);
  EXPECT_EQ(count_vectors(*mt.tokenizer, kData + "/ggml-vocab/ggml-vocab-gpt-2.gguf"), 46);
}

std::string error_of(const json& doc) {
  try {
    (void)parse_hf_tokenizer_json(doc, "t.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HfTokenizerJson, UnsupportedComponentsAreNamed) {
  const json base = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}}};
  EXPECT_EQ(error_of(base), "no error");
  json doc = base;
  doc["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of(doc).find("model type 'WordPiece' is not supported"), std::string::npos)
      << error_of(doc);
  doc = base;
  doc["model"]["type"] = "Unigram";
  EXPECT_NE(error_of(doc).find("'Unigram'"), std::string::npos);
  doc = base;
  doc["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  EXPECT_NE(error_of(doc).find("pre_tokenizer type 'UnicodeScripts' is not supported"), std::string::npos);
  doc = base;
  doc["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(error_of(doc).find("normalizer type 'BertNormalizer' is not supported"), std::string::npos);
  doc = base;
  doc["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(error_of(doc).find("decoder type 'WordPiece' is not supported"), std::string::npos);
  doc = base;
  doc["post_processor"] = {{"type", "Mystery"}};
  EXPECT_NE(error_of(doc).find("post_processor type 'Mystery' is not supported"), std::string::npos);
  doc = base;
  doc["model"]["merges"] = {"a c"};
  EXPECT_NE(error_of(doc).find("'c', which is not in the vocabulary"), std::string::npos);
  doc = base;
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(error_of(doc).find("does not compile"), std::string::npos);
  EXPECT_NE(error_of(json::object()).find("t.json"), std::string::npos);
  // Values of the wrong JSON type anywhere: a load error naming the file, not nlohmann's exception (found
  // by fuzz_hf_tokenizer_json).
  for (const auto& [path, value] : std::vector<std::pair<json::json_pointer, json>>{
           {json::json_pointer("/model/vocab/a"), "zero"},
           {json::json_pointer("/model/byte_fallback"), 3},
           {json::json_pointer("/normalizer"), {{"type", 7}}},
           {json::json_pointer("/added_tokens"), {{{"id", "1"}, {"content", "x"}}}},
           // and a model id far past the vocabulary (every per-token table would be sized by it; added
           // tokens' ids are assigned, not read, as in tokenizers)
           {json::json_pointer("/model/vocab/a"), 22222250},
           // Floats where integers belong: nlohmann's get<int>() would cast them, undefined past the type's
           // range (found by fuzz_hf_tokenizer_json as a Strip decoder's start of 9.6e115).
           {json::json_pointer("/model/vocab/a"), 0.5},
           {json::json_pointer("/model/vocab/a"), 1e300},
           {json::json_pointer("/decoder"), {{"type", "Strip"}, {"content", " "}, {"start", 9.6e115}}},
           {json::json_pointer("/decoder"), {{"type", "Strip"}, {"content", " "}, {"stop", -1}}},
           {json::json_pointer("/added_tokens"), {{{"id", 1e300}, {"content", "x"}}}},
           {json::json_pointer("/post_processor"),
            {{"type", "RobertaProcessing"}, {"cls", {"a", -3e200}}, {"sep", {"b", 1}}}},
           // a [token, id] pair without its id: read past the array's end before (ASan: heap overflow)
           {json::json_pointer("/post_processor"),
            {{"type", "RobertaProcessing"}, {"cls", {"a"}}, {"sep", {"b", 1}}}},
           {json::json_pointer("/post_processor"),
            {{"type", "BertProcessing"}, {"cls", {"a", 0}}, {"sep", "b"}}},
           {json::json_pointer("/post_processor"),
            {{"type", "TemplateProcessing"},
             {"single", {{{"SpecialToken", {{"id", "a"}}}}}},
             {"special_tokens", {{"a", {{"ids", {4294967296.0}}}}}}}}}) {
    doc = base;
    doc[path] = value;
    const std::string msg = error_of(doc);
    EXPECT_NE(msg.find("t.json"), std::string::npos) << path.to_string() << ": " << msg;
  }
  doc = base;
  doc["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 9.6e115}};
  EXPECT_EQ(error_of(doc), "t.json: decoder Strip start must be an integer in [0, 2147483647], got 9.6e+115");
}

}  // namespace
}  // namespace inferx
