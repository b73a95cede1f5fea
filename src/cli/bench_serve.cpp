// inferx bench serve: streams completions from a running server and measures what a client sees.
// Prompts are random token ids (exact input lengths, like vLLM's random dataset) or text lines from a
// JSONL --dataset; every request streams with ignore_eos so output lengths are exact, and asks for usage.
#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "cli/bench.h"
#include "cli/bench_stats.h"
#include "core/error.h"
#include "server/http_client.h"

namespace inferx::cli {

using nlohmann::json;

namespace {

// A non-negative integer field of the server's JSON, or `def` when absent or not a JSON integer (the server
// under test may be any OpenAI-compatible one: nlohmann's get<int64_t>() of a float would cast it, undefined
// past int64's range).
int64_t count_or(const json& obj, const char* key, int64_t def) {
  if (!obj.is_object()) return def;
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) return def;
  return it->is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX))
                                  : std::max<int64_t>(it->get<int64_t>(), 0);
}

struct Prompt {
  json prompt;  // string or token-id array
  int64_t input_len = 0;
  int output_len = 0;
};

int jitter(int len, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return len;
  std::uniform_int_distribution<int> d(std::max(1, static_cast<int>(len * (1 - ratio))),
                                       std::max(1, static_cast<int>(len * (1 + ratio))));
  return d(rng);
}

