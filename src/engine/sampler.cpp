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

// The last token (in `higher` order) of the top-p nucleus: the smallest prefix of the probabilities
// sorted by `higher` whose mass reaches p (at least one token). Quickselect on mass: expected O(n), and
// exact because `higher` is a strict total order (ties broken by id), so the set equals the one a full
// sort gives.
std::pair<float, int32_t> nucleus_boundary(const std::vector<std::pair<float, int32_t>>& c, double p) {
  thread_local std::vector<std::pair<float, int32_t>> work;
  work.assign(c.begin(), c.end());
  size_t lo = 0, hi = work.size();  // the boundary lies in [lo, hi); everything before lo is kept
  double need = p;                  // mass still needed from work[lo..)
  while (hi - lo > 32) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(work.begin() + static_cast<std::ptrdiff_t>(lo),
                     work.begin() + static_cast<std::ptrdiff_t>(mid),
                     work.begin() + static_cast<std::ptrdiff_t>(hi), higher);
    double mass = 0.0;
    for (size_t i = lo; i < mid; ++i) mass += work[i].first;
    if (mass >= need) {
      hi = mid;  // the top (mid - lo) of the range already reach p
    } else {
      need -= mass;
      lo = mid;
    }
  }
  std::sort(work.begin() + static_cast<std::ptrdiff_t>(lo), work.begin() + static_cast<std::ptrdiff_t>(hi),
            higher);
  double cumulative = 0.0;
  for (size_t i = lo; i < hi; ++i) {
    cumulative += work[i].first;
    if (cumulative >= need) return work[i];
  }
  return work[hi - 1];  // rounding: the whole range is needed
}

// Fills `c` with the surviving candidates as (probability, id), probabilities summing to 1. The order of
// `c` is the order in which the draw walks the cumulative sum; it depends on no library's sort or
// partition algorithm: `higher` order when top-k applied (a full sort of the k by a strict total order),
// else id order.
void build_distribution(const SamplingParams& params, const float* logits, int64_t vocab_size,
                        std::vector<std::pair<float, int32_t>>& c) {
  c.clear();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const auto top_k = static_cast<size_t>(std::max<int32_t>(params.top_k, 0));
  const bool any_pos_inf = std::find(logits, logits + vocab_size, kInf) != logits + vocab_size;
  bool sorted = false;
  if (top_k > 0 && !any_pos_inf) {
    // Top-k in one pass with a k-sized heap whose front is the weakest kept candidate: O(V log k), and
    // nearly every logit is rejected by a single comparison.
    for (int64_t i = 0; i < vocab_size; ++i) {
      if (!std::isfinite(logits[i])) continue;
      const std::pair<float, int32_t> e(logits[i], static_cast<int32_t>(i));
      if (c.size() < top_k) {
        c.push_back(e);
        std::push_heap(c.begin(), c.end(), higher);
      } else if (higher(e, c.front())) {
        std::pop_heap(c.begin(), c.end(), higher);
        c.back() = e;
        std::push_heap(c.begin(), c.end(), higher);
      }
    }
    std::sort(c.begin(), c.end(), higher);
    sorted = true;
  } else {
    for (int64_t i = 0; i < vocab_size; ++i) {
      if (any_pos_inf ? logits[i] == kInf : std::isfinite(logits[i])) {
        // +inf tokens all get the same value: the distribution is uniform over them.
        c.emplace_back(any_pos_inf ? 0.0f : logits[i], static_cast<int32_t>(i));
      }
    }
    if (top_k > 0 && top_k < c.size()) {
      c.resize(top_k);  // equal values and ascending ids: the first k are the top k
    }
  }
  INFERX_CHECK(!c.empty(), "Sampler: no token can be chosen: all {} logits are NaN or -inf", vocab_size);

  // Softmax of logits / temperature as exp((x - max) / T), summed in double: dividing the difference
  // (never the logit) keeps a tiny temperature from overflowing to inf - inf.
  float max_value = c.front().first;
  for (const auto& e : c) max_value = std::max(max_value, e.first);
  const float inv_temperature = 1.0f / params.temperature;
  double sum = 0.0;
  for (auto& e : c) {
    const float w = std::exp((e.first - max_value) * inv_temperature);
    e.first = w;
    sum += w;
  }
  for (auto& e : c) e.first = static_cast<float>(e.first / sum);

  if (params.top_p < 1.0f && c.size() > 1) {
    if (sorted) {
      double cumulative = 0.0;
      size_t keep = 0;
      while (keep < c.size()) {
        cumulative += c[keep].first;
        ++keep;
        if (cumulative >= params.top_p) break;
      }
      c.resize(keep);
    } else {
      // Expected O(V) without sorting the vocabulary: find the last token of the nucleus, then keep
      // everything ranked at or above it, leaving `c` in id order.
      const std::pair<float, int32_t> last = nucleus_boundary(c, params.top_p);
      std::erase_if(c, [&](const std::pair<float, int32_t>& e) { return higher(last, e); });
    }
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
