// hf_config: the published config.json of real models (copied here from their Hugging Face model
// pages) parse to the numbers those models are documented with; wrong input gives named errors.
#include "formats/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace inferx {
namespace {

constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr const char* kQwen25_7B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 18944,
  "max_position_embeddings": 131072,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 152064
})";

constexpr const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Replaces the first occurrence of `from` in `text` (which must be there) with `to`.
std::string edit(std::string text, const std::string& from, const std::string& to) {
  size_t pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) text.replace(pos, from.size(), to);
  return text;
}

std::string error_of(const std::string& text) {
  try {
    parse_hf_config(text, "config.json");
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

::testing::AssertionResult is_error(const std::string& message, const std::string& needle) {
  if (message.rfind("config.json", 0) == 0 && message.find(needle) != std::string::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "error \"" << message << "\" does not name config.json and contain \"" << needle << "\"";
}

TEST(HfConfigTest, Llama31_8B) {
  ModelConfig c = parse_hf_config(kLlama31_8B, "config.json");
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{128001});
  // Left to the architecture registry: the parser keeps the defaults.
  EXPECT_EQ(c.rope_layout, ModelConfig{}.rope_layout);
  EXPECT_FALSE(c.qk_norm);
}

TEST(HfConfigTest, Llama32_1B_Tied) {
  ModelConfig c = parse_hf_config(kLlama32_1B, "config.json");
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 16);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 32.0f);
}

TEST(HfConfigTest, Mistral7B_SlidingWindow) {
  ModelConfig c = parse_hf_config(kMistral7B, "config.json");
  EXPECT_EQ(c.architecture, "mistral");
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::None);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
}

TEST(HfConfigTest, Qwen25_7B_WindowDisabled) {
  ModelConfig c = parse_hf_config(kQwen25_7B, "config.json");
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_EQ(c.hidden_size, 3584);
  EXPECT_EQ(c.num_heads, 28);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.sliding_window, 0) << "use_sliding_window is false";
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FALSE(c.attention_bias) << "not in the json: the registry sets Qwen2's bias";
  // Turning the window on honours the value.
  c = parse_hf_config(edit(kQwen25_7B, R"("use_sliding_window": false)", R"("use_sliding_window": true)"),
                      "config.json");
  EXPECT_EQ(c.sliding_window, 131072);
}

TEST(HfConfigTest, Qwen3_06B_ExplicitHeadDim) {
  ModelConfig c = parse_hf_config(kQwen3_06B, "config.json");
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.head_dim, 128) << "not hidden_size / num_heads = 64";
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::None);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);  // written as an integer
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151645});
}

TEST(HfConfigTest, DefaultsAndAlternatives) {
  // model_type alone identifies the architecture; absent kv heads, rope_theta and head_dim default.
  std::string minimal = R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 256, "head_dim": null})";
  ModelConfig c = parse_hf_config(minimal, "config.json");
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_TRUE(c.eos_token_ids.empty());

  c = parse_hf_config(edit(minimal, "\"head_dim\": null", R"("eos_token_id": [128001, 128008, 128009],
      "rope_scaling": {"type": "linear", "factor": 2.0}, "attention_bias": true)"),
                      "config.json");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 2.0f);
  EXPECT_TRUE(c.attention_bias);

  c = parse_hf_config(edit(minimal, "\"head_dim\": null", R"("rope_scaling": {"rope_type": "default"})"),
                      "config.json");
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::None);
  for (auto [cls, key] :
       {std::pair{"MistralForCausalLM", "mistral"}, std::pair{"Qwen2ForCausalLM", "qwen2"}}) {
    c = parse_hf_config(edit(minimal, "\"head_dim\": null", fmt::format(R"("architectures": ["{}"])", cls)),
                        "config.json");
    EXPECT_EQ(c.architecture, key);
  }
}

TEST(HfConfigTest, UnsupportedArchitecture) {
  std::string e = error_of(edit(kLlama31_8B, "LlamaForCausalLM", "GPT2LMHeadModel"));
  EXPECT_TRUE(is_error(e, "architecture 'GPT2LMHeadModel' is not supported"));
  for (const char* name : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
    EXPECT_NE(e.find(name), std::string::npos) << name;
  EXPECT_TRUE(is_error(error_of(R"({"model_type": "gemma"})"), "architecture 'gemma'"));
  EXPECT_TRUE(is_error(error_of(R"({"vocab_size": 3})"), "neither 'architectures' nor 'model_type'"));
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, R"(["LlamaForCausalLM"])", "[]")), "'architectures'"));
}

