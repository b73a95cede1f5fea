// Finds a model's tokenizer and chat template: GGUF metadata, a Hugging Face folder, or a tokenizer.json.
#include "text/tokenizer_loader.h"

#include <filesystem>

#include "formats/gguf.h"
#include "text/bpe_tokenizer.h"
#include "text/hf_tokenizer_json.h"
#include "text/spm_tokenizer.h"

namespace inferx {

ModelText load_model_text(const std::string& model_spec, const TensorSource* source) {
  namespace fs = std::filesystem;
  ModelText out;
  if (auto* gguf = dynamic_cast<const GgufFile*>(source); gguf != nullptr) {
    if (gguf->find_metadata("tokenizer.ggml.model") != nullptr) {
      out.tokenizer = load_gguf_tokenizer(*gguf);
      if (auto* spm = dynamic_cast<const SpmTokenizer*>(out.tokenizer.get()))
        out.add_bos = spm->add_bos_default();
      if (auto* bpe = dynamic_cast<const BpeTokenizer*>(out.tokenizer.get()))
        out.add_bos = bpe->adds_prefix();
    }
    if (const GgufValue* t = gguf->find_metadata("tokenizer.chat_template"); t && t->type == GgufType::STRING)
      out.chat_template = t->as_string();
    return out;
  }
  // A Hugging Face folder (tokenizer.json or vocab.json + merges.txt), or a bare tokenizer.json file.
  std::error_code ec;
  const fs::path path(model_spec);
  if (fs::is_directory(path, ec) &&
      (fs::exists(path / "tokenizer.json", ec) || fs::exists(path / "vocab.json", ec))) {
    HfFolderText hf = load_hf_folder_text(model_spec);
    out.add_bos = hf.tokenizer->adds_prefix();
    out.tokenizer = std::move(hf.tokenizer);
    out.chat_template = std::move(hf.chat_template);
  } else if (fs::is_regular_file(path, ec) && path.extension() == ".json") {
    auto tok = load_hf_tokenizer_json(model_spec);
    out.add_bos = tok->adds_prefix();
    out.tokenizer = std::move(tok);
  }
  return out;
}

ModelText load_model_text(const std::string& model_spec) {
  std::unique_ptr<GgufFile> gguf;
  if (model_spec.size() > 5 && model_spec.ends_with(".gguf")) gguf = std::make_unique<GgufFile>(model_spec);
  return load_model_text(model_spec, gguf.get());
}

}  // namespace inferx
