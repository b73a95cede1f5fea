// libFuzzer target for the quantization plan a checkpoint stores in its metadata
// ("inferx.quantization_plan", read by QuantPlan::from_json when the checkpoint loads): any text must give
// a plan or throw inferx::Error, and a plan must survive to_json -> from_json unchanged (the round trip
// `inferx quantize` relies on). Seeds: fuzz/seeds/quant_plan/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "quant/plan.h"

namespace {
volatile uint64_t g_sink = 0;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  inferx::QuantPlan plan;
  try {
    plan = inferx::QuantPlan::from_json(text, "fuzz/model.safetensors");
  } catch (const inferx::Error&) {
    return 0;
  }
  g_sink = g_sink + plan.summary().size();
  const inferx::QuantPlan back = inferx::QuantPlan::from_json(plan.to_json(), "round trip");
  if (back.kind != plan.kind || back.layers.size() != plan.layers.size()) std::abort();
  for (size_t i = 0; i < plan.layers.size(); ++i)
    if (back.layers[i].first != plan.layers[i].first || !(back.layers[i].second == plan.layers[i].second))
      std::abort();
  return 0;
}