TEST(HfConfigTest, WrongTypes) {
  EXPECT_EQ(error_of(edit(kLlama31_8B, "\"hidden_size\": 4096", "\"hidden_size\": \"4096\"")),
            "config.json: field 'hidden_size' must be an integer, got string");
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"hidden_size\": 4096", "\"hidden_size\": 4096.5")),
                       "field 'hidden_size' must be an integer, got float"));
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"rope_theta\": 500000.0", "\"rope_theta\": [1]")),
                       "field 'rope_theta' must be a number, got array"));
  EXPECT_TRUE(
      is_error(error_of(edit(kLlama31_8B, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0")),
               "field 'tie_word_embeddings' must be a boolean"));
  EXPECT_TRUE(is_error(error_of(edit(kMistral7B, "\"sliding_window\": 4096", "\"sliding_window\": \"4k\"")),
                       "field 'sliding_window' must be an integer"));
  EXPECT_TRUE(
      is_error(error_of(edit(kLlama31_8B, "\"eos_token_id\": 128001", "\"eos_token_id\": [1, \"x\"]")),
               "field 'eos_token_id[1]' must be an integer"));
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"eos_token_id\": 128001", "\"eos_token_id\": -5")),
                       "is not a token id"));
  EXPECT_TRUE(
      is_error(error_of(edit(kLlama31_8B, "\"vocab_size\": 128256", "\"vocab_size\": 18446744073709551615")),
               "out of range"));
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"rope_theta\": 500000.0", "\"rope_theta\": 1e300")),
                       "field 'rope_theta' = 1e+300 is out of range"));
  EXPECT_TRUE(is_error(error_of(edit(kQwen3_06B, "\"rope_scaling\": null", "\"rope_scaling\": 2")),
                       "'rope_scaling' must be an object or null"));
}

TEST(HfConfigTest, MissingAndInvalidValues) {
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"vocab_size\": 128256", "\"vocab\": 1")),
                       "missing field 'vocab_size'"));
  // ModelConfig::validate runs at the end.
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"hidden_size\": 4096", "\"hidden_size\": -4096")),
                       "hidden_size"));
  EXPECT_TRUE(
      is_error(error_of(edit(kLlama31_8B, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5")),
               "not a multiple of num_kv_heads"));
  EXPECT_TRUE(
      is_error(error_of(edit(kLlama31_8B, "\"num_attention_heads\": 32", "\"num_attention_heads\": 0")),
               "num_attention_heads"));
  EXPECT_TRUE(
      is_error(error_of(edit(kLlama31_8B, "\"num_attention_heads\": 32", "\"num_attention_heads\": 30")),
               "not a multiple of num_attention_heads"));
}

TEST(HfConfigTest, RopeScaling) {
  for (const char* type : {"yarn", "dynamic", "longrope"}) {
    std::string e =
        error_of(edit(kLlama31_8B, "\"rope_type\": \"llama3\"", fmt::format("\"rope_type\": \"{}\"", type)));
    EXPECT_TRUE(is_error(e, fmt::format("rope_scaling type '{}' is not supported", type)));
  }
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"low_freq_factor\": 1.0,", "")),
                       "missing field 'low_freq_factor'"));
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"rope_type\": \"llama3\"", "\"kind\": \"llama3\"")),
                       "no 'rope_type'"));
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 1.0")),
                       "low_freq_factor < high_freq_factor"));
  EXPECT_TRUE(is_error(error_of(edit(kLlama31_8B, "\"factor\": 8.0", "\"factor\": 0.5")), "factor"));
}

TEST(HfConfigTest, MalformedJson) {
  EXPECT_TRUE(is_error(error_of("{\"vocab_size\": "), "not valid JSON"));
  EXPECT_TRUE(is_error(error_of("[1, 2]"), "must be a JSON object, got array"));
  EXPECT_TRUE(is_error(error_of(R"({"vocab_size": 1e999})"), "not valid JSON"));
  EXPECT_TRUE(is_error(error_of(std::string(100000, '[') + std::string(100000, ']')), "nested deeper"));
  EXPECT_TRUE(is_error(error_of(""), "not valid JSON"));
}

// read_hf_config: folder layout and generation_config.json overriding the eos/bos ids.
TEST(HfConfigTest, ReadFolder) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("inferx_hfcfg_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  try {
    read_hf_config(dir.string());
    ADD_FAILURE() << "expected an error for a folder without config.json";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no config.json"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "config.json") << kLlama31_8B;
  ModelConfig c = read_hf_config(dir.string());
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{128001});

  // Llama 3.1 Instruct's generation_config.json.
  std::ofstream(dir / "generation_config.json") << R"({
  "bos_token_id": 128000,
  "do_sample": true,
  "eos_token_id": [128001, 128008, 128009],
  "temperature": 0.6,
  "top_p": 0.9,
  "transformers_version": "4.42.3"
})";
  c = read_hf_config(dir.string());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);

  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": "x"})";
  try {
    read_hf_config(dir.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json: field 'eos_token_id'"), std::string::npos)
        << e.what();
  }
  // Errors in config.json name its path.
  std::ofstream(dir / "config.json") << "{}";
  try {
    read_hf_config(dir.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "config.json").string()), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace inferx
