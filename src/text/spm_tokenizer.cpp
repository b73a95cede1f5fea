// SentencePiece BPE encoding and decoding (see spm_tokenizer.h for the algorithm and its sources).
#include "text/spm_tokenizer.h"

#include <algorithm>
#include <array>
#include <queue>
#include <utility>

#include "core/error.h"

namespace inferx {
namespace {

// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible stand-in for a space (its "meta symbol").
constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

// Length of the well-formed UTF-8 character at s[pos] (Unicode 15 table 3-7), or 1 for a byte that does
// not start one. Ill-formed bytes thus become one-byte symbols that fall back to their byte tokens, so
// encoding stays lossless and cannot swallow the following character (e.g. a "▁") into a bogus sequence.
size_t utf8_char_length(std::string_view s, size_t pos) {
  const auto b = static_cast<uint8_t>(s[pos]);
  size_t n = 1;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b < 0xC2 || b > 0xF4) return 1;  // ASCII, continuation bytes, C0/C1, F5..FF
  if (b < 0xE0) {
    n = 2;
  } else if (b < 0xF0) {
    n = 3;
    lo = b == 0xE0 ? 0xA0 : 0x80;
    hi = b == 0xED ? 0x9F : 0xBF;
  } else {
    n = 4;
    lo = b == 0xF0 ? 0x90 : 0x80;
    hi = b == 0xF4 ? 0x8F : 0xBF;
  }
  if (s.size() - pos < n) return 1;
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<uint8_t>(s[pos + k]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 1;
  }
  return n;
}

// "<0x0A>" -> 0x0A; -1 when the piece is not of that form.
int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') {
      value += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value += c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

// One symbol of the linked list BPE works on: a span of the fragment; len == 0 once merged away.
struct Symbol {
  uint32_t start;
  uint32_t len;
  int32_t prev;
  int32_t next;
};

// A candidate merge of symbol `left` with its right neighbour, producing `len` bytes.
struct Bigram {
  float score;
  int32_t left;
  uint32_t len;
};

// Priority: higher score first, then the leftmost pair (SentencePiece bpe_model.cc's agenda order).
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

SpmTokenizer::SpmTokenizer(SpmVocab vocab) : vocab_(std::move(vocab)) {
  const size_t n = vocab_.pieces.size();
  const std::string& src = vocab_.source;
  INFERX_CHECK(n > 0, "{}: the tokenizer vocabulary is empty", src);
  INFERX_CHECK(n <= static_cast<size_t>(INT32_MAX), "{}: {} tokens is too many", src, n);
  INFERX_CHECK(vocab_.scores.size() == n, "{}: {} tokens but {} scores; the arrays must have equal lengths",
               src, n, vocab_.scores.size());
  INFERX_CHECK(vocab_.types.size() == n,
               "{}: {} tokens but {} token types; the arrays must have equal lengths", src, n,
               vocab_.types.size());
  // Out-of-range special ids (GGUF writers store 0xFFFFFFFF for "none") mean "absent".
  for (int32_t* id : {&vocab_.bos_id, &vocab_.eos_id, &vocab_.unk_id, &vocab_.pad_id}) {
    if (*id < 0 || static_cast<size_t>(*id) >= n) *id = -1;
  }

  bytes_.resize(n);
  byte_ids_.assign(256, -1);
  merge_.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const std::string& p = vocab_.pieces[i];
    const auto id = static_cast<int32_t>(i);
    switch (vocab_.types[i]) {
      case TokenType::Byte: {
        const int b = parse_byte_piece(p);
        INFERX_CHECK(b >= 0, "{}: token {} has type byte but its piece '{}' is not of the form <0xXX>", src,
                     id, p);
        if (byte_ids_[b] < 0) byte_ids_[b] = id;
        has_byte_tokens_ = true;
        bytes_[i] = std::string(1, static_cast<char>(b));
        break;
      }
      case TokenType::Control:
        bytes_[i].clear();  // BOS/EOS and friends carry no text
        break;
      case TokenType::Unknown:
        bytes_[i] = p;  // shown as its piece (e.g. "<unk>"), not SentencePiece's " \u2047 "
        break;
      case TokenType::UserDefined:
        bytes_[i] = p;  // matched verbatim in the input, so decoded verbatim
        user_defined_.push_back(id);
        merge_.emplace(vocab_.pieces[i], id);
        break;
      case TokenType::Normal:
      case TokenType::Unused:
        bytes_[i] = replace_all(p, kSpaceMarker, " ");
        merge_.emplace(vocab_.pieces[i], id);  // first occurrence wins for duplicate pieces
        break;
      default:
        fail("{}: token {} has unknown token type {}", src, id, static_cast<int>(vocab_.types[i]));
    }
  }
  // Longest first, so the first match at a position is the longest one.
  std::stable_sort(user_defined_.begin(), user_defined_.end(),
                   [&](int32_t a, int32_t b) { return vocab_.pieces[a].size() > vocab_.pieces[b].size(); });
  std::erase_if(user_defined_, [&](int32_t id) { return vocab_.pieces[id].empty(); });
}

void SpmTokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    fail("{}: token id {} is out of range (vocabulary has {} tokens)", vocab_.source, id, vocab_size());
  }
}

TokenType SpmTokenizer::token_type(int32_t id) const {
  check_id(id);
  return vocab_.types[id];
}

const std::string& SpmTokenizer::piece(int32_t id) const {
  check_id(id);
  return vocab_.pieces[id];
}

float SpmTokenizer::score(int32_t id) const {
  check_id(id);
  return vocab_.scores[id];
}

std::string SpmTokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return bytes_[id];
}

