#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"
#include "engine/block_table.h"

namespace inferx {

Scheduler::Scheduler(const SchedulerConfig& config, BlockPool& pool) : config_(config), pool_(pool) {
  INFERX_CHECK(config.max_num_batched_tokens > 0,
               "scheduler: max_num_batched_tokens must be positive, got {}", config.max_num_batched_tokens);
  INFERX_CHECK(config.max_batch_size > 0, "scheduler: max_batch_size must be positive, got {}",
               config.max_batch_size);
  INFERX_CHECK(config.block_size > 0, "scheduler: block_size must be positive, got {}", config.block_size);
  running_.reserve(static_cast<size_t>(config.max_batch_size) * 2);
  order_.reserve(static_cast<size_t>(config.max_batch_size) * 2);
  out_.seqs.reserve(static_cast<size_t>(config.max_batch_size) * 2);
}

int32_t Scheduler::pending_forks(const Sequence* s) {
  return (s->index == 0 && !s->request->forked) ? std::max(s->request->req.params.n, 1) - 1 : 0;
}

Scheduler::WaitingKey Scheduler::key(Sequence* s) {
  return {s->request->req.priority, s->request->arrival_order, s->index, s};
}

void Scheduler::add_waiting(Sequence* seq) {
  if (seq->status != SequenceStatus::Preempted) seq->status = SequenceStatus::Waiting;
  waiting_.insert(key(seq));
}

void Scheduler::fork(const Sequence& parent, Sequence& child) {
  INFERX_CHECK(parent.num_computed >= parent.num_prompt, "scheduler: fork before the prompt is computed");
  const int32_t bs = config_.block_size;
  // Full blocks strictly before the last prompt token: the child computes the last token itself (it
  // needs its logits) and writes into blocks of its own, never into shared ones.
  const int32_t shared =
      std::min<int32_t>((child.num_prompt - 1) / bs, static_cast<int32_t>(parent.blocks.size()));
  child.blocks.assign(parent.blocks.begin(), parent.blocks.begin() + shared);
  for (int32_t b : child.blocks) {
    if (b >= 0) pool_.retain(b);
  }
  child.num_released_blocks = std::min(parent.num_released_blocks, shared);
  child.num_computed = shared * bs;
  child.num_cached_blocks = std::min(parent.num_cached_blocks, shared);
  const size_t hashes = std::min(parent.block_hashes.size(), static_cast<size_t>(shared));
  child.block_hashes.assign(parent.block_hashes.begin(),
                            parent.block_hashes.begin() + static_cast<ptrdiff_t>(hashes));
  child.status = SequenceStatus::Running;
  running_.push_back(&child);
  if (reserved_ > 0) --reserved_;  // the slot the parent's admission reserved for this child
}

void Scheduler::release_all_blocks(Sequence* seq) {
  // Reverse order: the tail blocks (least likely shared) reach the LRU head first and are evicted first.
  for (auto it = seq->blocks.rbegin(); it != seq->blocks.rend(); ++it) {
    if (*it >= 0) pool_.release(*it);
  }
  seq->blocks.clear();
  seq->num_released_blocks = 0;
  seq->num_cached_blocks = 0;
  seq->num_computed = 0;
}

void Scheduler::remove(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) {
    running_.erase(it);
    reserved_ -= pending_forks(seq);
  }
  waiting_.erase(key(seq));
  release_all_blocks(seq);
}

void Scheduler::preempt(Sequence* seq) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  reserved_ -= pending_forks(seq);
  // Unschedule it if it already got tokens this step: its budget goes back to the others.
  for (auto it = out_.seqs.begin(); it != out_.seqs.end(); ++it) {
    if (it->seq == seq) {
      budget_ += it->num_new;
      out_.num_tokens -= it->num_new;
      out_.seqs.erase(it);
      break;
    }
  }
  release_all_blocks(seq);
  seq->status = SequenceStatus::Preempted;
  waiting_.insert(key(seq));
  out_.preempted.push_back(seq);
  ++counters_.preemptions;
}

