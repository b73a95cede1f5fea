#pragma once
// The token-budget scheduler (vLLM v1 sched/scheduler.py): each step hands every chosen sequence a number
// of tokens and nothing else, so prefill, chunked prefill and decode are one mechanism.
//   1. Running sequences with one token to compute (decodes) go first: a long prompt never stalls them.
//   2. Running sequences part-way through their prompt (chunked prefill) take what is left of the budget.
//   3. Waiting sequences are admitted by priority (lower first), then arrival (FCFS), while the budget,
//      --max-batch-size and free KV blocks allow; their longest cached prefix is reused, not recomputed.
// When a running sequence needs a block and none is free, the lowest-priority newest running sequence is
// preempted by recompute: its blocks are freed and it goes back to the waiting queue with its tokens, to be
// fed through the model again on resumption (its sampled tokens and generator are kept, so the output
// is the same as without preemption).
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "engine/block_pool.h"
#include "engine/sequence.h"

namespace inferx {

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 2048;
  int32_t max_batch_size = 256;
  int32_t block_size = 16;
  bool enable_chunked_prefill = true;
  int64_t sliding_window = 0;  // > 0: blocks that fall out of the window are freed
};

struct ScheduledSequence {
  Sequence* seq = nullptr;
  int32_t start = 0;    // num_computed when scheduled: the position of the first new token
  int32_t num_new = 0;  // tokens fed this step
  bool sample = false;  // the step reaches the end of the sequence's tokens: a token is sampled
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> seqs;
  int32_t num_tokens = 0;
  std::vector<Sequence*> preempted;  // this step
  bool empty() const { return seqs.empty(); }
};

struct SchedulerCounters {
  int64_t preemptions = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // tokens
  int64_t computed_tokens = 0;                              // fed through the model
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockPool& pool);

  // A new sequence (or nothing yet computed) joins the waiting queue.
  void add_waiting(Sequence* seq);
  // `child` (tokens = the parent's prompt) shares the parent's full prompt blocks and joins the running
  // set; it computes the rest of the prompt (less than one block) itself. The parent's prompt must be
  // computed.
  void fork(const Sequence& parent, Sequence& child);
  // Removes a finished or aborted sequence from the queues and frees its blocks.
  void remove(Sequence* seq);

  // Plans one step. The output stays valid until the next call.
  const SchedulerOutput& schedule();
  // Plans the step after `prev` while prev's sampled tokens are still on their way (an overlapped decode
  // step, engine.cpp): each sequence of prev (every row a one-token decode that samples) feeds its pending
  // token at position num_computed, except those with ends[i] set (they end with prev's token, by length).
  // Returns null, having changed nothing, wherever schedule() after prev's tokens could plan otherwise: a
  // running sequence not in prev (a prompt part-way), a waiting sequence it would admit into a free slot,
  // or too few free blocks (it would preempt). prev must be on_step_computed already.
  const SchedulerOutput* schedule_after(const SchedulerOutput& prev, const std::vector<char>& ends);
  // After the forward pass: the scheduled tokens are computed; full blocks enter the prefix cache.
  void on_step_computed(const SchedulerOutput& out);

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const std::vector<Sequence*>& running() const { return running_; }
  const SchedulerCounters& counters() const { return counters_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  using WaitingKey = std::tuple<int32_t, uint64_t, int32_t, Sequence*>;  // priority, arrival, index
  static WaitingKey key(Sequence* seq);
  // Running slots a not yet forked first sequence holds for its n - 1 siblings.
  static int32_t pending_forks(const Sequence* seq);
  void schedule_running(bool decodes);
  void schedule_waiting();
  // Gives `seq` blocks up to `total_tokens`, preempting others (or itself: returns false) when short.
  bool ensure_blocks(Sequence* seq, int64_t total_tokens);
  void release_window_blocks(Sequence* seq);
  void release_all_blocks(Sequence* seq);
  void preempt(Sequence* seq);
  void push(Sequence* seq, int32_t num_new);

  SchedulerConfig config_;
  BlockPool& pool_;
  std::vector<Sequence*> running_;
  std::set<WaitingKey> waiting_;
  SchedulerOutput out_;
  std::vector<Sequence*> order_;  // scratch: the running set at the start of a pass
  int32_t budget_ = 0;
  int32_t reserved_ = 0;  // sum of pending_forks over running sequences
  SchedulerCounters counters_;
};

}  // namespace inferx
