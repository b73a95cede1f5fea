#include "engine/logits_processors.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/sampling_kernels.h"

namespace inferx {

PenaltyState::PenaltyState(const GenerationParams& p, const std::vector<int32_t>& prompt)
    : repetition_(p.repetition_penalty), presence_(p.presence_penalty), frequency_(p.frequency_penalty) {
  active_ = repetition_ != 1.0f || presence_ != 0.0f || frequency_ != 0.0f;
  if (!active_ || repetition_ == 1.0f) return;
  std::vector<int32_t> tokens = prompt;
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  entries_.reserve(tokens.size());
  for (int32_t t : tokens) entries_.push_back({t, true, 0});
}

PenaltyState::Entry& PenaltyState::entry(int32_t token) {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), token,
                             [](const Entry& e, int32_t t) { return e.token < t; });
  if (it == entries_.end() || it->token != token) it = entries_.insert(it, Entry{token, false, 0});
  return *it;
}

void PenaltyState::add_generated(int32_t token) {
  if (!active_) return;
  Entry& e = entry(token);
  if (repetition_ != 1.0f) e.seen = true;
  if (presence_ != 0.0f || frequency_ != 0.0f) ++e.count;
}

// Per token: the repetition penalty, then the frequency / presence subtraction (the order of vLLM's
// sampler; each token's value depends only on its own entry).
void PenaltyState::apply(float* row, int64_t vocab) const {
  if (!active_) return;
  for (const Entry& e : entries_) {
    if (e.token < 0 || e.token >= vocab) continue;
    float& x = row[e.token];
    if (e.seen) x = x > 0.0f ? x / repetition_ : x * repetition_;
    if (e.count > 0) x -= static_cast<float>(e.count) * frequency_ + presence_;
  }
}

bool PenaltyState::append_edits(int32_t row, const std::vector<std::pair<int32_t, float>>& bias,
                                int64_t vocab, std::vector<LogitEdit>& out) const {
  thread_local std::vector<std::pair<int32_t, float>> sorted;
  sorted.clear();
  for (const auto& b : bias) {
    if (b.first >= 0 && b.first < vocab) sorted.push_back(b);
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t k = 1; k < sorted.size(); ++k) {
    if (sorted[k].first == sorted[k - 1].first) return false;
  }
  // Merge the bias tokens with the entries (both in token order).
  const size_t n = active_ ? entries_.size() : 0;
  size_t i = 0, k = 0;
  while (i < n || k < sorted.size()) {
    LogitEdit e;
    e.row = row;
    const bool take_entry = i < n && (k == sorted.size() || entries_[i].token <= sorted[k].first);
    const bool take_bias = k < sorted.size() && (i == n || sorted[k].first <= entries_[i].token);
    if (take_bias) {
      e.token = sorted[k].first;
      e.bias = sorted[k].second;
      ++k;
    }
    if (take_entry) {
      const Entry& en = entries_[i++];
      // Outside the vocabulary: skipped (a bias there was filtered above, so none was taken with it).
      if (en.token < 0 || en.token >= vocab) continue;
      e.token = en.token;
      if (en.seen) e.repetition = repetition_;
      if (en.count > 0) e.subtract = static_cast<float>(en.count) * frequency_ + presence_;
    }
    out.push_back(e);
  }
  return true;
}

void apply_logit_bias(float* row, int64_t vocab, const std::vector<std::pair<int32_t, float>>& bias) {
  for (const auto& [t, b] : bias) {
    if (t >= 0 && t < vocab) row[t] += b;
  }
}

namespace {

bool better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

// log-sum-exp of the non-NaN values: with every value finite or -inf (the usual case), max plus the log
// of the vectorised softmax weights' sum (sampling_kernels::exp_nonpositive, ~3 ulp per weight, so the
// result is within ~1e-7 of the double-precision sum); otherwise in double, one value at a time.
double log_sum_exp(const float* row, int64_t vocab) {
  const sampling_kernels::RowScan scan = sampling_kernels::scan_row(row, vocab);
  if (!scan.has_nan && std::isfinite(scan.max)) {
    thread_local std::vector<float> w;
    thread_local std::vector<double> blocks;
    w.resize(static_cast<size_t>(vocab));
    blocks.resize(static_cast<size_t>((vocab + sampling_kernels::kBlock - 1) / sampling_kernels::kBlock));
    const double sum = sampling_kernels::softmax_weights(row, vocab, scan.max, 1.0f, w.data(), blocks.data());
    return static_cast<double>(scan.max) + std::log(sum);
  }
  const float max_value = scan.max;
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(row[i])) sum += std::exp(static_cast<double>(row[i]) - max_value);
  }
  return static_cast<double>(max_value) + std::log(sum);
}

}  // namespace

TokenLogprob compute_logprobs(const float* row, int64_t vocab, int32_t token, int32_t top,
                              std::vector<std::pair<float, int32_t>>& scratch) {
  const double lse = log_sum_exp(row, vocab);
  auto lp = [&](int64_t i) {
    return std::isnan(row[i]) ? -std::numeric_limits<float>::infinity()
                              : static_cast<float>(static_cast<double>(row[i]) - lse);
  };
  TokenLogprob out;
  out.token = token;
  out.logprob = lp(token);
  if (top > 0) {
    // The `top` best by (value desc, id asc), NaN as -inf: a heap of `top` whose front is the weakest
    // kept; once full, only a value strictly above the front can enter (later equal values have higher
    // ids), and the scan jumps to the next such value 16 at a time.
    const auto k = static_cast<size_t>(std::min<int64_t>(top, vocab));
    scratch.clear();
    for (int64_t i = 0; i < vocab; ++i) {
      if (scratch.size() == k) {
        i += sampling_kernels::first_greater(row + i, vocab - i, scratch.front().first);
        if (i >= vocab) break;
      }
      const std::pair<float, int32_t> e(std::isnan(row[i]) ? -std::numeric_limits<float>::infinity() : row[i],
                                        static_cast<int32_t>(i));
      if (scratch.size() < k) {
        scratch.push_back(e);
        std::push_heap(scratch.begin(), scratch.end(), better);
      } else if (better(e, scratch.front())) {
        std::pop_heap(scratch.begin(), scratch.end(), better);
        scratch.back() = e;
        std::push_heap(scratch.begin(), scratch.end(), better);
      }
    }
    std::sort(scratch.begin(), scratch.end(), better);
    out.top.reserve(k);
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(scratch[i].second, lp(scratch[i].second));
  }
  return out;
}

}  // namespace inferx