void Scheduler::release_window_blocks(Sequence* seq) {
  const int32_t dead =
      std::min<int32_t>(blocks_outside_window(seq->num_computed, config_.sliding_window, config_.block_size),
                        static_cast<int32_t>(seq->blocks.size()));
  for (int32_t j = seq->num_released_blocks; j < dead; ++j) {
    int32_t& b = seq->blocks[static_cast<size_t>(j)];
    if (b >= 0) pool_.release(b);
    b = -1;
  }
  seq->num_released_blocks = std::max(seq->num_released_blocks, dead);
}

bool Scheduler::ensure_blocks(Sequence* seq, int64_t total_tokens) {
  const int32_t need =
      blocks_for_tokens(total_tokens, config_.block_size) - static_cast<int32_t>(seq->blocks.size());
  while (need > pool_.num_free()) {
    // Victim: the lowest-priority (largest value), newest running sequence (vLLM's priority policy).
    auto victim = std::max_element(running_.begin(), running_.end(),
                                   [](Sequence* a, Sequence* b) { return key(a) < key(b); });
    Sequence* v = *victim;
    preempt(v);
    if (v == seq) return false;
  }
  for (int32_t i = 0; i < need; ++i) seq->blocks.push_back(pool_.allocate());
  return true;
}

void Scheduler::push(Sequence* seq, int32_t num_new) {
  ScheduledSequence s;
  s.seq = seq;
  s.start = seq->num_computed;
  s.num_new = num_new;
  s.sample = seq->num_computed + num_new == static_cast<int32_t>(seq->tokens.size());
  out_.seqs.push_back(s);
  out_.num_tokens += num_new;
  budget_ -= num_new;
}

void Scheduler::schedule_running(bool decodes) {
  order_.assign(running_.begin(), running_.end());
  for (Sequence* seq : order_) {
    if (budget_ <= 0) return;
    if (seq->status != SequenceStatus::Running) continue;  // preempted earlier in this pass
    const int32_t remaining = static_cast<int32_t>(seq->tokens.size()) - seq->num_computed;
    if (remaining <= 0 || (remaining == 1) != decodes) continue;
    const int32_t num_new = std::min(remaining, budget_);
    if (num_new < remaining && !config_.enable_chunked_prefill) continue;
    release_window_blocks(seq);
    if (!ensure_blocks(seq, seq->num_computed + num_new)) continue;  // it preempted itself
    push(seq, num_new);
  }
}

void Scheduler::schedule_waiting() {
  const int32_t bs = config_.block_size;
  while (!waiting_.empty() && budget_ > 0) {
    Sequence* seq = std::get<3>(*waiting_.begin());
    // A request's first admission reserves room for all n sequences it will fork into.
    RequestState& r = *seq->request;
    const int32_t forks = pending_forks(seq);
    if (static_cast<int32_t>(running_.size()) + reserved_ + 1 + forks > config_.max_batch_size) return;

    const auto len = static_cast<int32_t>(seq->tokens.size());
    int32_t hit_blocks = 0;
    if (pool_.prefix_caching()) {
      // At most the blocks before the last token: that one is always computed, for its logits.
      const int32_t max_blocks = (len - 1) / bs;
      extend_block_hashes(seq->tokens, bs, max_blocks, seq->block_hashes);
      hit_blocks = pool_.prefix_cache().longest_cached_prefix(seq->block_hashes, max_blocks);
    }
    const int32_t computed = hit_blocks * bs;
    const int32_t remaining = len - computed;
    const int32_t num_new = std::min(remaining, budget_);
    if (num_new < remaining && !config_.enable_chunked_prefill) return;
    int32_t hits_now_free = 0;
    for (int32_t j = 0; j < hit_blocks; ++j) {
      if (pool_.ref_count(pool_.find_cached(seq->block_hashes[static_cast<size_t>(j)])) == 0) ++hits_now_free;
    }
    const int32_t new_blocks = blocks_for_tokens(computed + num_new, bs) - hit_blocks;
    if (pool_.num_free() - hits_now_free < new_blocks) return;  // no preemption for admissions

    waiting_.erase(waiting_.begin());
    seq->blocks.clear();
    for (int32_t j = 0; j < hit_blocks; ++j) {
      const int32_t b = pool_.find_cached(seq->block_hashes[static_cast<size_t>(j)]);
      pool_.retain(b);
      seq->blocks.push_back(b);
    }
    for (int32_t j = 0; j < new_blocks; ++j) seq->blocks.push_back(pool_.allocate());
    seq->num_computed = computed;
    seq->num_cached_blocks = hit_blocks;
    seq->num_released_blocks = 0;
    release_window_blocks(seq);
    counters_.prefix_cache_queries += len;
    counters_.prefix_cache_hits += computed;
    if (seq->index == 0 && r.times.scheduled == 0) r.cached_prompt_tokens = computed;  // first admission
    seq->status = SequenceStatus::Running;
    running_.push_back(seq);
    reserved_ += forks;
    push(seq, num_new);
  }
}

