#pragma once
// Structured output, JSON mode (OpenAI `response_format: {"type": "json_object"}`): a TokenConstraint that
// lets a sequence generate only a prefix of one JSON object, and end only once the object is complete.
//
// How: the vocabulary is a byte trie (TokenTrie, built once per tokenizer from Tokenizer::token_bytes and
// shared), and the JSON grammar a byte-level pushdown automaton (JsonCursor: container stack as bits,
// lexical mode). For the next token, a depth-first walk of the trie steps the automaton through each
// token's bytes and prunes at the first byte that cannot continue, so every token whose bytes keep the text
// a valid JSON prefix is allowed - also tokens that span several JSON tokens (`"},`). Masks are cached per
// automaton state (a long string repeats one state). Whitespace between JSON tokens is one space, or one
// newline and an indentation (kMaxIndent), so a model cannot stall in blank space; after the object only an
// end token may come.
// Strings may hold any bytes but '"', '\\' and control characters (tokens can split UTF-8 characters).
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "inferx/engine.h"
#include "text/json_lexer.h"

namespace inferx {

class Tokenizer;

// The vocabulary's byte strings as a trie (children of a node contiguous). Tokens with no bytes (control
// tokens) are not in it: a constraint never allows them, except end tokens where the text is complete.
class TokenTrie {
 public:
  explicit TokenTrie(const Tokenizer& tokenizer);
  // From explicit byte strings (tests): token id i has bytes[i].
  explicit TokenTrie(const std::vector<std::string>& bytes);
  int32_t vocab_size() const { return vocab_size_; }
  uint32_t num_nodes() const { return static_cast<uint32_t>(child_begin_.size()) - 1; }

  // Node 0 is the root. Children of n: [child_begin(n), child_begin(n + 1)).
  uint32_t child_begin(uint32_t n) const { return child_begin_[n]; }
  uint8_t child_byte(uint32_t c) const { return child_byte_[c]; }
  uint32_t child_node(uint32_t c) const { return child_node_[c]; }
  // Tokens whose bytes end at node n.
  const int32_t* tokens_begin(uint32_t n) const { return token_ids_.data() + token_begin_[n]; }
  const int32_t* tokens_end(uint32_t n) const { return token_ids_.data() + token_begin_[n + 1]; }
  // Token t's bytes ("" for control tokens and ids outside the vocabulary).
  const std::string& bytes(int32_t t) const;

 private:
  void build(const std::vector<std::string>& bytes);
  int32_t vocab_size_ = 0;
  std::vector<uint32_t> child_begin_, child_node_, token_begin_;
  std::vector<uint8_t> child_byte_;
  std::vector<int32_t> token_ids_;
  std::vector<std::string> bytes_;
};

// Token masks by automaton state (bit t: token t may come next), shared by every sequence started from one
// prototype, so a state's mask is computed once for all of them (JSON mode's prototype serves every request
// of a server). Sampler threads use it at once; a mask stays valid while a sequence holds it.
class MaskCache {
 public:
  using Mask = std::shared_ptr<const std::vector<uint64_t>>;
  // The mask of `key`, computed by `compute()` (returning std::vector<uint64_t>) when not cached; two
  // threads missing at once both compute, and the first stored one is kept.
  template <class Compute>
  Mask get(const std::string& key, Compute&& compute) {
    if (Mask m = find(key)) return m;
    return insert(key, compute());
  }
  Mask find(const std::string& key);
  Mask insert(const std::string& key, std::vector<uint64_t> bits);  // the stored mask (the first if raced)

 private:
  static constexpr size_t kEntries = 512;  // ~8 MB at a 128k-token vocabulary; emptied when full
  std::mutex mu_;
  std::unordered_map<std::string, Mask> map_;
};

// The tokens (bit t) whose bytes `step` takes from `start`: a depth-first walk of the trie that drops a
// subtree at the first byte `step` refuses. step(const State& from, uint8_t byte, State& to) -> bool.
template <class State, class Step>
std::vector<uint64_t> continuing_tokens(const TokenTrie& trie, const State& start, Step&& step) {
  std::vector<uint64_t> bits((static_cast<size_t>(trie.vocab_size()) + 63) / 64, 0);
  std::vector<std::pair<uint32_t, State>> stack;
  stack.emplace_back(0, start);
  State next;
  while (!stack.empty()) {
    auto [node, state] = std::move(stack.back());
    stack.pop_back();
    for (uint32_t c = trie.child_begin(node); c < trie.child_begin(node + 1); ++c) {
      if (!step(state, trie.child_byte(c), next)) continue;
      const uint32_t child = trie.child_node(c);
      for (const int32_t* t = trie.tokens_begin(child); t != trie.tokens_end(child); ++t)
        bits[static_cast<size_t>(*t) >> 6] |= uint64_t{1} << (*t & 63);
      stack.emplace_back(child, std::move(next));
      next = State{};
    }
  }
  return bits;
}

// A constrained row: every token not in `allowed` (bit t; null: none) is set to -inf, and so is every row
// past the trie's vocabulary (padding). The end tokens keep their logits only when `may_end` (the text is
// complete): a stop token with bytes could otherwise fit mid-value. `scratch` holds their values meanwhile.
void apply_token_mask(float* logits, int64_t vocab, const uint64_t* allowed, int64_t trie_vocab,
                      const std::vector<int32_t>& end_ids, bool may_end,
                      std::vector<std::pair<int32_t, float>>& scratch);

inline constexpr int kMaxJsonDepth = 64;
using json_lexer::kMaxIndent;

// Where a JSON text is, byte by byte. step() is false for a byte that cannot continue a valid JSON text
// (the cursor is then unspecified). A default cursor takes one object (JSON mode); any_value() any value.
struct JsonCursor {
  enum Mode : uint8_t {
    Start,
    Value,
    ArrayFirst,
    ObjectFirst,
    ObjectKey,
    Colon,
    After,
    String,
    Number,
    Literal,
    Done
  };
  uint64_t stack = 0;  // bit d: 1 if the container at depth d + 1 is an object
  uint8_t depth = 0;
  uint8_t mode = Start;
  uint8_t sub =
      0;  // String: 0 plain, 1 after '\', 2.. hex digits of \u left + 1; Number: its state; Literal: which
  uint8_t pos = 0;  // Literal: bytes matched
  uint8_t whitespace = 0;
  uint8_t key = 0;  // String: it is an object key

  // A cursor for any one JSON value (the default one, mode Start, takes an object only).
  static JsonCursor any_value() {
    JsonCursor c;
    c.mode = Value;
    return c;
  }

  bool step(uint8_t byte);
  bool complete() const { return mode == Done; }
  // A number at the top level is complete, so the value ends at the first byte that is not part of it
  // (step() refuses that byte: nothing follows a top-level value).
  bool top_level_number_complete() const {
    return mode == Number && depth == 0 && json_lexer::number_complete(sub);
  }
  // The state as a cache key (every field).
  std::pair<uint64_t, uint64_t> key_bits() const;

 private:
  bool value_start(uint8_t byte, bool allow_close_array);
  bool after_value();
};

// The request's prototype; start() gives each sequence its own state.
std::shared_ptr<const TokenConstraint> make_json_object_constraint(std::shared_ptr<const TokenTrie> trie);

}  // namespace inferx
