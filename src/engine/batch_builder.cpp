#include "engine/batch_builder.h"

#include <algorithm>

#include "core/error.h"

namespace inferx {

BatchView BatchBuilder::build(const SchedulerOutput& out) {
  INFERX_CHECK(!out.seqs.empty(), "batch builder: empty schedule");
  const auto S = static_cast<int32_t>(out.seqs.size());
  const int32_t T = out.num_tokens;
  int32_t max_blocks = 1, num_logits = 0, max_query = 0, max_seq = 0, decode_prefix = 0;
  bool in_prefix = true;  // the leading run of one-token sequences (BatchView::num_decode_prefix)
  for (const ScheduledSequence& s : out.seqs) {
    in_prefix = in_prefix && s.num_new == 1;
    decode_prefix += in_prefix ? 1 : 0;
    max_blocks = std::max(max_blocks, static_cast<int32_t>(s.seq->blocks.size()));
    num_logits += s.sample ? 1 : 0;
    max_query = std::max(max_query, s.num_new);
    max_seq = std::max(max_seq, s.start + s.num_new);
  }
  const BatchLayout layout(T, S, max_blocks, num_logits);
  const size_t o_pos = layout.positions(), o_qs = layout.query_start(), o_len = layout.seq_lens(),
               o_bt = layout.block_tables(), o_rows = layout.logits_rows(), total = layout.total();
  host_.resize(total);  // capacity is kept between steps
  int32_t* h = host_.data();
  int32_t t = 0, logit = 0;
  for (int32_t i = 0; i < S; ++i) {
    const ScheduledSequence& s = out.seqs[static_cast<size_t>(i)];
    const int32_t* tokens = s.seq->tokens.data() + s.start;
    h[o_qs + static_cast<size_t>(i)] = t;
    for (int32_t k = 0; k < s.num_new; ++k, ++t) {
      h[static_cast<size_t>(t)] = tokens[k];
      h[o_pos + static_cast<size_t>(t)] = s.start + k;
    }
    h[o_len + static_cast<size_t>(i)] = s.start + s.num_new;
    int32_t* bt = h + o_bt + static_cast<size_t>(i) * static_cast<size_t>(max_blocks);
    const auto nb = static_cast<int32_t>(s.seq->blocks.size());
    // Blocks dropped by a sliding window (-1) are never read (attention starts inside the window); 0
    // keeps every entry a valid block id anyway.
    for (int32_t j = 0; j < nb; ++j) bt[j] = std::max(s.seq->blocks[static_cast<size_t>(j)], 0);
    std::fill(bt + nb, bt + max_blocks, 0);
    if (s.sample) h[o_rows + static_cast<size_t>(logit++)] = t - 1;
  }
  h[o_qs + static_cast<size_t>(S)] = t;

  const size_t bytes = total * sizeof(int32_t);
  ensure_device(bytes);
  backend_.copy_to_device(device_->data(), h, bytes);
  BatchView b = layout.view(static_cast<const int32_t*>(device_->data()));
  b.max_query_len = max_query;
  b.max_seq_len = max_seq;
  b.num_decode_prefix = decode_prefix;
  return b;
}

void BatchBuilder::ensure_device(size_t bytes) {
  if (!device_ || device_->size() < bytes) device_ = backend_.allocate(bytes * 2);  // headroom: grow rarely
}

void BatchBuilder::reserve(int32_t tokens, int32_t seqs, int32_t max_blocks, int32_t logits) {
  const size_t total = BatchLayout(tokens, seqs, max_blocks, logits).total();
  host_.reserve(total);
  ensure_device(total * sizeof(int32_t));
}

}  // namespace inferx
