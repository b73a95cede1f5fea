// inferx generate: run one prompt through a model and stream the completion to stdout.
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include "backend/backend.h"
#include "cli/backend_choice.h"
#include "cli/commands.h"
#include "cli/quantize_options.h"
#include "cli/tensor_parallel_options.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace inferx::cli {

namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  int n = 128;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  uint64_t seed = 0;
  int threads = 0;
  std::string dtype = "bf16";
  std::string device = "cpu";
  std::string kv_cache_dtype = "auto";
  bool ignore_eos = false;
  bool no_bos = false;
  std::string quantize = "none";
  std::string calibration;
  int tensor_parallel_size = 1;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      INFERX_CHECK(used == item.size(), "--prompt-ids: '{}' is not an integer", item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::logic_error&) {
      fail("--prompt-ids: '{}' is not an integer", item);
    }
  }
  return ids;
}

void run_generate(const GenerateArgs& a) {
  auto t_load = std::chrono::steady_clock::now();
  auto backend = make_backend(a.device, a.threads, a.kv_cache_dtype);
  LoadOptions lo;
  auto dt = dtype_from_name(a.dtype);
  INFERX_CHECK(dt.has_value(), "--dtype: unknown weight type '{}'", a.dtype);
  lo.dummy_dtype = *dt;
  lo.dummy_seed = a.seed;
  apply_quantize(a.quantize, a.calibration, a.model, a.threads, lo);
  apply_tensor_parallel(a.device, a.threads, a.tensor_parallel_size, lo, a.kv_cache_dtype);
  auto model = Model::load(a.model, *backend, lo);
  std::fprintf(stderr, "model: %s\nbackend: %s\n", model->description().c_str(), backend->name().c_str());
  print_quant_plan(*model);

  std::unique_ptr<Tokenizer> tokenizer;
  if (auto* gguf = dynamic_cast<const GgufFile*>(model->source());
      gguf && gguf->find_metadata("tokenizer.ggml.model"))
    tokenizer = load_gguf_tokenizer(*gguf);

  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    prompt = parse_ids(a.prompt_ids);
  } else if (tokenizer) {
    prompt = tokenizer->encode(a.prompt, !a.no_bos);
  } else {
    fail("{} has no tokenizer InferX can read yet: give the prompt as token ids with --prompt-ids 1,2,3",
         a.model);
  }
  INFERX_CHECK(!prompt.empty(), "the prompt is empty (give --prompt text, or --prompt-ids)");
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  SequenceRunner runner(*model, static_cast<int64_t>(prompt.size()) + a.n);
  Sampler sampler({a.temperature, a.top_k, a.top_p, a.min_p, a.seed});
  std::unique_ptr<IncrementalDetokenizer> detok;
  if (tokenizer) detok = std::make_unique<IncrementalDetokenizer>(*tokenizer);
  const int64_t vocab = model->config().vocab_size;
  const auto& eos = model->config().eos_token_ids;
  const int32_t tok_eos = tokenizer ? tokenizer->eos_id() : -1;

  auto t0 = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &runner.step(prompt);
  auto t1 = std::chrono::steady_clock::now();
  int generated = 0;
  for (; generated < a.n; ++generated) {
    int32_t next = sampler.sample(logits->data(), vocab);
    const bool is_eos = next == tok_eos || std::find(eos.begin(), eos.end(), next) != eos.end();
    if (is_eos && !a.ignore_eos) break;
    if (detok) {
      std::string piece = detok->push(next);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
    } else {
      std::printf("%s%d", generated ? " " : "", next);
    }
    std::fflush(stdout);
    if (generated + 1 < a.n) logits = &runner.step({next});
  }
  if (detok) {
    std::string rest = detok->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::printf("\n");
  auto t2 = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(
      stderr,
      "load %.2f s | prompt %zu tokens in %.3f s (%.1f tok/s) | generated %d tokens in %.3f s (%.2f tok/s)\n",
      load_s, prompt.size(), prefill_s, static_cast<double>(prompt.size()) / prefill_s, generated, decode_s,
      generated > 0 ? generated / decode_s : 0.0);
}

}  // namespace

void register_generate(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* sub =
      app.add_subcommand("generate", "Generate text from a prompt (streams to stdout; speed on stderr)");
  sub->add_option("-m,--model", args->model, "A .gguf file, a Hugging Face folder, or dummy:NAME[:DTYPE]")
      ->required();
  sub->add_option("-p,--prompt", args->prompt, "Prompt text");
  sub->add_option("--prompt-ids", args->prompt_ids,
                  "Prompt as comma-separated token ids (models without tokenizer)");
  sub->add_option("-n,--max-tokens", args->n, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--temperature", args->temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-k", args->top_k, "Keep the k most likely tokens (0 = off)")
      ->check(CLI::Range(0, 1 << 24));
  sub->add_option("--top-p", args->top_p, "Nucleus sampling threshold (1 = off)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--min-p", args->min_p, "Drop tokens below min_p * p_max (0 = off)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--seed", args->seed, "Sampling seed (and dummy weight seed)");
  sub->add_option("-t,--threads", args->threads, "CPU threads (0 = all)")->check(CLI::Range(0, 1024));
  sub->add_option("--dtype", args->dtype, "Weight type of dummy models: f32 f16 bf16 q8_0 q4_0 q4_k q6_k");
  sub->add_option("--device", args->device, "cpu, cuda or cuda:N");
  sub->add_option(
      "--kv-cache-dtype", args->kv_cache_dtype,
      "KV cache element type: auto (CUDA bf16, CPU f32), bf16, fp8 (E4M3, scale 1.0; CUDA) or f32");
  sub->add_flag("--ignore-eos", args->ignore_eos, "Keep generating past end-of-sequence");
  sub->add_flag("--no-bos", args->no_bos, "Do not prepend the BOS token");
  add_quantize_options(*sub, args->quantize, args->calibration);
  add_tensor_parallel_option(*sub, args->tensor_parallel_size);
  out.emplace_back(sub, [args] { run_generate(*args); });
}

}  // namespace inferx::cli
