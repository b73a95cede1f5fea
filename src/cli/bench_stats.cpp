#include "cli/bench_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace inferx::cli {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

namespace {
nlohmann::json dist_ms(const std::vector<double>& s) {
  const double mean =
      s.empty() ? 0 : std::accumulate(s.begin(), s.end(), 0.0) / static_cast<double>(s.size());
  return {{"mean", mean * 1e3},
          {"p50", percentile(s, 50) * 1e3},
          {"p90", percentile(s, 90) * 1e3},
          {"p99", percentile(s, 99) * 1e3}};
}
}  // namespace

BenchSummary summarize(const std::vector<RequestRecord>& records, double duration_s,
                       const nlohmann::json& setup) {
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t ok = 0, in_tokens = 0, out_tokens = 0;
  std::string first_error;
  for (const auto& r : records) {
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    in_tokens += r.prompt_tokens;
    out_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / static_cast<double>(r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  BenchSummary s;
  const double d = std::max(duration_s, 1e-9);
  s.json = setup;
  s.json["completed"] = ok;
  s.json["failed"] = static_cast<int64_t>(records.size()) - ok;
  if (!first_error.empty()) s.json["first_error"] = first_error;
  s.json["duration_s"] = duration_s;
  s.json["total_input_tokens"] = in_tokens;
  s.json["total_output_tokens"] = out_tokens;
  s.json["request_throughput"] = static_cast<double>(ok) / d;
  s.json["output_throughput"] = static_cast<double>(out_tokens) / d;
  s.json["total_token_throughput"] = static_cast<double>(in_tokens + out_tokens) / d;
  s.json["ttft_ms"] = dist_ms(ttft);
  s.json["tpot_ms"] = dist_ms(tpot);
  s.json["itl_ms"] = dist_ms(itl);
  s.json["e2e_ms"] = dist_ms(e2e);

  std::string& t = s.text;
  t += fmt::format("{:=^60}\n", " inferx bench ");
  t += fmt::format("{:<40}{:>20}\n", "Successful requests:", ok);
  t += fmt::format("{:<40}{:>20}\n", "Failed requests:", records.size() - static_cast<size_t>(ok));
  if (!first_error.empty()) t += fmt::format("First error: {}\n", first_error.substr(0, 200));
  t += fmt::format("{:<40}{:>20.2f}\n", "Duration (s):", duration_s);
  t += fmt::format("{:<40}{:>20}\n", "Total input tokens:", in_tokens);
  t += fmt::format("{:<40}{:>20}\n", "Total generated tokens:", out_tokens);
  t += fmt::format("{:<40}{:>20.2f}\n",
                   "Request throughput (req/s):", s.json["request_throughput"].get<double>());
  t += fmt::format("{:<40}{:>20.2f}\n",
                   "Output token throughput (tok/s):", s.json["output_throughput"].get<double>());
  t += fmt::format("{:<40}{:>20.2f}\n",
                   "Total token throughput (tok/s):", s.json["total_token_throughput"].get<double>());
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) {
    const auto& j = s.json[k];
    t += fmt::format("{:-^60}\n", fmt::format(" {} ", k));
    for (const char* q : {"mean", "p50", "p90", "p99"})
      t += fmt::format("{:<40}{:>20.3f}\n", fmt::format("{} {} (ms):", q, k), j[q].get<double>());
  }
  t += fmt::format("{:=^60}\n", "");
  return s;
}

void draw_progress(int64_t done, int64_t total, double elapsed_s) {
  const int width = 40;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>';
  bar.resize(width, ' ');
  std::fprintf(stderr, "\r[%s] %lld/%lld %.1f s", bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total), elapsed_s);
  if (done >= total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace inferx::cli
