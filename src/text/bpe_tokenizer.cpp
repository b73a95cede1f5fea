// Byte-pair encoding with the Hugging Face tokenizers pipeline (see bpe_tokenizer.h).
#include "text/bpe_tokenizer.h"

#include <algorithm>
#include <climits>
#include <queue>

#include "core/error.h"
#include "text/unicode.h"

namespace inferx {
namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};
constexpr int32_t kNoRank = INT32_MAX;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

size_t slot_of(uint64_t key, uint64_t mask) {
  // Fibonacci hashing of the pair: cheap and spreads the structured keys well.
  return static_cast<size_t>(((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask);
}

// "<0x0A>" is the name tokenizers' byte_fallback looks up for byte 0x0A (format "<{b:#04X}>").
std::string byte_token_name(int b) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

}  // namespace

BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer::BpeTokenizer(BpeSpec spec)
    : source_(std::move(spec.source)),
      normalizer_(std::move(spec.normalizer)),
      pre_tokenizer_(std::move(spec.pre_tokenizer)),
      decoder_(std::move(spec.decoder)),
      prefix_ids_(std::move(spec.prefix_ids)),
      suffix_ids_(std::move(spec.suffix_ids)),
      byte_level_(pre_tokenizer_.byte_level()),
      byte_fallback_(spec.byte_fallback),
      ignore_merges_(spec.ignore_merges),
      fuse_unk_(spec.fuse_unk) {
  // The id space covers the model vocabulary and every added token.
  size_t n = spec.vocab.size();
  for (const AddedToken& t : spec.added_tokens) {
    INFERX_CHECK(t.id >= 0, "{}: added token '{}' has a negative id {}", source_, t.content, t.id);
    n = std::max(n, static_cast<size_t>(t.id) + 1);
  }
  INFERX_CHECK(n > 0, "{}: the tokenizer vocabulary is empty", source_);
  INFERX_CHECK(n < static_cast<size_t>(INT32_MAX), "{}: {} tokens is too many", source_, n);
  // A stray huge id would size every per-token table by it (gigabytes for one corrupt entry: found by
  // fuzz_hf_tokenizer_json; max_token_ids).
  size_t named = spec.added_tokens.size();
  for (const std::string& tok : spec.vocab) named += !tok.empty();
  INFERX_CHECK(n <= max_token_ids(named), "{}: token ids reach {} but only {} tokens are named", source_,
               n - 1, named);
  pieces_.assign(n, std::string());
  types_.assign(n, TokenType::Unused);
  bytes_.assign(n, std::string());

  // Model tokens, keyed the way words are: raw bytes for byte-level vocabularies.
  keys_.resize(spec.vocab.size());
  lookup_.reserve(spec.vocab.size() * 2);
  byte_ids_.fill(-1);
  for (size_t i = 0; i < spec.vocab.size(); ++i) {
    const std::string& tok = spec.vocab[i];
    if (tok.empty()) continue;
    const auto id = static_cast<int32_t>(i);
    pieces_[i] = tok;
    types_[i] = TokenType::Normal;
    if (byte_level_) {
      if (!byte_level_decode(tok, keys_[i])) keys_[i] = tok;  // not in the byte alphabet: unreachable
    } else {
      keys_[i] = tok;
    }
    lookup_.emplace(keys_[i], id);  // first wins for duplicates
  }
  if (byte_level_) {
    for (int b = 0; b < 256; ++b) {
      const char c = static_cast<char>(b);
      const auto hit = lookup_.find(std::string_view(&c, 1));
      if (hit != lookup_.end()) byte_ids_[b] = hit->second;
    }
  } else if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      const auto hit = lookup_.find(byte_token_name(b));
      if (hit != lookup_.end()) {
        byte_ids_[b] = hit->second;
        types_[hit->second] = TokenType::Byte;
      }
    }
  }
  if (!spec.unk_token.empty()) {
    const auto hit = lookup_.find(spec.unk_token);
    INFERX_CHECK(hit != lookup_.end(), "{}: unk_token '{}' is not in the vocabulary", source_,
                 spec.unk_token);
    unk_id_ = hit->second;
    types_[unk_id_] = TokenType::Unknown;
  }

  // Merges: (left id, right id) -> (rank, merged id), in an open-addressing table at most half full.
  size_t cap = 16;
  while (cap < spec.merges.size() * 2) cap *= 2;
  merges_.assign(cap, MergeSlot{kEmptyKey, 0, 0});
  merge_mask_ = cap - 1;
  const auto model_id = [&](const std::string& tok, size_t rank) {
    std::string key;
    if (!byte_level_ || !byte_level_decode(tok, key)) key = tok;
    const auto hit = lookup_.find(key);
    INFERX_CHECK(hit != lookup_.end(), "{}: merge {} ('{} {}') uses '{}', which is not in the vocabulary",
                 source_, rank, spec.merges[rank].first, spec.merges[rank].second, tok);
    return hit->second;
  };
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [a, b] = spec.merges[r];
    const int32_t left = model_id(a, r), right = model_id(b, r), merged = model_id(a + b, r);
    const uint64_t key = pair_key(left, right);
    size_t s = slot_of(key, merge_mask_);
    while (merges_[s].key != kEmptyKey && merges_[s].key != key) s = (s + 1) & merge_mask_;
    if (merges_[s].key == key) continue;  // a repeated merge keeps its first (lowest) rank
    merges_[s] = {key, static_cast<int32_t>(r), merged};
  }

  // Added tokens override the model's view of their ids.
  std::vector<AddedToken> raw, normalized;
  for (AddedToken& t : spec.added_tokens) {
    // Added tokens are matched as literal text in the (valid UTF-8) input before any model: one that is
    // not valid UTF-8 itself (a lone continuation byte from a corrupt GGUF vocabulary, say) would match
    // inside a character and hand the pre-tokenizer a split one (found by fuzz_gguf).
    INFERX_CHECK(unicode::is_valid_utf8(t.content), "{}: added token {} is not valid UTF-8", source_, t.id);
    pieces_[t.id] = t.content;
    types_[t.id] = t.special ? TokenType::Control : TokenType::UserDefined;
    (t.normalized && !normalizer_.empty() ? normalized : raw).push_back(t);
  }
  raw_added_ = AddedTokenMatcher(std::move(raw));
  normalized_added_ = AddedTokenMatcher(std::move(normalized));

  for (size_t i = 0; i < n; ++i) {
    if (types_[i] == TokenType::Control || types_[i] == TokenType::Unused) continue;
    bytes_[i] = decoder_.token_bytes(pieces_[i]);
  }
  for (int32_t id : prefix_ids_) check_id(id);
  for (int32_t id : suffix_ids_) check_id(id);
  bos_id_ = spec.bos_id >= 0 && static_cast<size_t>(spec.bos_id) < n ? spec.bos_id : -1;
  eos_id_ = spec.eos_id >= 0 && static_cast<size_t>(spec.eos_id) < n ? spec.eos_id : -1;
}

void BpeTokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    fail("{}: token id {} is out of range (vocabulary has {} tokens)", source_, id, vocab_size());
  }
}

TokenType BpeTokenizer::token_type(int32_t id) const {
  check_id(id);
  return types_[id];
}

const std::string& BpeTokenizer::piece(int32_t id) const {
  check_id(id);
  return pieces_[id];
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return bytes_[id];
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    check_id(id);
    if (types_[id] == TokenType::Unused) continue;  // no token has this id
    if (skip_special && types_[id] == TokenType::Control) continue;
    tokens.push_back(pieces_[id]);
  }
  return decoder_.decode(std::move(tokens));
}

bool BpeTokenizer::find_merge(int32_t left, int32_t right, int32_t& rank, int32_t& merged) const {
  if (left < 0 || right < 0) return false;
  const uint64_t key = pair_key(left, right);
  for (size_t s = slot_of(key, merge_mask_);; s = (s + 1) & merge_mask_) {
    const MergeSlot& slot = merges_[s];
    if (slot.key == key) {
      rank = slot.rank;
      merged = slot.merged;
      return true;
    }
    if (slot.key == kEmptyKey) return false;
  }
}

// Short words: rescan the pair ranks after every merge (cheaper than a heap for a handful of symbols).
// The lowest rank wins, the leftmost on ties: the order tokenizers' heap of (rank, position) gives.
void BpeTokenizer::merge_small(std::vector<int32_t>& symbols) const {
  thread_local std::vector<int32_t> ranks, results;
  const size_t n = symbols.size();
  ranks.assign(n, kNoRank);
  results.assign(n, -1);
  for (size_t i = 0; i + 1 < n; ++i)
    if (!find_merge(symbols[i], symbols[i + 1], ranks[i], results[i])) ranks[i] = kNoRank;
  size_t size = n;
  while (size > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < size; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == kNoRank) break;
    symbols[best] = results[best];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    results.erase(results.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    --size;
    const auto refresh = [&](size_t i) {
      if (i + 1 >= size || !find_merge(symbols[i], symbols[i + 1], ranks[i], results[i])) ranks[i] = kNoRank;
    };
    if (best > 0) refresh(best - 1);
    refresh(best);
  }
}

