// Engine::Impl (engine_impl.h): the serving loop (schedule -> build batch -> forward -> sample -> update ->
// emit) on its own thread. Other threads only touch the inbox (submit/abort) and the stats snapshot, both
// under one mutex; every other piece of state belongs to the engine thread (or to step()'s caller without
// start()). Overlapped decode steps: overlapped_steps.cpp.
#include "inferx/engine.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "engine/block_table.h"
#include "engine/engine_impl.h"
#include "engine/warm_up.h"

namespace inferx {
namespace {

constexpr int64_t kDefaultKvBytes = int64_t{1} << 30;
constexpr int32_t kMaxLogprobs = 20;  // OpenAI's top_logprobs limit

// Device memory a GPU backend needs besides weights and KV cache, so that sizing the KV pool from
// gpu_memory_utilization leaves room for it: the forward pass's activations at the step token budget
// (residual, norms, q/k/v, attention output, gate/up, BF16 copies; F32, doubled for slack), the logits of
// a full batch, and a fixed margin for cuBLASLt workspaces, attention partials, sampler and graphs.
int64_t activation_reserve(const ModelConfig& mc, const EngineConfig& c) {
  const int64_t tokens = std::max<int64_t>(c.max_num_batched_tokens, c.max_batch_size);
  const int64_t q = mc.num_heads * mc.head_dim, kv = mc.num_kv_heads * mc.head_dim;
  const int64_t per_token = 4 * mc.hidden_size + 2 * q + 2 * kv + 3 * mc.intermediate_size;
  const int64_t logits = int64_t{c.max_batch_size} * mc.vocab_size * 4;
  return 2 * tokens * per_token * 4 + 2 * logits + (int64_t{512} << 20);
}

// INFERX_GRAPHS: "0" runs every step eagerly; "pad" pads decode steps to their buckets but runs them
// eagerly, on any backend (tests: the padded path on the CPU, graph replay against it on a GPU); anything
// else (or unset): graphs on GPU backends.
const char* graphs_env() {
  const char* g = std::getenv("INFERX_GRAPHS");
  return g ? g : "";
}

void validate_params(const GenerationParams& p, int64_t vocab, int32_t max_batch_size) {
  INFERX_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature must be >= 0, got {}",
               p.temperature);
  INFERX_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got {}", p.top_p);
  INFERX_CHECK(p.top_k >= -1, "top_k must be -1, 0 (off) or positive, got {}", p.top_k);
  INFERX_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1], got {}", p.min_p);
  INFERX_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
               "repetition_penalty must be > 0, got {}", p.repetition_penalty);
  INFERX_CHECK(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f,
               "presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  INFERX_CHECK(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f,
               "frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  INFERX_CHECK(p.max_tokens >= 1, "max_tokens must be >= 1, got {}", p.max_tokens);
  INFERX_CHECK(p.n >= 1 && p.n <= max_batch_size, "n must be in [1, {}] (the max batch size), got {}",
               max_batch_size, p.n);
  INFERX_CHECK(p.logprobs >= -1 && p.logprobs <= kMaxLogprobs, "logprobs must be in [0, {}], got {}",
               kMaxLogprobs, p.logprobs);
  for (const auto& [t, b] : p.logit_bias) {
    INFERX_CHECK(t >= 0 && t < vocab, "logit_bias: token id {} is out of range (vocabulary of {})", t, vocab);
    INFERX_CHECK(std::isfinite(b) && b >= -100.0f && b <= 100.0f,
                 "logit_bias: value {} for token {} is not in "
                 "[-100, 100]",
                 b, t);
  }
  for (int32_t t : p.stop_token_ids) {
    INFERX_CHECK(t >= 0 && t < vocab, "stop_token_ids: token id {} is out of range (vocabulary of {})", t,
                 vocab);
  }
}

}  // namespace

