#include "engine/batch_sampler.h"

#include <algorithm>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <cmath>
#include <limits>

#include "core/error.h"

namespace inferx {
namespace {

// Greedy: the first index of the largest logit, NaN and -inf never chosen, exactly as Sampler's argmax,
// in two branch-free passes (max, then the first index holding it) instead of one branchy pass: greedy
// decoding of a large batch is otherwise dominated by this scan. maxps(x, m) returns m when x is NaN
// (Intel SDM, MAXPS: "if either value is a NaN, the second operand is returned"), so NaN never wins.
int32_t fast_argmax(const float* row, int64_t vocab) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float best = kNegInf;
  int64_t i = 0;
#if defined(__AVX2__)
  __m256 m0 = _mm256_set1_ps(kNegInf), m1 = m0;
  for (; i + 16 <= vocab; i += 16) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(row + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(row + i + 8), m1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  for (float v : lanes) best = v > best ? v : best;
#endif
  for (; i < vocab; ++i) best = row[i] > best ? row[i] : best;
  INFERX_CHECK(best > kNegInf, "sampler: no token can be chosen: all {} logits are NaN or -inf", vocab);
  return static_cast<int32_t>(std::find(row, row + vocab, best) - row);
}

}  // namespace

void BatchSampler::sample(const SchedulerOutput& out, float* logits, int64_t vocab,
                          std::vector<SampledToken>& result) {
  result.clear();
  int64_t row_index = 0;
  for (const ScheduledSequence& s : out.seqs) {
    if (!s.sample) continue;
    Sequence& seq = *s.seq;
    float* row = logits + row_index++ * vocab;
    const GenerationParams& p = seq.request->req.params;
    INFERX_CHECK(seq.sampler.has_value(), "batch sampler: sequence {} has no sampler", seq.index);
    const bool processed = !p.logit_bias.empty() || seq.penalties.active();
    // Logprobs describe the model's own distribution (vLLM's default: raw logprobs), so the raw row is
    // kept when processing is about to change it in place.
    const float* raw = row;
    if (p.logprobs >= 0 && processed) {
      raw_.assign(row, row + vocab);
      raw = raw_.data();
    }
    if (!p.logit_bias.empty()) apply_logit_bias(row, vocab, p.logit_bias);
    seq.penalties.apply(row, vocab);
    SampledToken r;
    r.seq = &seq;
    r.token = p.temperature > 0.0f ? seq.sampler->sample(row, vocab) : fast_argmax(row, vocab);
    if (p.logprobs >= 0) {
      r.has_logprob = true;
      r.logprob = compute_logprobs(raw, vocab, r.token, p.logprobs, scratch_);
    }
    result.push_back(std::move(r));
  }
}

}  // namespace inferx
