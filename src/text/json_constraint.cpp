#include "text/json_constraint.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "text/tokenizer.h"

namespace inferx {

// ---- TokenTrie ----

TokenTrie::TokenTrie(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(static_cast<size_t>(tokenizer.vocab_size()));
  for (int32_t t = 0; t < tokenizer.vocab_size(); ++t) {
    // Only what decodes to text: normal, byte and user-defined tokens (control, unknown and unused never
    // come out of a constrained sequence, except an end token once the text is complete).
    const TokenType type = tokenizer.token_type(t);
    if (type == TokenType::Normal || type == TokenType::Byte || type == TokenType::UserDefined)
      bytes[static_cast<size_t>(t)] = tokenizer.token_bytes(t);
  }
  build(bytes);
}

TokenTrie::TokenTrie(const std::vector<std::string>& bytes) { build(bytes); }

const std::string& TokenTrie::bytes(int32_t t) const {
  static const std::string kNone;
  return t >= 0 && t < vocab_size_ ? bytes_[static_cast<size_t>(t)] : kNone;
}

void TokenTrie::build(const std::vector<std::string>& bytes) {
  vocab_size_ = static_cast<int32_t>(bytes.size());
  bytes_ = bytes;
  // Sorted byte strings make every node's subtree a contiguous run, so the trie is built level by level
  // from ranges of the sorted order: a node is (range of sorted tokens, depth).
  std::vector<int32_t> order;
  for (int32_t t = 0; t < vocab_size_; ++t)
    if (!bytes[static_cast<size_t>(t)].empty()) order.push_back(t);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes[static_cast<size_t>(a)] < bytes[static_cast<size_t>(b)];
  });
  struct Pending {
    size_t begin, end, depth;  // tokens order[begin, end) share this node's depth-byte prefix
  };
  std::vector<Pending> level = {{0, order.size(), 0}};
  // Nodes are numbered in breadth-first order, so children of consecutive nodes are consecutive.
  child_begin_.assign(1, 0);
  token_begin_.assign(1, 0);
  size_t next_node = 1;
  while (!level.empty()) {
    std::vector<Pending> next;
    for (const Pending& p : level) {
      size_t i = p.begin;
      // Tokens that end exactly here come first in sorted order (a prefix sorts before its extensions).
      while (i < p.end && bytes[static_cast<size_t>(order[i])].size() == p.depth)
        token_ids_.push_back(order[i++]);
      token_begin_.push_back(static_cast<uint32_t>(token_ids_.size()));
      while (i < p.end) {
        const auto b = static_cast<uint8_t>(bytes[static_cast<size_t>(order[i])][p.depth]);
        size_t j = i;
        while (j < p.end && static_cast<uint8_t>(bytes[static_cast<size_t>(order[j])][p.depth]) == b) ++j;
        child_byte_.push_back(b);
        child_node_.push_back(static_cast<uint32_t>(next_node++));
        next.push_back({i, j, p.depth + 1});
        i = j;
      }
      child_begin_.push_back(static_cast<uint32_t>(child_byte_.size()));
    }
    level.swap(next);
  }
  INFERX_CHECK(child_begin_.size() == next_node + 1 && token_begin_.size() == next_node + 1,
               "token trie: inconsistent build ({} nodes)", next_node);
}

// ---- MaskCache ----

MaskCache::Mask MaskCache::find(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second;
}

MaskCache::Mask MaskCache::insert(const std::string& key, std::vector<uint64_t> bits) {
  auto mask = std::make_shared<const std::vector<uint64_t>>(std::move(bits));
  std::lock_guard lock(mu_);
  if (map_.size() >= kEntries) map_.clear();
  return map_.emplace(key, std::move(mask)).first->second;
}

// ---- JsonCursor ----

using namespace json_lexer;

namespace {
constexpr const char* kLiterals[] = {"true", "false", "null"};
}  // namespace

std::pair<uint64_t, uint64_t> JsonCursor::key_bits() const {
  return {stack, uint64_t{depth} | uint64_t{mode} << 8 | uint64_t{sub} << 16 | uint64_t{pos} << 24 |
                     uint64_t{whitespace} << 32 | uint64_t{key} << 40};
}

bool JsonCursor::after_value() {
  mode = depth == 0 ? Done : After;
  return true;
}

// The first byte of a value: container, string, number or literal (or ']' right after '[').
bool JsonCursor::value_start(uint8_t c, bool allow_close_array) {
  switch (c) {
    case '{':
    case '[':
      if (depth >= kMaxJsonDepth) return false;
      if (c == '{')
        stack |= uint64_t{1} << depth;
      else
        stack &= ~(uint64_t{1} << depth);
      ++depth;
      mode = c == '{' ? ObjectFirst : ArrayFirst;
      return true;
    case '"':
      mode = String;
      sub = 0;
      key = 0;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode = Literal;
      sub = c == 't' ? 0 : c == 'f' ? 1 : 2;
      pos = 1;
      return true;
    case ']':
      if (!allow_close_array) return false;
      --depth;
      return after_value();
    default:
      if (!start_number(sub, c)) return false;
      mode = Number;
      return true;
  }
}

