#include "engine/batch_sampler.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/sampling_kernels.h"

namespace inferx {
namespace {

// Below this many logits per chunk a parallel loop costs more in hand-off than it saves (a row of a
// small vocabulary takes well under a microsecond).
constexpr int64_t kLogitsPerChunk = 32768;

// One sequence's row: processors, draw, logprobs. Touches only this row and this sequence's state.
SampledToken sample_row(Sequence& seq, float* row, int64_t vocab) {
  const GenerationParams& p = seq.request->req.params;
  INFERX_CHECK(seq.sampler.has_value(), "batch sampler: sequence {} has no sampler", seq.index);
  const bool processed = !p.logit_bias.empty() || seq.penalties.active() || seq.constraint;
  // Logprobs describe the model's own distribution (vLLM's default: raw logprobs), so the raw row is
  // kept when processing is about to change it in place.
  thread_local std::vector<float> raw_copy;
  thread_local std::vector<std::pair<float, int32_t>> scratch;
  const float* raw = row;
  if (p.logprobs >= 0 && processed) {
    raw_copy.assign(row, row + vocab);
    raw = raw_copy.data();
  }
  if (!p.logit_bias.empty()) apply_logit_bias(row, vocab, p.logit_bias);
  seq.penalties.apply(row, vocab);
  if (seq.constraint) seq.constraint->mask(row, vocab);  // structured output: after the processors (vLLM)
  SampledToken r;
  r.seq = &seq;
  if (p.temperature > 0.0f) {
    r.token = seq.sampler->sample(row, vocab);
  } else {
    // Greedy: the first index of the largest logit, NaN and -inf never chosen (Sampler's argmax).
    const int64_t best = sampling_kernels::argmax(row, vocab);
    INFERX_CHECK(best >= 0, "sampler: no token can be chosen: all {} logits are NaN or -inf", vocab);
    r.token = static_cast<int32_t>(best);
  }
  if (p.logprobs >= 0) {
    r.has_logprob = true;
    r.logprob = compute_logprobs(raw, vocab, r.token, p.logprobs, scratch);
  }
  return r;
}

}  // namespace

void BatchSampler::sample(const SchedulerOutput& out, float* logits, int64_t vocab,
                          std::vector<SampledToken>& result) {
  seqs_.clear();
  for (const ScheduledSequence& s : out.seqs) {
    if (s.sample) seqs_.push_back(s.seq);
  }
  sample_rows(seqs_, logits, vocab, result);
}

void BatchSampler::sample_rows(const std::vector<Sequence*>& seqs, float* logits, int64_t vocab,
                               std::vector<SampledToken>& result) {
  result.clear();
  rows_.clear();
  for (Sequence* seq : seqs) {
    result.emplace_back().seq = seq;
    rows_.push_back(logits + static_cast<int64_t>(rows_.size()) * vocab);
  }
  const auto n = static_cast<int64_t>(rows_.size());
  auto run = [&](int64_t begin, int64_t end, int /*thread*/) {
    for (int64_t i = begin; i < end; ++i) {
      const auto k = static_cast<size_t>(i);
      result[k] = sample_row(*result[k].seq, rows_[k], vocab);
    }
  };
  const int64_t grain = std::max<int64_t>(1, kLogitsPerChunk / std::max<int64_t>(vocab, 1));
  if (pool_ != nullptr && n > grain) {
    pool_->parallel_for(n, run, grain);
  } else {
    run(0, n, 0);
  }
}

}  // namespace inferx
