// libFuzzer target for the GGUF reader: any byte string must either parse into a GgufFile whose every
// tensor byte range and metadata value is safe to touch (and read_gguf_config only throws), or throw
// inferx::Error. Seeds: fuzz/seeds/gguf/.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_config.h"

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
    // The metadata -> config mapping must also only ever throw.
    g_sink = g_sink + static_cast<uint64_t>(inferx::read_gguf_config(g).num_layers);
  } catch (const inferx::Error&) {
  }
  return 0;
}
