#pragma once
// Finds and loads the tokenizer (and chat template) that belongs to a model: GGUF tokenizer.ggml.*
// metadata, or a Hugging Face folder's tokenizer.json + tokenizer_config.json.
#include <memory>
#include <optional>
#include <string>

#include "text/tokenizer.h"

namespace inferx {

class TensorSource;

struct ModelText {
  std::unique_ptr<Tokenizer> tokenizer;      // null when the model has none (dummy models)
  std::optional<std::string> chat_template;  // template source, when the model ships one
  bool add_bos = true;                       // whether prompts get BOS by default
};

// model_spec: as given to Model::load; source: the model's tensor source (GGUF metadata lives there).
ModelText load_model_text(const std::string& model_spec, const TensorSource* source);
// The same for a model given by path alone (a .gguf file, a Hugging Face folder or a tokenizer.json), as the
// text-only commands and benches open it: a .gguf is read for its metadata and closed again.
ModelText load_model_text(const std::string& model_spec);

}  // namespace inferx
