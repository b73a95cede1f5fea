// Batch-1 decode speed on the CPU backend, as a fraction of the memory-bandwidth roofline:
// roofline tok/s = bandwidth / weight bytes read per token. Prints one line per weight type.
// A benchmark, not a test: it asserts nothing.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "core/bandwidth.h"
#include "core/error.h"
#include "model/model.h"

using namespace inferx;

int main(int argc, char** argv) {
  CLI::App app{"CPU batch-1 decode benchmark with roofline ratio"};
  std::string model_spec = "dummy:llama-3.2-1b";
  std::vector<std::string> dtypes = {"q8_0", "q4_k"};
  int prompt = 32, steps = 32, threads = 0;
  app.add_option("--model", model_spec, "Model (dummy:NAME to generate random weights of that shape)");
  app.add_option("--dtype", dtypes, "Weight types for dummy models")->delimiter(',');
  app.add_option("--prompt", prompt, "Prompt tokens before decoding (context)");
  app.add_option("--steps", steps, "Decode steps timed");
  app.add_option("--threads", threads, "Threads (0 = all)");
  CLI11_PARSE(app, argc, argv);
  try {
    CpuBackend backend({threads});
    const double read_bw = measure_read_bandwidth_gbs(backend.pool());
    const double memcpy_bw = measure_memcpy_bandwidth_gbs();
    std::printf("threads %d | read bandwidth %.2f GB/s | memcpy bandwidth %.2f GB/s (read+write)\n",
                backend.pool().size(), read_bw, memcpy_bw);
    std::printf("%-28s %-6s %10s %9s %10s %10s %10s\n", "model", "dtype", "weights GB", "tok/s", "GB/s",
                "vs read", "vs memcpy");
    for (const std::string& dt : dtypes) {
      LoadOptions lo;
      auto parsed = dtype_from_name(dt);
      INFERX_CHECK(parsed.has_value(), "unknown dtype {}", dt);
      lo.dummy_dtype = *parsed;
      auto model = Model::load(model_spec, backend, lo);
      SequenceRunner runner(*model, prompt + steps + 8);
      std::vector<int32_t> ids(static_cast<size_t>(prompt));
      for (int i = 0; i < prompt; ++i)
        ids[static_cast<size_t>(i)] = (i * 7919 + 1) % static_cast<int32_t>(model->config().vocab_size);
      runner.step(ids);
      for (int i = 0; i < 3; ++i) runner.step({5});  // warm-up
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) runner.step({static_cast<int32_t>(i + 10)});
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double tps = steps / s;
      const double gb = static_cast<double>(model->weight_bytes_per_token()) / 1e9;
      std::printf("%-28s %-6s %10.3f %9.2f %10.2f %9.1f%% %9.1f%%\n", model_spec.c_str(), dt.c_str(), gb, tps,
                  gb * tps, 100 * gb * tps / read_bw, 100 * gb * tps / memcpy_bw);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_decode_cpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
