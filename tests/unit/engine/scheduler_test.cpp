// The scheduler and block pool alone, driven by a fake model (the "next token" is a function of the
// sequence): starvation, prefix reuse, preemption, sliding window, forks, priorities and a randomized
// leak check.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>

#include "core/error.h"

namespace inferx {
namespace {

class Harness {
 public:
  Harness(int32_t num_blocks, SchedulerConfig config, bool caching = true)
      : pool(num_blocks, caching), sched(config, pool) {}

  Sequence* submit(std::vector<int32_t> prompt, int32_t max_tokens, int32_t priority = 0, int32_t n = 1) {
    auto r = std::make_unique<RequestState>();
    r->req.id = std::to_string(reqs.size());
    r->req.prompt = std::move(prompt);
    r->req.priority = priority;
    r->req.params.max_tokens = max_tokens;
    r->req.params.n = n;
    r->arrival_order = next_arrival++;
    r->seqs.push_back(make_seq(*r, 0));
    Sequence* s = r->seqs[0].get();
    sched.add_waiting(s);
    reqs.push_back(std::move(r));
    return s;
  }

  // One step of the fake model: sampled sequences get token f(length); finished ones leave.
  const SchedulerOutput& step() {
    const SchedulerOutput& out = sched.schedule();
    sched.on_step_computed(out);
    for (const ScheduledSequence& s : out.seqs) {
      if (!s.sample) continue;
      Sequence* seq = s.seq;
      RequestState& r = *seq->request;
      r.times.scheduled = 1;
      seq->tokens.push_back(static_cast<int32_t>((seq->tokens.size() * 7 + seq->index) % 50));
      if (seq->index == 0 && !r.forked) {
        r.forked = true;
        for (int32_t i = 1; i < r.req.params.n; ++i) {
          r.seqs.push_back(make_seq(r, i));
          sched.fork(*seq, *r.seqs.back());
        }
      }
      if (seq->num_generated() >= r.req.params.max_tokens) finish(seq);
    }
    return out;
  }

  void finish(Sequence* seq) {
    sched.remove(seq);
    seq->status = SequenceStatus::Finished;
  }

  // Every reference the pool counts is held by exactly one block-table entry of a live sequence.
  void check_references() const {
    std::map<int32_t, int32_t> refs;
    for (const auto& r : reqs) {
      for (const auto& s : r->seqs) {
        if (s->finished()) {
          EXPECT_TRUE(s->blocks.empty());
          continue;
        }
        for (int32_t b : s->blocks) {
          if (b >= 0) ++refs[b];
        }
      }
    }
    int32_t used = 0;
    for (int32_t b = 0; b < pool.num_blocks(); ++b) {
      const auto it = refs.find(b);
      ASSERT_EQ(pool.ref_count(b), it == refs.end() ? 0 : it->second) << "block " << b;
      used += pool.ref_count(b) > 0;
    }
    ASSERT_EQ(used, pool.num_used());
  }

  BlockPool pool;
  Scheduler sched;
  std::vector<std::unique_ptr<RequestState>> reqs;

 private:
  static std::unique_ptr<Sequence> make_seq(RequestState& r, int32_t index) {
    auto s = std::make_unique<Sequence>();
    s->request = &r;
    s->index = index;
    s->tokens = r.req.prompt;
    s->num_prompt = static_cast<int32_t>(r.req.prompt.size());
    return s;
  }
  uint64_t next_arrival = 0;
};

std::vector<int32_t> tokens(int32_t n, int32_t salt = 0) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back((i * 13 + salt * 31) % 97);
  return t;
}

SchedulerConfig config(int32_t budget, int32_t max_batch = 256, int32_t bs = 16) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_batch_size = max_batch;
  c.block_size = bs;
  return c;
}

TEST(Scheduler, DecodesAreNeverStarvedByALongPrompt) {
  Harness h(2000, config(256));
  std::vector<Sequence*> decoders;
  for (int i = 0; i < 8; ++i) decoders.push_back(h.submit(tokens(10, i), 10000));
  h.step();  // all 8 prompts in one step
  for (Sequence* s : decoders) ASSERT_EQ(s->num_generated(), 1);
  Sequence* big = h.submit(tokens(5000, 99), 5);
  int steps = 0;
  while (big->num_generated() == 0) {
    const SchedulerOutput& out = h.step();
    ++steps;
    ASSERT_LE(out.num_tokens, 256);
    std::set<Sequence*> scheduled;
    for (const auto& s : out.seqs) {
      scheduled.insert(s.seq);
      if (s.seq != big) {
        EXPECT_EQ(s.num_new, 1);
      }
    }
    for (Sequence* s : decoders) EXPECT_TRUE(scheduled.contains(s)) << "decode starved at step " << steps;
    if (big->num_generated() == 0) {
      EXPECT_EQ(out.num_tokens, 256) << "budget not filled by the prefill chunk";
    }
  }
  EXPECT_EQ(steps, (5000 + 247) / 248);  // 256 - 8 decodes per step
  for (Sequence* s : decoders) EXPECT_EQ(s->num_generated(), 1 + steps);
}

