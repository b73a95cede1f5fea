// inferx bench: `offline` drives the Engine in-process (throughput for N prompts of given lengths);
// `serve` (bench_serve.cpp) drives a running `inferx serve` over HTTP. Both print TTFT / TPOT / ITL / E2E
// percentiles and throughput (bench_stats.h), with a progress bar on stderr and --json for machines.
#include "cli/bench.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>

#include "cli/bench_roofline.h"
#include "cli/bench_stats.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"

namespace inferx::cli {

namespace {

struct BenchOfflineArgs {
  EngineArgs engine;
  int64_t num_prompts = 64;
  int64_t warmup = 1;  // untimed requests first (kernel/algorithm choice, graph capture, allocations)
  int input_len = 128, output_len = 128;
  uint64_t seed = 0;
  bool json = false;
  bool no_progress = false;
  bool roofline = false;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void run_bench_offline(BenchOfflineArgs a) {
  check_quantize(a.engine.quantize);
  if (a.engine.model.empty()) a.engine.model = default_model();
  LoadedEngine l = load_engine(a.engine);
  Roofline roofline;
  if (a.roofline) roofline = measure_roofline(*l.backend, *l.model, a.engine.threads);  // before the run
  const int64_t vocab = l.model->config().vocab_size;
  INFERX_CHECK(a.input_len + a.output_len <= l.engine->max_model_len(),
               "--input-len + --output-len = {} exceeds max_model_len {}", a.input_len + a.output_len,
               l.engine->max_model_len());
  std::mt19937_64 rng(a.seed);
  // Token ids away from the low specials (BOS/EOS/UNK sit at 0-3 in SentencePiece vocabularies).
  std::uniform_int_distribution<int32_t> tok(std::min<int32_t>(4, static_cast<int32_t>(vocab) - 1),
                                             static_cast<int32_t>(vocab) - 1);

  std::vector<RequestRecord> records(static_cast<size_t>(a.num_prompts));
  std::vector<double> submit_t(records.size()), last_t(records.size(), -1);
  std::mutex mu;
  std::condition_variable cv;
  int64_t finished = 0;
  l.engine->start();
  // Warm-up: the same prompt length, a few output tokens (first-use costs stay out of the figures).
  if (a.warmup > 0) {
    std::mutex wmu;
    std::condition_variable wcv;
    int64_t wdone = 0;
    for (int64_t i = 0; i < a.warmup; ++i) {
      EngineRequest r;
      r.id = fmt::format("warmup-{}", i);
      r.prompt.resize(static_cast<size_t>(a.input_len));
      for (auto& t : r.prompt) t = tok(rng);
      r.params.max_tokens = std::min(a.output_len, 8);
      r.params.ignore_eos = true;
      r.params.temperature = 0;
      r.on_output = [&](RequestOutput&& out) {
        if (!out.finished) return;
        std::lock_guard lock(wmu);
        ++wdone;
        wcv.notify_all();
      };
      l.engine->submit(std::move(r));
    }
    std::unique_lock lock(wmu);
    wcv.wait(lock, [&] { return wdone == a.warmup; });
  }
  const double t0 = now_s();
  for (int64_t i = 0; i < a.num_prompts; ++i) {
    EngineRequest r;
    r.id = fmt::format("bench-{}", i);
    r.prompt.resize(static_cast<size_t>(a.input_len));
    for (auto& t : r.prompt) t = tok(rng);
    r.params.max_tokens = a.output_len;
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    const size_t idx = static_cast<size_t>(i);
    r.on_output = [&, idx](RequestOutput&& out) {
      const double t = now_s();
      auto& rec = records[idx];
      int64_t n = 0;
      for (const auto& d : out.deltas) n += static_cast<int64_t>(d.token_ids.size());
      if (n > 0) {
        if (last_t[idx] < 0)
          rec.ttft = t - submit_t[idx];
        else
          rec.itl.push_back(t - last_t[idx]);
        last_t[idx] = t;
      }
      if (!out.finished) return;
      rec.ok = out.error.empty();
      rec.error = out.error;
      rec.prompt_tokens = out.prompt_tokens;
      rec.output_tokens = out.completion_tokens;
      rec.e2e = t - submit_t[idx];
      std::lock_guard lock(mu);
      ++finished;
      cv.notify_all();
    };
    submit_t[idx] = now_s();
    l.engine->submit(std::move(r));
  }
  {
    std::unique_lock lock(mu);
    while (finished < a.num_prompts) {
      cv.wait_for(lock, std::chrono::milliseconds(200));
      if (!a.no_progress) draw_progress(finished, a.num_prompts, now_s() - t0);
    }
  }
  const double duration = now_s() - t0;
  l.engine->stop();
  nlohmann::json setup = {{"mode", "offline"},
                          {"model", a.engine.model},
                          {"num_prompts", a.num_prompts},
                          {"warmup", a.warmup},
                          {"input_len", a.input_len},
                          {"output_len", a.output_len},
                          {"max_batch_size", a.engine.max_batch_size},
                          {"backend", l.backend->name()}};
  BenchSummary s = summarize(records, duration, setup);
  // The engine's own counters over the process (warm-up requests included): how the steps ran.
  const EngineStats es = l.engine->stats();
  s.json["engine"] = {{"steps", es.steps},
                      {"decode_graph_steps", es.decode_graph_steps},
                      {"decode_graph_replays", es.decode_graph_replays},
                      {"overlapped_decode_steps", es.overlapped_steps},
                      {"preemptions", es.preemptions},
                      {"device_sampled_tokens", es.device_sampled_tokens},
                      {"warm_up_s", es.warm_up_seconds}};
  s.text += fmt::format(
      "engine: {} steps ({} padded decode, {} from CUDA graphs, {} overlapped), {} preemptions\n", es.steps,
      es.decode_graph_steps, es.decode_graph_replays, es.overlapped_steps, es.preemptions);
  if (a.roofline) add_roofline(s, roofline);
  if (a.json)
    std::printf("%s\n", s.json.dump(2).c_str());
  else
    std::printf("%s", s.text.c_str());
}

}  // namespace

void register_bench(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmark the engine (offline) or a running server (serve)");
  bench->require_subcommand(1);

  auto off = std::make_shared<BenchOfflineArgs>();
  CLI::App* o =
      bench->add_subcommand("offline", "Engine throughput for N prompts of given lengths (no HTTP)");
  add_engine_options(*o, off->engine);
  o->add_option("--num-prompts", off->num_prompts, "Requests")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  o->add_option("--input-len", off->input_len, "Prompt tokens (random ids)")->check(CLI::Range(1, 1 << 24));
  o->add_option("--output-len", off->output_len, "Generated tokens (ignore_eos)")
      ->check(CLI::Range(1, 1 << 24));
  o->add_option("--seed", off->seed, "Prompt sampling seed");
  o->add_option("--warmup", off->warmup, "Untimed warm-up requests before the timed ones (default 1)")
      ->check(CLI::Range(0, 1 << 20));
  o->add_flag("--json", off->json, "Print the results as JSON on stdout");
  o->add_flag("--no-progress", off->no_progress, "No progress bar");
  o->add_flag(
      "--roofline", off->roofline,
      "Also measure the memory bandwidth in-process and report the batch-1 roofline (weight bytes per "
      "token / bandwidth) and TPOT against it");
  out.emplace_back(o, [off] { run_bench_offline(*off); });

  auto sv = std::make_shared<BenchServeArgs>();
  CLI::App* s =
      bench->add_subcommand("serve", "Drive a running inferx serve (or any OpenAI server) over HTTP");
  s->add_option("--url", sv->url, "Server base URL, http://HOST:PORT");
  s->add_option("--model", sv->model, "Model name to send (default: the server's first)");
  s->add_option("--concurrency", sv->concurrency,
                "Max requests in flight (0: unlimited with --request-rate, else 1)")
      ->check(CLI::Range(0, 1 << 20));
  s->add_option("--request-rate", sv->request_rate,
                "Poisson arrival rate, requests/s (0: as fast as allowed)")
      ->check(CLI::Range(0.0, 1e9));
  s->add_option("--num-prompts", sv->num_prompts, "Requests")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  s->add_option("--input-len", sv->input_len, "Prompt tokens (random token ids)")
      ->check(CLI::Range(1, 1 << 24));
  s->add_option("--output-len", sv->output_len, "max_tokens per request (ignore_eos)")
      ->check(CLI::Range(1, 1 << 24));
  s->add_option("--range-ratio", sv->range_ratio, "Lengths uniform in len*(1 -+ r)")
      ->check(CLI::Range(0.0, 0.99));
  s->add_option("--dataset", sv->dataset,
                "JSONL file of {\"prompt\": text, \"output_len\": n} (instead of random)");
  s->add_option("--seed", sv->seed, "Prompt/arrival sampling seed");
  s->add_option("--api-key", sv->api_key, "Bearer key");
  s->add_flag("--json", sv->json, "Print the results as JSON on stdout");
  s->add_flag("--no-progress", sv->no_progress, "No progress bar");
  out.emplace_back(s, [sv] { run_bench_serve(*sv); });
}

}  // namespace inferx::cli
