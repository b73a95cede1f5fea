#include "engine/batch_sampler.h"

#include <algorithm>

#include "core/error.h"

namespace inferx {

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
    r.token = seq.sampler->sample(row, vocab);
    if (p.logprobs >= 0) {
      r.has_logprob = true;
      r.logprob = compute_logprobs(raw, vocab, r.token, p.logprobs, scratch_);
    }
    result.push_back(std::move(r));
  }
}

}  // namespace inferx
