#pragma once
// SentencePiece-style BPE tokenizer (the "llama" tokenizer.ggml.model of GGUF, and llama2.c's
// tokenizer.bin). Private to src/text: callers use the Tokenizer interface of text/tokenizer.h and the
// loaders there.
//
// Encoding follows SentencePiece's BPE model (sentencepiece/src/bpe_model.cc, as described in the
// SentencePiece paper, Kudo & Richardson 2018, and llama.cpp's llm_tokenizer_spm): the text is split into
// UTF-8 characters, then the adjacent pair whose concatenation is a vocabulary piece with the highest
// score is merged (ties: leftmost) until no pair is in the vocabulary; characters that are not pieces
// fall back to the <0xXX> byte tokens.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace inferx {

// Everything a SentencePiece vocabulary needs, as read by a loader. Pieces use U+2581 ("▁") for spaces.
struct SpmVocab {
  std::string source;  // file name, for error messages
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<TokenType> types;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = true;           // tokenizer.ggml.add_bos_token (what a caller should pass to encode)
  bool add_space_prefix = true;  // SentencePiece add_dummy_prefix
};

class SpmTokenizer final : public Tokenizer {
 public:
  // Validates the vocabulary (equal lengths, ids in range); throws inferx::Error naming vocab.source.
  explicit SpmTokenizer(SpmVocab vocab);
  SpmTokenizer(const SpmTokenizer&) = delete;  // lookup_ holds views into vocab_.pieces
  SpmTokenizer& operator=(const SpmTokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override;
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.pieces.size()); }
  int32_t bos_id() const override { return vocab_.bos_id; }
  int32_t eos_id() const override { return vocab_.eos_id; }
  TokenType token_type(int32_t id) const override;
  const std::string& piece(int32_t id) const override;

  bool add_bos_default() const { return vocab_.add_bos; }
  bool add_space_prefix() const { return vocab_.add_space_prefix; }
  float score(int32_t id) const;

 private:
  void check_id(int32_t id) const;
  // Longest user-defined piece starting at text[pos]; -1 when none.
  int32_t match_user_defined(std::string_view text, size_t pos, size_t* length) const;
  // BPE over one fragment of raw text (already prefixed with a space when due).
  void encode_fragment(std::string_view raw, std::vector<int32_t>& out) const;
  // Emits the ids for one final symbol: its piece, or the pieces it was merged from when that piece is
  // Unused (SentencePiece "resegment"), or its bytes.
  void emit_symbol(std::string_view text, const std::unordered_map<std::string_view, size_t>& rev_merge,
                   std::vector<int32_t>& out) const;

  SpmVocab vocab_;
  std::vector<std::string> bytes_;                       // token_bytes() of every id, precomputed
  std::unordered_map<std::string_view, int32_t> merge_;  // pieces a merge may produce (normal/user/unused)
  std::vector<int32_t> byte_ids_;                        // byte value -> <0xXX> id, -1 if absent
  std::vector<int32_t> user_defined_;                    // ids of user-defined pieces, longest first
  bool has_byte_tokens_ = false;
};

}  // namespace inferx
