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

namespace {

enum NumberState : uint8_t { Minus = 1, Zero, Int, Dot, Frac, Exp, ExpSign, ExpDigits };
constexpr const char* kLiterals[] = {"true", "false", "null"};

bool is_space(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

std::pair<uint64_t, uint64_t> JsonCursor::key_bits() const {
  return {stack, uint64_t{depth} | uint64_t{mode} << 8 | uint64_t{sub} << 16 | uint64_t{pos} << 24 |
                     uint64_t{whitespace} << 32 | uint64_t{key} << 40};
}

// Whitespace between JSON tokens as llama.cpp's JSON grammar allows it: nothing, one space (or tab), or a
// newline and up to kMaxIndent spaces or tabs - enough for pretty-printed JSON, and a model cannot run on in
// blank lines. `whitespace`: 0 none yet, 1 after a space, 2 + n after a newline and n indentation bytes.
bool JsonCursor::space(uint8_t c) {
  if (whitespace == 0) {
    if (c == '\n') {
      whitespace = 2;
      return true;
    }
    whitespace = 1;
    return c == ' ' || c == '\t';
  }
  if (whitespace == 1 || c == '\n' || c == '\r' || whitespace >= 2 + kMaxIndent) return false;
  ++whitespace;
  return true;
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
    case '-':
      mode = Number;
      sub = Minus;
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
      if (!is_digit(c)) return false;
      mode = Number;
      sub = c == '0' ? Zero : Int;
      return true;
  }
}

bool JsonCursor::step(uint8_t c) {
  if (mode != String && mode != Number && mode != Literal) {
    if (is_space(c)) return mode != Done && space(c);
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
      if (sub == 0) {
        if (c == '"') {
          if (key) {
            mode = Colon;
            return true;
          }
          return after_value();
        }
        if (c == '\\') {
          sub = 1;
          return true;
        }
        return c >= 0x20;
      }
      if (sub == 1) {
        if (c == 'u') {
          sub = 5;  // four hex digits to come
          return true;
        }
        const bool simple =
            c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
        sub = 0;
        return simple;
      }
      if (!is_hex(c)) return false;
      sub = sub == 2 ? 0 : sub - 1;
      return true;
    case Number: {
      auto to = [&](uint8_t s) {
        sub = s;
        return true;
      };
      switch (sub) {
        case Minus:
          return c == '0' ? to(Zero) : is_digit(c) ? to(Int) : false;
        case Zero:
        case Int:
          if (c == '.') return to(Dot);
          if (c == 'e' || c == 'E') return to(Exp);
          if (sub == Int && is_digit(c)) return true;
          break;
        case Dot:
          return is_digit(c) && to(Frac);
        case Frac:
          if (is_digit(c)) return true;
          if (c == 'e' || c == 'E') return to(Exp);
          break;
        case Exp:
          return (c == '+' || c == '-') ? to(ExpSign) : is_digit(c) ? to(ExpDigits) : false;
        case ExpSign:
          return is_digit(c) && to(ExpDigits);
        case ExpDigits:
          if (is_digit(c)) return true;
          break;
        default:
          return false;
      }
      // A byte that ends a complete number (Zero, Int, Frac, ExpDigits) belongs to what follows it.
      after_value();
      return step(c);
    }
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
    const bool may_end = cursor_.complete() || broken_;
    const MaskCache::Mask allowed = allowed_now();
    kept_.clear();
    if (may_end)
      for (int32_t e : end_ids_)
        if (e >= 0 && e < vocab) kept_.emplace_back(e, logits[e]);
    constexpr float kNo = -std::numeric_limits<float>::infinity();
    const int64_t in_trie = std::min<int64_t>(vocab, trie_->vocab_size());
    const uint64_t* bits = allowed->data();
    for (int64_t t = 0; t < in_trie; ++t)
      if (!((bits[static_cast<size_t>(t) >> 6] >> (t & 63)) & 1)) logits[t] = kNo;
    std::fill(logits + in_trie, logits + vocab, kNo);  // rows past the tokenizer's vocabulary (padding)
    // End tokens end the text: only once it is complete (a stop token with bytes could fit mid-object).
    if (!may_end)
      for (int32_t e : end_ids_)
        if (e >= 0 && e < vocab) logits[e] = kNo;
    for (const auto& [e, v] : kept_) logits[e] = v;
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
  // Bit t set: token t's bytes continue the text. None once the text is complete.
  MaskCache::Mask allowed_now() {
    std::string key;
    if (broken_ || cursor_.complete()) {
      key = "end";
    } else {
      const auto bits = cursor_.key_bits();
      key.assign(reinterpret_cast<const char*>(&bits.first), 8);
      key.append(reinterpret_cast<const char*>(&bits.second), 8);
    }
    if (MaskCache::Mask m = cache_->find(key)) return m;
    std::vector<uint64_t> bits((static_cast<size_t>(trie_->vocab_size()) + 63) / 64, 0);
    if (key != "end") {
      // Depth first over the trie, with the cursor after each node's bytes: a subtree is skipped at the
      // first byte that cannot continue the text.
      walk_.clear();
      walk_.push_back({0, cursor_});
      while (!walk_.empty()) {
        const Frame f = walk_.back();
        walk_.pop_back();
        for (uint32_t c = trie_->child_begin(f.node); c < trie_->child_begin(f.node + 1); ++c) {
          JsonCursor next = f.cursor;
          if (!next.step(trie_->child_byte(c))) continue;
          const uint32_t child = trie_->child_node(c);
          for (const int32_t* t = trie_->tokens_begin(child); t != trie_->tokens_end(child); ++t)
            bits[static_cast<size_t>(*t) >> 6] |= uint64_t{1} << (*t & 63);
          walk_.push_back({child, next});
        }
      }
    }
    return cache_->insert(key, std::move(bits));
  }

  struct Frame {
    uint32_t node;
    JsonCursor cursor;
  };

  std::shared_ptr<const TokenTrie> trie_;
  std::shared_ptr<MaskCache> cache_;
  std::vector<int32_t> end_ids_;
  JsonCursor cursor_;
  bool broken_ = false;
  std::vector<Frame> walk_;
  std::vector<std::pair<int32_t, float>> kept_;
};

}  // namespace

std::shared_ptr<const TokenConstraint> make_json_object_constraint(std::shared_ptr<const TokenTrie> trie) {
  INFERX_CHECK(trie != nullptr, "json constraint: no token trie");
  return std::make_shared<JsonObjectConstraint>(std::move(trie), std::make_shared<MaskCache>());
}

}  // namespace inferx