Engine::Impl::Impl(Model& m, const Tokenizer* tok, const EngineConfig& c)
    : model(m), tokenizer(tok), config(c) {
  const ModelConfig& mc = model.config();
  vocab = mc.vocab_size;
  INFERX_CHECK(config.block_size > 0 && config.block_size <= 1024,
               "engine: block_size must be in [1, 1024], got {}", config.block_size);
  INFERX_CHECK(config.max_batch_size > 0, "engine: max_batch_size must be positive, got {}",
               config.max_batch_size);
  INFERX_CHECK(config.max_num_batched_tokens > 0, "engine: max_num_batched_tokens must be positive, got {}",
               config.max_num_batched_tokens);
  INFERX_CHECK(config.max_model_len >= 0, "engine: max_model_len must be >= 0, got {}", config.max_model_len);
  INFERX_CHECK(config.sliding_window >= 0, "engine: sliding window must be >= 0, got {}",
               config.sliding_window);
  const bool explicit_len = config.max_model_len > 0;
  int64_t max_len = explicit_len ? config.max_model_len : mc.max_position_embeddings;

  // KV pool: --kv-cache-memory when given. Else a GPU backend takes gpu_memory_utilization of the
  // device's total memory minus what is in use already (the weights) and the activation reserve (vLLM's
  // meaning); the CPU takes 1 GiB or what max_batch_size sequences of max_model_len need, whichever is
  // smaller.
  const int32_t bs = config.block_size;
  const int64_t bytes_per_block = KvCache::bytes_per_block(model, bs);  // tensor-parallel ranks included
  int64_t num_blocks = 0;
  size_t free_bytes = 0, total_bytes = 0;
  const bool device_memory = model.backend().memory_info(free_bytes, total_bytes);
  if (config.kv_cache_bytes <= 0 && device_memory) {
    const float util = config.gpu_memory_utilization;
    INFERX_CHECK(util > 0.0f && util <= 1.0f, "engine: gpu_memory_utilization must be in (0, 1], got {}",
                 util);
    const auto total = static_cast<int64_t>(total_bytes);
    const int64_t in_use = total - static_cast<int64_t>(free_bytes);
    const int64_t reserve = activation_reserve(mc, config);
    const auto allowed = static_cast<int64_t>(static_cast<double>(util) * static_cast<double>(total));
    const int64_t budget = std::min(allowed - in_use - reserve, static_cast<int64_t>(free_bytes) - reserve);
    INFERX_CHECK(budget >= bytes_per_block,
                 "engine: no device memory left for the KV cache: --gpu-memory-utilization {} of {} MiB "
                 "is {} MiB, {} MiB are in use already (weights), {} MiB are reserved for activations "
                 "(--max-num-batched-tokens {}, --max-batch-size {}), one KV block takes {} bytes; raise "
                 "--gpu-memory-utilization, lower those limits, or use a smaller or quantized model",
                 util, total >> 20, allowed >> 20, in_use >> 20, reserve >> 20, config.max_num_batched_tokens,
                 config.max_batch_size, bytes_per_block);
    num_blocks = budget / bytes_per_block;
  } else if (config.kv_cache_bytes > 0) {
    num_blocks = config.kv_cache_bytes / bytes_per_block;
    INFERX_CHECK(num_blocks > 0,
                 "engine: kv cache memory of {} bytes is smaller than one KV block ({} bytes for "
                 "{} tokens)",
                 config.kv_cache_bytes, bytes_per_block, bs);
  } else {
    const int64_t want = int64_t{config.max_batch_size} * blocks_for_tokens(max_len, bs);
    num_blocks = std::max<int64_t>(1, std::min(want, kDefaultKvBytes / bytes_per_block));
  }
  num_blocks = std::min<int64_t>(num_blocks, std::numeric_limits<int32_t>::max() / 2);
  if (num_blocks * bs < max_len) {
    INFERX_CHECK(!explicit_len,
                 "engine: max_model_len {} does not fit the KV cache ({} blocks of {} tokens = {} "
                 "tokens, {} bytes); raise --kv-cache-memory (GPU: --gpu-memory-utilization) or lower "
                 "--max-model-len",
                 max_len, num_blocks, bs, num_blocks * bs, num_blocks * bytes_per_block);
    max_len = num_blocks * bs;  // defaulted: the longest sequence the pool can hold
  }
  config.max_model_len =
      static_cast<int32_t>(std::min<int64_t>(max_len, std::numeric_limits<int32_t>::max()));
  config.kv_cache_bytes = num_blocks * bytes_per_block;

  // --kv-cache-strategy sliding-window-N: the model's attention must see the same window, or freed blocks
  // would still be read.
  if (config.sliding_window > 0 && config.sliding_window != mc.sliding_window) {
    model.set_sliding_window(config.sliding_window);
  }
  config.sliding_window = model.config().sliding_window;
  // Without chunked prefill a whole prompt must fit one step.
  if (!config.enable_chunked_prefill) {
    config.max_num_batched_tokens = std::max(config.max_num_batched_tokens, config.max_model_len);
  }

  // One block more than the pool hands out: the scratch block padded decode rows write to and read.
  kv = std::make_unique<KvCache>(model, num_blocks + 1, bs);  // per-rank caches when tensor parallel
  pool = std::make_unique<BlockPool>(static_cast<int32_t>(num_blocks), config.enable_prefix_caching);
  SchedulerConfig sc;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.max_batch_size = config.max_batch_size;
  sc.block_size = bs;
  sc.enable_chunked_prefill = config.enable_chunked_prefill;
  sc.sliding_window = config.sliding_window;
  scheduler = std::make_unique<Scheduler>(sc, *pool);
  builder = std::make_unique<BatchBuilder>(model.backend());

  // Host-side sampling threads (rows that need the host, or every row on the CPU backend).
  int32_t threads = config.sampler_threads;
  if (threads <= 0)
    threads =
        std::min<int32_t>(4, std::max<int32_t>(1, static_cast<int32_t>(std::thread::hardware_concurrency())));
  config.sampler_threads = threads;
  if (threads > 1) sampler_pool = std::make_unique<ThreadPool>(threads);
  const char* ds = std::getenv("INFERX_DEVICE_SAMPLING");
  step_sampler =
      std::make_unique<StepSampler>(model.backend(), !(ds && std::strcmp(ds, "0") == 0), sampler_pool.get());
  // Decode steps from CUDA graphs on GPU backends (padded eagerly elsewhere only for tests).
  const bool gpu = model.backend().device() != Device::CPU;
  const std::string genv = graphs_env();
  const bool pad = genv == "pad" || (gpu && genv != "0" && !config.enforce_eager);
  if (genv == "0") config.enforce_eager = true;
  if (pad) {
    DecodeGraphConfig gc;
    gc.max_batch_size = config.max_batch_size;
    gc.max_blocks_per_seq = static_cast<int32_t>(blocks_for_tokens(config.max_model_len, bs));
    gc.scratch_block = static_cast<int32_t>(num_blocks);
    gc.capture = gpu && genv != "pad";
    gc.short_context = model.backend().decode_stack_context_bound();
    decode_graphs = std::make_unique<DecodeGraphs>(model, *kv, gc);
  }
  defer_emit = gpu;
  const char* ad = std::getenv("INFERX_ASYNC_DECODE");
  if (ad) config.async_decode = std::strcmp(ad, "0") != 0;
  // Tensor parallel too: the ids gathered into rank 0's metadata reach the other ranks with the step's
  // metadata broadcast (model/tensor_parallel.h).
  async_decode = config.async_decode && decode_graphs && model.backend().async_sampling();
  config.async_decode = async_decode;
  if (const char* w = std::getenv("INFERX_WARMUP")) config.warm_up = std::strcmp(w, "0") != 0;
  if (decode_graphs && config.warm_up) warm_up(static_cast<int32_t>(num_blocks));
  eos_ids = mc.eos_token_ids;
  if (tokenizer && tokenizer->eos_id() >= 0 && !is_eos(tokenizer->eos_id()))
    eos_ids.push_back(tokenizer->eos_id());
  publish_stats();
}

