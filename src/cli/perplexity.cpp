// inferx perplexity: chunked perplexity of a text (as llama.cpp's perplexity tool) and the KL divergence
// of a (quantized) model's token distributions against a saved base run (model/perplexity.h).
//
//   inferx perplexity -m M -f TEXT --kl-divergence-base base.kl               # base run: writes base.kl
//   inferx perplexity -m M -f TEXT --quantize fp8 --kl-divergence-base base.kl --kl-divergence
//   inferx perplexity -m M -f TEXT --device cuda --kv-cache-dtype fp8 --decode-steps ...  # the decode path
#include "model/perplexity.h"

#include <cstdio>
#include <memory>

#include "cli/backend_choice.h"
#include "cli/commands.h"
#include "cli/quantize_options.h"
#include "core/error.h"
#include "core/text_file.h"

namespace inferx::cli {

namespace {

struct PerplexityArgs {
  std::string model, file, quantize = "none", calibration, kl_base, device = "cpu", kv_cache_dtype = "auto";
  bool kl_divergence = false, decode_steps = false;
  int64_t ctx = 128;
  int64_t top_k = 0;
  int threads = 0;
};

void run_perplexity(const PerplexityArgs& a) {
  const std::string text = read_text_file(a.file, "the text file");
  auto backend = make_backend(a.device, a.threads, a.kv_cache_dtype);
  const PerplexityMode mode = a.decode_steps ? PerplexityMode::DecodeSteps : PerplexityMode::Prefill;
  LoadOptions lo;
  apply_quantize(a.quantize, a.calibration, a.model, a.threads, lo);
  auto model = Model::load(a.model, *backend, lo);
  std::fprintf(stderr, "model: %s\n", model->description().c_str());
  print_quant_plan(*model);
  const std::vector<int32_t> tokens = tokenize_for_model(a.model, model->source(), text);
  const int64_t vocab = model->config().vocab_size;
  const uint64_t hash = hash_tokens(tokens, a.ctx);

  PerplexityResult r;
  if (a.kl_divergence) {
    INFERX_CHECK(!a.kl_base.empty(),
                 "--kl-divergence needs --kl-divergence-base FILE (written by a base run)");
    const KlBase base = KlBase::read(a.kl_base);
    INFERX_CHECK(
        base.tokens_hash == hash && base.ctx == a.ctx,
        "{}: written for other text or --ctx (base ctx {}); rerun the base with the same -f and --ctx",
        a.kl_base, base.ctx);
    KlAccumulator kl(base);
    r = compute_perplexity(
        *model, tokens, a.ctx, [&](const float* lp, int64_t v, int32_t) { kl.add(lp, v); }, mode);
    const KlStats s = kl.stats();
    std::printf("perplexity: %.4f over %lld tokens (%lld chunks of %lld)\n", r.perplexity(),
                static_cast<long long>(r.scored), static_cast<long long>(r.chunks),
                static_cast<long long>(a.ctx));
    std::printf("base perplexity: %.4f\nmean KL divergence: %.6f nats (max %.4f)\ntop-1 agreement: %.2f%%\n",
                base.base_perplexity, s.mean_kl, s.max_kl, 100.0 * s.top1_agreement);
    return;
  }
  KlBase base;
  if (!a.kl_base.empty())
    base = KlBase::for_text(vocab, tokens, a.ctx, a.top_k > 0 ? a.top_k : std::min<int64_t>(vocab, 256));
  r = compute_perplexity(
      *model, tokens, a.ctx,
      [&](const float* lp, int64_t v, int32_t) {
        if (!a.kl_base.empty()) base.add(lp, v);
      },
      mode);
  std::printf("perplexity: %.4f over %lld tokens (%lld chunks of %lld)\n", r.perplexity(),
              static_cast<long long>(r.scored), static_cast<long long>(r.chunks),
              static_cast<long long>(a.ctx));
  if (!a.kl_base.empty()) {
    base.base_perplexity = r.perplexity();
    base.write(a.kl_base);
    std::printf("wrote the top-%lld log-probabilities of %lld tokens to %s\n",
                static_cast<long long>(base.top_k), static_cast<long long>(base.positions()),
                a.kl_base.c_str());
  }
}

}  // namespace

void register_perplexity(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* sub = app.add_subcommand(
      "perplexity",
      "Perplexity of a text in non-overlapping chunks (second half of each scored), and KL "
      "divergence against a base run");
  sub->add_option("-m,--model", a->model, "A .gguf file or a Hugging Face folder")->required();
  sub->add_option("-f,--file", a->file, "Text file to score")->required();
  sub->add_option("--ctx", a->ctx, "Tokens per chunk")->check(CLI::Range(4, 1 << 20));
  sub->add_option(
      "--kl-divergence-base", a->kl_base,
      "Without --kl-divergence: write the base distributions here; with it: compare against them");
  sub->add_flag("--kl-divergence", a->kl_divergence,
                "Report KL divergence and top-1 agreement vs the base file");
  sub->add_option("--kl-top-k", a->top_k,
                  "Log-probabilities kept per token in the base file (default min(vocab, 256))")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("-t,--threads", a->threads, "CPU threads (0 = all)")->check(CLI::Range(0, 1024));
  sub->add_option("--device", a->device, "cpu, cuda or cuda:N");
  sub->add_option(
      "--kv-cache-dtype", a->kv_cache_dtype,
      "KV cache element type: auto (CUDA bf16, CPU f32), bf16, fp8 (E4M3, scale 1.0; CUDA) or f32");
  sub->add_flag(
      "--decode-steps", a->decode_steps,
      "Score each position in a one-token step of its own after a prefill of the chunk's first half "
      "(the decode path that generated tokens take), not all at once in one prefill");
  add_quantize_options(*sub, a->quantize, a->calibration);
  out.emplace_back(sub, [a] { run_perplexity(*a); });
}

}  // namespace inferx::cli
