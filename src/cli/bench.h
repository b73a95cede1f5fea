#pragma once
// inferx bench serve (bench_serve.cpp): drives a running server over HTTP.
#include <cstdint>
#include <string>

namespace inferx::cli {

struct BenchServeArgs {
  std::string url = "http://127.0.0.1:8000";
  std::string model;        // empty: the first of GET /v1/models
  int concurrency = 0;      // 0: unlimited (with --request-rate) / 1 otherwise
  double request_rate = 0;  // requests/s, Poisson arrivals; 0: all at once (limited by concurrency)
  int64_t num_prompts = 100;
  int input_len = 128, output_len = 128;
  double range_ratio = 0;  // lengths uniform in [len*(1-r), len*(1+r)]
  std::string dataset;     // jsonl: {"prompt": "...", "output_len": N} per line
  uint64_t seed = 0;
  bool json = false;
  bool no_progress = false;
  std::string api_key;
};

void run_bench_serve(const BenchServeArgs& a);

}  // namespace inferx::cli
