#pragma once
// The inferx_* metrics the server exports on GET /metrics (names follow vLLM's vllm:* set where one
// exists, with Prometheus naming rules: counters end in _total, durations in _seconds).
#include <string>

#include "inferx/engine.h"
#include "server/metrics.h"

namespace inferx::server {

// Prompt-length bins of inferx_inference_latency_seconds: tiny 1-128, small 129-512, large 513-2048,
// xlarge > 2048 tokens.
const char* input_length_bin(int64_t prompt_tokens);

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_version);

  // One finished request (called once, from the engine's output callback).
  void request_finished(FinishReason reason, int64_t prompt_tokens, int64_t generation_tokens, double e2e_s,
                        double queue_s);
  void first_token(double ttft_s) { ttft_.observe({}, ttft_s); }
  void inter_token(double itl_s) { itl_.observe({}, itl_s); }
  void http_response(const std::string& route, int status);
  // Mirrors the engine's gauges and counters; called on every scrape.
  void update_engine(const EngineStats& s);
  std::string render() const { return registry_.render(); }
  MetricsRegistry& registry() { return registry_; }

 private:
  std::string model_version_;
  MetricsRegistry registry_;
  MetricFamily& requests_;
  MetricFamily& prompt_tokens_;
  MetricFamily& generation_tokens_;
  MetricFamily& running_;
  MetricFamily& waiting_;
  MetricFamily& kv_usage_;
  MetricFamily& kv_blocks_used_;
  MetricFamily& kv_blocks_total_;
  MetricFamily& prefix_queries_;
  MetricFamily& prefix_hits_;
  MetricFamily& preemptions_;
  MetricFamily& steps_;
  MetricFamily& graph_steps_;
  MetricFamily& graph_replays_;
  MetricFamily& overlapped_steps_;
  MetricFamily& ttft_;
  MetricFamily& itl_;
  MetricFamily& e2e_;
  MetricFamily& queue_;
  MetricFamily& inference_latency_;
  MetricFamily& prompt_len_;
  MetricFamily& http_;
};

}  // namespace inferx::server