// Long words (SentencePiece-style vocabularies run BPE over whole sentences): a heap of candidate merges
// over a linked list of symbols, as tokenizers' Word::merge_all. Stale entries are skipped when popped.
void BpeTokenizer::merge_large(std::vector<int32_t>& symbols) const {
  const auto n = static_cast<int32_t>(symbols.size());
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    int32_t rank = 0, merged = 0;
    if (find_merge(symbols[pos], symbols[next[pos]], rank, merged)) queue.push({rank, pos, merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int32_t right = next[top.pos];
    if (symbols[top.pos] < 0 || right < 0) continue;
    int32_t rank = 0, merged = 0;
    if (!find_merge(symbols[top.pos], symbols[right], rank, merged) || merged != top.merged) continue;
    symbols[top.pos] = merged;
    symbols[right] = -1;  // merged away
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push(prev[top.pos]);
    push(top.pos);
  }
  std::erase(symbols, -1);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto hit = lookup_.find(word);
    if (hit != lookup_.end()) {
      out.push_back(hit->second);
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  // Unknown characters become unk (fused runs with fuse_unk) or are dropped when there is no unk token,
  // as tokenizers' merge_word does; the pending unk is only written before the next known character.
  int32_t pending_unk = -1;
  const auto known = [&](int32_t id) {
    if (pending_unk >= 0) {
      symbols.push_back(pending_unk);
      pending_unk = -1;
    }
    symbols.push_back(id);
  };
  const auto unknown = [&] {
    if (unk_id_ < 0) return;
    if (pending_unk >= 0 && !fuse_unk_) symbols.push_back(pending_unk);
    pending_unk = unk_id_;
  };
  if (byte_level_) {
    for (char c : word) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        known(id);
      } else {
        unknown();
      }
    }
  } else {
    for (size_t pos = 0; pos < word.size();) {
      const size_t len = std::max<size_t>(1, unicode::sequence_length(word, pos));
      const std::string_view ch = word.substr(pos, len);
      pos += len;
      const auto hit = lookup_.find(ch);
      if (hit != lookup_.end()) {
        known(hit->second);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          for (char c : ch) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
          continue;
        }
      }
      unknown();
    }
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);
  if (symbols.size() > 1) {
    if (symbols.size() <= 48) {
      merge_small(symbols);
    } else {
      merge_large(symbols);
    }
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos) const {
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos) out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());

  thread_local PreTokenized pieces;
  const auto model = [&](std::string_view segment, bool at_start) {
    pre_tokenizer_.split(segment, at_start, pieces);
    const std::string_view t(pieces.text);
    for (const auto& [b, e] : pieces.spans) encode_word(t.substr(b, e - b), out);
  };
  std::vector<AddedSplit> splits;
  raw_added_.split(text, splits);
  for (const AddedSplit& s : splits) {
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    const std::string_view segment = text.substr(s.begin, s.end - s.begin);
    if (normalizer_.empty()) {
      model(segment, s.begin == 0);
      continue;
    }
    const std::string normalized = normalizer_.apply(segment);
    if (normalized_added_.empty()) {
      model(normalized, s.begin == 0);
      continue;
    }
    std::vector<AddedSplit> inner;
    normalized_added_.split(normalized, inner);
    for (const AddedSplit& n : inner) {
      if (n.id >= 0) {
        out.push_back(n.id);
      } else {
        model(std::string_view(normalized).substr(n.begin, n.end - n.begin), s.begin == 0 && n.begin == 0);
      }
    }
  }
  if (add_bos) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

}  // namespace inferx
