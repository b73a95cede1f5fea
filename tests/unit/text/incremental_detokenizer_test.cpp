// IncrementalDetokenizer: characters split across byte tokens, the leading-space rule, U+FFFD for invalid
// bytes, and a property test against decode() followed by an independently written UTF-8 sanitiser.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "text/tokenizer.h"

namespace inferx {
namespace {

const std::string kData = INFERX_TESTDATA_DIR;
const std::string kFFFD = "\xEF\xBF\xBD";

class Detok : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = new GgufFile(kData + "/ggml-vocab/ggml-vocab-llama-spm.gguf");
    tok_ = load_gguf_tokenizer(*gguf_).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete gguf_;
  }
  static int32_t byte_id(uint8_t b) { return 3 + b; }  // Llama 2 layout: <0x00> is id 3

  // Pushes every id and returns each push's output (and flush() as the last element).
  static std::vector<std::string> stream(const std::vector<int32_t>& ids, bool skip_special = true) {
    IncrementalDetokenizer d(*tok_, skip_special);
    std::vector<std::string> parts;
    for (int32_t id : ids) parts.push_back(d.push(id));
    parts.push_back(d.flush());
    return parts;
  }
  static std::string joined(const std::vector<std::string>& parts) {
    std::string s;
    for (const auto& p : parts) s += p;
    return s;
  }

  static GgufFile* gguf_;
  static Tokenizer* tok_;
};
GgufFile* Detok::gguf_ = nullptr;
Tokenizer* Detok::tok_ = nullptr;

TEST_F(Detok, CjkSplitAcrossByteTokens) {
  ASSERT_EQ(tok_->piece(byte_id(0xE4)), "<0xE4>");
  // U+4F60 "你" = E4 BD A0: nothing until the third byte arrives.
  const auto parts = stream({byte_id(0xE4), byte_id(0xBD), byte_id(0xA0)});
  EXPECT_EQ(parts, (std::vector<std::string>{"", "", "\xE4\xBD\xA0", ""}));
}

TEST_F(Detok, EmojiFromTheLlamaTestVector) {
  // " this is 🦙.cpp" -> 29871 445 338 29871 243 162 169 156 29889 8223 (llama.cpp test vector).
  const std::vector<int32_t> ids = {29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223};
  const auto parts = stream(ids);
  EXPECT_EQ(joined(parts), " this is \xF0\x9F\xA6\x99.cpp");
  EXPECT_EQ(parts[4], "");
  EXPECT_EQ(parts[5], "");
  EXPECT_EQ(parts[6], "");
  EXPECT_EQ(parts[7], "\xF0\x9F\xA6\x99");
}

TEST_F(Detok, LeadingSpaceDroppedOnlyForTheFirstPiece) {
  // <s> ▁Hello ▁world: like decode(), the dummy-prefix space of the first piece goes, later spaces stay.
  const auto parts = stream({1, 15043, 3186, 2});
  EXPECT_EQ(parts, (std::vector<std::string>{"", "Hello", " world", "", ""}));
  EXPECT_EQ(joined(parts), tok_->decode({1, 15043, 3186, 2}));
}

TEST_F(Detok, InvalidBytesBecomeReplacementCharacters) {
  // A lone continuation byte is invalid at once.
  EXPECT_EQ(stream({byte_id('a'), byte_id(0x80)})[1], kFFFD);
  // E4 BD then 'a': the sequence is broken; one U+FFFD for the maximal subpart E4 BD, then "a".
  const auto parts = stream({byte_id(0xE4), byte_id(0xBD), byte_id('a')});
  EXPECT_EQ(parts, (std::vector<std::string>{"", "", kFFFD + "a", ""}));
  // ED A0 (a surrogate) is invalid from its second byte: two maximal subparts.
  EXPECT_EQ(joined(stream({byte_id(0xED), byte_id(0xA0)})), kFFFD + kFFFD);
  // An incomplete tail is replaced only by flush().
  const auto tail = stream({byte_id(0xF0), byte_id(0x9F)});
  EXPECT_EQ(tail, (std::vector<std::string>{"", "", kFFFD}));
  // C0 and F5 can never start a sequence.
  EXPECT_EQ(joined(stream({byte_id(0xC0), byte_id(0xF5)})), kFFFD + kFFFD);
}

