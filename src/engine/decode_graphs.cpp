#include "engine/decode_graphs.h"

#include <algorithm>

#include "core/error.h"

namespace inferx {

std::vector<int32_t> decode_buckets(int32_t max_batch_size) {
  std::vector<int32_t> b;
  for (int32_t v : {1, 2, 4, 8, 16, 24, 32}) {
    if (v < max_batch_size) b.push_back(v);
  }
  for (int32_t v = 48; v < max_batch_size; v += v < 256 ? 16 : 32) b.push_back(v);
  b.push_back(max_batch_size);
  return b;
}

DecodeGraphs::DecodeGraphs(Model& model, KvCache& kv, const DecodeGraphConfig& config)
    : model_(model), kv_(kv), config_(config), buckets_(decode_buckets(config.max_batch_size)) {
  INFERX_CHECK(config_.max_blocks_per_seq > 0, "decode graphs: max_blocks_per_seq must be positive");
  INFERX_CHECK(config_.scratch_block >= 0 && config_.scratch_block < kv.num_blocks(),
               "decode graphs: scratch block {} is not in the cache of {} blocks", config_.scratch_block,
               kv.num_blocks());
  // A padded bucket B is B one-token sequences, each wanting logits; after the layout, an overlapped
  // step's row map (SampledTokenSource::prev_rows) for the token gather.
  const size_t ints =
      BatchLayout(buckets_.back(), buckets_.back(), config_.max_blocks_per_seq, buckets_.back()).total() +
      static_cast<size_t>(buckets_.back());
  for (auto& h : host_) h = model_.backend().allocate_upload(ints * sizeof(int32_t));
  // Allocated once, before any recording: its address never changes.
  device_ = model_.backend().allocate(ints * sizeof(int32_t));
  if (config_.short_context > 0 &&
      static_cast<int64_t>(config_.short_context) < int64_t{config_.max_blocks_per_seq} * kv.block_size())
    short_context_ = config_.short_context;
  state_.assign(buckets_.size() + 1, 0);  // the last slot: batch 1's short-context recording
  graph_logits_.resize(buckets_.size() + 1);
}

DecodeGraphs::~DecodeGraphs() {
  for (size_t i = 0; i < state_.size(); ++i) {
    if (state_[i] == 1) {
      try {
        model_.backend().drop_graph(key(i));
      } catch (const std::exception&) {  // never throw from a destructor
      }
    }
  }
}

int32_t DecodeGraphs::bucket_for(int32_t num_seqs) const {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), num_seqs);
  INFERX_CHECK(it != buckets_.end(), "decode graphs: {} sequences exceed the largest bucket {}", num_seqs,
               buckets_.back());
  return *it;
}

bool DecodeGraphs::accepts(const SchedulerOutput& out) const {
  if (out.seqs.empty() || static_cast<int32_t>(out.seqs.size()) > buckets_.back()) return false;
  for (const ScheduledSequence& s : out.seqs) {
    if (s.num_new != 1 || !s.sample) return false;
    if (static_cast<int64_t>(s.seq->blocks.size()) > config_.max_blocks_per_seq) return false;
  }
  return true;
}

bool DecodeGraphs::short_class(const SchedulerOutput& out, int32_t bucket) const {
  if (bucket != 1 || short_context_ == 0) return false;
  for (const ScheduledSequence& s : out.seqs) {
    if (s.start + 1 > short_context_) return false;
  }
  return true;
}

size_t DecodeGraphs::slot(int32_t bucket, bool short_len) const {
  if (short_len) return buckets_.size();
  const auto it = std::lower_bound(buckets_.begin(), buckets_.end(), bucket);
  INFERX_CHECK(it != buckets_.end() && *it == bucket, "decode graphs: {} is not a bucket", bucket);
  return static_cast<size_t>(it - buckets_.begin());
}

BatchView DecodeGraphs::build(const SchedulerOutput& out, int32_t bucket, const SampledTokenSource* tokens) {
  return build_for(out, bucket, tokens, short_class(out, bucket));
}

