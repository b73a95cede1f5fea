#include "text/tokenizer_loader.h"

#include "formats/gguf.h"
#include "text/spm_tokenizer.h"

namespace inferx {

ModelText load_model_text(const std::string& model_spec, const TensorSource* source) {
  ModelText out;
  if (auto* gguf = dynamic_cast<const GgufFile*>(source); gguf != nullptr) {
    if (gguf->find_metadata("tokenizer.ggml.model") != nullptr) {
      out.tokenizer = load_gguf_tokenizer(*gguf);
      if (auto* spm = dynamic_cast<const SpmTokenizer*>(out.tokenizer.get()))
        out.add_bos = spm->add_bos_default();
    }
    if (const GgufValue* t = gguf->find_metadata("tokenizer.chat_template"); t && t->type == GgufType::STRING)
      out.chat_template = t->as_string();
  }
  // Hugging Face folders (tokenizer.json) come with the tokenizer work (issue 3).
  (void)model_spec;
  return out;
}

}  // namespace inferx
