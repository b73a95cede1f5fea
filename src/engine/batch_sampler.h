#pragma once
// Samples the next token of every sequence that reached the end of its tokens this step, from the logits
// of the whole batch (one host copy of [num_logits, vocab]). Each sequence has its own generator
// (Sequence::sampler, seeded per request and sequence), so a seeded request draws the same tokens
// whatever else shares its batch; processing happens row by row in place:
//   logprobs of the raw row (if asked) -> logit_bias -> penalties -> temperature/top-k/top-p/min-p -> draw.
// Rows are independent (each touches only its own row, penalty state and generator), so they may be
// sampled in parallel on a ThreadPool with results identical to sampling them one after another.
#include <cstdint>
#include <vector>

#include "engine/scheduler.h"

namespace inferx {

struct SampledToken {
  Sequence* seq = nullptr;
  int32_t token = -1;
  bool has_logprob = false;
  TokenLogprob logprob;
};

class ThreadPool;

class BatchSampler {
 public:
  BatchSampler() = default;
  // `pool` (not owned, may be null: rows on the calling thread) runs the rows of large batches.
  explicit BatchSampler(ThreadPool* pool) : pool_(pool) {}
  void set_thread_pool(ThreadPool* pool) { pool_ = pool; }

  // `logits` rows follow the order of the sampled sequences in `out` (BatchBuilder's logits rows).
  // The rows are modified in place. Appends one SampledToken per sampled sequence to `result`.
  void sample(const SchedulerOutput& out, float* logits, int64_t vocab, std::vector<SampledToken>& result);
  // The same for an explicit list: row i of `logits` belongs to seqs[i]. Replaces `result`'s contents.
  void sample_rows(const std::vector<Sequence*>& seqs, float* logits, int64_t vocab,
                   std::vector<SampledToken>& result);

 private:
  ThreadPool* pool_ = nullptr;
  std::vector<float*> rows_;
  std::vector<Sequence*> seqs_;
};

}  // namespace inferx
