#pragma once
// Byte-pair-encoding tokenizer with Hugging Face tokenizers' pipeline: added tokens -> normalizer ->
// pre-tokenizer -> BPE model -> post-processor, and the decoder chain back. One class covers
//   - byte-level BPE (GPT-2, Llama 3, Qwen2, DeepSeek, Falcon, StarCoder, MPT/NeoX): GPT-2's
//     byte-to-unicode alphabet (Radford et al. 2019, openai/gpt-2 encoder.py), merges applied by rank;
//   - SentencePiece-style BPE from tokenizer.json (Llama 2, Mistral, TinyLlama): "▁" for spaces,
//     merges by rank, unknown characters as <0xXX> byte tokens (byte_fallback).
// The model follows tokenizers/src/models/bpe (model.rs merge_word, word.rs merge_all): a word starts
// as one symbol per character (per byte for byte-level vocabularies), then the adjacent pair with the
// lowest merge rank is merged, leftmost first on ties, until no pair has a merge. ignore_merges (Llama
// 3): a word that is itself in the vocabulary is emitted whole.
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/added_tokens.h"
#include "text/decoder.h"
#include "text/normalizer.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"

namespace inferx {

// Everything a loader reads (tokenizer.json, GGUF tokenizer.ggml.*).
struct BpeSpec {
  std::string source;              // file name, for error messages
  std::vector<std::string> vocab;  // id -> token string of the model ("" where no model token has the id)
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::string unk_token;                                    // "" when none
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  std::vector<AddedToken> added_tokens;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  std::vector<int32_t> prefix_ids, suffix_ids;  // added around a sequence when special tokens are wanted
  int32_t bos_id = -1, eos_id = -1;
};

// How many token ids a vocabulary naming `named` tokens may span: its tokens plus 65536 unused ids, and at
// least 2^21 (a vocabulary cut from a real one keeps the original ids: ollama's mini Llama 3 test tokenizer
// names 323 tokens up to id 128255). A corrupt file with one huge id is refused instead of sizing every
// per-token table by it (about 100 bytes per id).
inline size_t max_token_ids(size_t named) { return std::max(named + 65536, size_t{1} << 21); }

class BpeTokenizer final : public Tokenizer {
 public:
  // Validates the spec (merges name vocabulary tokens, ids in range); throws inferx::Error naming
  // spec.source.
  explicit BpeTokenizer(BpeSpec spec);
  ~BpeTokenizer() override;

  // add_bos: add the post-processor's special tokens (BOS and/or EOS), like add_special_tokens=True.
  // Invalid UTF-8 in `text` is replaced by U+FFFD first (per maximal subpart, as Python's
  // bytes.decode("utf-8", "replace")), so the ids are those of Hugging Face for that decoded string.
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids) const override { return decode(ids, true); }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  TokenType token_type(int32_t id) const override;
  const std::string& piece(int32_t id) const override;

  // Whether encode(text, true) puts a token before the text (what a caller's "add BOS" default is).
  bool adds_prefix() const { return !prefix_ids_.empty(); }

 private:
  void check_id(int32_t id) const;
  // The BPE model on one pre-tokenized word (raw bytes for byte-level vocabularies).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_small(std::vector<int32_t>& symbols) const;
  void merge_large(std::vector<int32_t>& symbols) const;
  // Rank and result of merging the pair (left, right), or false.
  bool find_merge(int32_t left, int32_t right, int32_t& rank, int32_t& merged) const;

  std::string source_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Decoder decoder_;
  AddedTokenMatcher raw_added_, normalized_added_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool byte_level_ = false, byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;

  std::vector<std::string> pieces_;  // id -> token string (model or added)
  std::vector<std::string> bytes_;   // id -> token_bytes
  std::vector<TokenType> types_;
  std::vector<std::string> keys_;  // storage for lookup_ keys (raw bytes for byte-level vocabularies)
  std::unordered_map<std::string_view, int32_t> lookup_;  // model token -> id
  std::array<int32_t, 256> byte_ids_;                     // byte-level: byte -> id; byte_fallback: <0xXX>
  struct MergeSlot {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  std::vector<MergeSlot> merges_;  // open addressing, key = left << 32 | right, empty key = ~0
  uint64_t merge_mask_ = 0;
};

}  // namespace inferx
