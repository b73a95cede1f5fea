#include "engine/warm_up.h"

#include <algorithm>

#include "core/error.h"

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

int32_t warm_up_step_sizes(Model& model, KvCache& kv, int32_t scratch_block,
                           const std::vector<int32_t>& counts) {
  INFERX_CHECK(scratch_block >= 0 && scratch_block < kv.num_blocks(),
               "warm-up: scratch block {} is not in the cache of {} blocks", scratch_block, kv.num_blocks());
  Backend& be = model.backend();
  for (const int32_t t : counts) {
    INFERX_CHECK(t > 0, "warm-up: token count {} must be positive", t);
    const BatchLayout layout(t, t, 1, 1);
    const size_t total = layout.total();
    auto host = be.allocate_upload(total * sizeof(int32_t));
    auto* h = static_cast<int32_t*>(host->data());
    std::fill(h, h + total, 0);  // token ids and positions 0
    for (int32_t i = 0; i < t; ++i) {
      h[layout.query_start() + static_cast<size_t>(i)] = i;
      h[layout.seq_lens() + static_cast<size_t>(i)] = 1;
      h[layout.block_tables() + static_cast<size_t>(i)] = scratch_block;
    }
    h[layout.query_start() + static_cast<size_t>(t)] = t;
    h[layout.logits_rows()] = 0;
    auto device = be.allocate(total * sizeof(int32_t));
    be.copy_to_device(device->data(), h, total * sizeof(int32_t));
    BatchView v = layout.view(static_cast<const int32_t*>(device->data()));
    v.max_query_len = 1;
    v.max_seq_len = 1;
    v.num_decode_prefix = t;  // every row a one-token sequence: the decode attention takes them all
    model.forward(v, kv);
    be.synchronize();  // before the metadata's memory goes
  }
  return static_cast<int32_t>(counts.size());
}

}  // namespace inferx
