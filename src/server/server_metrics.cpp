#include "server/server_metrics.h"

#include <fmt/format.h>

namespace inferx::server {

const char* input_length_bin(int64_t n) {
  if (n <= 128) return "tiny";
  if (n <= 512) return "small";
  if (n <= 2048) return "large";
  return "xlarge";
}

namespace {
// Latency buckets (seconds) from 1 ms to 5 min, roughly x2.5 per step (vLLM uses similar spans).
const std::vector<double> kLatency = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,  0.5,
                                      1.0,   2.5,    5.0,   10.0, 20.0,  40.0, 80.0, 160.0, 320.0};
const std::vector<double> kItl = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                  0.1,    0.15,  0.2,   0.3,   0.5,  0.75, 1.0,  2.5,  5.0};
const std::vector<double> kTokens = {1, 8, 32, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
}  // namespace

ServerMetrics::ServerMetrics(std::string model_version)
    : model_version_(std::move(model_version)),
      requests_(registry_.counter("inferx_requests_total", "Finished requests by finish reason",
                                  {"finish_reason"})),
      prompt_tokens_(registry_.counter("inferx_prompt_tokens_total", "Prompt tokens of finished requests")),
      generation_tokens_(
          registry_.counter("inferx_generation_tokens_total", "Generated tokens of finished requests")),
      running_(registry_.gauge("inferx_num_requests_running", "Requests in the running batch")),
      waiting_(registry_.gauge("inferx_num_requests_waiting", "Requests waiting to be scheduled")),
      kv_usage_(registry_.gauge("inferx_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0-1)")),
      kv_blocks_used_(registry_.gauge("inferx_kv_cache_blocks_used", "KV cache blocks in use")),
      kv_blocks_total_(registry_.gauge("inferx_kv_cache_blocks_total", "KV cache blocks in the pool")),
      prefix_queries_(registry_.counter("inferx_prefix_cache_queries_total",
                                        "Prompt tokens looked up in the prefix cache")),
      prefix_hits_(
          registry_.counter("inferx_prefix_cache_hits_total", "Prompt tokens found in the prefix cache")),
      preemptions_(
          registry_.counter("inferx_num_preemptions_total", "Sequences preempted (recomputed later)")),
      steps_(registry_.counter("inferx_engine_steps_total", "Engine steps (forward passes)")),
      graph_steps_(
          registry_.counter("inferx_decode_graph_steps_total",
                            "Decode steps padded to a batch bucket (replayed from a CUDA graph on a GPU)")),
      graph_replays_(registry_.counter("inferx_decode_graph_replays_total",
                                       "Padded decode steps that a recorded CUDA graph ran")),
      overlapped_steps_(
          registry_.counter("inferx_overlapped_decode_steps_total",
                            "Decode steps launched before the previous step's tokens reached the host")),
      ttft_(registry_.histogram("inferx_time_to_first_token_seconds", "Time from arrival to the first token",
                                kLatency)),
      itl_(registry_.histogram("inferx_inter_token_latency_seconds",
                               "Time between consecutive outputs of a request", kItl)),
      e2e_(registry_.histogram("inferx_e2e_request_latency_seconds", "Time from arrival to the last token",
                               kLatency)),
      queue_(registry_.histogram("inferx_request_queue_time_seconds", "Time from arrival to first scheduling",
                                 kLatency)),
      inference_latency_(registry_.histogram("inferx_inference_latency_seconds",
                                             "End-to-end latency by model version and prompt-length bin",
                                             kLatency, {"model_version", "input_length_bin"})),
      prompt_len_(
          registry_.histogram("inferx_request_prompt_tokens", "Prompt length of finished requests", kTokens)),
      http_(registry_.counter("inferx_http_responses_total", "HTTP responses by route and status",
                              {"route", "status"})) {}

void ServerMetrics::request_finished(FinishReason reason, int64_t prompt_tokens, int64_t generation_tokens,
                                     double e2e_s, double queue_s) {
  requests_.inc({finish_reason_name(reason)});
  prompt_tokens_.inc({}, static_cast<double>(prompt_tokens));
  generation_tokens_.inc({}, static_cast<double>(generation_tokens));
  prompt_len_.observe({}, static_cast<double>(prompt_tokens));
  if (reason == FinishReason::Abort) return;  // latency of a request cut short says nothing about serving
  e2e_.observe({}, e2e_s);
  if (queue_s >= 0) queue_.observe({}, queue_s);
  inference_latency_.observe({model_version_, input_length_bin(prompt_tokens)}, e2e_s);
}

void ServerMetrics::http_response(const std::string& route, int status) {
  http_.inc({route, fmt::format("{}", status)});
}

void ServerMetrics::update_engine(const EngineStats& s) {
  running_.set({}, s.running);
  waiting_.set({}, s.waiting);
  kv_blocks_used_.set({}, static_cast<double>(s.kv_blocks_used));
  kv_blocks_total_.set({}, static_cast<double>(s.kv_blocks_total));
  kv_usage_.set({}, s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
  prefix_queries_.set({}, static_cast<double>(s.prefix_cache_queries));
  prefix_hits_.set({}, static_cast<double>(s.prefix_cache_hits));
  preemptions_.set({}, static_cast<double>(s.preemptions));
  steps_.set({}, static_cast<double>(s.steps));
  graph_steps_.set({}, static_cast<double>(s.decode_graph_steps));
  graph_replays_.set({}, static_cast<double>(s.decode_graph_replays));
  overlapped_steps_.set({}, static_cast<double>(s.overlapped_steps));
}

}  // namespace inferx::server