TEST(Scheduler, WithoutChunkingAPromptIsScheduledWhole) {
  SchedulerConfig c = config(64);
  c.enable_chunked_prefill = false;
  Harness h(100, c);
  Sequence* a = h.submit(tokens(50), 3);
  Sequence* b = h.submit(tokens(30, 1), 3);  // 50 + 30 > 64: waits a step
  const SchedulerOutput& out = h.step();
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].seq, a);
  EXPECT_EQ(out.seqs[0].num_new, 50);
  EXPECT_EQ(b->num_computed, 0);
  h.step();
  EXPECT_EQ(b->num_computed, 30);
}

TEST(Scheduler, PrefixCacheHitReusesBlocksAndSkipsCompute) {
  Harness h(100, config(512));
  Sequence* a = h.submit(tokens(64), 100);
  h.step();
  const int64_t before = h.sched.counters().computed_tokens;
  std::vector<int32_t> p = tokens(64);
  for (int i = 0; i < 10; ++i) p.push_back(i);
  Sequence* b = h.submit(p, 100);
  const SchedulerOutput& out = h.step();
  // b's first 4 blocks are a's; only its 10 new prompt tokens (plus a's decode) were computed.
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(b->blocks[static_cast<size_t>(j)], a->blocks[static_cast<size_t>(j)]);
    EXPECT_EQ(h.pool.ref_count(a->blocks[static_cast<size_t>(j)]), 2);
  }
  EXPECT_NE(b->blocks[4], a->blocks[4]);
  EXPECT_EQ(h.sched.counters().computed_tokens - before, 10 + 1);
  EXPECT_EQ(out.num_tokens, 11);
  EXPECT_EQ(h.sched.counters().prefix_cache_hits, 64);
  EXPECT_EQ(h.sched.counters().prefix_cache_queries, 64 + 74);
  h.check_references();
}

TEST(Scheduler, FreedCachedBlocksAreEvictedInLruOrder) {
  Harness h(8, config(512));
  Sequence* a = h.submit(tokens(33), 1);  // 3 blocks, 2 of them full and cached
  h.step();
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(h.pool.num_free(), 8);
  EXPECT_EQ(h.pool.prefix_cache().size(), 2u);
  // A same-prefix request still hits after a finished (blocks are free but cached).
  Sequence* b = h.submit(tokens(40), 1);
  h.step();
  EXPECT_EQ(h.sched.counters().prefix_cache_hits, 32);
  ASSERT_TRUE(b->finished());
  // Filling the whole pool with other tokens evicts every cached block.
  Sequence* c = h.submit(tokens(128, 5), 1);
  h.step();
  EXPECT_TRUE(c->finished());
  Sequence* d = h.submit(tokens(40), 1);
  h.step();
  EXPECT_EQ(h.sched.counters().prefix_cache_hits, 32);  // no new hits
  EXPECT_TRUE(d->finished());
  EXPECT_EQ(h.pool.num_free(), 8);
}

TEST(Scheduler, PreemptsTheLowestPriorityNewestAndResumes) {
  Harness h(12, config(512));  // 12 blocks of 16 tokens
  Sequence* hi = h.submit(tokens(60, 1), 60, /*priority=*/0);
  Sequence* lo_old = h.submit(tokens(60, 2), 60, /*priority=*/1);
  Sequence* lo_new = h.submit(tokens(60, 3), 60, /*priority=*/1);
  h.step();  // 4 blocks each: the pool is full
  ASSERT_EQ(h.pool.num_free(), 0);
  for (int i = 0; i < 4; ++i) h.step();  // decode positions 60..63 still fit the fourth block
  EXPECT_EQ(h.sched.counters().preemptions, 0);
  h.step();  // position 64 needs a fifth block: lo_new is preempted
  EXPECT_EQ(lo_new->status, SequenceStatus::Preempted);
  EXPECT_EQ(hi->status, SequenceStatus::Running);
  EXPECT_EQ(lo_old->status, SequenceStatus::Running);
  EXPECT_GE(h.sched.counters().preemptions, 1);
  EXPECT_EQ(lo_new->num_computed, 0);
  EXPECT_EQ(lo_new->blocks.size(), 0u);
  const std::vector<int32_t> kept = lo_new->tokens;
  EXPECT_EQ(lo_new->num_generated(), 5);  // its sampled tokens survive preemption
  h.check_references();
  for (int i = 0; i < 500 && !lo_new->finished(); ++i) h.step();
  EXPECT_TRUE(lo_new->finished());
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), lo_new->tokens.begin()));
  EXPECT_EQ(h.pool.num_free(), 12);
}

