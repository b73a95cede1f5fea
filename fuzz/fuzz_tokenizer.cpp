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
#include "fuzz_utf8.h"
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
  if (!fuzz::valid_utf8(streamed)) std::abort();
  if (fuzz::valid_utf8(text) && streamed != expected) std::abort();
  return 0;
}
