// libFuzzer target for the Hugging Face config.json parser: any text must either give a validated
// ModelConfig or throw inferx::Error. Seeds: fuzz/seeds/hf_config/.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "formats/hf_config.h"

namespace {
volatile uint64_t g_sink = 0;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    inferx::ModelConfig c = inferx::parse_hf_config(text, "fuzz/config.json");
    g_sink = g_sink + static_cast<uint64_t>(c.hidden_size) + c.eos_token_ids.size();
  } catch (const inferx::Error&) {
  }
  return 0;
}
