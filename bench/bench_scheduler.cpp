// Prints the engine's per-step CPU overhead outside the model: scheduler + batch building + sampling +
// token bookkeeping, with 256 running decode sequences and a fake model (fixed random logits, so the
// forward pass costs nothing). Target (issue 4): under 100 microseconds per step on the CPU.
// Usage: bench_scheduler [num_seqs=256] [steps=2000] [sampler_threads=1]
// sampler_threads > 1 samples the rows on a ThreadPool of that many threads (BatchSampler::set_thread_pool).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "engine/batch_builder.h"
#include "engine/batch_sampler.h"
#include "engine/logits_processors.h"
#include "engine/scheduler.h"

namespace inferx {
namespace {

struct Result {
  double schedule_us = 0, build_us = 0, sample_us = 0, total_us = 0;
  // On a shared machine the mean wall time counts the time other processes hold the core; the fastest
  // step and the calling thread's CPU time per step do not.
  double min_total_us = 1e300, cpu_us = 0;
};

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

// One configuration: `vocab` logits per row; temperature 0 (greedy) or 0.8 with top-p 0.95 and a seed.
Result run(int32_t num_seqs, int32_t steps, int64_t vocab, bool random_sampling, ThreadPool* sampler_pool) {
  using clock = std::chrono::steady_clock;
  constexpr int32_t kPrompt = 128, kBlock = 16;
  const int32_t max_len = kPrompt + steps + 64;
  BlockPool pool(num_seqs * ((max_len + kBlock - 1) / kBlock) + 16, /*enable_prefix_caching=*/true);
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 8192;
  sc.max_batch_size = num_seqs;
  sc.block_size = kBlock;
  Scheduler scheduler(sc, pool);
  auto backend = make_cpu_backend({1});
  BatchBuilder builder(*backend);
  BatchSampler sampler(sampler_pool);

  std::vector<std::unique_ptr<RequestState>> reqs;
  std::mt19937 rng(1);
  for (int32_t i = 0; i < num_seqs; ++i) {
    auto r = std::make_unique<RequestState>();
    r->req.id = std::to_string(i);
    for (int32_t t = 0; t < kPrompt; ++t) r->req.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    r->req.params.temperature = random_sampling ? 0.8f : 0.0f;
    r->req.params.top_p = random_sampling ? 0.95f : 1.0f;
    r->req.params.seed = i;
    r->arrival_order = static_cast<uint64_t>(i);
    r->forked = true;
    auto s = std::make_unique<Sequence>();
    s->request = r.get();
    s->tokens.reserve(static_cast<size_t>(max_len));
    s->tokens = r->req.prompt;
    s->num_prompt = kPrompt;
    SamplingParams sp{r->req.params.temperature, 0, r->req.params.top_p, 0.0f, static_cast<uint64_t>(i)};
    s->sampler.emplace(sp);
    scheduler.add_waiting(s.get());
    r->seqs.push_back(std::move(s));
    reqs.push_back(std::move(r));
  }
  std::vector<float> logits_src(static_cast<size_t>(num_seqs) * static_cast<size_t>(vocab));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : logits_src) x = normal(rng);
  std::vector<float> logits = logits_src;
  std::vector<SampledToken> sampled;

