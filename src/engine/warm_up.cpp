#include "engine/warm_up.h"

#include <algorithm>

#include "core/error.h"
#include "engine/sequence.h"

namespace inferx {

std::vector<int32_t> warm_up_token_counts(int32_t max_tokens, int32_t floor) {
  std::vector<int32_t> counts;
  if (max_tokens <= floor) return counts;
  counts.push_back(max_tokens);
  int64_t p = 1;
  while (2 * p < max_tokens) p *= 2;  // the largest power of two below max_tokens
  for (; p > floor; p /= 2) counts.push_back(static_cast<int32_t>(p));
  return counts;
}

int32_t warm_up_step_sizes(Model& model, KvCache& kv, BatchBuilder& builder, int32_t scratch_block,
                           const std::vector<int32_t>& counts, int32_t decode_rows) {
  INFERX_CHECK(scratch_block >= 0 && scratch_block < kv.num_blocks(),
               "warm-up: scratch block {} is not in the cache of {} blocks", scratch_block, kv.num_blocks());
  const auto bs = static_cast<int32_t>(kv.block_size());
  // Two stand-in sequences living in the scratch block: a decode row (one token at position 0) and a chunk
  // (up to a block of tokens from position 0); every scheduled row points at one of them.
  Sequence decode, chunk;
  decode.tokens.assign(1, 0);
  chunk.tokens.assign(static_cast<size_t>(bs), 0);
  decode.blocks.assign(1, scratch_block);
  chunk.blocks.assign(1, scratch_block);
  SchedulerOutput out;
  for (const int32_t t : counts) {
    INFERX_CHECK(t > 0, "warm-up: token count {} must be positive", t);
    const int32_t d = std::min(std::max(decode_rows, 0), t / 2);
    out.seqs.clear();
    out.num_tokens = t;
    for (int32_t i = 0; i < d; ++i) out.seqs.push_back({&decode, 0, 1, false});
    for (int32_t tok = d; tok < t; tok += bs) out.seqs.push_back({&chunk, 0, std::min(bs, t - tok), false});
    out.seqs.back().sample = true;  // one row of logits: the last token's
    model.forward(builder.build(out), kv);
  }
  return static_cast<int32_t>(counts.size());
}

}  // namespace inferx