std::string SpmTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  bool at_start = true;
  for (int32_t id : ids) {
    check_id(id);
    const std::string& b = bytes_[id];
    if (b.empty()) continue;  // control tokens (BOS, EOS) produce no text
    // SentencePiece adds a dummy space before the text when encoding; decoding removes it from the first
    // piece (llama2.c run.c: "following BOS token, sentencepiece decoder strips any leading whitespace";
    // HF's Llama decoder: Strip(" ", start=1)). Only at the start of the sequence, not after a later BOS.
    if (at_start && vocab_.add_space_prefix && b[0] == ' ') {
      out.append(b, 1);
    } else {
      out.append(b);
    }
    at_start = false;
  }
  return out;
}

int32_t SpmTokenizer::match_user_defined(std::string_view text, size_t pos, size_t* length) const {
  for (int32_t id : user_defined_) {
    const std::string& p = vocab_.pieces[id];
    if (text.size() - pos >= p.size() && text.compare(pos, p.size(), p) == 0) {
      *length = p.size();
      return id;
    }
  }
  return -1;
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && vocab_.bos_id >= 0) out.push_back(vocab_.bos_id);

  // User-defined pieces are cut out of the text first and never split (SentencePiece treats them as
  // unbreakable; llama.cpp's tokenizer_st_partition does the same). Control pieces such as "<s>" written
  // in the text are plain text here. Each run of text that starts the input or follows a user-defined
  // piece gets the dummy space prefix, as llama.cpp does for text after a special token.
  std::array<bool, 256> first_byte{};
  for (int32_t id : user_defined_) first_byte[static_cast<uint8_t>(vocab_.pieces[id][0])] = true;

  bool prefix_due = true;
  size_t fragment_start = 0;
  const auto flush_fragment = [&](size_t end) {
    if (end > fragment_start) {
      std::string raw;
      if (vocab_.add_space_prefix && prefix_due) raw.push_back(' ');
      raw.append(text.substr(fragment_start, end - fragment_start));
      encode_fragment(raw, out);
      prefix_due = false;
    }
  };
  if (!user_defined_.empty()) {
    for (size_t pos = 0; pos < text.size();) {
      size_t len = 0;
      const int32_t id =
          first_byte[static_cast<uint8_t>(text[pos])] ? match_user_defined(text, pos, &len) : -1;
      if (id < 0) {
        ++pos;
        continue;
      }
      flush_fragment(pos);
      out.push_back(id);
      prefix_due = true;
      pos += len;
      fragment_start = pos;
    }
  }
  flush_fragment(text.size());
  return out;
}

void SpmTokenizer::encode_fragment(std::string_view raw, std::vector<int32_t>& out) const {
  const std::string text = replace_all(raw, " ", kSpaceMarker);
  INFERX_CHECK(text.size() < static_cast<size_t>(INT32_MAX), "{}: text of {} bytes is too long to encode",
               vocab_.source, text.size());

  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = utf8_char_length(text, pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len), index - 1, index + 1});
    pos += len;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  const std::string_view view(text);
  std::unordered_map<std::string_view, size_t> rev_merge;  // unused piece -> length of its left part
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> agenda;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const std::string_view merged = view.substr(l.start, l.len + r.len);
    const auto it = merge_.find(merged);
    if (it == merge_.end()) return;
    agenda.push({vocab_.scores[it->second], left, l.len + r.len});
    // SentencePiece never outputs an Unused piece: it is split back into what it was merged from.
    if (vocab_.types[it->second] == TokenType::Unused) rev_merge[merged] = l.len;
  };
  for (size_t i = 1; i < symbols.size(); ++i) try_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));

  while (!agenda.empty()) {
    const Bigram top = agenda.top();
    agenda.pop();
    Symbol& l = symbols[top.left];
    // Stale entries: merges only ever grow symbols, so a changed neighbourhood changes the length.
    if (l.len == 0 || l.next < 0) continue;
    Symbol& r = symbols[l.next];
    if (l.len + r.len != top.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (l.next >= 0) symbols[l.next].prev = top.left;
    try_add(l.prev, top.left);
    try_add(top.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    emit_symbol(view.substr(symbols[i].start, symbols[i].len), rev_merge, out);
  }
}

void SpmTokenizer::emit_symbol(std::string_view text,
                               const std::unordered_map<std::string_view, size_t>& rev_merge,
                               std::vector<int32_t>& out) const {
  const auto it = merge_.find(text);
  if (it != merge_.end()) {
    if (vocab_.types[it->second] == TokenType::Unused) {
      const auto split = rev_merge.find(text);
      if (split != rev_merge.end()) {
        emit_symbol(text.substr(0, split->second), rev_merge, out);
        emit_symbol(text.substr(split->second), rev_merge, out);
        return;
      }
    }
    out.push_back(it->second);
    return;
  }
  // Byte fallback (SentencePiece byte_fallback): each UTF-8 byte of an unknown character as <0xXX>.
  if (has_byte_tokens_) {
    for (char c : text) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        out.push_back(id);
      } else if (vocab_.unk_id >= 0) {
        out.push_back(vocab_.unk_id);
      } else {
        fail("{}: byte 0x{:02X} has no <0x{:02X}> token and the vocabulary has no unknown token",
             vocab_.source, static_cast<uint8_t>(c), static_cast<uint8_t>(c));
      }
    }
    return;
  }
  INFERX_CHECK(vocab_.unk_id >= 0,
               "{}: the text contains a character that is not in the vocabulary, which has neither byte "
               "tokens nor an unknown token",
               vocab_.source);
  out.push_back(vocab_.unk_id);
}

}  // namespace inferx