TEST_F(Detok, SpecialTokens) {
  EXPECT_EQ(joined(stream({1, 15043, 2}, /*skip_special=*/true)), "Hello");
  EXPECT_EQ(joined(stream({1, 15043, 2}, /*skip_special=*/false)), "<s>Hello</s>");
  EXPECT_THROW(stream({32000}), Error);
}

// ---- property test -----------------------------------------------------------------------------------
// Reference sanitiser written a different way from the implementation: a sequence is well formed when it
// decodes to a code point in the range its length allows (no overlongs, no surrogates, <= U+10FFFF); an
// invalid position is replaced with one U+FFFD covering its longest prefix that some well-formed sequence
// starts with (found by brute force), as Unicode 15 section 3.9 recommends.
int sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 0;
}

bool well_formed(const std::string& s) {
  const int n = sequence_length(static_cast<uint8_t>(s[0]));
  if (n == 0 || static_cast<int>(s.size()) != n) return false;
  uint32_t cp = static_cast<uint8_t>(s[0]) & (n == 1 ? 0x7F : (0x7F >> n));
  for (int i = 1; i < n; ++i) {
    const auto b = static_cast<uint8_t>(s[i]);
    if ((b & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (b & 0x3F);
  }
  static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  return cp >= kMin[n] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
}

bool is_prefix_of_well_formed(const std::string& p) {
  static std::map<std::string, bool> memo;
  const auto it = memo.find(p);
  if (it != memo.end()) return it->second;
  bool found = false;
  const int n = sequence_length(static_cast<uint8_t>(p[0]));
  if (n > static_cast<int>(p.size())) {
    std::string s = p;
    const std::function<void()> extend = [&] {
      if (found) return;
      if (static_cast<int>(s.size()) == n) {
        found = well_formed(s);
        return;
      }
      for (int b = 0x80; b <= 0xBF && !found; ++b) {
        s.push_back(static_cast<char>(b));
        extend();
        s.pop_back();
      }
    };
    extend();
  }
  return memo[p] = found;
}

std::string reference_sanitize(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    bool done = false;
    for (size_t len = 1; len <= 4 && i + len <= s.size(); ++len) {
      if (well_formed(s.substr(i, len))) {
        out += s.substr(i, len);
        i += len;
        done = true;
        break;
      }
    }
    if (done) continue;
    size_t k = 1;
    while (k < 3 && i + k + 1 <= s.size() && is_prefix_of_well_formed(s.substr(i, k + 1))) ++k;
    out += kFFFD;
    i += k;
  }
  return out;
}

TEST(ReferenceSanitize, KnownCases) {
  EXPECT_EQ(reference_sanitize("a\x80z"), "a" + kFFFD + "z");
  EXPECT_EQ(reference_sanitize("\xE4\xBD"), kFFFD);
  EXPECT_EQ(reference_sanitize("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);
  EXPECT_EQ(reference_sanitize("\xF0\x9F\xA6\x99"), "\xF0\x9F\xA6\x99");
}

TEST_F(Detok, StreamEqualsSanitizedDecodeOnRandomIds) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> kind(0, 9), any(0, tok_->vocab_size() - 1), byte(0, 255), len(1, 24);
  const int32_t multibyte_leads[] = {0xC3, 0xE4, 0xED, 0xF0, 0xF4, 0xE0};
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<int32_t> ids;
    const int n = len(rng);
    for (int i = 0; i < n; ++i) {
      const int k = kind(rng);
      if (k < 4) {
        ids.push_back(byte_id(static_cast<uint8_t>(0x80 + byte(rng) % 64)));  // continuation bytes
      } else if (k < 6) {
        ids.push_back(byte_id(static_cast<uint8_t>(multibyte_leads[byte(rng) % 6])));
      } else if (k < 7) {
        ids.push_back(byte_id(static_cast<uint8_t>(byte(rng))));
      } else if (k < 8) {
        ids.push_back(byte(rng) % 3);  // <unk>, <s>, </s>
      } else {
        ids.push_back(any(rng));
      }
    }
    const std::string streamed = joined(stream(ids));
    EXPECT_EQ(streamed, reference_sanitize(tok_->decode(ids))) << "iteration " << iter;
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace inferx