  Result res;
  const int32_t warmup = 20;
  for (int32_t step = 0; step < warmup + steps; ++step) {
    const double c0 = thread_cpu_us();
    const auto t0 = clock::now();
    const SchedulerOutput& out = scheduler.schedule();
    const auto t1 = clock::now();
    const BatchView batch = builder.build(out);
    (void)batch;
    const auto t2 = clock::now();
    scheduler.on_step_computed(out);
    sampler.sample(out, logits.data(), vocab, sampled);
    for (const SampledToken& t : sampled) t.seq->tokens.push_back(t.token);
    const auto t3 = clock::now();
    const double c1 = thread_cpu_us();
    if (step >= warmup) {
      res.cpu_us += c1 - c0;
      res.min_total_us =
          std::min(res.min_total_us, std::chrono::duration<double, std::micro>(t3 - t0).count());
      res.schedule_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
      res.build_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
      res.sample_us += std::chrono::duration<double, std::micro>(t3 - t2).count();
    }
    if (step == warmup - 1 && scheduler.num_running() != num_seqs) {
      std::fprintf(stderr, "only %d of %d sequences running\n", scheduler.num_running(), num_seqs);
      std::exit(1);
    }
  }
  res.schedule_us /= steps;
  res.build_us /= steps;
  res.sample_us /= steps;
  res.cpu_us /= steps;
  res.total_us = res.schedule_us + res.build_us + res.sample_us;
  return res;
}

// Penalized rows on a device sampler: the host's per-step work is turning each row's penalty state into
// LogitEdits (PenaltyState::append_edits). Rows of `prompt` prompt + `generated` generated tokens (vocab
// 128256) with repetition, presence and frequency penalties; microseconds per row per step, and the host
// path's PenaltyState::apply on a full row for comparison (which also needs the row copied to the host).
void bench_penalty_edits(int32_t rows, int32_t prompt, int32_t generated) {
  constexpr int64_t kVocab = 128256;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  GenerationParams p;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.3f;
  std::vector<PenaltyState> states;
  for (int32_t r = 0; r < rows; ++r) {
    std::vector<int32_t> pr(static_cast<size_t>(prompt));
    for (int32_t& t : pr) t = tok(rng);
    states.emplace_back(p, pr);
    for (int32_t g = 0; g < generated; ++g) states.back().add_generated(tok(rng) % 4000);
  }
  std::vector<LogitEdit> edits;
  const int reps = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    edits.clear();
    for (int32_t r = 0; r < rows; ++r)
      states[static_cast<size_t>(r)].append_edits(r, {{7, 1.0f}}, kVocab, edits);
  }
  const double edit_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps / rows;
  std::vector<float> row(kVocab, 0.5f);
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i)
    for (int32_t r = 0; r < rows; ++r) states[static_cast<size_t>(r)].apply(row.data(), kVocab);
  const double apply_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count() / reps / rows;
  std::printf(
      "penalty edits, %d rows of %d prompt + %d generated tokens: %zu edits per step, %.1f us per row "
      "(host apply on the row: %.1f us per row, plus its 513 KB copy)\n",
      rows, prompt, generated, edits.size(), edit_us, apply_us);
}

}  // namespace
}  // namespace inferx

int main(int argc, char** argv) {
  const int32_t num_seqs = argc > 1 ? std::atoi(argv[1]) : 256;
  const int32_t steps = argc > 2 ? std::atoi(argv[2]) : 2000;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  std::unique_ptr<inferx::ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<inferx::ThreadPool>(threads);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf(
      "engine step overhead without the model: %d running decode sequences, %d steps, block 16, %d sampler "
      "thread(s)\n",
      num_seqs, steps, threads);
  std::printf("%-34s %10s %10s %10s %10s %10s %10s\n", "sampling", "schedule", "batch", "sample", "total(us)",
              "min total", "cpu total");
  struct Case {
    const char* name;
    int64_t vocab;
    bool random;
  };
  for (const Case& c :
       {Case{"greedy, vocab 512 (dummy:tiny)", 512, false},
        Case{"T=0.8 top-p 0.95 seeded, vocab 512", 512, true}, Case{"greedy, vocab 32000", 32000, false},
        Case{"T=0.8 top-p 0.95 seeded, vocab 32000", 32000, true}}) {
    // The large vocabulary is dominated by the per-row scan: fewer steps give the same average.
    const inferx::Result r = inferx::run(num_seqs, c.vocab > 512 ? std::max(steps / 20, 10) : steps, c.vocab,
                                         c.random, pool.get());
    std::printf("%-34s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n", c.name, r.schedule_us, r.build_us,
                r.sample_us, r.total_us, r.min_total_us, r.cpu_us);
  }
  inferx::bench_penalty_edits(num_seqs, 2000, 500);
  return 0;
}