void Engine::Impl::warm_up(int32_t scratch_block) {
  const auto t0 = std::chrono::steady_clock::now();
  // Step sizes first: their forwards size the workspace (growing it drops recorded graphs).
  const std::vector<int32_t> counts = warm_up_token_counts(
      std::min(config.max_num_batched_tokens, EngineConfig::kMaxWarmUpTokens), config.max_batch_size);
  warm_up_step_sizes(model, *kv, *builder, scratch_block, counts, config.max_batch_size);
  // The step metadata at its largest, so that no served step grows it (on CUDA the old buffer's release
  // retires every recorded graph); then the decode buckets, recorded last.
  builder->reserve(std::max(config.max_num_batched_tokens, config.max_batch_size), config.max_batch_size,
                   static_cast<int32_t>(blocks_for_tokens(config.max_model_len, config.block_size)),
                   config.max_batch_size);
  const int32_t buckets = decode_graphs->warm_up();
  model.backend().synchronize();
  warm_up_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(
      stderr,
      "inferx engine: warm-up: %zu step sizes (%d..%d tokens), %d decode sizes (%lld recorded%s) in %.2f s\n",
      counts.size(), counts.empty() ? 0 : counts.back(), counts.empty() ? 0 : counts.front(), buckets,
      static_cast<long long>(decode_graphs->captures()),
      decode_graphs->short_context() > 0
          ? fmt::format(", batch 1 once up to {} tokens, once beyond", decode_graphs->short_context()).c_str()
          : "",
      warm_up_seconds);
}

