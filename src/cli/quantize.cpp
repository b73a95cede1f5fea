// inferx quantize: load a Hugging Face model with a quantization plan and write it as a checkpoint in the
// InferX quantized layout (docs/quantized-checkpoint.md), loadable with `--model DIR`.
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/quantize_options.h"
#include "model/quantized_checkpoint.h"

namespace inferx::cli {

namespace {

struct QuantizeArgs {
  std::string model, out, plan = "fp8", calibration;
  int threads = 0;
};

void run_quantize(const QuantizeArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  auto backend = make_cpu_backend({a.threads});
  LoadOptions lo;
  apply_quantize(a.plan, a.calibration, a.model, a.threads, lo);
  auto model = Model::load(a.model, *backend, lo);
  std::fprintf(stderr, "%s\n", model->quant_plan().summary().c_str());
  write_quantized_checkpoint(a.model, *model, a.out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "wrote %s in %.1f s (linear weights: %.1f MiB per token read)\n", a.out.c_str(), s,
               static_cast<double>(model->weight_bytes_per_token()) / (1 << 20));
}

}  // namespace

void register_quantize(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* sub =
      app.add_subcommand("quantize", "Write a quantized checkpoint (safetensors) of a Hugging Face model");
  sub->add_option("-m,--model", a->model, "A Hugging Face model folder")->required();
  sub->add_option("-o,--out", a->out, "Output folder")->required();
  sub->add_option("--quantize", a->plan, kQuantizeHelp);
  sub->add_option("--calibration", a->calibration, "Text file for --quantize auto");
  sub->add_option("-t,--threads", a->threads, "CPU threads (0 = all)")->check(CLI::Range(0, 1024));
  out.emplace_back(sub, [a] { run_quantize(*a); });
}

}  // namespace inferx::cli
