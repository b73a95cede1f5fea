#pragma once
// The engine flags `inferx serve` and `inferx bench offline` share (the product quick start's names),
// and loading model + tokenizer + engine from them.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "inferx/engine.h"
#include "model/model.h"
#include "text/tokenizer_loader.h"

namespace inferx::cli {

struct EngineArgs {
  std::string model;  // empty: default_model()
  std::string device = "cpu";
  int threads = 0;
  std::string dtype = "bf16";  // dummy models
  int32_t max_batch_size = 256;
  int32_t max_num_batched_tokens = 0;  // 0: kDefaultStepTokensGpu on a GPU, kDefaultStepTokensCpu else
  int32_t block_size = 16;
  std::string kv_cache_memory;  // "4GiB", "512MiB", bytes; empty: engine default
  float gpu_memory_utilization = 0.9f;
  int32_t max_model_len = 0;
  std::string kv_cache_strategy = "full";
  std::string kv_cache_dtype = "auto";  // auto | bf16 | fp8 | f32 (backend_choice.h)
  bool no_prefix_caching = false;
  bool enable_alp = true;  // chunked prefill (on by default; the flag exists for the quick start)
  bool no_chunked_prefill = false;
  bool enforce_eager = false;    // GPU: no CUDA graphs for decode steps
  bool no_async_decode = false;  // GPU: no overlapped decode steps (EngineConfig::async_decode)
  bool no_warmup = false;        // GPU: no startup warm-up (EngineConfig::warm_up)
  std::string quantize = "none";
  std::string calibration;  // --quantize auto
  int tensor_parallel_size = 1;
};

// Default token budget of a step. GPU: 8192, as vLLM's default on large-memory GPUs - measured on the H200
// (2026-12-03, served 1024/256 x1000 at concurrency 256) against 2048: bf16 5,153 vs 5,016 output tok/s,
// FP8 7,235 vs 6,938, TTFT p99 7.8 vs 9.2 s (bf16); longer steps make the prefill GEMMs efficient.
// CPU: 2048 (a step of 8192 tokens would take seconds there).
inline constexpr int32_t kDefaultStepTokensGpu = 8192, kDefaultStepTokensCpu = 2048;

void add_engine_options(CLI::App& sub, EngineArgs& a);

// ../shared/testdata/stories260K.gguf next to the repository when present, else dummy:tiny.
std::string default_model();
// "path/to/stories260K.gguf" -> "stories260K"; "dummy:tiny" stays.
std::string default_served_name(const std::string& model_spec);
// --quantize: throws on a plan parse_quant_options (quant/plan.h) does not know.
void check_quantize(const std::string& value);
// "4GiB" / "512MiB" / "1.5GB" / "1000000" -> bytes; throws naming --kv-cache-memory.
int64_t parse_memory_size(const std::string& text);
// The engine's settings from the flags; `device` (the backend's) picks the default step size.
EngineConfig engine_config(const EngineArgs& a, Device device = Device::CPU);

struct LoadedEngine {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  ModelText text;
  std::unique_ptr<Engine> engine;
};
LoadedEngine load_engine(const EngineArgs& a);

}  // namespace inferx::cli