void Engine::Impl::submit(EngineRequest&& r) {
  INFERX_CHECK(!r.id.empty(), "request id must not be empty");
  INFERX_CHECK(!r.prompt.empty(), "request {}: the prompt is empty", r.id);
  INFERX_CHECK(static_cast<int64_t>(r.prompt.size()) <= config.max_model_len,
               "request {}: the prompt has {} tokens, more than max_model_len {}", r.id, r.prompt.size(),
               config.max_model_len);
  for (int32_t t : r.prompt) {
    INFERX_CHECK(t >= 0 && t < vocab, "request {}: prompt token id {} is out of range (vocabulary of {})",
                 r.id, t, vocab);
  }
  try {
    validate_params(r.params, vocab, config.max_batch_size);
  } catch (const Error& e) {
    fail("request {}: {}", r.id, e.what());
  }
  const double arrival = engine_now();
  {
    std::lock_guard<std::mutex> lock(mu);
    INFERX_CHECK(live_ids.insert(r.id).second, "request id {} is already in use by a live request", r.id);
    inbox.push_back({std::move(r), arrival});
    ++snapshot.waiting;
  }
  cv.notify_one();
}

std::unique_ptr<Sequence> Engine::Impl::make_sequence(RequestState& r, int32_t index) {
  const GenerationParams& p = r.req.params;
  auto s = std::make_unique<Sequence>();
  s->request = &r;
  s->index = index;
  s->tokens.reserve(r.req.prompt.size() + static_cast<size_t>(p.max_tokens) + 1);
  s->tokens = r.req.prompt;
  s->num_prompt = static_cast<int32_t>(r.req.prompt.size());
  SamplingParams sp;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.min_p = p.min_p;
  sp.seed = p.seed ? derive_sequence_seed(*p.seed, index) : seed_source();
  s->seed = sp.seed;
  s->sampler.emplace(sp);
  s->penalties = PenaltyState(p, r.req.prompt);
  if (p.constraint) {
    std::vector<int32_t> ends = p.stop_token_ids;
    if (!p.ignore_eos) ends.insert(ends.end(), eos_ids.begin(), eos_ids.end());
    s->constraint = p.constraint->start(ends);
  }
  if (tokenizer) s->detokenizer.emplace(*tokenizer, p.skip_special_tokens);
  s->stop = StopChecker(p.stop);
  s->pending.index = index;
  return s;
}

void Engine::Impl::accept(Submitted&& s) {
  auto r = std::make_unique<RequestState>();
  r->req = std::move(s.req);
  r->arrival_order = next_arrival++;
  r->times.arrival = s.arrival;
  r->seqs.push_back(make_sequence(*r, 0));
  scheduler->add_waiting(r->seqs[0].get());
  const std::string id = r->req.id;
  requests.emplace(id, std::move(r));
}

