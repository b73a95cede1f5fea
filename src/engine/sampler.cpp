// One-row sampler: greedy, or temperature -> top-k -> softmax -> top-p -> min-p -> renormalise -> draw.
// The filter order is llama.cpp's default chain and vLLM's (top-k/top-p on the scaled logits, min-p on the
// resulting probabilities). Min-p: Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling". Top-p
// (nucleus): Holtzman et al. 2019, keeping the smallest prefix of the sorted distribution whose mass is
// >= p.
//
// Non-finite logits: NaN and -inf mean "never this token". If any logit is +inf, the distribution is
// uniform over the +inf tokens (greedy takes the lowest such id). If no token is possible (every logit
// NaN or -inf) sample() and probabilities() throw inferx::Error: there is nothing meaningful to return.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace inferx {
namespace {

// Order of candidates: higher logit first, lower id on ties (so results never depend on sort stability).
bool higher(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  if (a.first != b.first) return a.first > b.first;
  return a.second < b.second;
}

void check_row(const float* logits, int64_t vocab_size) {
  INFERX_CHECK(logits != nullptr && vocab_size > 0, "Sampler: empty logits row (vocab_size {})", vocab_size);
  INFERX_CHECK(vocab_size <= std::numeric_limits<int32_t>::max(), "Sampler: vocab_size {} is too large",
               vocab_size);
}

int32_t argmax(const float* logits, int64_t vocab_size) {
  int32_t best = -1;
  float best_value = 0.0f;
  for (int64_t i = 0; i < vocab_size; ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == -std::numeric_limits<float>::infinity()) continue;
    if (best < 0 || v > best_value) {
      best = static_cast<int32_t>(i);
      best_value = v;
    }
  }
  INFERX_CHECK(best >= 0, "Sampler: no token can be chosen: all {} logits are NaN or -inf", vocab_size);
  return best;
}

// Fills `c` with the surviving candidates as (probability, id), probabilities summing to 1. The order of
// `c` is deterministic (sorted by probability when a filter needed sorting, else by id), and it is the
// order in which the draw walks the cumulative sum.
void build_distribution(const SamplingParams& params, const float* logits, int64_t vocab_size,
                        std::vector<std::pair<float, int32_t>>& c) {
  c.clear();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  bool any_pos_inf = false;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (logits[i] == kInf) {
      if (!any_pos_inf) c.clear();
      any_pos_inf = true;
      c.emplace_back(0.0f, static_cast<int32_t>(i));
    } else if (!any_pos_inf && std::isfinite(logits[i])) {
      c.emplace_back(logits[i], static_cast<int32_t>(i));  // temperature applied in the softmax
    }
  }
  INFERX_CHECK(!c.empty(), "Sampler: no token can be chosen: all {} logits are NaN or -inf", vocab_size);
  // With +inf logits every survivor has value 0 here: equal weights, i.e. uniform over the +inf tokens.

  bool sorted = false;
  const auto top_k = static_cast<size_t>(std::max<int32_t>(params.top_k, 0));
  if (top_k > 0 && top_k < c.size()) {
    // O(V + k log k) instead of sorting the whole vocabulary.
    std::nth_element(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(top_k) - 1, c.end(), higher);
    c.resize(top_k);
    std::sort(c.begin(), c.end(), higher);
    sorted = true;
  }

  // Softmax of logits / temperature in double, as exp((x - max) / T): dividing the difference (never the
  // logit) keeps a tiny temperature from overflowing to inf - inf.
  float max_value = c.front().first;
  for (const auto& e : c) max_value = std::max(max_value, e.first);
  const double temperature = params.temperature;
  double sum = 0.0;
  for (auto& e : c) {
    const double w = std::exp((static_cast<double>(e.first) - static_cast<double>(max_value)) / temperature);
    e.first = static_cast<float>(w);
    sum += w;
  }
  for (auto& e : c) e.first = static_cast<float>(e.first / sum);

  if (params.top_p < 1.0f && c.size() > 1) {
    if (!sorted) {
      // The nucleus is usually small: sort a growing head instead of the whole vocabulary.
      size_t head = std::min<size_t>(c.size(), 256);
      while (true) {
        std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(head), c.end(), higher);
        double mass = 0.0;
        for (size_t i = 0; i < head; ++i) mass += c[i].first;
        if (mass >= params.top_p || head == c.size()) break;
        head = std::min(c.size(), head * 4);
      }
      sorted = true;
    }
    double cumulative = 0.0;
    size_t keep = 0;
    while (keep < c.size()) {
      cumulative += c[keep].first;
      ++keep;
      if (cumulative >= params.top_p) break;
    }
    c.resize(std::max<size_t>(keep, 1));
  }

  if (params.min_p > 0.0f && c.size() > 1) {
    float p_max = 0.0f;
    for (const auto& e : c) p_max = std::max(p_max, e.first);
    const float threshold = params.min_p * p_max;
    std::erase_if(c, [&](const std::pair<float, int32_t>& e) { return e.first < threshold; });
  }

  double total = 0.0;
  for (const auto& e : c) total += e.first;
  for (auto& e : c) e.first = static_cast<float>(e.first / total);
}

// Uniform double in [0, 1) from the top 53 bits of one 64-bit output: identical on every standard library
// (std::uniform_real_distribution's algorithm is implementation-defined).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::sample(const float* logits, int64_t vocab_size) {
  check_row(logits, vocab_size);
  if (!(params_.temperature > 0.0f)) return argmax(logits, vocab_size);
  build_distribution(params_, logits, vocab_size, scratch_);
  const double u = uniform01(rng_);
  double cumulative = 0.0;
  for (const auto& e : scratch_) {
    cumulative += e.first;
    if (u < cumulative) return e.second;
  }
  return scratch_.back().second;  // rounding left u just above the last cumulative sum
}

std::vector<float> Sampler::probabilities(const float* logits, int64_t vocab_size) const {
  check_row(logits, vocab_size);
  std::vector<float> p(static_cast<size_t>(vocab_size), 0.0f);
  if (!(params_.temperature > 0.0f)) {
    p[argmax(logits, vocab_size)] = 1.0f;
    return p;
  }
  std::vector<std::pair<float, int32_t>> c;
  build_distribution(params_, logits, vocab_size, c);
  for (const auto& e : c) p[e.second] = e.first;
  return p;
}

}  // namespace inferx
