#pragma once
// Logits processors applied to one sequence's row before sampling, in this order (vLLM v1 sampler:
// logit_bias is a built-in logits processor applied before the penalties):
//   1. logit_bias: logits[t] += bias (OpenAI `logit_bias`);
//   2. repetition penalty over prompt + generated tokens (CTRL, Keskar et al. 2019, as in HF/vLLM):
//      logits[t] = logits[t] > 0 ? logits[t] / p : logits[t] * p;
//   3. frequency and presence penalties over generated tokens (OpenAI API reference):
//      logits[t] -= count[t] * frequency + (count[t] > 0) * presence.
// Then temperature, top-k, top-p and min-p (engine/sampler.h).
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/token_sampling.h"
#include "inferx/engine.h"

namespace inferx {

// What the penalties need to know about one sequence, kept up to date token by token (only when a
// penalty is on, so plain requests pay nothing): one entry per token the penalties touch, sorted by token,
// so applying them or turning them into device edits is one linear pass (a batch of penalized rows turns
// into edits every step).
class PenaltyState {
 public:
  PenaltyState() = default;
  PenaltyState(const GenerationParams& params, const std::vector<int32_t>& prompt);
  bool active() const { return active_; }
  void add_generated(int32_t token);
  void apply(float* row, int64_t vocab) const;
  // The same processing, and `bias` before it (apply_logit_bias), as LogitEdits of row `row`, one per
  // token it touches, in token order (Backend::edit_logits: the device applies them with the same
  // rounding). False, with nothing appended, when edits cannot express it: a token twice in `bias` (its
  // adds would round twice).
  bool append_edits(int32_t row, const std::vector<std::pair<int32_t, float>>& bias, int64_t vocab,
                    std::vector<LogitEdit>& out) const;

 private:
  struct Entry {
    int32_t token;
    bool seen;      // in prompt + generated (repetition penalty)
    int32_t count;  // times generated (frequency / presence penalties)
  };
  Entry& entry(int32_t token);  // found or inserted in order
  bool active_ = false;
  float repetition_ = 1.0f, presence_ = 0.0f, frequency_ = 0.0f;
  std::vector<Entry> entries_;
};

void apply_logit_bias(float* row, int64_t vocab, const std::vector<std::pair<int32_t, float>>& bias);

// log-softmax of `row` at `token`, plus the `top` most likely tokens (best first, lower id on ties).
// Computed on the raw model output, before any processing: vLLM's default logprobs mode.
TokenLogprob compute_logprobs(const float* row, int64_t vocab, int32_t token, int32_t top,
                              std::vector<std::pair<float, int32_t>>& scratch);

}  // namespace inferx
