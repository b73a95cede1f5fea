#pragma once
// Architectures as data: for each supported family, the tensor names in Hugging Face and GGUF files and
// the few switches in which the forward pass differs. Adding a Llama-like family is a table entry.
#include <string>
#include <string_view>
#include <vector>

#include "formats/model_config.h"

namespace inferx {

enum class WeightNaming : uint8_t { HuggingFace, Gguf };

// Name patterns; "{i}" stands for the layer index. An empty pattern: the tensor does not exist.
struct TensorNames {
  std::string token_embedding, final_norm, lm_head;
  std::string attn_norm, q, k, v, o, q_bias, k_bias, v_bias, q_norm, k_norm;
  std::string ffn_norm, gate, up, down;
};

struct ArchSpec {
  std::string name;                                // ModelConfig::architecture
  std::vector<std::string> gguf_names;             // general.architecture values mapped to this spec
  bool qkv_bias = false;                           // q/k/v projections carry biases (Qwen2)
  bool qk_norm = false;                            // per-head RMSNorm of q and k before RoPE (Qwen3)
  RopeLayout gguf_rope_layout = RopeLayout::NeoX;  // llama.cpp permutes Llama q/k rows -> Interleaved
};

const TensorNames& tensor_names(WeightNaming naming);
// Throws inferx::Error listing the supported architectures.
const ArchSpec& find_arch(std::string_view name);
std::vector<std::string> supported_architectures();

// Fills the per-architecture switches (qkv bias, q/k norm, RoPE layout for the naming) into config.
void apply_arch_spec(ModelConfig& config, WeightNaming naming);

// "{i}" -> layer index.
std::string layer_tensor_name(const std::string& pattern, int64_t layer);

}  // namespace inferx