const SchedulerOutput& Scheduler::schedule() {
  out_.seqs.clear();
  out_.preempted.clear();
  out_.num_tokens = 0;
  budget_ = config_.max_num_batched_tokens;
  schedule_running(/*decodes=*/true);
  schedule_running(/*decodes=*/false);
  // Sequences preempted this step mean KV is short: admitting new ones would only thrash.
  if (out_.preempted.empty()) schedule_waiting();
  return out_;
}

const SchedulerOutput* Scheduler::schedule_after(const SchedulerOutput& prev, const std::vector<char>& ends) {
  INFERX_CHECK(ends.size() == prev.seqs.size(), "scheduler: {} end flags for {} sequences", ends.size(),
               prev.seqs.size());
  if (prev.seqs.size() != running_.size()) return nullptr;
  int32_t continuing = 0, new_blocks = 0;
  for (size_t i = 0; i < prev.seqs.size(); ++i) {
    const ScheduledSequence& s = prev.seqs[i];
    if (s.num_new != 1 || !s.sample || s.seq->status != SequenceStatus::Running) return nullptr;
    if (ends[i]) continue;
    ++continuing;
    new_blocks += blocks_for_tokens(s.seq->num_computed + 1, config_.block_size) -
                  static_cast<int32_t>(s.seq->blocks.size());
  }
  if (continuing == 0 || continuing > config_.max_num_batched_tokens) return nullptr;
  // Blocks a sliding window releases this step are not counted: schedule() would be no shorter of blocks.
  if (new_blocks > pool_.num_free()) return nullptr;
  if (!waiting_.empty()) {
    const int32_t forks = pending_forks(std::get<3>(*waiting_.begin()));
    if (continuing + reserved_ + 1 + forks <= config_.max_batch_size) return nullptr;  // it would admit
  }
  out_.seqs.clear();
  out_.preempted.clear();
  out_.num_tokens = 0;
  for (size_t i = 0; i < prev.seqs.size(); ++i) {
    if (ends[i]) continue;
    Sequence* seq = prev.seqs[i].seq;
    release_window_blocks(seq);
    const bool ok = ensure_blocks(seq, seq->num_computed + 1);  // counted above: never preempts
    INFERX_CHECK(ok, "scheduler: overlapped step ran out of blocks after counting them");
    ScheduledSequence s;
    s.seq = seq;
    s.start = seq->num_computed;
    s.num_new = 1;
    s.sample = true;  // the token it feeds is not in seq->tokens yet
    out_.seqs.push_back(s);
    out_.num_tokens += 1;
  }
  return &out_;
}

void Scheduler::on_step_computed(const SchedulerOutput& out) {
  const int32_t bs = config_.block_size;
  for (const ScheduledSequence& s : out.seqs) {
    Sequence* seq = s.seq;
    seq->num_computed += s.num_new;
    counters_.computed_tokens += s.num_new;
    if (!pool_.prefix_caching()) continue;
    const int32_t full = seq->num_computed / bs;
    if (full <= seq->num_cached_blocks) continue;
    extend_block_hashes(seq->tokens, bs, full, seq->block_hashes);
    for (int32_t j = seq->num_cached_blocks; j < full; ++j) {
      const int32_t b = seq->blocks[static_cast<size_t>(j)];
      if (b >= 0) pool_.cache(b, seq->block_hashes[static_cast<size_t>(j)]);
    }
    seq->num_cached_blocks = full;
  }
}

}  // namespace inferx
