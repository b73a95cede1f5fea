#pragma once
// Token sampling from one row of logits: greedy, or temperature -> top-k -> top-p -> min-p -> draw,
// with a per-request seeded generator (the same seed gives the same tokens). The batched, penalised
// sampler of the serving engine builds on these steps.
#include <cstdint>
#include <random>
#include <vector>

namespace inferx {

struct SamplingParams {
  float temperature = 1.0f;  // <= 0: greedy (argmax)
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off; keeps tokens with p >= min_p * p_max
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(const float* logits, int64_t vocab_size);
  // The probabilities sample() would draw from (after all filters), for tests; zero for removed tokens.
  std::vector<float> probabilities(const float* logits, int64_t vocab_size) const;

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace inferx
