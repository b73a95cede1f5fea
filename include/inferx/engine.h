#pragma once
// The public engine API: what the HTTP server, `inferx bench` and embedders talk to.
//
// The engine core runs one loop on its own thread: schedule -> prepare batch -> forward -> sample ->
// update sequences -> emit outputs (docs: ../shared/docs/DESIGN.md). The server never touches the model;
// it submits EngineRequests and receives RequestOutputs through each request's callback.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace inferx {

class Model;
class Tokenizer;

// Structured output: which tokens a sequence may generate next (e.g. JSON mode, text/json_constraint.h).
// A request carries a prototype; each of its n sequences gets its own state from start(). The engine
// calls mask() on a sampler thread and accept() on its own thread, never at once for one sequence. A
// constrained sequence is sampled on the host (its mask needs the row there).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // A fresh state; `end_ids` (the tokens that end generation: EOS unless ignore_eos, stop_token_ids) are
  // allowed only where the constrained text is complete.
  virtual std::unique_ptr<TokenConstraint> start(const std::vector<int32_t>& end_ids) const = 0;
  // Sets the logits of every token that may not come next to -inf.
  virtual void mask(float* logits, int64_t vocab) = 0;
  // `token` was generated.
  virtual void accept(int32_t token) = 0;
};

// Per-request generation parameters (OpenAI completions/chat semantics).
struct GenerationParams {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // CTRL-style, over prompt + generated tokens; 1: off
  float presence_penalty = 0.0f;    // OpenAI: -2..2, over generated tokens
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to logits before sampling
  std::optional<uint64_t> seed;                       // same seed -> same text whatever else is in the batch
  std::vector<std::string> stop;  // stop strings: matched across token boundaries, never streamed
  std::vector<int32_t> stop_token_ids;
  int32_t max_tokens = 16;  // generated tokens per sequence
  bool ignore_eos = false;
  int32_t n = 1;          // sequences per request; they share the prompt's KV blocks
  int32_t logprobs = -1;  // -1: none; 0: the sampled token's; k > 0: plus the top k
  bool skip_special_tokens = true;
  std::shared_ptr<const TokenConstraint> constraint;  // null: unconstrained
};

enum class FinishReason : uint8_t { None, Stop, Length, Abort };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", ""

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // most likely alternatives, best first
};

// New output of one of a request's n sequences since the previous RequestOutput.
struct SequenceDelta {
  int32_t index = 0;
  std::vector<int32_t> token_ids;
  std::string text;  // complete UTF-8 only; text past a matched stop string is never included
  std::vector<TokenLogprob> logprobs;  // one per token in token_ids, when requested
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;  // the stop string or token id text that ended the sequence
};

struct RequestTimes {  // seconds on a steady clock
  double arrival = 0, scheduled = 0, first_token = 0, finished = 0;
};

struct RequestOutput {
  std::string request_id;
  std::vector<SequenceDelta> deltas;  // only sequences with something new
  bool finished = false;              // all n sequences finished: the last output of this request
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;     // so far, all sequences
  int32_t cached_prompt_tokens = 0;  // served from the prefix cache
  RequestTimes times;
  std::string error;  // non-empty: the request failed (finished is true)
};

struct EngineRequest {
  std::string id;  // unique among live requests
  std::vector<int32_t> prompt;
  GenerationParams params;
  int32_t priority = 0;  // lower value = scheduled first (vLLM convention); FCFS within a priority
  std::string tenant;
  // Called on the engine thread, in order, for every RequestOutput of this request; must not block.
  std::function<void(RequestOutput&&)> on_output;
};

struct EngineConfig {
  int32_t max_num_batched_tokens = 2048;  // token budget of one step
  int32_t max_batch_size = 256;           // max running sequences
  int32_t block_size = 16;                // tokens per KV block
  // KV pool size; 0: on a GPU backend gpu_memory_utilization * total device memory minus what is already
  // in use (weights) and a reserve for activations (vLLM's meaning); on the CPU 1 GiB or what fits
  // max_model_len x batch, whichever is smaller.
  int64_t kv_cache_bytes = 0;
  float gpu_memory_utilization = 0.9f;
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  int64_t sliding_window = 0;  // --kv-cache-strategy sliding-window-N (0: the model's own / full)
  int32_t max_model_len = 0;   // 0: the model's max_position_embeddings
  // GPU: decode-only steps replay CUDA graphs captured per padded batch size; true runs every step
  // eagerly (--enforce-eager; INFERX_GRAPHS=0 does the same).
  bool enforce_eager = false;
  // Threads sampling host-side rows of large batches; 0: min(4, hardware threads); 1: the engine thread.
  int32_t sampler_threads = 0;
  // Overlapped decode steps (vLLM's async scheduling): a decode step is launched before the previous
  // one's tokens reach the host, its input ids gathered on the device, so the host's scheduling, metadata
  // and token handling run while the device computes. Applies to padded decode steps (CUDA graphs) whose
  // rows sample on the device; a sequence that stops on a token costs one extra row. INFERX_ASYNC_DECODE=0
  // turns it off.
  bool async_decode = true;
  // Startup warm-up where decode steps are padded (GPU graphs): before the first request, every padded
  // decode size runs once and is recorded, largest first (DecodeGraphs::warm_up), and one eager step of
  // each power-of-two token count from max_num_batched_tokens (at most kMaxWarmUpTokens) down
  // (engine/warm_up.h), so that no served step pays for its size's first eager run, GEMM algorithm timing
  // or graph recording (vLLM captures its graphs at startup the same way). Costs startup time (seconds on
  // an 8B model); INFERX_WARMUP=0 turns it off.
  bool warm_up = true;
  static constexpr int32_t kMaxWarmUpTokens = 16384;
};

struct EngineStats {
  int32_t running = 0, waiting = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in tokens, like vLLM
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t steps = 0;
  int64_t decode_graph_steps = 0;     // decode steps padded to a bucket (replayed from a graph on a GPU)
  int64_t decode_graph_replays = 0;   // of those, the steps a recorded CUDA graph ran (0 without graphs)
  int64_t device_sampled_tokens = 0;  // tokens chosen by Backend::sample_tokens (the rest on the host)
  int64_t overlapped_steps = 0;       // decode steps launched before the previous step's tokens arrived
  double warm_up_seconds = 0;         // EngineConfig::warm_up at construction (0: none ran)
};

class Engine {
 public:
  // The model and tokenizer must outlive the engine. tokenizer may be null (ids in, ids out).
  Engine(Model& model, const Tokenizer* tokenizer, const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the loop on a background thread until stop().
  void start();
  void stop();

  // Validates and queues a request; throws inferx::Error with a user-facing message (prompt longer
  // than max_model_len, n out of range, token ids out of the vocabulary, duplicate id ...).
  void submit(EngineRequest request);
  // Aborts a live request (client gone): its blocks are freed and it gets a final output with
  // finish_reason Abort. Unknown ids are ignored.
  void abort(const std::string& request_id);

  EngineStats stats() const;
  int32_t num_unfinished() const;
  const EngineConfig& config() const;
  int32_t max_model_len() const;

  // Without start(): runs one step on the calling thread (tests, offline bench). Returns false when
  // there was nothing to do.
  bool step();
  void run_until_idle();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferx
