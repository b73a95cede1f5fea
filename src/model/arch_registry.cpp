#include "model/arch_registry.h"

#include <array>

#include "core/error.h"

namespace inferx {

namespace {

// Hugging Face transformers names (modeling_llama.py and its descendants).
const TensorNames kHfNames = {
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head.weight",
    "model.layers.{i}.input_layernorm.weight",
    "model.layers.{i}.self_attn.q_proj.weight",
    "model.layers.{i}.self_attn.k_proj.weight",
    "model.layers.{i}.self_attn.v_proj.weight",
    "model.layers.{i}.self_attn.o_proj.weight",
    "model.layers.{i}.self_attn.q_proj.bias",
    "model.layers.{i}.self_attn.k_proj.bias",
    "model.layers.{i}.self_attn.v_proj.bias",
    "model.layers.{i}.self_attn.q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight",
    "model.layers.{i}.mlp.gate_proj.weight",
    "model.layers.{i}.mlp.up_proj.weight",
    "model.layers.{i}.mlp.down_proj.weight",
};

// llama.cpp GGUF names (gguf-py constants.py, MODEL_TENSOR names).
const TensorNames kGgufNames = {
    "token_embd.weight",          "output_norm.weight",         "output.weight",
    "blk.{i}.attn_norm.weight",   "blk.{i}.attn_q.weight",      "blk.{i}.attn_k.weight",
    "blk.{i}.attn_v.weight",      "blk.{i}.attn_output.weight", "blk.{i}.attn_q.bias",
    "blk.{i}.attn_k.bias",        "blk.{i}.attn_v.bias",        "blk.{i}.attn_q_norm.weight",
    "blk.{i}.attn_k_norm.weight", "blk.{i}.ffn_norm.weight",    "blk.{i}.ffn_gate.weight",
    "blk.{i}.ffn_up.weight",      "blk.{i}.ffn_down.weight",
};

const std::array<ArchSpec, 4> kArchs = {{
    // Llama 2/3/3.1/3.2: llama.cpp's converter permutes q/k rows so GGUF files use interleaved pairs.
    {"llama", {"llama"}, false, false, RopeLayout::Interleaved},
    // Mistral: Llama plus a sliding window (config); GGUFs call it "llama" and are permuted the same way.
    {"mistral", {}, false, false, RopeLayout::Interleaved},
    {"qwen2", {"qwen2"}, true, false, RopeLayout::NeoX},
    {"qwen3", {"qwen3"}, false, true, RopeLayout::NeoX},
}};

}  // namespace

const TensorNames& tensor_names(WeightNaming naming) {
  return naming == WeightNaming::Gguf ? kGgufNames : kHfNames;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const auto& a : kArchs) out.push_back(a.name);
  return out;
}

const ArchSpec& find_arch(std::string_view name) {
  for (const auto& a : kArchs)
    if (a.name == name) return a;
  for (const auto& a : kArchs)
    for (const auto& g : a.gguf_names)
      if (g == name) return a;
  fail("unsupported architecture '{}' (supported: {})", name, fmt::join(supported_architectures(), ", "));
}

void apply_arch_spec(ModelConfig& config, WeightNaming naming) {
  const ArchSpec& spec = find_arch(config.architecture);
  config.architecture = spec.name;
  config.attention_bias = config.attention_bias || spec.qkv_bias;
  config.qk_norm = spec.qk_norm;
  // Hugging Face checkpoints all use rotate_half (NeoX) pairs; GGUF depends on the converter.
  config.rope_layout = naming == WeightNaming::Gguf ? spec.gguf_rope_layout : RopeLayout::NeoX;
}

std::string layer_tensor_name(const std::string& pattern, int64_t layer) {
  std::string out = pattern;
  auto at = out.find("{i}");
  if (at != std::string::npos) out.replace(at, 3, std::to_string(layer));
  return out;
}

}  // namespace inferx
