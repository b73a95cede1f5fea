#pragma once
// Added tokens (tokenizer.json "added_tokens"): strings cut out of the text before the model sees it,
// as Hugging Face tokenizers' AddedVocabulary does (tokenizers/src/tokenizer/added_vocabulary.rs):
// leftmost-longest matching, then single_word / lstrip / rstrip applied to each match. Tokens with
// normalized=false are matched on the raw text, the others on the normalized text.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace inferx {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// One piece of a split: an added token (id >= 0) or a stretch of text (id == -1), as byte offsets.
struct AddedSplit {
  int32_t id;
  size_t begin, end;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }
  // Splits `text` into added tokens and the text between them (non-empty text pieces only; an empty
  // text gives one empty text piece, as tokenizers does).
  void split(std::string_view text, std::vector<AddedSplit>& out) const;

 private:
  // Leftmost-longest match at or after `from`; false when none.
  bool find(std::string_view text, size_t from, size_t& begin, size_t& index) const;

  std::vector<AddedToken> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // token indices, longest first
};

}  // namespace inferx
