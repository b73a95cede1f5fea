#pragma once
// `inferx quantize`: writes a model loaded with a quantization plan as a Hugging Face folder in the
// InferX quantized layout (docs/quantized-checkpoint.md), loadable with `--model DIR`.
#include <string>

#include "model/model.h"

namespace inferx {

// `model` must have been loaded from the Hugging Face folder `source_dir` (on the CPU backend). Writes
// out_dir/model.safetensors (quantized linear layers in our layout, every other tensor copied as
// stored), out_dir/config.json (with quantization_config {quant_method: "inferx", plan}) and copies the
// folder's other files (tokenizer, generation config). Throws if out_dir would overwrite source_dir.
void write_quantized_checkpoint(const std::string& source_dir, const Model& model,
                                const std::string& out_dir);

}  // namespace inferx
