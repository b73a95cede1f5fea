// libFuzzer target for Hugging Face tokenizer.json (text/hf_tokenizer_json.h), which a model folder brings:
// any bytes must either load a tokenizer or throw inferx::Error naming the problem (an nlohmann type_error,
// a std::out_of_range or a crash would be a load that dies instead of an error message). A loaded tokenizer
// must encode fixed texts (ASCII, accents, an emoji, added-token text, invalid UTF-8) with every id in
// range, decode them, and stream-decode them to valid UTF-8 without throwing anything but inferx::Error.
// Seeds: fuzz/seeds/hf_tokenizer_json/ (ours, tools/make_tokenizer_json_seeds.py).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/json_text.h"
#include "text/hf_tokenizer_json.h"
#include "text/tokenizer.h"

namespace {

volatile uint64_t g_sink = 0;

void exercise(const inferx::Tokenizer& tok) {
  static const char* const kTexts[] = {
      "Hello, world! The 12345 in a test.",
      "  caf\xc3\xa9 na\xc3\xafve \xf0\x9f\xa6\x99\n\tx",
      "<|begin|>text<|end|><s></s>    ",
      "bad \xff\xfe bytes \xc3",
      "",
  };
  for (const char* text : kTexts) {
    for (bool bos : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(text, bos);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) std::abort();
      g_sink = g_sink + tok.decode(ids).size();
      inferx::IncrementalDetokenizer detok(tok);
      for (int32_t id : ids) g_sink = g_sink + detok.push(id).size();
      g_sink = g_sink + detok.flush().size();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json doc;
  try {
    // As load_hf_tokenizer_json reads the file: nesting bounded (formats/json_text.h).
    doc = inferx::parse_json_text(std::string_view(reinterpret_cast<const char*>(data), size),
                                  "fuzz/tokenizer.json");
  } catch (const inferx::Error&) {
    return 0;
  }
  try {
    const auto tok = inferx::parse_hf_tokenizer_json(doc, "fuzz/tokenizer.json");
    exercise(*tok);
  } catch (const inferx::Error&) {
  }
  return 0;
}
