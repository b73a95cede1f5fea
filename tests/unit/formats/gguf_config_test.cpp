// read_gguf_config on the llama.cpp-converted stories260K (values from its llama2.c header) and on
// synthetic files covering defaults, rope scaling and every error path.
#include "formats/gguf_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace inferx {
namespace {

TEST(GgufConfig, Stories260K) {
  GgufFile g(std::string(INFERX_TESTDATA_DIR) + "/stories260K.gguf");
  ModelConfig c = read_gguf_config(g);
  // llama2.c header of stories260K.bin: dim 64, hidden_dim 172, n_layers 5, n_heads 8, n_kv_heads 4, vocab
  // 512.
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 128);  // the converter's default, see testdata/SOURCES.md
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::None);
  EXPECT_FALSE(c.tie_word_embeddings);  // output.weight is stored
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2}));
}

// The golden fixtures' GGUF exports (tools/reference/gguf_export.py) against the Hugging Face config.json
// they were exported from.
TEST(GgufConfig, GoldenFixturesMatchConfigJson) {
  for (const char* name : {"llama-tiny", "qwen2-tiny"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(INFERX_SOURCE_DIR) + "/tests/golden/fixtures/";
    std::ifstream f(dir + name + "/config.json");
    ASSERT_TRUE(f) << "missing fixture";
    nlohmann::json j = nlohmann::json::parse(f);
    GgufFile g(dir + name + ".gguf");
    ModelConfig c = read_gguf_config(g);
    EXPECT_EQ(c.architecture, j.at("model_type").get<std::string>());
    EXPECT_EQ(c.vocab_size, j.at("vocab_size").get<int64_t>());
    EXPECT_EQ(c.hidden_size, j.at("hidden_size").get<int64_t>());
    EXPECT_EQ(c.intermediate_size, j.at("intermediate_size").get<int64_t>());
    EXPECT_EQ(c.num_layers, j.at("num_hidden_layers").get<int64_t>());
    EXPECT_EQ(c.num_heads, j.at("num_attention_heads").get<int64_t>());
    EXPECT_EQ(c.num_kv_heads, j.at("num_key_value_heads").get<int64_t>());
    EXPECT_EQ(c.head_dim, c.hidden_size / c.num_heads);
    EXPECT_EQ(c.max_position_embeddings, j.at("max_position_embeddings").get<int64_t>());
    EXPECT_FLOAT_EQ(c.rms_norm_eps, j.at("rms_norm_eps").get<float>());
    EXPECT_FLOAT_EQ(c.rope_theta, j.at("rope_theta").get<float>());
    EXPECT_EQ(c.tie_word_embeddings, j.at("tie_word_embeddings").get<bool>());
    EXPECT_EQ(c.bos_token_id, j.at("bos_token_id").get<int32_t>());
    EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{j.at("eos_token_id").get<int32_t>()}));
  }
}

// A minimal model file: required keys for `arch`, plus what `extra` adds.
GgufWriter base(const std::string& arch) {
  GgufWriter w;
  auto u32 = [](uint64_t v) { return GgufValue::of_uint(GgufType::UINT32, v); };
  w.set("general.architecture", GgufValue::of_string(arch));
  w.set(arch + ".context_length", u32(32768));
  w.set(arch + ".embedding_length", u32(256));
  w.set(arch + ".block_count", u32(2));
  w.set(arch + ".feed_forward_length", u32(512));
  w.set(arch + ".attention.head_count", u32(4));
  w.set(arch + ".attention.layer_norm_rms_epsilon", GgufValue::of_float(GgufType::FLOAT32, 1e-6));
  return w;
}

ModelConfig parse(const GgufWriter& w) {
  std::vector<uint8_t> b = w.to_bytes();
  GgufFile g(b.data(), b.size(), "synthetic.gguf");
  return read_gguf_config(g);
}

