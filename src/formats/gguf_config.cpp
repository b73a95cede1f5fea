// GGUF metadata -> ModelConfig. Key names follow the GGUF spec's "LLM" section (ggml docs/gguf.md):
// [llm].context_length, [llm].embedding_length, [llm].block_count, [llm].feed_forward_length,
// [llm].attention.head_count(_kv), [llm].attention.key_length, [llm].attention.layer_norm_rms_epsilon,
// [llm].rope.freq_base, [llm].rope.scaling.{type,factor,original_context_length}.
// RoPE layout, q/k/v biases and q/k norm are fixed per architecture and left to the model's registry.
#include "formats/gguf_config.h"

#include <fmt/ranges.h>

#include <array>
#include <limits>

#include "core/error.h"

namespace inferx {

namespace {

constexpr std::array<std::string_view, 3> kSupported = {"llama", "qwen2", "qwen3"};

int32_t token_id(const GgufFile& gguf, std::string_view key) {
  int64_t id = gguf.get_int(key);
  INFERX_CHECK(id >= 0 && id <= std::numeric_limits<int32_t>::max(), "{}: {} = {} is not a valid token id",
               gguf.path(), key, id);
  return static_cast<int32_t>(id);
}

RopeScaling read_rope_scaling(const GgufFile& gguf, const std::string& arch) {
  RopeScaling s;
  const std::string p = arch + ".rope.";
  // Llama 3.1 GGUFs made by llama.cpp carry a "rope_freqs.weight" tensor (per-frequency divisors already
  // computed from the llama3 formula) instead of scaling keys; the model code applies rope_freqs, so
  // scaling stays None here to avoid applying it twice.
  if (gguf.find("rope_freqs.weight") != nullptr) return s;

  if (const GgufValue* type = gguf.find_metadata(p + "scaling.type")) {
    std::string kind;
    try {
      kind = type->as_string();
    } catch (const Error& e) {
      fail("{}: metadata key '{}scaling.type': {}", gguf.path(), p, e.what());
    }
    if (kind == "none") return s;
    if (kind == "linear") {
      s.kind = RopeScaling::Kind::Linear;
    } else if (kind == "llama3") {
      s.kind = RopeScaling::Kind::Llama3;
      s.low_freq_factor =
          static_cast<float>(gguf.get_float(p + "scaling.low_freq_factor", s.low_freq_factor));
      s.high_freq_factor =
          static_cast<float>(gguf.get_float(p + "scaling.high_freq_factor", s.high_freq_factor));
    } else {
      fail("{}: {}scaling.type '{}' is not supported (supported: none, linear, llama3)", gguf.path(), p,
           kind);
    }
    s.factor = static_cast<float>(gguf.get_float(p + "scaling.factor"));
    s.original_max_position = gguf.get_int(p + "scaling.original_context_length", s.original_max_position);
    return s;
  }
  // Older converters wrote linear scaling as a bare factor.
  if (gguf.find_metadata(p + "scale_linear") != nullptr) {
    double factor = gguf.get_float(p + "scale_linear");
    if (factor != 1.0) {
      s.kind = RopeScaling::Kind::Linear;
      s.factor = static_cast<float>(factor);
    }
  }
  return s;
}

int64_t read_vocab_size(const GgufFile& gguf, const std::string& arch) {
  if (gguf.find_metadata(arch + ".vocab_size") != nullptr) return gguf.get_int(arch + ".vocab_size");
  if (const GgufValue* tokens = gguf.find_metadata("tokenizer.ggml.tokens")) {
    INFERX_CHECK(tokens->type == GgufType::ARRAY, "{}: tokenizer.ggml.tokens is not an array", gguf.path());
    return static_cast<int64_t>(tokens->as_array().items.size());
  }
  if (const TensorEntry* emb = gguf.find("token_embd.weight")) return emb->shape.front();
  fail("{}: cannot tell the vocabulary size: no {}.vocab_size, tokenizer.ggml.tokens or token_embd.weight",
       gguf.path(), arch);
}

}  // namespace

ModelConfig read_gguf_config(const GgufFile& gguf) {
  ModelConfig c;
  std::string arch = gguf.get_string("general.architecture");
  bool supported = false;
  for (std::string_view a : kSupported) supported = supported || a == arch;
  INFERX_CHECK(supported, "{}: general.architecture '{}' is not supported (supported: {})", gguf.path(), arch,
               fmt::join(kSupported, ", "));
  c.architecture = arch;
  const std::string p = arch + ".";

  c.max_position_embeddings = gguf.get_int(p + "context_length");
  c.hidden_size = gguf.get_int(p + "embedding_length");
  c.num_layers = gguf.get_int(p + "block_count");
  c.intermediate_size = gguf.get_int(p + "feed_forward_length");
  c.num_heads = gguf.get_int(p + "attention.head_count");
  c.num_kv_heads = gguf.get_int(p + "attention.head_count_kv", c.num_heads);
  // head_count 0 is reported by validate(); only divide when it is usable.
  int64_t default_head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  c.head_dim = gguf.get_int(p + "attention.key_length", default_head_dim);
  c.rms_norm_eps = static_cast<float>(gguf.get_float(p + "attention.layer_norm_rms_epsilon", c.rms_norm_eps));
  c.rope_theta = static_cast<float>(gguf.get_float(p + "rope.freq_base", 10000.0));
  c.rope_scaling = read_rope_scaling(gguf, arch);
  c.sliding_window = gguf.get_int(p + "attention.sliding_window", 0);
  c.vocab_size = read_vocab_size(gguf, arch);
  c.tie_word_embeddings = gguf.find("output.weight") == nullptr;
  if (gguf.find_metadata("tokenizer.ggml.bos_token_id") != nullptr)
    c.bos_token_id = token_id(gguf, "tokenizer.ggml.bos_token_id");
  if (gguf.find_metadata("tokenizer.ggml.eos_token_id") != nullptr)
    c.eos_token_ids = {token_id(gguf, "tokenizer.ggml.eos_token_id")};

  c.validate(gguf.path());
  return c;
}

}  // namespace inferx
