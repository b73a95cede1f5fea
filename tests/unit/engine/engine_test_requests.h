#pragma once
// Requests the engine tests (CPU and GPU) feed in: deterministic prompts of ids below 512 (dummy:tiny's
// vocabulary), and greedy generation of a fixed length.
#include <cstdint>
#include <vector>

#include "inferx/engine.h"

namespace inferx::testing {

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

}  // namespace inferx::testing