void Engine::Impl::touch(RequestState& r) {
  // A flag, not a search of the list: every sampled token touches its request, so a search made a step of
  // 500 decode rows quadratic (~125k comparisons on the host while the GPU waits).
  if (!r.touched) {
    r.touched = true;
    touched.push_back(&r);
  }
}

void Engine::Impl::finish(Sequence& seq, FinishReason reason, double now) {
  seq.status = SequenceStatus::Finished;
  seq.finish_reason = reason;
  seq.pending.finish_reason = reason;
  seq.pending.stop_reason = seq.stop_reason;
  seq.has_pending = true;
  scheduler->remove(&seq);
  RequestState& r = *seq.request;
  if (++r.num_finished == r.req.params.n) r.times.finished = now;
  touch(r);
}

void Engine::Impl::abort_request(RequestState& r, const std::string& error) {
  const double now = engine_now();
  r.req.params.n = std::max(r.req.params.n, 1);
  for (auto& s : r.seqs) {
    if (!s->finished()) finish(*s, FinishReason::Abort, now);
  }
  // Sequences never forked off the prompt end too.
  for (auto i = static_cast<int32_t>(r.seqs.size()); i < r.req.params.n; ++i) {
    r.seqs.push_back(make_sequence(r, i));
    finish(*r.seqs.back(), FinishReason::Abort, now);
  }
  r.forked = true;
  r.times.finished = now;
  r.error = error;
  touch(r);
}

void Engine::Impl::handle_token(SampledToken& t, double now) {
  Sequence& seq = *t.seq;
  RequestState& r = *seq.request;
  const GenerationParams& p = r.req.params;
  if (r.times.first_token == 0) r.times.first_token = now;
  seq.tokens.push_back(t.token);
  seq.penalties.add_generated(t.token);
  if (seq.constraint) seq.constraint->accept(t.token);
  ++generation_tokens;
  // The prompt is computed: fork the other n - 1 sequences off its blocks.
  if (seq.index == 0 && !r.forked) {
    r.forked = true;
    for (int32_t i = 1; i < p.n; ++i) {
      r.seqs.push_back(make_sequence(r, i));
      scheduler->fork(seq, *r.seqs.back());
    }
  }
  seq.pending.token_ids.push_back(t.token);
  if (t.has_logprob) seq.pending.logprobs.push_back(std::move(t.logprob));
  seq.has_pending = true;
  touch(r);

  auto final_text = [&] {  // the sequence ends: release held-back text (it may still complete a stop)
    if (!seq.detokenizer) return;
    seq.pending.text += seq.stop.push(seq.detokenizer->flush());
    if (!seq.stop.matched()) seq.pending.text += seq.stop.flush();
  };
  const bool stop_token =
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t.token) != p.stop_token_ids.end();
  if (stop_token || (!p.ignore_eos && is_eos(t.token))) {
    final_text();
    seq.stop_reason = seq.stop.matched() ? seq.stop.matched_stop()
                      : stop_token       ? std::to_string(t.token)
                                         : "";
    finish(seq, FinishReason::Stop, now);
    return;
  }
  if (seq.detokenizer) seq.pending.text += seq.stop.push(seq.detokenizer->push(t.token));
  if (!seq.stop.matched() && at_length_limit(seq, 0)) {
    final_text();
    if (!seq.stop.matched()) {
      finish(seq, FinishReason::Length, now);
      return;
    }
  }
  if (seq.stop.matched()) {
    seq.stop_reason = seq.stop.matched_stop();
    finish(seq, FinishReason::Stop, now);
  }
}

