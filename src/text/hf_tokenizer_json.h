#pragma once
// Hugging Face tokenizer files: tokenizer.json (tokenizers' serialization: model, added_tokens,
// normalizer, pre_tokenizer, post_processor, decoder), the older vocab.json + merges.txt pair of GPT-2
// style folders, and the transformers files around them (tokenizer_config.json, special_tokens_map.json,
// generation_config.json) that fix BOS/EOS, add_bos_token/add_eos_token and the chat template.
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/bpe_tokenizer.h"

namespace inferx {

// Parses a tokenizer.json document. `config` is tokenizer_config.json (or null): add_bos_token /
// add_eos_token rebuild the post-processor as transformers' Llama/Gemma tokenizers do, bos_token /
// eos_token name BOS/EOS. Throws inferx::Error naming `source` and the unsupported component
// (model type, normalizer, pre-tokenizer, post-processor or decoder).
std::unique_ptr<BpeTokenizer> parse_hf_tokenizer_json(const nlohmann::json& doc, const std::string& source,
                                                      const nlohmann::json& config = nullptr);
std::unique_ptr<BpeTokenizer> load_hf_tokenizer_json(const std::string& path,
                                                     const nlohmann::json& config = nullptr);

// A GPT-2 style vocabulary file (token -> id JSON: vocab.json, encoder.json) and merges file
// ("a b" lines, optional "#version" header: merges.txt, vocab.bpe) with the given pre_tokenizer JSON
// (null: GPT-2's ByteLevel). Special tokens of `config` that are in the vocabulary become special.
std::unique_ptr<BpeTokenizer> load_hf_vocab_merges(const std::string& vocab_path,
                                                   const std::string& merges_path,
                                                   const nlohmann::json& pre_tokenizer, bool ignore_merges,
                                                   const nlohmann::json& config = nullptr);

// Everything text-related in a Hugging Face model folder.
struct HfFolderText {
  std::unique_ptr<BpeTokenizer> tokenizer;
  std::optional<std::string> chat_template;
};
// Reads DIR/tokenizer.json (or DIR/vocab.json + DIR/merges.txt) and the config files next to it.
HfFolderText load_hf_folder_text(const std::string& dir);

}  // namespace inferx
