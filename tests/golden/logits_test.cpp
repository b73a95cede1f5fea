// Golden logits: InferX's CPU forward pass on small random-weight models against an independent fp64
// numpy reference (tools/reference/transformer_ref.py, fixtures from make_logits_fixtures.py; see
// tests/golden/README.md). One fixture per supported family and feature: Llama 2 (GQA), Llama 3 (llama3
// RoPE scaling, tied embeddings, explicit head_dim), Mistral (sliding window), Qwen2 (qkv bias, disabled
// window), Qwen3 (q/k norm, head_dim != hidden / heads), and GGUF exports of llama (permuted q/k,
// interleaved RoPE), qwen2 and Llama 3 (llama3 scaling as llama.cpp's rope_freqs.weight divisors, tied
// embeddings, key_length) made with llama.cpp's gguf-py.
//
// Metric, per position (row of [seq, vocab] logits):
//   rel = max_v |inferx[v] - reference[v]| / max(max_v |reference[v]|, 1e-6)   must be <= 1e-4,
// and the argmax of every row must agree (the fixtures guarantee a top-1/top-2 gap of >= 2e-3 of the
// row's max, so rounding cannot flip it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace inferx {
namespace {

constexpr double kMaxRelError = 1e-4;
const std::string kFixtures = std::string(INFERX_SOURCE_DIR) + "/tests/golden/fixtures/";

struct Expected {
  std::vector<int32_t> input_ids;
  int64_t seq = 0, vocab = 0;
  std::vector<float> logits;  // [seq, vocab]
};

Expected read_expected(const std::string& name) {
  const std::string dir = kFixtures + name + "/";
  std::ifstream jf(dir + "expected.json");
  if (!jf) throw std::runtime_error("cannot open " + dir + "expected.json");
  const nlohmann::json j = nlohmann::json::parse(jf);
  Expected e;
  e.input_ids = j.at("input_ids").get<std::vector<int32_t>>();
  e.seq = j.at("shape").at(0).get<int64_t>();
  e.vocab = j.at("shape").at(1).get<int64_t>();
  if (e.seq != static_cast<int64_t>(e.input_ids.size()))
    throw std::runtime_error(dir + "expected.json: shape[0] != len(input_ids)");
  const std::string bin = dir + j.at("logits_file").get<std::string>();
  std::ifstream bf(bin, std::ios::binary);
  if (!bf) throw std::runtime_error("cannot open " + bin);
  e.logits.resize(static_cast<size_t>(e.seq * e.vocab));
  // float32 little-endian; every platform we build for is little-endian.
  bf.read(reinterpret_cast<char*>(e.logits.data()), static_cast<std::streamsize>(e.logits.size() * 4));
  if (bf.gcount() != static_cast<std::streamsize>(e.logits.size() * 4) || bf.peek() != EOF)
    throw std::runtime_error(bin + ": size does not match shape in expected.json");
  return e;
}

size_t argmax(const float* row, int64_t n) {
  return static_cast<size_t>(std::max_element(row, row + n) - row);
}

// Compares rows [first, first + rows) of the reference with `got` ([rows, vocab]).
void expect_rows_match(const Expected& e, const std::vector<float>& got, int64_t first, int64_t rows,
                       const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<size_t>(rows * e.vocab)) << what;
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* ref = e.logits.data() + (first + r) * e.vocab;
    const float* out = got.data() + r * e.vocab;
    double max_ref = 0.0, max_diff = 0.0;
    bool finite = true;
    for (int64_t v = 0; v < e.vocab; ++v) {
      finite = finite && std::isfinite(out[v]);
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(out[v]) - ref[v]));
    }
    ASSERT_TRUE(finite) << what << ": non-finite logit at position " << first + r;
    const double rel = max_diff / std::max(max_ref, 1e-6);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, kMaxRelError) << what << ": position " << first + r << " max|diff| " << max_diff
                                 << " max|ref| " << max_ref;
    EXPECT_EQ(argmax(out, e.vocab), argmax(ref, e.vocab)) << what << ": argmax at position " << first + r;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", worst);
  ::testing::Test::RecordProperty("worst_rel_error_" + std::to_string(first), buf);
}

struct Case {
  const char* model;     // path under tests/golden/fixtures/
  const char* expected;  // folder holding expected.json / expected_logits.bin
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model; }

class GoldenLogits : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend({2});
    expected_ = read_expected(GetParam().expected);
    model_ = Model::load(kFixtures + GetParam().model, *backend_);
    ASSERT_EQ(model_->config().vocab_size, expected_.vocab);
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  Expected expected_;
};

// The whole sequence as one prefill.
TEST_P(GoldenLogits, PrefillMatchesReference) {
  SequenceRunner runner(*model_, 64);
  const std::vector<float> got = runner.step_all_logits(expected_.input_ids);
  expect_rows_match(expected_, got, 0, expected_.seq, std::string(GetParam().model) + " prefill");
  EXPECT_EQ(runner.length(), expected_.seq);
}

// Prefill 5, then two single-token decode steps, then the rest in one chunk: the KV cache path
// (positions, cache writes across a block boundary with block_size 4, window over cached keys) must
// give the same logits as the reference.
TEST_P(GoldenLogits, ChunkedThroughKvCacheMatchesReference) {
  SequenceRunner runner(*model_, 64, /*block_size=*/4);
  const std::vector<int64_t> chunks = {5, 1, 1, expected_.seq - 7};
  int64_t pos = 0;
  for (int64_t n : chunks) {
    std::vector<int32_t> ids(expected_.input_ids.begin() + pos, expected_.input_ids.begin() + pos + n);
    const std::vector<float> got = runner.step_all_logits(ids);
    expect_rows_match(expected_, got, pos, n,
                      std::string(GetParam().model) + " chunk at " + std::to_string(pos));
    pos += n;
  }
  EXPECT_EQ(runner.length(), expected_.seq);
}

// Token by token (pure decode) with step(), which returns only the last row.
TEST_P(GoldenLogits, TokenByTokenLastRowMatchesReference) {
  SequenceRunner runner(*model_, 64);
  for (int64_t p = 0; p < expected_.seq; ++p) {
    const std::vector<float>& got = runner.step({expected_.input_ids[static_cast<size_t>(p)]});
    expect_rows_match(expected_, got, p, 1, std::string(GetParam().model) + " step");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GoldenLogits,
    ::testing::Values(Case{"llama-tiny", "llama-tiny"}, Case{"llama3-tiny", "llama3-tiny"},
                      Case{"mistral-tiny", "mistral-tiny"}, Case{"qwen2-tiny", "qwen2-tiny"},
                      Case{"qwen3-tiny", "qwen3-tiny"}, Case{"llama-tiny.gguf", "llama-tiny"},
                      Case{"qwen2-tiny.gguf", "qwen2-tiny"}, Case{"llama3-tiny.gguf", "llama3-tiny"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = info.param.model;
      std::replace(n.begin(), n.end(), '-', '_');
      std::replace(n.begin(), n.end(), '.', '_');
      return n;
    });

}  // namespace
}  // namespace inferx