void Engine::Impl::emit() {
  for (RequestState* r : touched) {
    RequestOutput out;
    out.request_id = r->req.id;
    out.prompt_tokens = static_cast<int32_t>(r->req.prompt.size());
    out.cached_prompt_tokens = r->cached_prompt_tokens;
    for (auto& s : r->seqs) {
      out.completion_tokens += std::max(0, s->num_generated());
      if (!s->has_pending) continue;
      out.deltas.push_back(std::move(s->pending));
      s->pending = SequenceDelta{};
      s->pending.index = s->index;
      s->has_pending = false;
    }
    out.finished = r->num_finished >= r->req.params.n;
    out.times = r->times;
    out.error = r->error;
    if (r->req.on_output) {
      try {
        r->req.on_output(std::move(out));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "inferx engine: output callback of request %s threw: %s\n", r->req.id.c_str(),
                     e.what());
      }
    }
  }
  for (RequestState* r : touched) {
    r->touched = false;
    if (r->num_finished >= r->req.params.n) {
      const std::string id = r->req.id;
      requests.erase(id);
      std::lock_guard<std::mutex> lock(mu);
      live_ids.erase(id);
    }
  }
  touched.clear();
}

void Engine::Impl::publish_stats() {
  EngineStats s;
  const SchedulerCounters& c = scheduler->counters();
  s.running = scheduler->num_running();
  s.kv_blocks_total = pool->num_blocks();
  s.kv_blocks_used = pool->num_used();
  s.prefix_cache_queries = c.prefix_cache_queries;
  s.prefix_cache_hits = c.prefix_cache_hits;
  s.preemptions = c.preemptions;
  s.prompt_tokens = prompt_tokens;
  s.generation_tokens = generation_tokens;
  s.steps = steps;
  s.decode_graph_steps = graph_steps;
  s.decode_graph_replays = decode_graphs ? decode_graphs->replays() : 0;
  s.warm_up_seconds = warm_up_seconds;
  s.device_sampled_tokens = step_sampler->device_rows();
  s.overlapped_steps = overlapped_steps;
  std::lock_guard<std::mutex> lock(mu);
  s.waiting = scheduler->num_waiting() + static_cast<int32_t>(inbox.size());
  snapshot = s;
}

bool Engine::Impl::step() {
  std::lock_guard<std::mutex> step_lock(step_mu);
  profile.begin_step();
  {
    std::lock_guard<std::mutex> lock(mu);
    new_requests.swap(inbox);
    new_aborts.swap(aborts);
  }
  const bool had_input = !new_requests.empty() || !new_aborts.empty();
  for (Submitted& s : new_requests) accept(std::move(s));
  new_requests.clear();
  for (const std::string& id : new_aborts) {
    auto it = requests.find(id);
    if (it != requests.end()) abort_request(*it->second, "");
  }
  new_aborts.clear();
  if (in_flight) {
    drop_finished(*in_flight);  // aborted just now: their requests may be destroyed by the next emit
    if (in_flight->out.seqs.empty()) {
      const bool ok = retire(*in_flight);
      in_flight.reset();
      if (!ok) return true;
    }
  }
  profile.mark(StepProfile::kIntake);
  if (in_flight) return step_overlapped();

  const SchedulerOutput& out = scheduler->schedule();
  if (out.empty()) {
    profile.cancel_step();
    emit();
    publish_stats();
    return had_input;
  }
  const double now = engine_now();
  for (const ScheduledSequence& s : out.seqs) {
    RequestState& r = *s.seq->request;
    if (r.times.scheduled == 0) {
      r.times.scheduled = now;
      prompt_tokens += static_cast<int64_t>(r.req.prompt.size());
    }
  }
  profile.mark(StepProfile::kSchedule);
  bool graph_step = false;
  try {
    Tensor logits;
    if (decode_graphs && decode_graphs->accepts(out)) {
      logits = decode_graphs->run(out);
      ++graph_steps;
      graph_step = true;
    } else {
      logits = model.forward(builder->build(out), *kv);
    }
    profile.mark(StepProfile::kLaunch);
    // The device runs this step asynchronously until sampling waits for it: deliver the previous step's
    // outputs meanwhile.
    if (defer_emit) emit();
    profile.mark(StepProfile::kEmitOverlapped);
    scheduler->on_step_computed(out);
    if (graph_step && overlappable(out)) {
      // Left in flight: the next step() plans and launches the step after it before collecting it. No step
      // is in flight before this one, so either sampling slot is free.
      step_sampler->sample_async(out, logits, /*slot=*/0, /*pending=*/0);
      in_flight.emplace(out, /*slot=*/0);
      ++steps;
      profile.mark(StepProfile::kSample);
      publish_stats();
      profile.mark(StepProfile::kPublish);
      profile.end_step(StepProfile::kGraphDecode, static_cast<int64_t>(out.seqs.size()));
      return true;
    }
    step_sampler->sample(out, logits, sampled);
    profile.mark(StepProfile::kSample);
  } catch (const std::exception& e) {
    fail_step({&out}, e);
    return true;
  }
  ++steps;
  const double done = engine_now();
  for (SampledToken& t : sampled) handle_token(t, done);
  profile.mark(StepProfile::kHandle);
  // Deferred outputs wait for the next step only while there is one to overlap with.
  if (!defer_emit || (scheduler->num_running() == 0 && scheduler->num_waiting() == 0)) emit();
  profile.mark(StepProfile::kEmitTail);
  publish_stats();
  profile.mark(StepProfile::kPublish);
  profile.end_step(graph_step ? StepProfile::kGraphDecode : StepProfile::kOther,
                   static_cast<int64_t>(out.seqs.size()));
  return true;
}

