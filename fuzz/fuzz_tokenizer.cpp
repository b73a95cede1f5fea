// libFuzzer target: SentencePiece encode of arbitrary bytes (invalid UTF-8 included), then decode and
// streaming detokenization of the ids. Checks the invariants that hold for every input:
//   - every id is in range;
//   - decode(encode(text)) == text with U+2581 read as a space (SentencePiece BPE with byte fallback is
//     lossless otherwise; the dummy-prefix space that encode adds is the one decode drops);
//   - the streamed text equals decode() with invalid bytes replaced, so it is valid UTF-8 and, when the
//     input was valid UTF-8, equal to the input.
// The vocabulary is stories260K's tok512.bin, read from $INFERX_TESTDATA_DIR (default
// ../shared/testdata, relative to the working directory).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/tokenizer.h"

namespace {

const inferx::Tokenizer& tokenizer() {
  static const std::unique_ptr<inferx::Tokenizer> tok = [] {
    const char* dir = std::getenv("INFERX_TESTDATA_DIR");
    const std::string path = std::string(dir != nullptr ? dir : "../shared/testdata") + "/tok512.bin";
    try {
      return inferx::load_llama2c_tokenizer(path, 512);
    } catch (const inferx::Error& e) {
      std::fprintf(stderr, "fuzz_tokenizer: %s (set INFERX_TESTDATA_DIR)\n", e.what());
      std::abort();
    }
  }();
  return *tok;
}

// True when s is well-formed UTF-8 (Unicode 15 table 3-7).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
      n = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 3;
      lo = b == 0xE0 ? 0xA0 : 0x80;
      hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 4;
      lo = b == 0xF0 ? 0x90 : 0x80;
      hi = b == 0xF4 ? 0x8F : 0xBF;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const inferx::Tokenizer& tok = tokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool add_bos = size > 0 && (data[0] & 1);

  const std::vector<int32_t> ids = tok.encode(text, add_bos);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  }
  // A literal U+2581 in the input is SentencePiece's space marker, so it comes back as a space.
  std::string expected = text;
  for (size_t at = expected.find("\xE2\x96\x81"); at != std::string::npos;
       at = expected.find("\xE2\x96\x81", at)) {
    expected.replace(at, 3, " ");
  }
  const std::string decoded = tok.decode(ids);
  if (decoded != expected) std::abort();

  inferx::IncrementalDetokenizer detok(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += detok.push(id);
  streamed += detok.flush();
  if (!valid_utf8(streamed)) std::abort();
  if (valid_utf8(text) && streamed != expected) std::abort();
  return 0;
}