bool JsonCursor::step(uint8_t c) {
  if (mode != String && mode != Number && mode != Literal) {
    if (is_space(c)) return mode != Done && step_space(whitespace, c);
    whitespace = 0;
  }
  switch (mode) {
    case Start:  // JSON mode: the top-level value is an object
      return c == '{' && value_start(c, false);
    case Value:
      return value_start(c, false);
    case ArrayFirst:
      return value_start(c, true);
    case ObjectFirst:
    case ObjectKey:
      if (c == '"') {
        mode = String;
        sub = 0;
        key = 1;
        return true;
      }
      if (c == '}' && mode == ObjectFirst) {
        --depth;
        return after_value();
      }
      return false;
    case Colon:
      if (c != ':') return false;
      mode = Value;
      return true;
    case After: {
      const bool in_object = (stack >> (depth - 1)) & 1;
      if (c == ',') {
        mode = in_object ? ObjectKey : Value;
        return true;
      }
      if (c == (in_object ? '}' : ']')) {
        --depth;
        return after_value();
      }
      return false;
    }
    case String:
      switch (step_string(sub, c)) {
        case StringStep::More:
          return true;
        case StringStep::Closed:
          if (!key) return after_value();
          mode = Colon;
          return true;
        case StringStep::Invalid:
          return false;
      }
      return false;
    case Number:
      switch (step_number(sub, c)) {
        case NumberStep::More:
          return true;
        case NumberStep::Ended:  // the byte belongs to what follows the number
          after_value();
          return step(c);
        case NumberStep::Invalid:
          return false;
      }
      return false;
    case Literal: {
      const char* lit = kLiterals[sub];
      if (c != static_cast<uint8_t>(lit[pos])) return false;
      if (lit[++pos] == '\0') return after_value();
      return true;
    }
    case Done:
    default:
      return false;
  }
}

// ---- The constraint ----

void apply_token_mask(float* logits, int64_t vocab, const uint64_t* allowed, int64_t trie_vocab,
                      const std::vector<int32_t>& end_ids, bool may_end,
                      std::vector<std::pair<int32_t, float>>& scratch) {
  scratch.clear();
  if (may_end)
    for (int32_t e : end_ids)
      if (e >= 0 && e < vocab) scratch.emplace_back(e, logits[e]);
  constexpr float kNo = -std::numeric_limits<float>::infinity();
  const int64_t in_trie = std::min(vocab, trie_vocab);
  for (int64_t t = 0; t < in_trie; ++t)
    if (!allowed || !((allowed[static_cast<size_t>(t) >> 6] >> (t & 63)) & 1)) logits[t] = kNo;
  std::fill(logits + in_trie, logits + vocab, kNo);
  for (int32_t e : end_ids)
    if (e >= 0 && e < vocab) logits[e] = kNo;
  for (const auto& [e, v] : scratch) logits[e] = v;
}

namespace {

class JsonObjectConstraint final : public TokenConstraint {
 public:
  JsonObjectConstraint(std::shared_ptr<const TokenTrie> trie, std::shared_ptr<MaskCache> cache)
      : trie_(std::move(trie)), cache_(std::move(cache)) {}

  std::unique_ptr<TokenConstraint> start(const std::vector<int32_t>& end_ids) const override {
    auto s = std::make_unique<JsonObjectConstraint>(trie_, cache_);
    s->end_ids_ = end_ids;
    return s;
  }

  void mask(float* logits, int64_t vocab) override {
    // Complete (or broken by a token the mask did not allow): no token continues, only an end token.
    const bool may_end = cursor_.complete() || broken_;
    const MaskCache::Mask allowed = may_end ? nullptr : allowed_now();
    apply_token_mask(logits, vocab, allowed ? allowed->data() : nullptr, trie_->vocab_size(), end_ids_,
                     may_end, kept_);
  }

  void accept(int32_t token) override {
    if (broken_ || std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end()) return;
    const std::string& bytes = trie_->bytes(token);
    // Every generated token came through mask(), so its bytes continue the text; anything else (a token
    // forced past the sampler) leaves only the end tokens.
    if (bytes.empty()) broken_ = true;
    for (unsigned char c : bytes)
      if (!cursor_.step(c)) {
        broken_ = true;
        return;
      }
  }

 private:
  // Bit t set: token t's bytes continue the text.
  MaskCache::Mask allowed_now() const {
    const auto bits = cursor_.key_bits();
    std::string key(reinterpret_cast<const char*>(&bits.first), 8);
    key.append(reinterpret_cast<const char*>(&bits.second), 8);
    return cache_->get(key, [&] {
      return continuing_tokens(*trie_, cursor_, [](const JsonCursor& from, uint8_t b, JsonCursor& to) {
        to = from;
        return to.step(b);
      });
    });
  }

  std::shared_ptr<const TokenTrie> trie_;
  std::shared_ptr<MaskCache> cache_;
  std::vector<int32_t> end_ids_;
  JsonCursor cursor_;
  bool broken_ = false;
  std::vector<std::pair<int32_t, float>> kept_;
};

}  // namespace

std::shared_ptr<const TokenConstraint> make_json_object_constraint(std::shared_ptr<const TokenTrie> trie) {
  INFERX_CHECK(trie != nullptr, "json constraint: no token trie");
  return std::make_shared<JsonObjectConstraint>(std::move(trie), std::make_shared<MaskCache>());
}

}  // namespace inferx
