// libFuzzer target for the safetensors reader: any byte string must either parse into a SafetensorsFile
// whose every tensor byte range is safe to touch, or throw inferx::Error. Seeds: fuzz/seeds/safetensors/.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"

namespace {
volatile uint64_t g_sink = 0;  // keeps the touches from being optimised away
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size copy: libFuzzer's buffer is already exact, but this keeps the contract explicit.
  std::vector<uint8_t> bytes(data, data + size);
  try {
    inferx::SafetensorsFile f(bytes.data(), bytes.size(), "fuzz.safetensors");
    for (const inferx::TensorEntry& t : f.tensors()) {
      if (t.nbytes > 0) g_sink = g_sink + t.data[0] + t.data[t.nbytes - 1];
      if (f.find(t.name) != &t) __builtin_trap();  // the index must agree with the list
      if (t.shape.size() <= 4) g_sink = g_sink + static_cast<uint64_t>(t.view().numel());
    }
    for (const auto& [k, v] : f.metadata()) g_sink = g_sink + k.size() + v.size();
  } catch (const inferx::Error&) {
  }
  return 0;
}
