// Every llama.cpp tokenizer test vector in testdata (ggml-vocab/*.gguf with .inp/.out, made by llama.cpp's
// tests/test-tokenizer-0 from Hugging Face transformers ids, add_special_tokens=False; see
// testdata/SOURCES.md) through our GGUF loaders, plus the llama-bpe pair with the Llama 3.2 vocabulary
// files. bert-bge is WordPiece, which is not supported: its loader must say so.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "text/hf_tokenizer_json.h"
#include "text/tokenizer.h"

namespace inferx {
namespace {

const std::string kData = INFERX_TESTDATA_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

// .inp: every case followed by "\n__ggml_vocab_test__\n"; .out: one line of ids per case.
std::vector<VocabCase> read_cases(const std::string& stem) {
  const std::string inp = slurp(stem + ".inp");
  const std::string marker = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t end = inp.find(marker, pos);
    if (end == std::string::npos) break;
    cases.push_back({inp.substr(pos, end - pos), {}});
    pos = end + marker.size();
  }
  std::istringstream out(slurp(stem + ".out"));
  std::string line;
  for (auto& c : cases) {
    EXPECT_TRUE(static_cast<bool>(std::getline(out, line))) << stem << ": missing .out line";
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

// Returns how many cases give exactly the expected ids; reports each mismatch.
int count_passing(const Tokenizer& tok, const std::string& stem) {
  const auto cases = read_cases(stem);
  EXPECT_EQ(cases.size(), 46u) << stem;
  int passed = 0;
  for (const auto& c : cases) {
    const auto ids = tok.encode(c.text, /*add_bos=*/false);
    EXPECT_EQ(ids, c.ids) << stem << "\ntext: '" << c.text << "'";
    passed += ids == c.ids;
  }
  return passed;
}

class GgufVocab : public testing::TestWithParam<std::string> {};

TEST_P(GgufVocab, AllCasesMatch) {
  const std::string path = kData + "/ggml-vocab/ggml-vocab-" + GetParam() + ".gguf";
  GgufFile gguf(path);
  const auto tok = load_gguf_tokenizer(gguf);
  EXPECT_EQ(count_passing(*tok, path), 46) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, GgufVocab,
                         testing::Values("gpt-2", "mpt", "falcon", "starcoder", "refact", "deepseek-coder",
                                         "deepseek-llm", "llama-spm", "phi-3"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

TEST(LlamaCppVectors, EveryVocabInTestdataIsCovered) {
  // A new vocab dropped into testdata must be added to the list above (or to the unsupported test).
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(kData + "/ggml-vocab"))
    if (e.path().extension() == ".gguf") found.push_back(e.path().stem().string());
  std::sort(found.begin(), found.end());
  const std::vector<std::string> expected = {
      "ggml-vocab-bert-bge", "ggml-vocab-deepseek-coder", "ggml-vocab-deepseek-llm", "ggml-vocab-falcon",
      "ggml-vocab-gpt-2",    "ggml-vocab-llama-spm",      "ggml-vocab-mpt",          "ggml-vocab-phi-3",
      "ggml-vocab-refact",   "ggml-vocab-starcoder"};
  EXPECT_EQ(found, expected);
}

TEST(LlamaCppVectors, BertWordPieceIsReportedUnsupported) {
  const std::string path = kData + "/ggml-vocab/ggml-vocab-bert-bge.gguf";
  GgufFile gguf(path);
  try {
    (void)load_gguf_tokenizer(gguf);
    FAIL() << "WordPiece loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ggml-vocab-bert-bge.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'bert'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("WordPiece"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
  }
}

TEST(LlamaCppVectors, Llama3BpeWithVocabAndMerges) {
  // encoder.json + vocab.bpe are Llama 3.2's vocabulary; the split regex and ignore_merges are those of
  // its tokenizer.json.
  const std::string dir = kData + "/hf-tokenizers/llama3.2";
  const auto pre = nlohmann::json::parse(R"({"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       "behavior":"Isolated","invert":false},
      {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})");
  const auto tok =
      load_hf_vocab_merges(dir + "/encoder.json", dir + "/vocab.bpe", pre, /*ignore_merges=*/true);
  EXPECT_EQ(count_passing(*tok, dir + "/ggml-vocab-llama-bpe.gguf"), 46);
  // Without ignore_merges exactly one case ("Cửa Việt") differs, as SOURCES.md records: the flag matters.
  const auto plain = load_hf_vocab_merges(dir + "/encoder.json", dir + "/vocab.bpe", pre, false);
  int same = 0;
  for (const auto& c : read_cases(dir + "/ggml-vocab-llama-bpe.gguf"))
    same += plain->encode(c.text, false) == c.ids;
  EXPECT_EQ(same, 45);
}

TEST(LlamaCppVectors, Gpt2VocabJsonAgreesWithGguf) {
  const std::string dir = kData + "/hf-tokenizers/gpt2";
  const auto tok = load_hf_vocab_merges(dir + "/vocab.json", dir + "/merges.txt", nullptr, false);
  EXPECT_EQ(count_passing(*tok, kData + "/ggml-vocab/ggml-vocab-gpt-2.gguf"), 46);
}

}  // namespace
}  // namespace inferx