BatchView DecodeGraphs::build_for(const SchedulerOutput& out, int32_t bucket,
                                  const SampledTokenSource* tokens, bool short_len) {
  const auto S = static_cast<int32_t>(out.seqs.size());
  const int32_t B = bucket, M = config_.max_blocks_per_seq;
  INFERX_CHECK(S >= 0 && S <= B && B <= buckets_.back(), "decode graphs: {} sequences in a bucket of {}", S,
               B);
  const BatchLayout layout(B, B, M, B);
  const size_t o_pos = layout.positions(), o_qs = layout.query_start(), o_len = layout.seq_lens(),
               o_bt = layout.block_tables(), o_rows = layout.logits_rows(), total = layout.total();
  int32_t* h = static_cast<int32_t*>(host_[next_host_]->data());
  next_host_ ^= 1;
  const int32_t scratch = config_.scratch_block;
  for (int32_t i = 0; i < B; ++i) {
    const auto k = static_cast<size_t>(i);
    int32_t* bt = h + o_bt + k * static_cast<size_t>(M);
    h[o_qs + k] = i;
    h[o_rows + k] = i;
    if (i < S) {
      const ScheduledSequence& s = out.seqs[k];
      h[k] = tokens ? 0 : s.seq->tokens[static_cast<size_t>(s.start)];  // gathered below
      h[o_pos + k] = s.start;
      h[o_len + k] = s.start + 1;
      const auto nb = static_cast<int32_t>(s.seq->blocks.size());
      // Blocks a sliding window dropped (-1) are never read; the scratch block keeps the entry valid.
      for (int32_t j = 0; j < nb; ++j) {
        const int32_t id = s.seq->blocks[static_cast<size_t>(j)];
        bt[j] = id >= 0 ? id : scratch;
      }
      std::fill(bt + nb, bt + M, scratch);
    } else {  // padding: a one-token sequence at position 0 living in the scratch block
      h[k] = 0;
      h[o_pos + k] = 0;
      h[o_len + k] = 1;
      std::fill(bt, bt + M, scratch);
    }
  }
  h[o_qs + static_cast<size_t>(B)] = B;
  size_t upload = total;
  if (tokens) {
    INFERX_CHECK(tokens->prev_rows && tokens->prev_rows->size() == static_cast<size_t>(S),
                 "decode graphs: {} sampled-token rows for {} sequences",
                 tokens->prev_rows ? tokens->prev_rows->size() : 0, S);
    std::copy(tokens->prev_rows->begin(), tokens->prev_rows->end(), h + total);
    upload += static_cast<size_t>(S);
  }
  // Queued: the sampling at the end of the step waits for the device, long before this copy is reused.
  Backend& be = model_.backend();
  // After the mark run_bucket left behind the previous step's forward, the last reader of device_: a backend
  // may copy beside that step's sampling.
  be.upload_async_after_mark(device_->data(), h, upload * sizeof(int32_t));
  auto* dev = static_cast<int32_t*>(device_->data());
  if (tokens) be.gather_sampled_tokens(tokens->slot, dev + total, S, dev);  // the token ids lead the layout
  BatchView v = layout.view(static_cast<const int32_t*>(device_->data()));
  v.max_query_len = 1;
  // A host hint frozen into a recording: the largest length any replay may see.
  v.max_seq_len = short_len ? short_context_ : M * static_cast<int32_t>(kv_.block_size());
  return v;
}

Tensor DecodeGraphs::run(const SchedulerOutput& out, const SampledTokenSource* tokens) {
  INFERX_CHECK(!out.seqs.empty(), "decode graphs: a step without sequences");
  const auto S = static_cast<int32_t>(out.seqs.size());
  const int32_t B = bucket_for(S);
  return run_bucket(out, B, tokens, short_class(out, B)).rows_view(0, S);
}

int32_t DecodeGraphs::warm_up() {
  const SchedulerOutput none;
  for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) run_bucket(none, *it, nullptr, false);
  if (short_context_ > 0) run_bucket(none, 1, nullptr, true);
  return static_cast<int32_t>(buckets_.size());
}

int32_t DecodeGraphs::bucket_state(int32_t bucket, bool short_context) const {
  INFERX_CHECK(!short_context || bucket == 1, "decode graphs: only batch 1 has a short-context recording");
  return state_[slot(bucket, short_context)];
}

Tensor DecodeGraphs::run_bucket(const SchedulerOutput& out, int32_t B, const SampledTokenSource* tokens,
                                bool short_len) {
  const size_t bi = slot(B, short_len);
  const BatchView batch = build_for(out, B, tokens, short_len);
  Backend& be = model_.backend();
  if (state_[bi] == 1) {
    if (be.replay_graph(key(bi))) {
      ++replays_;
      be.mark_upload_point();  // nothing queued after this reads device_ before the next build_for
      return graph_logits_[bi];
    }
    state_[bi] = 0;  // the backend dropped it (a buffer moved): record again below
  }
  const Tensor logits = model_.forward(batch, kv_);
  if (config_.capture && state_[bi] == 0 && be.begin_graph_capture()) {
    try {
      // Recorded, not run: the eager step above already computed this step.
      graph_logits_[bi] = model_.forward(batch, kv_);
      be.end_graph_capture(key(bi));
      state_[bi] = graph_logits_[bi].data == logits.data ? 1 : 0;
      if (state_[bi] == 1) ++captures_;
    } catch (const Error&) {
      be.end_graph_capture(key(bi), false);
      state_[bi] = -1;  // e.g. an op that cannot be recorded: this bucket stays eager
    }
  }
  be.mark_upload_point();
  return logits;
}

}  // namespace inferx