void expect_config_error(const GgufWriter& w, const std::string& needle) {
  std::vector<uint8_t> b = w.to_bytes();
  GgufFile g(b.data(), b.size(), "synthetic.gguf");
  try {
    read_gguf_config(g);
    ADD_FAILURE() << "no error; expected: " << needle;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("synthetic.gguf"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(GgufConfig, Qwen2DefaultsAndVocabFromEmbedding) {
  GgufWriter w = base("qwen2");
  w.set("qwen2.attention.head_count_kv", GgufValue::of_uint(GgufType::UINT32, 2));
  w.set("qwen2.rope.freq_base", GgufValue::of_float(GgufType::FLOAT32, 1000000.0));
  w.set("qwen2.attention.sliding_window", GgufValue::of_uint(GgufType::UINT32, 4096));
  std::vector<float> emb(100 * 256);
  w.add_tensor("token_embd.weight", DType::F32, {100, 256}, emb.data(), emb.size() * 4);
  ModelConfig c = parse(w);
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);  // embedding_length / head_count
  EXPECT_EQ(c.vocab_size, 100);
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_TRUE(c.eos_token_ids.empty());
  // Defaults the registry, not the file, decides stay at ModelConfig's defaults.
  ModelConfig d;
  EXPECT_EQ(c.rope_layout, d.rope_layout);
  EXPECT_EQ(c.attention_bias, d.attention_bias);
  EXPECT_EQ(c.qk_norm, d.qk_norm);
}

TEST(GgufConfig, Qwen3ExplicitHeadDimAndVocabSources) {
  GgufWriter w = base("qwen3");
  w.set("qwen3.attention.key_length", GgufValue::of_uint(GgufType::UINT32, 128));
  w.set("tokenizer.ggml.tokens",
        GgufValue::of_array(
            GgufArray{GgufType::STRING, {GgufValue::of_string("a"), GgufValue::of_string("b")}}));
  std::vector<float> out(8 * 256);
  w.add_tensor("output.weight", DType::F32, {8, 256}, out.data(), out.size() * 4);
  ModelConfig c = parse(w);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 4);  // defaults to head_count
  EXPECT_EQ(c.vocab_size, 2);    // tokens array beats nothing else given
  EXPECT_FALSE(c.tie_word_embeddings);
  w.set("qwen3.vocab_size", GgufValue::of_uint(GgufType::UINT32, 151936));
  EXPECT_EQ(parse(w).vocab_size, 151936);  // explicit key wins
}

TEST(GgufConfig, RopeScaling) {
  GgufWriter w = base("llama");
  w.set("tokenizer.ggml.tokens",
        GgufValue::of_array(GgufArray{GgufType::STRING, {GgufValue::of_string("a")}}));
  w.set("llama.rope.scaling.type", GgufValue::of_string("linear"));
  w.set("llama.rope.scaling.factor", GgufValue::of_float(GgufType::FLOAT32, 4.0));
  ModelConfig c = parse(w);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 4.0f);

  w.set("llama.rope.scaling.type", GgufValue::of_string("llama3"));
  w.set("llama.rope.scaling.factor", GgufValue::of_float(GgufType::FLOAT32, 8.0));
  w.set("llama.rope.scaling.original_context_length", GgufValue::of_uint(GgufType::UINT32, 8192));
  c = parse(w);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);

  // llama.cpp's Llama 3.1 files carry precomputed rope_freqs instead; the model code applies them.
  std::vector<float> freqs(32, 1.0f);
  w.add_tensor("rope_freqs.weight", DType::F32, {32}, freqs.data(), freqs.size() * 4);
  EXPECT_EQ(parse(w).rope_scaling.kind, RopeScaling::Kind::None);

  GgufWriter y = base("llama");
  y.set("tokenizer.ggml.tokens",
        GgufValue::of_array(GgufArray{GgufType::STRING, {GgufValue::of_string("a")}}));
  y.set("llama.rope.scaling.type", GgufValue::of_string("yarn"));
  y.set("llama.rope.scaling.factor", GgufValue::of_float(GgufType::FLOAT32, 4.0));
  expect_config_error(y, "scaling.type 'yarn' is not supported");
}

TEST(GgufConfig, Errors) {
  expect_config_error(base("gpt2"),
                      "general.architecture 'gpt2' is not supported (supported: llama, qwen2, qwen3)");

  GgufWriter no_vocab = base("llama");
  expect_config_error(no_vocab, "cannot tell the vocabulary size");

  GgufWriter w = base("llama");
  w.set("llama.vocab_size", GgufValue::of_uint(GgufType::UINT32, 10));
  EXPECT_EQ(parse(w).vocab_size, 10);

  GgufWriter missing = base("llama");
  missing.set("llama.vocab_size", GgufValue::of_uint(GgufType::UINT32, 10));
  GgufWriter m2;
  for (const char* k : {"general.architecture"}) m2.set(k, GgufValue::of_string("llama"));
  m2.set("llama.context_length", GgufValue::of_uint(GgufType::UINT32, 10));
  expect_config_error(m2, "'llama.embedding_length' is missing");

  GgufWriter zero_heads = base("llama");
  zero_heads.set("llama.vocab_size", GgufValue::of_uint(GgufType::UINT32, 10));
  zero_heads.set("llama.attention.head_count", GgufValue::of_uint(GgufType::UINT32, 0));
  expect_config_error(zero_heads, "num_heads");

  GgufWriter bad_kv = base("llama");
  bad_kv.set("llama.vocab_size", GgufValue::of_uint(GgufType::UINT32, 10));
  bad_kv.set("llama.attention.head_count_kv", GgufValue::of_uint(GgufType::UINT32, 3));
  expect_config_error(bad_kv, "not a multiple of num_kv_heads 3");

  GgufWriter wrong_type = base("llama");
  wrong_type.set("llama.vocab_size", GgufValue::of_uint(GgufType::UINT32, 10));
  wrong_type.set("llama.block_count", GgufValue::of_string("two"));
  expect_config_error(wrong_type, "llama.block_count");

  GgufWriter bad_eos = base("llama");
  bad_eos.set("llama.vocab_size", GgufValue::of_uint(GgufType::UINT32, 10));
  bad_eos.set("tokenizer.ggml.eos_token_id", GgufValue::of_int(GgufType::INT32, -1));
  expect_config_error(bad_eos, "not a valid token id");
}

}  // namespace
}  // namespace inferx
