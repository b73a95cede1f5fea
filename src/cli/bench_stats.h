#pragma once
// What `inferx bench` measures per request and how it summarises them: TTFT, TPOT (time per output token
// after the first), ITL (every gap between streamed outputs), E2E latency, each at mean/p50/p90/p99, plus
// request and token throughput. Definitions follow vLLM's benchmark_serving so figures compare.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace inferx::cli {

struct RequestRecord {
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double ttft = 0, e2e = 0;  // seconds
  std::vector<double> itl;   // seconds
};

struct BenchSummary {
  nlohmann::json json;  // every figure, for --json
  std::string text;     // the human-readable table
};

BenchSummary summarize(const std::vector<RequestRecord>& records, double duration_s,
                       const nlohmann::json& setup);
double percentile(std::vector<double> v, double p);  // p in [0, 100]; linear interpolation

// "[=====>     ] 40/100 3.2 s" on stderr, redrawn in place.
void draw_progress(int64_t done, int64_t total, double elapsed_s);

}  // namespace inferx::cli
