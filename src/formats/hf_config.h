#pragma once
// Hugging Face config.json -> ModelConfig, for the architectures in model/arch_registry
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM).
#include <string>

#include "formats/model_config.h"

namespace inferx {

// Reads `folder`/config.json (+ generation_config.json for eos ids when present). Throws inferx::Error
// naming the file and field on missing/invalid fields or an unsupported architecture.
ModelConfig read_hf_config(const std::string& folder);
// Parses config.json text; `source` names it in errors.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& source);

}  // namespace inferx
