#include "cli/engine_options.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "cli/backend_choice.h"
#include "cli/quantize_options.h"
#include "cli/tensor_parallel_options.h"
#include "core/dtype.h"
#include "core/error.h"

#ifndef INFERX_SOURCE_DIR
#define INFERX_SOURCE_DIR "."
#endif

namespace inferx::cli {

void add_engine_options(CLI::App& sub, EngineArgs& a) {
  sub.add_option(
      "-m,--model", a.model,
      "A .gguf file, a Hugging Face folder or dummy:NAME (default: ../shared/testdata/stories260K.gguf "
      "when present, else dummy:tiny)");
  sub.add_option("--device", a.device, "cpu, cuda or cuda:N");
  sub.add_option("-t,--threads", a.threads, "CPU threads for the kernels (0 = all)")
      ->check(CLI::Range(0, 1024));
  sub.add_option("--dtype", a.dtype, "Weight type of dummy models: f32 f16 bf16 q8_0 q4_0 q4_k q6_k");
  sub.add_option("--max-batch-size", a.max_batch_size, "Max running sequences")
      ->check(CLI::Range(1, 1 << 16));
  sub.add_option("--max-num-batched-tokens", a.max_num_batched_tokens,
                 "Token budget of one engine step (default: 8192 on a GPU, 2048 on the CPU)")
      ->check(CLI::Range(1, 1 << 24));
  sub.add_option("--block-size", a.block_size, "Tokens per KV cache block")->check(CLI::Range(1, 1024));
  sub.add_option("--kv-cache-memory", a.kv_cache_memory,
                 "KV cache size, e.g. 2GiB or 512MiB (default: CPU 1 GiB at most; GPU from "
                 "--gpu-memory-utilization)");
  sub.add_option("--gpu-memory-utilization", a.gpu_memory_utilization,
                 "GPU: fraction of the device's total memory for weights, activations and the KV cache "
                 "(the KV cache takes what is left)")
      ->check(CLI::Range(0.01, 1.0));
  sub.add_option("--max-model-len", a.max_model_len, "Max prompt + completion tokens (0: the model's)")
      ->check(CLI::Range(0, 1 << 24));
  sub.add_option("--kv-cache-strategy", a.kv_cache_strategy, "full or sliding-window-N");
  sub.add_option(
      "--kv-cache-dtype", a.kv_cache_dtype,
      "KV cache element type: auto (CUDA bf16, CPU f32), bf16, fp8 (E4M3, scale 1.0; CUDA) or f32");
  sub.add_flag("--no-prefix-caching", a.no_prefix_caching, "Disable automatic prefix caching");
  sub.add_flag("--enable-alp", a.enable_alp, "Chunked prefill (on by default)");
  sub.add_flag("--no-chunked-prefill", a.no_chunked_prefill, "Prefill whole prompts in one step");
  sub.add_flag("--enforce-eager", a.enforce_eager, "GPU: run every step eagerly (no CUDA graphs)");
  sub.add_flag("--no-async-decode", a.no_async_decode,
               "GPU: wait for each decode step's tokens before launching the next (no overlapped steps)");
  sub.add_flag("--no-warmup", a.no_warmup,
               "GPU: start without the warm-up (each step size's first served step then times its GEMM "
               "algorithms and records its CUDA graph)");
  add_quantize_options(sub, a.quantize, a.calibration);
  add_tensor_parallel_option(sub, a.tensor_parallel_size);
}

std::string default_model() {
  const std::filesystem::path p =
      std::filesystem::path(INFERX_SOURCE_DIR) / ".." / "shared" / "testdata" / "stories260K.gguf";
  if (std::filesystem::exists(p)) return p.lexically_normal().string();
  return "dummy:tiny";
}

std::string default_served_name(const std::string& spec) {
  if (spec.rfind("dummy:", 0) == 0) return spec;
  std::filesystem::path p(spec);
  if (p.filename().empty()) p = p.parent_path();  // "folder/"
  return p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
}

void check_quantize(const std::string& value) { (void)parse_quant_options(value); }

int64_t parse_memory_size(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("--kv-cache-memory: '{}' is not a size (examples: 2GiB, 512MiB, 1000000)", text);
  }
  std::string unit = text.substr(used);
  double mul = 1;
  if (unit.empty() || unit == "B")
    mul = 1;
  else if (unit == "KiB" || unit == "K")
    mul = 1024.0;
  else if (unit == "MiB" || unit == "M")
    mul = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    mul = 1024.0 * 1024 * 1024;
  else if (unit == "KB")
    mul = 1e3;
  else if (unit == "MB")
    mul = 1e6;
  else if (unit == "GB")
    mul = 1e9;
  else
    fail("--kv-cache-memory: unknown unit '{}' in '{}' (use B, KiB, MiB, GiB, KB, MB, GB)", unit, text);
  INFERX_CHECK(v > 0 && std::isfinite(v), "--kv-cache-memory: '{}' must be positive", text);
  return static_cast<int64_t>(v * mul);
}

