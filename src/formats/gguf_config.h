#pragma once
// GGUF metadata ({arch}.context_length, {arch}.embedding_length, {arch}.rope.freq_base, ...) ->
// ModelConfig, for general.architecture llama / qwen2 / qwen3 (Mistral GGUFs say "llama").
#include "formats/gguf.h"
#include "formats/model_config.h"

namespace inferx {

ModelConfig read_gguf_config(const GgufFile& gguf);

}  // namespace inferx