TEST(Scheduler, SlidingWindowFreesBlocksOutsideTheWindow) {
  SchedulerConfig c = config(64);
  c.sliding_window = 32;
  Harness h(100, c, /*caching=*/false);
  Sequence* s = h.submit(tokens(300), 200);
  int32_t max_used = 0;
  while (!s->finished()) {
    h.step();
    if (s->finished()) break;
    max_used = std::max(max_used, h.pool.num_used());
    // Live blocks cover at most the window plus the step's chunk (64) plus partial blocks.
    EXPECT_LE(h.pool.num_used(), (32 + 64) / 16 + 2);
    h.check_references();
  }
  EXPECT_EQ(s->num_generated(), 200);
  EXPECT_EQ(h.pool.num_free(), 100);
  EXPECT_LE(max_used, 8);
}

TEST(Scheduler, ForkSharesThePromptBlocks) {
  Harness h(100, config(512));
  Sequence* parent = h.submit(tokens(40), 5, 0, /*n=*/3);
  h.step();
  RequestState& r = *parent->request;
  ASSERT_EQ(r.seqs.size(), 3u);
  // (40 - 1) / 16 = 2 full blocks before the last prompt token are shared three ways.
  for (int j = 0; j < 2; ++j) EXPECT_EQ(h.pool.ref_count(parent->blocks[static_cast<size_t>(j)]), 3);
  EXPECT_EQ(h.pool.ref_count(parent->blocks[2]), 1);
  for (int i = 1; i < 3; ++i) {
    Sequence* c = r.seqs[static_cast<size_t>(i)].get();
    EXPECT_EQ(c->blocks[0], parent->blocks[0]);
    EXPECT_EQ(c->num_computed, 32);
  }
  const SchedulerOutput& out = h.step();  // children compute 8 prompt tokens each, parent 1
  EXPECT_EQ(out.num_tokens, 1 + 8 + 8);
  h.check_references();
  while (h.sched.num_running() > 0) h.step();
  EXPECT_EQ(h.pool.num_free(), 100);
}

TEST(Scheduler, AdmitsByPriorityThenArrival) {
  Harness h(100, config(512, /*max_batch=*/1));
  Sequence* late_low = h.submit(tokens(5), 1, 2);
  Sequence* first_mid = h.submit(tokens(5), 1, 1);
  Sequence* second_mid = h.submit(tokens(5), 1, 1);
  Sequence* high = h.submit(tokens(5), 1, 0);
  std::vector<Sequence*> order;
  for (int i = 0; i < 4; ++i) order.push_back(h.step().seqs.at(0).seq);
  EXPECT_EQ(order, (std::vector<Sequence*>{high, first_mid, second_mid, late_low}));
}

TEST(Scheduler, RespectsMaxBatchSize) {
  Harness h(1000, config(4096, /*max_batch=*/4));
  for (int i = 0; i < 10; ++i) h.submit(tokens(20, i), 50);
  for (int i = 0; i < 20; ++i) {
    h.step();
    EXPECT_LE(h.sched.num_running(), 4);
  }
  EXPECT_EQ(h.sched.num_running(), 4);
  EXPECT_EQ(h.sched.num_waiting(), 6);
}

// schedule_after (overlapped decode steps): the step after a decode step, planned before its tokens are
// appended, is the step schedule() would plan once they are, or nothing.
TEST(Scheduler, ScheduleAfterPlansTheNextDecodeOrNothing) {
  Harness h(1000, config(4096, /*max_batch=*/2, /*bs=*/4));
  Sequence* a = h.submit(tokens(6, 1), 50);
  Sequence* b = h.submit(tokens(7, 2), 50);
  h.submit(tokens(5, 3), 50);             // waiting: the batch of 2 is full
  h.step();                               // both prompts
  const SchedulerOutput prev = h.step();  // both decode; their tokens are appended by the harness
  ASSERT_EQ(prev.seqs.size(), 2u);
  // As if prev's tokens were still on their way: take them back out.
  a->tokens.pop_back();
  b->tokens.pop_back();
  const int32_t a_len = a->num_computed, blocks_a = static_cast<int32_t>(a->blocks.size());
  const SchedulerOutput* next = h.sched.schedule_after(prev, {0, 0});
  ASSERT_NE(next, nullptr) << "a full batch admits nothing: the plan does not need prev's tokens";
  ASSERT_EQ(next->seqs.size(), 2u);
  EXPECT_EQ(next->seqs[0].seq, a);
  EXPECT_EQ(next->seqs[0].start, a_len);
  EXPECT_TRUE(next->seqs[0].sample && next->seqs[0].num_new == 1);
  // a's next position a_len = 7 with blocks of 4 needs 2 blocks; it has them (no new block yet).
  EXPECT_EQ(static_cast<int32_t>(a->blocks.size()), std::max(blocks_a, (a_len + 1 + 3) / 4));

  // One of the two ends with prev's token: a slot frees, and the waiting one would be admitted.
  EXPECT_EQ(h.sched.schedule_after(prev, {0, 1}), nullptr);
  // Flags of the wrong length are a programming error.
  EXPECT_THROW(h.sched.schedule_after(prev, {0}), Error);
}