std::vector<Prompt> make_prompts(const BenchServeArgs& a, int64_t vocab, int64_t max_len,
                                 std::mt19937_64& rng) {
  std::vector<Prompt> out;
  if (!a.dataset.empty()) {
    std::ifstream f(a.dataset);
    INFERX_CHECK(f, "--dataset: cannot open '{}'", a.dataset);
    std::vector<Prompt> all;
    std::string line;
    for (int64_t ln = 1; std::getline(f, line); ++ln) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json j;
      try {
        j = json::parse(line);
      } catch (const json::parse_error& e) {
        fail("--dataset {}:{}: not JSON ({})", a.dataset, ln, e.what());
      }
      INFERX_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
                   "--dataset {}:{}: expected {{\"prompt\": \"...\"}}", a.dataset, ln);
      Prompt p;
      p.prompt = j["prompt"];
      p.input_len = 0;  // from the server's usage
      p.output_len = j.value("output_len", jitter(a.output_len, a.range_ratio, rng));
      all.push_back(std::move(p));
    }
    INFERX_CHECK(!all.empty(), "--dataset {}: no prompts", a.dataset);
    for (int64_t i = 0; i < a.num_prompts; ++i) out.push_back(all[static_cast<size_t>(i) % all.size()]);
    return out;
  }
  std::uniform_int_distribution<int64_t> tok(std::min<int64_t>(4, vocab - 1), vocab - 1);
  for (int64_t i = 0; i < a.num_prompts; ++i) {
    Prompt p;
    p.input_len = jitter(a.input_len, a.range_ratio, rng);
    p.output_len = jitter(a.output_len, a.range_ratio, rng);
    if (max_len > 0 && p.input_len + p.output_len > max_len)
      fail("input {} + output {} tokens exceed the server's max_model_len {}", p.input_len, p.output_len,
           max_len);
    p.prompt = json::array();
    for (int64_t k = 0; k < p.input_len; ++k) p.prompt.push_back(tok(rng));
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

void run_bench_serve(const BenchServeArgs& a) {
  std::string host;
  int port = 0;
  server::parse_http_url(a.url, host, port);
  server::HttpClient client(host, port);
  client.set_api_key(a.api_key);

  // The model name and, for random prompts, the vocabulary and context size.
  auto models = client.get("/v1/models");
  INFERX_CHECK(models.status == 200, "GET {}/v1/models: HTTP {} {}", a.url, models.status, models.body);
  json mj = json::parse(models.body, nullptr, false);
  INFERX_CHECK(mj.is_object() && mj.contains("data") && mj["data"].is_array() && !mj["data"].empty() &&
                   mj["data"][0].is_object(),
               "GET /v1/models: no model listed");
  const json& m0 = mj["data"][0];
  const auto id = m0.find("id");
  const std::string model = !a.model.empty()                    ? a.model
                            : id != m0.end() && id->is_string() ? id->get<std::string>()
                                                                : "";
  const int64_t vocab =
      std::max<int64_t>(count_or(m0, "vocab_size", 256), 1);  // random ids in [min(4, V-1), V)
  const int64_t max_len = count_or(m0, "max_model_len", 0);

  std::mt19937_64 rng(a.seed);
  std::vector<Prompt> prompts = make_prompts(a, vocab, max_len, rng);
  const int64_t n = static_cast<int64_t>(prompts.size());
  std::vector<RequestRecord> records(prompts.size());
  const int limit = a.concurrency > 0 ? a.concurrency : (a.request_rate > 0 ? 1 << 30 : 1);

  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0, done = 0;
  const double t0 = server::steady_seconds();
  std::exponential_distribution<double> gap(a.request_rate > 0 ? a.request_rate : 1.0);
  double next_arrival = t0;
  double last_progress = 0;

  for (int64_t i = 0; i < n; ++i) {
    if (a.request_rate > 0) {  // Poisson process: exponential gaps between arrivals
      next_arrival += gap(rng);
      const double wait = next_arrival - server::steady_seconds();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    }
    {
      std::unique_lock lock(mu);
      while (in_flight >= limit) {
        cv.wait_for(lock, std::chrono::milliseconds(100));
        const double t = server::steady_seconds();
        if (!a.no_progress && t - last_progress > 0.1) {
          draw_progress(done, n, t - t0);
          last_progress = t;
        }
      }
      ++in_flight;
    }
    const Prompt& p = prompts[static_cast<size_t>(i)];
    json body = {{"model", model},
                 {"prompt", p.prompt},
                 {"max_tokens", p.output_len},
                 {"temperature", 0},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    auto rec = &records[static_cast<size_t>(i)];
    auto last = std::make_shared<double>(-1.0);
    auto start = std::make_shared<double>(server::steady_seconds());
    client.post(
        "/v1/completions", body.dump(),
        [rec, last, start](const std::string& data, double t) {
          if (data == "[DONE]") return;
          json c = json::parse(data, nullptr, false);
          if (!c.is_object()) return;
          if (c.contains("usage") && c["usage"].is_object()) {
            rec->prompt_tokens = count_or(c["usage"], "prompt_tokens", 0);
            rec->output_tokens = count_or(c["usage"], "completion_tokens", 0);
          }
          if (!c.contains("choices") || !c["choices"].is_array() || c["choices"].empty() ||
              !c["choices"][0].is_object())
            return;
          const json& ch = c["choices"][0];
          // Only chunks that carry text count as token arrivals (not the finish chunk).
          if (!ch.contains("text") || !ch["text"].is_string() ||
              ch["text"].get_ref<const std::string&>().empty())
            return;
          if (*last < 0)
            rec->ttft = t - *start;
          else
            rec->itl.push_back(t - *last);
          *last = t;
        },
        [rec, start, &mu, &cv, &in_flight, &done](server::ClientResponse&& r) {
          rec->e2e = r.t_end - *start;
          rec->ok = r.error.empty() && r.status == 200 && rec->output_tokens > 0;
          if (!rec->ok)
            rec->error =
                !r.error.empty() ? r.error : fmt::format("HTTP {} {}", r.status, r.body.substr(0, 300));
          std::lock_guard lock(mu);
          --in_flight;
          ++done;
          cv.notify_all();
        });
  }
  {
    std::unique_lock lock(mu);
    while (done < n) {
      cv.wait_for(lock, std::chrono::milliseconds(100));
      if (!a.no_progress) draw_progress(done, n, server::steady_seconds() - t0);
    }
  }
  const double duration = server::steady_seconds() - t0;
  json setup = {{"mode", "serve"},
                {"url", a.url},
                {"model", model},
                {"num_prompts", n},
                {"concurrency", a.concurrency},
                {"request_rate", a.request_rate},
                {"input_len", a.dataset.empty() ? json(a.input_len) : json(nullptr)},
                {"output_len", a.output_len},
                {"dataset", a.dataset.empty() ? json(nullptr) : json(a.dataset)}};
  BenchSummary s = summarize(records, duration, setup);
  if (a.json)
    std::printf("%s\n", s.json.dump(2).c_str());
  else
    std::printf("%s", s.text.c_str());
}

}  // namespace inferx::cli
