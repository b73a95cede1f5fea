// Model::load: dummy shapes, file-kind detection, and clear errors for broken model folders/files.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "formats/safetensors.h"
#include "model/arch_registry.h"
#include "model/dummy_models.h"
#include "model/model.h"

namespace fs = std::filesystem;

namespace inferx {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ArchRegistry, KnownAndUnknown) {
  EXPECT_EQ(find_arch("qwen2").qkv_bias, true);
  EXPECT_EQ(find_arch("qwen3").qk_norm, true);
  EXPECT_EQ(find_arch("llama").gguf_rope_layout, RopeLayout::Interleaved);
  std::string msg = error_of([] { find_arch("gpt-j"); });
  EXPECT_NE(msg.find("unsupported architecture 'gpt-j'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("qwen3"), std::string::npos) << msg;
}

TEST(DummyModels, RealShapes) {
  ModelConfig c = dummy_model_config("llama-3-8b");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(dummy_model_config("qwen2.5-7b").attention_bias, true);
  EXPECT_EQ(dummy_model_config("llama-3.2-1b").tie_word_embeddings, true);
  EXPECT_NE(error_of([] { dummy_model_config("gpt-5"); }).find("unknown shape"), std::string::npos);
}

class DummyTiny : public ::testing::TestWithParam<const char*> {};

// Prefill all at once, or token by token through the KV cache: the same logits.
TEST_P(DummyTiny, PrefillEqualsIncrementalDecode) {
  auto be = make_cpu_backend({2});
  LoadOptions lo;
  lo.dummy_dtype = *dtype_from_name(GetParam());
  auto model = Model::load("dummy:tiny", *be, lo);
  EXPECT_NE(model->description().find("RANDOM"), std::string::npos);
  std::vector<int32_t> ids = {1, 17, 400, 3, 99, 250, 7, 511};
  SequenceRunner all(*model, 32);
  std::vector<float> full = all.step_all_logits(ids);
  SequenceRunner inc(*model, 32);
  const int64_t V = model->config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<float>& l = inc.step({ids[i]});
    for (int64_t j = 0; j < V; ++j) {
      ASSERT_TRUE(std::isfinite(l[j]));
      ASSERT_NEAR(l[j], full[i * V + j], 1e-4f * (1 + std::fabs(full[i * V + j]))) << "token " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DummyTiny,
                         ::testing::Values("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k"));

TEST(DummyModels, DtypeInSpecAndUnknownDtype) {
  auto be = make_cpu_backend({1});
  auto model = Model::load("dummy:tiny:q6_k", *be);
  EXPECT_NE(model->description().find("Q6_K"), std::string::npos) << model->description();
  std::string msg = error_of([&] { Model::load("dummy:tiny:q5_k", *be); });
  EXPECT_NE(msg.find("unknown weight type 'q5_k'"), std::string::npos) << msg;
}

class BrokenFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("inferx_model_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
      "tie_word_embeddings": true})";
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::map<std::string, std::vector<int64_t>>& tensors) {
    SafetensorsWriter w;
    for (const auto& [name, shape] : tensors) {
      int64_t n = 1;
      for (auto d : shape) n *= d;
      std::vector<float> data(static_cast<size_t>(n), 0.01f);
      w.add_tensor(name, DType::F32, shape, data.data(), data.size() * 4);
    }
    w.write((dir_ / "model.safetensors").string());
  }
  std::map<std::string, std::vector<int64_t>> complete() {
    return {{"model.embed_tokens.weight", {32, 16}},
            {"model.norm.weight", {16}},
            {"model.layers.0.input_layernorm.weight", {16}},
            {"model.layers.0.post_attention_layernorm.weight", {16}},
            {"model.layers.0.self_attn.q_proj.weight", {16, 16}},
            {"model.layers.0.self_attn.k_proj.weight", {8, 16}},
            {"model.layers.0.self_attn.v_proj.weight", {8, 16}},
            {"model.layers.0.self_attn.o_proj.weight", {16, 16}},
            {"model.layers.0.mlp.gate_proj.weight", {32, 16}},
            {"model.layers.0.mlp.up_proj.weight", {32, 16}},
            {"model.layers.0.mlp.down_proj.weight", {16, 32}}};
  }
  std::string load_error() {
    auto be = make_cpu_backend({1});
    return error_of([&] { Model::load(dir_.string(), *be); });
  }
  fs::path dir_;
};

TEST_F(BrokenFolder, CompleteLoadsAndRuns) {
  write(complete());
  auto be = make_cpu_backend({1});
  auto model = Model::load(dir_.string(), *be);
  SequenceRunner r(*model, 8);
  EXPECT_EQ(r.step({1, 2, 3}).size(), 32u);
}

TEST_F(BrokenFolder, MissingTensorIsNamed) {
  auto t = complete();
  t.erase("model.layers.0.mlp.up_proj.weight");
  write(t);
  std::string msg = load_error();
  EXPECT_NE(msg.find("model.layers.0.mlp.up_proj.weight' is missing"), std::string::npos) << msg;
}

TEST_F(BrokenFolder, WrongShapeIsNamed) {
  auto t = complete();
  t["model.layers.0.self_attn.k_proj.weight"] = {16, 16};
  write(t);
  std::string msg = load_error();
  EXPECT_NE(msg.find("k_proj.weight' has shape [16, 16], expected [8, 16]"), std::string::npos) << msg;
}

TEST_F(BrokenFolder, NoWeights) {
  std::string msg = load_error();
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST(ModelLoad, NotAModel) {
  auto be = make_cpu_backend({1});
  EXPECT_NE(error_of([&] { Model::load("/nonexistent/model.gguf", *be); }).find("no such file"),
            std::string::npos);
  fs::path p = fs::temp_directory_path() / ("inferx_not_a_model_" + std::to_string(::getpid()) + ".bin");
  std::ofstream(p) << "hello";
  std::string msg = error_of([&] { Model::load(p.string(), *be); });
  EXPECT_NE(msg.find("not a GGUF file"), std::string::npos) << msg;
  fs::remove(p);
}

}  // namespace
}  // namespace inferx