// A step failed (a backend or sampler error): fail the requests in it rather than the engine.
void Engine::Impl::fail_step(std::initializer_list<const SchedulerOutput*> outs, const std::exception& e) {
  std::vector<RequestState*> failed;
  for (const SchedulerOutput* out : outs) {
    if (!out) continue;
    for (const ScheduledSequence& s : out->seqs) {
      if (std::find(failed.begin(), failed.end(), s.seq->request) == failed.end())
        failed.push_back(s.seq->request);
    }
  }
  for (RequestState* r : failed) abort_request(*r, fmt::format("engine step failed: {}", e.what()));
  profile.cancel_step();
  emit();
  publish_stats();
}

void Engine::Impl::loop() {
  while (true) {
    bool worked = false;
    try {
      worked = step();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "inferx engine: step failed: %s\n", e.what());
    }
    std::unique_lock<std::mutex> lock(mu);
    if (stop_flag) return;
    if (!worked) {
      // Idle: sleep until input arrives (bounded, in case work is waiting on something else).
      cv.wait_for(lock, std::chrono::milliseconds(requests.empty() ? 1000 : 5),
                  [&] { return stop_flag || !inbox.empty() || !aborts.empty(); });
      if (stop_flag) return;
    }
  }
}

// Engine --------------------------------------------------------------------------------------------------

Engine::Engine(Model& model, const Tokenizer* tokenizer, const EngineConfig& config)
    : impl_(std::make_unique<Impl>(model, tokenizer, config)) {}

Engine::~Engine() {
  stop();
  if (impl_->in_flight) {
    // A step still on the device writes the sampling slot's pinned copy: let it land before anything goes.
    try {
      impl_->model.backend().synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "inferx engine: waiting for the step in flight failed: %s\n", e.what());
    }
  }
  if (impl_->profile.enabled()) std::fputs(impl_->profile.report().c_str(), stderr);
}

void Engine::start() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->thread.joinable()) return;
  impl_->stop_flag = false;
  impl_->thread = std::thread([this] { impl_->loop(); });
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop_flag = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void Engine::submit(EngineRequest request) { impl_->submit(std::move(request)); }

void Engine::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->live_ids.contains(request_id)) return;
    impl_->aborts.push_back(request_id);
  }
  impl_->cv.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->snapshot;
}

int32_t Engine::num_unfinished() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int32_t>(impl_->live_ids.size());
}

const EngineConfig& Engine::config() const { return impl_->config; }
int32_t Engine::max_model_len() const { return impl_->config.max_model_len; }

bool Engine::step() { return impl_->step(); }

void Engine::run_until_idle() {
  while (impl_->step()) {
  }
}

}  // namespace inferx
