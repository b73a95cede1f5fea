// libFuzzer target for the GGUF reader: any byte string must either parse into a GgufFile whose every
// tensor byte range and metadata value is safe to touch (and read_gguf_config only throws), or throw
// inferx::Error. The tokenizer built from its tokenizer.ggml.* metadata must likewise load or throw, and a
// loaded one must encode and decode without crashing, every id in range. Seeds: fuzz/seeds/gguf/ (the
// vocab_*.gguf ones: our fixtures' metadata without tensors, tools/make_gguf_vocab_seeds.py).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_config.h"
#include "text/tokenizer.h"

namespace {

volatile uint64_t g_sink = 0;  // keeps the touches from being optimised away

void touch(const inferx::GgufValue& v) {
  using inferx::GgufType;
  switch (v.type) {
    case GgufType::STRING:
      g_sink = g_sink + v.as_string().size();
      break;
    case GgufType::ARRAY:
      for (const inferx::GgufValue& item : v.as_array().items) touch(item);
      break;
    case GgufType::BOOL:
      g_sink = g_sink + v.as_bool();
      break;
    case GgufType::FLOAT32:
    case GgufType::FLOAT64:
      g_sink = g_sink + static_cast<uint64_t>(v.as_float() != 0);
      break;
    default:
      g_sink = g_sink + static_cast<uint64_t>(v.as_float() != 0);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    inferx::GgufFile g(data, size, "fuzz.gguf");
    for (const auto& [key, value] : g.metadata()) {
      g_sink = g_sink + key.size();
      touch(value);
    }
    for (const inferx::TensorEntry& t : g.tensors()) {
      // nbytes > 0 always (every ne >= 1), so first and last bytes exist inside the input.
      g_sink = g_sink + t.data[0] + t.data[t.nbytes - 1];
      if (g.find(t.name) != &t) __builtin_trap();
    }
    // The tokenizer from the metadata, independently of the config (a file may have one and not the other).
    try {
      const std::unique_ptr<inferx::Tokenizer> tok = inferx::load_gguf_tokenizer(g);
      const std::vector<int32_t> ids = tok->encode("Hello, w\xc3\xb6rld! 12345 \xf0\x9f\xa6\x99\n", true);
      for (int32_t id : ids)
        if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
      g_sink = g_sink + tok->decode(ids).size();
    } catch (const inferx::Error&) {
    }
    // The metadata -> config mapping must also only ever throw.
    g_sink = g_sink + static_cast<uint64_t>(inferx::read_gguf_config(g).num_layers);
  } catch (const inferx::Error&) {
  }
  return 0;
}
