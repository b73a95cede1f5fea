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
                           const std::vector<int32_t>& counts, int32_t decode_rows) {
  INFERX_CHECK(scratch_block >= 0 && scratch_block < kv.num_blocks(),
               "warm-up: scratch block {} is not in the cache of {} blocks", scratch_block, kv.num_blocks());
  Backend& be = model.backend();
  const auto bs = static_cast<int32_t>(kv.block_size());
  for (const int32_t t : counts) {
    INFERX_CHECK(t > 0, "warm-up: token count {} must be positive", t);
    const int32_t d = std::min(std::max(decode_rows, 0), t / 2), rest = t - d;
    const int32_t seqs = d + (rest + bs - 1) / bs;
    const BatchLayout layout(t, seqs, 1, 1);
    const size_t total = layout.total();
    auto host = be.allocate_upload(total * sizeof(int32_t));
    auto* h = static_cast<int32_t*>(host->data());
    std::fill(h, h + total, 0);  // token ids 0
    int32_t tok = 0;
    for (int32_t s = 0; s < seqs; ++s) {
      const int32_t n = s < d ? 1 : std::min(bs, t - tok);
      h[layout.query_start() + static_cast<size_t>(s)] = tok;
      for (int32_t k = 0; k < n; ++k) h[layout.positions() + static_cast<size_t>(tok + k)] = k;
      h[layout.seq_lens() + static_cast<size_t>(s)] = n;
      h[layout.block_tables() + static_cast<size_t>(s)] = scratch_block;
      tok += n;
    }
    h[layout.query_start() + static_cast<size_t>(seqs)] = t;
    h[layout.logits_rows()] = t - 1;
    auto device = be.allocate(total * sizeof(int32_t));
    be.copy_to_device(device->data(), h, total * sizeof(int32_t));
    BatchView v = layout.view(static_cast<const int32_t*>(device->data()));
    v.max_query_len = rest > 0 ? std::min(bs, rest) : 1;
    v.max_seq_len = v.max_query_len;
    v.num_decode_prefix = d;
    model.forward(v, kv);
    be.synchronize();  // before the metadata's memory goes
  }
  return static_cast<int32_t>(counts.size());
}

}  // namespace inferx
