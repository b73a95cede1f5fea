#pragma once
// Requests the engine tests (CPU and GPU) feed in: deterministic prompts of ids below 512 (dummy:tiny's
// vocabulary), greedy generation of a fixed length, and the GPU tests' run of a batch of them.
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "inferx/engine.h"

namespace inferx::testing {

// Bytes for dummy:tiny's ids (it has no tokenizer), for structured-output tests: JSON-ish pieces in turn;
// the last id has none (the tests' end token).
inline std::vector<std::string> json_pieces_vocab(int64_t vocab) {
  const std::vector<std::string> pieces = {
      "{", "}",  "\"",  "\"a", "b",   ":", ",", " ", "1", "-", "true", "[", "]", "\"k\":", "\n  ", "\\",
      "n", "},", "\"}", "x",   "0.5", "e", "u", "l", "r", "s", "f",    "E", "+", "2",      "\"\"", "null"};
  std::vector<std::string> v(static_cast<size_t>(vocab));
  for (int64_t i = 0; i + 1 < vocab; ++i)
    v[static_cast<size_t>(i)] = pieces[static_cast<size_t>(i) % pieces.size()];
  return v;
}

// `len` ids, a different sequence per `salt`.
inline std::vector<int32_t> test_prompt(int32_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back((i * 37 + salt * 101 + 7) % 512);
  return p;
}

// Greedy, exactly `max_tokens` tokens (EOS ignored).
inline GenerationParams greedy_tokens(int32_t max_tokens) {
  GenerationParams g;
  g.temperature = 0.0f;
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  return g;
}

// Serves request i = (prompts[i], params[i]) for every i to its end on a new engine with `cfg`; returns each
// request's token ids (and the engine's counters in `stats`). `constructed`, when given, sees the engine
// before the first request.
inline std::vector<std::vector<int32_t>> run_requests(Model& model, const EngineConfig& cfg,
                                                      const std::vector<std::vector<int32_t>>& prompts,
                                                      const std::vector<GenerationParams>& params,
                                                      EngineStats* stats = nullptr,
                                                      const std::function<void(Engine&)>& constructed = {}) {
  Engine engine(model, nullptr, cfg);
  if (constructed) constructed(engine);
  std::vector<std::vector<int32_t>> tokens(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EngineRequest r;
    r.id = fmt::format("r{}", i);
    r.prompt = prompts[i];
    r.params = params[i];
    r.on_output = [&tokens, i](RequestOutput&& o) {
      for (const SequenceDelta& d : o.deltas)
        tokens[i].insert(tokens[i].end(), d.token_ids.begin(), d.token_ids.end());
    };
    engine.submit(std::move(r));
  }
  engine.run_until_idle();
  if (stats) *stats = engine.stats();
  return tokens;
}

// The GPU engine tests' run: a new engine (512-token context, 128-token steps, batch 16, 64 MB of KV cache)
// serves request i = (test_prompt(12 + 7 i, i), params[i]) for every i to its end.
inline std::vector<std::vector<int32_t>> run_to_end(Model& model, const std::vector<GenerationParams>& params,
                                                    EngineStats* stats = nullptr) {
  EngineConfig cfg;
  cfg.max_model_len = 512;
  cfg.max_num_batched_tokens = 128;
  cfg.max_batch_size = 16;
  cfg.kv_cache_bytes = 64 << 20;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < params.size(); ++i)
    prompts.push_back(test_prompt(12 + 7 * static_cast<int32_t>(i), static_cast<int32_t>(i)));
  return run_requests(model, cfg, prompts, params, stats);
}

}  // namespace inferx::testing
