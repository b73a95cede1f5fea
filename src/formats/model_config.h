#pragma once
// The architecture-neutral description of a decoder-only transformer. Filled from a Hugging Face
// config.json (formats/hf_config.h) or GGUF metadata (formats/gguf_config.h); the architecture registry
// (model/arch_registry.h) then applies what is fixed per architecture (biases, q/k norm, RoPE layout).
// It lives in formats/ (not model/) because the readers produce it and formats sits below model.
#include <cstdint>
#include <string>
#include <vector>

namespace inferx {

// Which pairs of a head's dimensions RoPE rotates together.
enum class RopeLayout : uint8_t {
  Interleaved,  // pairs (2i, 2i+1): Meta's original Llama, llama2.c, GGUF "llama" (llama.cpp permutes q/k)
  NeoX,         // pairs (i, i + d/2): Hugging Face rotate_half, GGUF qwen2/qwen3
};

struct RopeScaling {
  enum class Kind : uint8_t { None, Linear, Llama3 };
  Kind kind = Kind::None;
  float factor = 1.0f;
  // llama3 ("rope_type": "llama3"): frequencies with wavelengths beyond original_max_position /
  // low_freq_factor are divided by factor, those below original_max_position / high_freq_factor are kept,
  // and the band between is interpolated (Llama 3.1 report; transformers _compute_llama3_parameters).
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position = 8192;
  // Per-frequency divisors of the inverse frequencies (GGUF "rope_freqs.weight", which llama.cpp's
  // converter writes for Llama 3.1+ instead of scaling keys: the llama3 formula, precomputed). Empty: none.
  std::vector<float> freq_factors = {};

  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  std::string architecture;  // registry key: "llama", "mistral", "qwen2", "qwen3"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // usually hidden_size / num_heads; Qwen3 sets it explicitly
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  RopeLayout rope_layout = RopeLayout::NeoX;
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  int64_t sliding_window = 0;   // 0: full attention
  bool attention_bias = false;  // bias on q, k, v projections (Qwen2)
  bool qk_norm = false;         // RMSNorm over each q and k head before RoPE (Qwen3)
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  // Throws inferx::Error naming `source` when a field is missing, non-positive or inconsistent
  // (heads not dividing, absurd sizes).
  void validate(const std::string& source) const;
};

}  // namespace inferx
