// Added-token matching (see added_tokens.h).
#include "text/added_tokens.h"

#include <algorithm>

#include "text/unicode.h"

namespace inferx {
namespace {

// The last / first character of a string is a word character (tokenizers' ends_with_word /
// starts_with_word use char::is_alphanumeric).
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return unicode::is_alphanumeric(unicode::next_code_point(s, start));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t pos = 0;
  return unicode::is_alphanumeric(unicode::next_code_point(s, pos));
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& t) { return t.content.empty(); });
  for (size_t i = 0; i < tokens_.size(); ++i)
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(static_cast<uint32_t>(i));
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, size_t& begin, size_t& index) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    for (uint32_t i : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      const std::string& c = tokens_[i].content;
      if (text.size() - pos >= c.size() && text.compare(pos, c.size(), c) == 0) {
        begin = pos;
        index = i;
        return true;
      }
    }
  }
  return false;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<AddedSplit>& out) const {
  out.clear();
  if (text.empty()) {
    out.push_back({-1, 0, 0});
    return;
  }
  size_t start_offset = 0;
  size_t search = 0;
  size_t mb = 0, index = 0;
  while (search < text.size() && find(text, search, mb, index)) {
    const AddedToken& t = tokens_[index];
    const size_t me = mb + t.content.size();
    search = me;  // the matcher moves on from the match itself, whatever lstrip/rstrip take
    size_t start = mb, stop = me;
    if (t.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      // Back over whitespace characters, never before the end of the previous split.
      size_t s = start;
      while (s > 0) {
        size_t c = s - 1;
        while (c > 0 && (static_cast<uint8_t>(text[c]) & 0xC0) == 0x80) --c;
        size_t pos = c;
        if (!unicode::is_whitespace(unicode::next_code_point(text, pos))) break;
        s = c;
      }
      start = std::max(s, start_offset);
    }
    if (t.rstrip) {
      size_t pos = stop;
      while (pos < text.size()) {
        size_t next = pos;
        if (!unicode::is_whitespace(unicode::next_code_point(text, next))) break;
        pos = next;
      }
      stop = pos;
    }
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({t.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({-1, start_offset, text.size()});
}

}  // namespace inferx