EngineConfig engine_config(const EngineArgs& a, Device device) {
  EngineConfig c;
  c.max_num_batched_tokens = a.max_num_batched_tokens > 0 ? a.max_num_batched_tokens
                             : device == Device::CPU      ? kDefaultStepTokensCpu
                                                          : kDefaultStepTokensGpu;
  c.max_batch_size = a.max_batch_size;
  c.block_size = a.block_size;
  if (!a.kv_cache_memory.empty()) c.kv_cache_bytes = parse_memory_size(a.kv_cache_memory);
  c.gpu_memory_utilization = a.gpu_memory_utilization;
  c.enable_prefix_caching = !a.no_prefix_caching;
  c.enable_chunked_prefill = a.enable_alp && !a.no_chunked_prefill;
  c.max_model_len = a.max_model_len;
  c.enforce_eager = a.enforce_eager;
  c.async_decode = !a.no_async_decode;
  c.warm_up = !a.no_warmup;
  const std::string sw = "sliding-window-";
  if (a.kv_cache_strategy == "full") {
    c.sliding_window = 0;
  } else if (a.kv_cache_strategy.rfind(sw, 0) == 0) {
    const std::string n = a.kv_cache_strategy.substr(sw.size());
    size_t used = 0;
    long long w = -1;
    try {
      w = std::stoll(n, &used);
    } catch (const std::exception&) {
    }
    INFERX_CHECK(w > 0 && used == n.size(),
                 "--kv-cache-strategy: '{}' needs a positive window, e.g. sliding-window-4096",
                 a.kv_cache_strategy);
    c.sliding_window = w;
  } else {
    fail("--kv-cache-strategy: '{}' is not full or sliding-window-N", a.kv_cache_strategy);
  }
  return c;
}

LoadedEngine load_engine(const EngineArgs& a) {
  LoadedEngine l;
  l.backend = make_backend(a.device, a.threads, a.kv_cache_dtype);
  const EngineConfig config = engine_config(a, l.backend->device());
  LoadOptions lo;
  auto dt = dtype_from_name(a.dtype);
  INFERX_CHECK(dt.has_value(), "--dtype: unknown weight type '{}'", a.dtype);
  lo.dummy_dtype = *dt;
  apply_quantize(a.quantize, a.calibration, a.model, a.threads, lo);
  apply_tensor_parallel(a.device, a.threads, a.tensor_parallel_size, lo, a.kv_cache_dtype);
  l.model = Model::load(a.model, *l.backend, lo);
  print_quant_plan(*l.model);
  l.text = load_model_text(a.model, l.model->source());
  l.engine = std::make_unique<Engine>(*l.model, l.text.tokenizer.get(), config);
  return l;
}

}  // namespace inferx::cli
