#include "engine/logits_processors.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace inferx {

PenaltyState::PenaltyState(const GenerationParams& p, const std::vector<int32_t>& prompt)
    : repetition_(p.repetition_penalty), presence_(p.presence_penalty), frequency_(p.frequency_penalty) {
  active_ = repetition_ != 1.0f || presence_ != 0.0f || frequency_ != 0.0f;
  if (active_ && repetition_ != 1.0f) seen_.insert(prompt.begin(), prompt.end());
}

void PenaltyState::add_generated(int32_t token) {
  if (!active_) return;
  if (repetition_ != 1.0f) seen_.insert(token);
  if (presence_ != 0.0f || frequency_ != 0.0f) ++counts_[token];
}

void PenaltyState::apply(float* row, int64_t vocab) const {
  if (!active_) return;
  for (int32_t t : seen_) {
    if (t < 0 || t >= vocab) continue;
    float& x = row[t];
    x = x > 0.0f ? x / repetition_ : x * repetition_;
  }
  for (const auto& [t, count] : counts_) {
    if (t < 0 || t >= vocab) continue;
    row[t] -= static_cast<float>(count) * frequency_ + presence_;
  }
}

void apply_logit_bias(float* row, int64_t vocab, const std::vector<std::pair<int32_t, float>>& bias) {
  for (const auto& [t, b] : bias) {
    if (t >= 0 && t < vocab) row[t] += b;
  }
}

TokenLogprob compute_logprobs(const float* row, int64_t vocab, int32_t token, int32_t top,
                              std::vector<std::pair<float, int32_t>>& scratch) {
  float max_value = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(row[i])) max_value = std::max(max_value, row[i]);
  }
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(row[i])) sum += std::exp(static_cast<double>(row[i]) - max_value);
  }
  const double lse = static_cast<double>(max_value) + std::log(sum);
  auto lp = [&](int64_t i) {
    return std::isnan(row[i]) ? -std::numeric_limits<float>::infinity()
                              : static_cast<float>(static_cast<double>(row[i]) - lse);
  };
  TokenLogprob out;
  out.token = token;
  out.logprob = lp(token);
  if (top > 0) {
    const auto k = static_cast<size_t>(std::min<int64_t>(top, vocab));
    scratch.clear();
    for (int64_t i = 0; i < vocab; ++i) {
      scratch.emplace_back(std::isnan(row[i]) ? -std::numeric_limits<float>::infinity() : row[i],
                           static_cast<int32_t>(i));
    }
    auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    std::partial_sort(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k), scratch.end(),
                      better);
    out.top.reserve(k);
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(scratch[i].second, lp(scratch[i].second));
  }
  return out;
}

}  // namespace inferx
