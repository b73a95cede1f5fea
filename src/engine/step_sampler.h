#pragma once
// Token selection for one engine step, where the logits are when possible.
//
// A row is sampled on the device (Backend::sample_tokens: greedy, temperature, top-k, top-p, min-p, one
// small copy of the ids back) when the backend can and the request asks for no logprobs. Its logit_bias and
// repetition / presence / frequency penalties are applied on the device first, as LogitEdits with the host
// processors' rounding (Backend::edit_logits); a backend that cannot edit sends those rows to the host.
// Other rows are copied to the host one by one and go through BatchSampler (every processor). Without
// device sampling (CPU backend) the whole [rows, vocab] block is copied and sampled on the host, as before.
//
// The choice depends only on the request's own parameters, so a request always takes the same path
// whatever else shares its batch. Device draws are keyed by (sequence seed, generated-token index):
// seeded requests give the same text in any batch, after a preemption, and between runs. Greedy rows
// pick the lowest index among equal maxima on both paths, so greedy output is identical either way.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "engine/batch_sampler.h"
#include "engine/scheduler.h"

namespace inferx {

// True when `seq`'s token can be chosen on the device: everything but logprobs (computed on the host from
// the raw row) and structured output (its mask is built on the host); its logit_bias and penalties are
// then applied there as edits (needs_logit_edits).
bool samples_on_device(const Sequence& seq);
bool needs_logit_edits(const Sequence& seq);
// The draw in [0, 1) for the token at generated index `token_index` of a sequence seeded `seed`
// (splitmix64 of both; 24 bits, so exactly representable and below 1).
float device_uniform(uint64_t seed, int64_t token_index);
// The device sampler's parameters for the next token of `seq`; `pending` tokens sampled before it have not
// been appended yet (an overlapped decode step: its draw index is past them).
TokenSampleParams device_sample_params(const Sequence& seq, int32_t pending = 0);

class StepSampler {
 public:
  // allow_device false: always the host path (INFERX_DEVICE_SAMPLING=0, comparisons). `pool` (may be
  // null) runs the host rows of large batches.
  StepSampler(Backend& backend, bool allow_device, ThreadPool* pool);

  // `logits` [rows, vocab] F32 in backend memory: one row per sampled sequence of `out`, in order.
  // Replaces `result` with one SampledToken per sampled sequence, in the same order.
  void sample(const SchedulerOutput& out, const Tensor& logits, std::vector<SampledToken>& result);

  // Overlapped decode steps (engine.cpp: step N + 1 launched before step N's ids reach the host). Whether
  // every sampled row of `out` can be sampled asynchronously (Backend::async_sampling), on the device and
  // without edits.
  bool can_sample_async(const SchedulerOutput& out) const;
  // Queues the sampling of every row of `out` (all sampled, one logits row each) into the backend's
  // `slot`; `pending`: tokens of each sequence sampled but not appended yet.
  void sample_async(const SchedulerOutput& out, const Tensor& logits, int slot, int32_t pending);
  // Waits for `slot`'s `rows` ids.
  void collect_async(int slot, int64_t rows, std::vector<int32_t>& ids);

  // Rows sampled on each path so far (tests, stats).
  int64_t device_rows() const { return device_rows_; }
  // Rows an overlapped step sampled whose sequence had already ended (their ids are never read).
  void uncount_device_rows(int64_t rows);
  int64_t host_rows() const { return host_rows_; }

 private:
  void sample_on_host(const Tensor& logits, std::vector<SampledToken>& result);

  Backend& backend_;
  bool device_ok_;  // cleared for good the first time the backend answers that it cannot
  BatchSampler host_;
  std::vector<Sequence*> seqs_, host_seqs_;
  std::vector<int32_t> host_index_, ids_;
  std::vector<TokenSampleParams> params_;
  std::vector<LogitEdit> edits_;
  std::vector<int32_t> edit_rows_;
  std::vector<float> logits_host_;
  std::vector<SampledToken> host_result_;
  int64_t device_rows_ = 0, host_rows_ = 0;
};

}  // namespace inferx