TEST(Scheduler, ScheduleAfterRefusesPrefillsAndShortPools) {
  {
    // A prompt part-way (chunked) is running beside the decode: schedule() would give it tokens.
    Harness h(1000, config(8, /*max_batch=*/4, /*bs=*/4));
    Sequence* a = h.submit(tokens(5, 1), 50);
    h.step();  // a's prompt (5 of the budget of 8)
    h.submit(tokens(30, 2), 50);
    const SchedulerOutput prev = h.step();  // a decodes, the long prompt takes the rest of the budget
    a->tokens.pop_back();
    EXPECT_EQ(h.sched.schedule_after(prev, std::vector<char>(prev.seqs.size(), 0)), nullptr);
  }
  for (int32_t pool_blocks : {3, 4}) {
    // Two sequences about to cross into their second block: with one block free schedule() would
    // preempt (nothing planned, nothing allocated); with two both get one.
    Harness h(pool_blocks, config(64, /*max_batch=*/2, /*bs=*/4), /*caching=*/false);
    Sequence* a = h.submit(tokens(3, 1), 50);
    Sequence* b = h.submit(tokens(3, 2), 50);
    h.step();                               // prompts: 1 block each
    const SchedulerOutput prev = h.step();  // positions 3, still the first block
    a->tokens.pop_back();
    b->tokens.pop_back();
    ASSERT_EQ(h.pool.num_free(), pool_blocks - 2);
    const SchedulerOutput* next = h.sched.schedule_after(prev, {0, 0});
    EXPECT_EQ(next != nullptr, pool_blocks == 4) << pool_blocks << " blocks";
    EXPECT_EQ(h.pool.num_free(), pool_blocks == 4 ? 0 : 1);
    EXPECT_EQ(a->blocks.size(), pool_blocks == 4 ? 2u : 1u);
  }
}

// Property: thousands of random submits, aborts and steps over a small pool (so preemption, eviction,
// forks and prefix hits all happen) keep every reference accounted for, and aborting everything
// returns the whole pool.
TEST(Scheduler, NoBlockLeaksUnderRandomSubmitAbortStep) {
  for (bool caching : {true, false}) {
    SCOPED_TRACE(caching);
    SchedulerConfig c = config(96, 16, 8);
    if (!caching) c.sliding_window = 20;
    Harness h(40, c, caching);
    std::mt19937 rng(7);
    std::vector<RequestState*> live;
    for (int op = 0; op < 5000; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 3) {
        const auto len = static_cast<int32_t>(1 + rng() % 60);
        const auto salt = static_cast<int32_t>(rng() % 3);  // few distinct prefixes: prefix hits
        Sequence* s = h.submit(tokens(len, salt), static_cast<int32_t>(1 + rng() % 40),
                               static_cast<int32_t>(rng() % 3), static_cast<int32_t>(1 + rng() % 3));
        live.push_back(s->request);
      } else if (kind < 4 && !live.empty()) {
        const size_t i = rng() % live.size();
        for (auto& s : live[i]->seqs) {
          if (!s->finished()) h.finish(s.get());
        }
        live.erase(live.begin() + static_cast<ptrdiff_t>(i));
      } else {
        h.step();
      }
      if (op % 50 == 0) h.check_references();
      ASSERT_LE(h.sched.num_running(), 16);  // forks included: admission reserves their slots
    }
    EXPECT_GT(h.sched.counters().preemptions, 0);
    if (caching) {
      EXPECT_GT(h.sched.counters().prefix_cache_hits, 0);
    }
    for (const auto& r : h.reqs) {
      for (auto& s : r->seqs) {
        if (!s->finished()) h.finish(s.get());
      }
    }
    h.check_references();
    EXPECT_EQ(h.pool.num_free(), h.pool.num_blocks());
    EXPECT_EQ(h.sched.num_running(), 0);
    EXPECT_EQ(h.sched.num_waiting(), 0);
  }
}

}  // namespace
}  // namespace inferx
