// DecodeGraphs on the CPU backend (no graphs: the padded batch runs eagerly): bucket sizes, the padded
// metadata, logits of the real rows identical to the unpadded batch, and the engine with padded decode
// steps (INFERX_GRAPHS=pad) giving the same greedy text as without.
#include "engine/decode_graphs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>

#include "backend/forwarding_backend.h"
#include "engine/batch_builder.h"
#include "engine/block_table.h"
#include "engine/warm_up.h"
#include "engine_test_requests.h"
#include "inferx/engine.h"

namespace inferx {
namespace {

TEST(DecodeGraphs, BucketsArePowersOfTwoThenSteps) {
  EXPECT_EQ(decode_buckets(1), (std::vector<int32_t>{1}));
  EXPECT_EQ(decode_buckets(20), (std::vector<int32_t>{1, 2, 4, 8, 16, 20}));
  const std::vector<int32_t> b = decode_buckets(256);
  EXPECT_EQ(std::vector<int32_t>(b.begin(), b.begin() + 10),
            (std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32, 48, 64, 80}));
  EXPECT_EQ(b.back(), 256);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
  EXPECT_EQ(std::adjacent_find(b.begin(), b.end()), b.end());
  EXPECT_EQ(decode_buckets(300).back(), 300);
  EXPECT_EQ(decode_buckets(300)[decode_buckets(300).size() - 2], 288);
}

class DecodeGraphsCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend({2}).release();
    model_ = Model::load("dummy:tiny", *backend_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
  }
  static Backend* backend_;
  static Model* model_;
};
Backend* DecodeGraphsCpu::backend_ = nullptr;
Model* DecodeGraphsCpu::model_ = nullptr;

TEST_F(DecodeGraphsCpu, PaddedDecodeGivesTheUnpaddedLogitsForRealRows) {
  constexpr int32_t kBlocks = 64, kBs = 16, kMaxLen = 256;
  const int64_t vocab = model_->config().vocab_size;
  KvCache kv(*backend_, model_->config(), kBlocks + 1, kBs);
  BlockPool pool(kBlocks, false);
  SchedulerConfig sc;
  sc.block_size = kBs;
  sc.max_batch_size = 8;
  Scheduler scheduler(sc, pool);
  BatchBuilder builder(*backend_);
  DecodeGraphConfig gc;
  gc.max_batch_size = 8;
  gc.max_blocks_per_seq = blocks_for_tokens(kMaxLen, kBs);
  gc.scratch_block = kBlocks;
  gc.capture = false;
  DecodeGraphs graphs(*model_, kv, gc);

  std::vector<std::unique_ptr<RequestState>> reqs;
  for (int i = 0; i < 5; ++i) {  // 5 sequences: bucket 8, three padding rows
    auto r = std::make_unique<RequestState>();
    r->req.id = fmt::format("r{}", i);
    for (int t = 0; t < 7 + 13 * i; ++t) r->req.prompt.push_back((t * 31 + i * 7 + 3) % 512);
    r->forked = true;
    auto s = std::make_unique<Sequence>();
    s->request = r.get();
    s->tokens = r->req.prompt;
    s->num_prompt = static_cast<int32_t>(s->tokens.size());
    scheduler.add_waiting(s.get());
    r->seqs.push_back(std::move(s));
    reqs.push_back(std::move(r));
  }
  std::vector<float> host(static_cast<size_t>(8 * vocab)), padded(static_cast<size_t>(8 * vocab));
  int decode_steps = 0;
  for (int step = 0; step < 12; ++step) {
    const SchedulerOutput& out = scheduler.schedule();
    ASSERT_FALSE(out.empty());
    const auto rows = static_cast<int64_t>(out.seqs.size());
    const bool decode = graphs.accepts(out);
    if (decode) {
      // The padded run first (its K/V writes for the real rows are the same values the unpadded run
      // writes next), then the unpadded one.
      const Tensor p = graphs.run(out);
      ASSERT_EQ(p.rows(), rows);
      backend_->copy_to_host(padded.data(), p.data, static_cast<size_t>(rows * vocab) * sizeof(float));
      // The padded metadata: padding rows live in the scratch block only.
      const BatchView v = graphs.build(out, graphs.bucket_for(static_cast<int32_t>(rows)));
      EXPECT_EQ(v.num_seqs, 8);
      const int32_t* bt = v.block_tables;
      for (int32_t r = static_cast<int32_t>(rows); r < 8; ++r) {
        for (int32_t j = 0; j < v.max_blocks_per_seq; ++j)
          ASSERT_EQ(bt[r * v.max_blocks_per_seq + j], kBlocks);
        EXPECT_EQ(v.seq_lens[r], 1);
        EXPECT_EQ(v.positions[r], 0);
      }
      for (int32_t r = 0; r < static_cast<int32_t>(rows); ++r) {
        const Sequence& s = *out.seqs[static_cast<size_t>(r)].seq;
        for (size_t j = 0; j < s.blocks.size(); ++j)
          ASSERT_EQ(bt[r * v.max_blocks_per_seq + static_cast<int32_t>(j)], s.blocks[j]);
        EXPECT_EQ(v.seq_lens[r], static_cast<int32_t>(s.tokens.size()));
      }
    }
    const Tensor logits = model_->forward(builder.build(out), kv);
    const int64_t n = logits.rows();
    backend_->copy_to_host(host.data(), logits.data, static_cast<size_t>(n * vocab) * sizeof(float));
    if (decode) {
      ++decode_steps;
      ASSERT_EQ(n, rows);
      for (int64_t i = 0; i < rows * vocab; ++i)
        ASSERT_EQ(padded[static_cast<size_t>(i)], host[static_cast<size_t>(i)])
            << "step " << step << " element " << i;
    }
    scheduler.on_step_computed(out);
    int64_t row = 0;
    for (const ScheduledSequence& s : out.seqs) {
      if (!s.sample) continue;
      const float* lr = host.data() + row++ * vocab;
      s.seq->tokens.push_back(static_cast<int32_t>(std::max_element(lr, lr + vocab) - lr));
    }
  }
  EXPECT_GE(decode_steps, 8);
}

// The metadata written for a sequence of decode steps whose rows change length (a row holding a long
// sequence, then a short one), bucket and block-table contents (dropped window blocks): each step's view has
// exactly a freshly written layout - the row's blocks, then the scratch block to the row's end; padding rows
// all scratch - through build()'s two host copies used in turn.
TEST_F(DecodeGraphsCpu, MetadataIsExactAcrossShrinkingRowsAndBuckets) {
  constexpr int32_t kBlocks = 64, kBs = 16, kMaxLen = 256, kM = kMaxLen / kBs;
  KvCache kv(*backend_, model_->config(), kBlocks + 1, kBs);
  DecodeGraphConfig gc;
  gc.max_batch_size = 8;
  gc.max_blocks_per_seq = kM;
  gc.scratch_block = kBlocks;
  gc.capture = false;
  DecodeGraphs graphs(*model_, kv, gc);
  std::mt19937 rng(3);
  std::vector<Sequence> seqs(8);
  for (int step = 0; step < 40; ++step) {
    // 1-8 sequences of 1-256 tokens (so 1-16 blocks), some with a dropped (-1) leading block.
    const int n = 1 + static_cast<int>(rng() % 8);
    SchedulerOutput out;
    for (int i = 0; i < n; ++i) {
      Sequence& s = seqs[static_cast<size_t>(i)];
      const int32_t len = 1 + static_cast<int32_t>(rng() % kMaxLen);
      s.tokens.assign(static_cast<size_t>(len), 7 + i);
      s.blocks.clear();
      for (int32_t j = 0; j < (len + kBs - 1) / kBs; ++j)
        s.blocks.push_back(j == 0 && rng() % 4 == 0 ? -1 : static_cast<int32_t>(rng() % kBlocks));
      out.seqs.push_back({&s, len - 1, 1, true});
    }
    ASSERT_TRUE(graphs.accepts(out));
    const int32_t bucket = graphs.bucket_for(n);
    const BatchView v = graphs.build(out, bucket);
    ASSERT_EQ(v.num_seqs, bucket);
    ASSERT_EQ(v.max_blocks_per_seq, kM);
    for (int32_t r = 0; r < bucket; ++r) {
      SCOPED_TRACE(::testing::Message() << "step " << step << " row " << r << " of " << n);
      ASSERT_EQ(v.query_start[r], r);
      const int32_t* bt = v.block_tables + static_cast<ptrdiff_t>(r) * kM;
      if (r < n) {
        const Sequence& s = seqs[static_cast<size_t>(r)];
        ASSERT_EQ(v.token_ids[r], s.tokens.back());
        ASSERT_EQ(v.positions[r], static_cast<int32_t>(s.tokens.size()) - 1);
        ASSERT_EQ(v.seq_lens[r], static_cast<int32_t>(s.tokens.size()));
        for (int32_t j = 0; j < kM; ++j) {
          const int32_t want =
              j < static_cast<int32_t>(s.blocks.size()) && s.blocks[static_cast<size_t>(j)] >= 0
                  ? s.blocks[static_cast<size_t>(j)]
                  : kBlocks;
          ASSERT_EQ(bt[j], want) << "entry " << j;
        }
      } else {
        ASSERT_EQ(v.seq_lens[r], 1);
        for (int32_t j = 0; j < kM; ++j) ASSERT_EQ(bt[j], kBlocks) << "padding entry " << j;
      }
    }
    ASSERT_EQ(v.query_start[bucket], bucket);
  }
}

// Batch 1 has a second recording for sequences within DecodeGraphConfig::short_context tokens, made with that
// as the step's length hint (a backend's fused batch-1 program takes it: CudaBackend::decode_stack); longer
// sequences and larger buckets get the capacity. A bound of 0, or one not below the capacity, adds none.
TEST_F(DecodeGraphsCpu, BatchOneWithinTheShortContextGetsItsOwnLengthHint) {
  constexpr int32_t kBlocks = 64, kBs = 16, kM = 16;  // capacity 256 tokens
  KvCache kv(*backend_, model_->config(), kBlocks + 1, kBs);
  std::vector<Sequence> seqs(2);
  auto step = [&](std::initializer_list<int32_t> lens) {
    SchedulerOutput out;
    size_t i = 0;
    for (int32_t len : lens) {
      Sequence& s = seqs[i++];
      s.tokens.assign(static_cast<size_t>(len), 5);
      s.blocks.assign(static_cast<size_t>((len + kBs - 1) / kBs), 3);
      out.seqs.push_back({&s, len - 1, 1, true});
    }
    return out;
  };
  for (const int32_t bound : {0, 64, 256, 300}) {
    SCOPED_TRACE(bound);
    DecodeGraphConfig gc;
    gc.max_batch_size = 4;
    gc.max_blocks_per_seq = kM;
    gc.scratch_block = kBlocks;
    gc.capture = false;
    gc.short_context = bound;
    DecodeGraphs graphs(*model_, kv, gc);
    const bool has = bound == 64;
    for (const int32_t len : {1, 63, 64, 65, 200, 256}) {
      const SchedulerOutput out = step({len});
      const bool want = has && len <= 64;
      EXPECT_EQ(graphs.short_class(out, 1), want) << len;
      EXPECT_EQ(graphs.build(out, 1).max_seq_len, want ? 64 : 256) << len;
      EXPECT_EQ(graphs.build(out, 2).max_seq_len, 256) << len << ": batch 1 only";
    }
    EXPECT_EQ(graphs.build(step({10, 20}), 2).max_seq_len, 256);
    EXPECT_EQ(graphs.build(SchedulerOutput{}, 1).max_seq_len, has ? 64 : 256) << "padding only";
  }
}

// On a backend that records (faked: the CPU backend runs every forward, a "recording" is its key), the two
// batch-1 recordings are made once each and replayed by the steps of their own side of the bound, the warm-up
// making both; each recorded forward saw its own hint.
TEST_F(DecodeGraphsCpu, ShortAndLongBatchOneStepsReplayTheirOwnRecordings) {
  struct RecordingBackend final : ForwardingBackend {
    explicit RecordingBackend(Backend& inner) : ForwardingBackend(inner) {}
    bool begin_graph_capture() override { return true; }
    void end_graph_capture(uint64_t key, bool keep) override {
      if (keep) keys.push_back(key);
    }
    bool replay_graph(uint64_t key) override {
      ++replays;
      return std::find(keys.begin(), keys.end(), key) != keys.end();
    }
    void drop_graph(uint64_t key) override { std::erase(keys, key); }
    void attention(const Tensor& q, const KvCacheLayer& cache, const BatchView& batch,
                   const AttentionParams& params, Tensor& out) override {
      hints.push_back(batch.max_seq_len);
      ForwardingBackend::attention(q, cache, batch, params, out);
    }
    std::vector<uint64_t> keys;
    std::vector<int32_t> hints;  // one per layer of every forward
    int64_t replays = 0;
  };
  RecordingBackend rec(*backend_);
  auto model = Model::load("dummy:tiny", rec);
  const auto layers = static_cast<size_t>(model->config().num_layers);
  constexpr int32_t kBlocks = 64, kBs = 16;
  KvCache kv(rec, model->config(), kBlocks + 1, kBs);
  DecodeGraphConfig gc;
  gc.max_batch_size = 4;
  gc.max_blocks_per_seq = 16;
  gc.scratch_block = kBlocks;
  gc.short_context = 64;
  std::vector<Sequence> seqs(1);
  auto step = [&](int32_t len) {
    Sequence& s = seqs[0];
    s.tokens.assign(static_cast<size_t>(len), 5);
    s.blocks.assign(static_cast<size_t>((len + kBs - 1) / kBs), 3);
    SchedulerOutput out;
    out.seqs.push_back({&s, len - 1, 1, true});
    return out;
  };
  {
    DecodeGraphs graphs(*model, kv, gc);
    for (const int32_t len : {10, 11, 100, 64, 101, 65, 12}) graphs.run(step(len));
    EXPECT_EQ(graphs.captures(), 2);
    EXPECT_EQ(graphs.replays(), 5);
    EXPECT_EQ(graphs.bucket_state(1, true), 1);
    EXPECT_EQ(graphs.bucket_state(1), 1);
    EXPECT_EQ(rec.keys.size(), 2u);
    // Eager then recorded, short first (10), then long (100): every layer saw its recording's hint.
    std::vector<int32_t> want;
    for (const int32_t h : {64, 64, 256, 256}) want.insert(want.end(), layers, h);
    EXPECT_EQ(rec.hints, want);
  }
  EXPECT_TRUE(rec.keys.empty()) << "the destructor drops both recordings";
  DecodeGraphs graphs(*model, kv, gc);
  graphs.warm_up();
  for (const int32_t b : decode_buckets(4)) EXPECT_EQ(graphs.bucket_state(b), 1) << b;
  EXPECT_EQ(graphs.bucket_state(1, true), 1);
  EXPECT_EQ(graphs.captures(), static_cast<int64_t>(decode_buckets(4).size()) + 1);
  const int64_t before = graphs.replays();
  graphs.run(step(30));
  graphs.run(step(200));
  EXPECT_EQ(graphs.replays(), before + 2);
  EXPECT_EQ(graphs.captures(), static_cast<int64_t>(decode_buckets(4).size()) + 1) << "no new recording";
}

TEST(WarmUp, TokenCountsRunFromTheStepBudgetDownInPowersOfTwoAboveTheDecodeSizes) {
  EXPECT_EQ(warm_up_token_counts(8192, 512), (std::vector<int32_t>{8192, 4096, 2048, 1024}));
  EXPECT_EQ(warm_up_token_counts(6000, 512), (std::vector<int32_t>{6000, 4096, 2048, 1024}));
  EXPECT_EQ(warm_up_token_counts(1024, 256), (std::vector<int32_t>{1024, 512}));
  EXPECT_EQ(warm_up_token_counts(2049, 2048), (std::vector<int32_t>{2049}));
  EXPECT_EQ(warm_up_token_counts(9, 0), (std::vector<int32_t>{9, 8, 4, 2, 1}));
  EXPECT_TRUE(warm_up_token_counts(512, 512).empty());
  EXPECT_TRUE(warm_up_token_counts(64, 256).empty());
}

// The warm-ups (every decode bucket, the step sizes) write K/V at position 0 of the scratch block only:
// every other block of every layer keeps its bytes, so sequences already in the cache are untouched.
TEST_F(DecodeGraphsCpu, WarmUpWritesOnlyTheScratchBlock) {
  constexpr int32_t kBlocks = 12, kBs = 16;
  KvCache kv(*backend_, model_->config(), kBlocks + 1, kBs);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<float>> before;
  for (int64_t l = 0; l < model_->config().num_layers; ++l) {
    for (Tensor* t : {&kv.layer(l).k, &kv.layer(l).v}) {
      auto* p = static_cast<float*>(t->data);
      for (int64_t i = 0; i < t->numel(); ++i) p[i] = u(rng);
      before.emplace_back(p, p + t->numel());
    }
  }
  DecodeGraphConfig gc;
  gc.max_batch_size = 8;
  gc.max_blocks_per_seq = 4;
  gc.scratch_block = kBlocks;
  gc.capture = false;
  DecodeGraphs graphs(*model_, kv, gc);
  BatchBuilder builder(*backend_);
  EXPECT_EQ(warm_up_step_sizes(*model_, kv, builder, kBlocks, warm_up_token_counts(40, 8), 8),
            3);  // 40, 32, 16
  EXPECT_EQ(graphs.warm_up(), static_cast<int32_t>(decode_buckets(8).size()));
  size_t i = 0;
  const int64_t per_block = kv.layer(0).k.numel() / (kBlocks + 1);
  for (int64_t l = 0; l < model_->config().num_layers; ++l) {
    for (Tensor* t : {&kv.layer(l).k, &kv.layer(l).v}) {
      const auto* p = static_cast<const float*>(t->data);
      const std::vector<float>& b = before[i++];
      for (int64_t j = 0; j < kBlocks * per_block; ++j)
        ASSERT_EQ(p[j], b[static_cast<size_t>(j)]) << "layer " << l;
      bool scratch_written = false;
      for (int64_t j = kBlocks * per_block; j < t->numel(); ++j)
        scratch_written |= p[j] != b[static_cast<size_t>(j)];
      EXPECT_TRUE(scratch_written) << "layer " << l << ": the warm-up wrote no K/V";
    }
  }
  for (int32_t b : decode_buckets(8)) EXPECT_EQ(graphs.bucket_state(b), 0) << "no graphs on the CPU";
}

// The engine tests below: a small padded engine (INFERX_GRAPHS=pad while it is built: decode steps padded to
// their buckets, eager on the CPU) or an unpadded one, 64-token steps, 6 sequences at a time.
EngineConfig small_engine_config(bool warm_up) {
  EngineConfig cfg;
  cfg.max_model_len = 256;
  cfg.max_num_batched_tokens = 64;
  cfg.max_batch_size = 6;
  cfg.warm_up = warm_up;
  return cfg;
}

struct PaddedGraphs {  // INFERX_GRAPHS=pad for one scope
  explicit PaddedGraphs(bool on) : on_(on) {
    if (on_) setenv("INFERX_GRAPHS", "pad", 1);
  }
  ~PaddedGraphs() {
    if (on_) unsetenv("INFERX_GRAPHS");
  }
  bool on_;
};

// After the warm-up the engine's served steps allocate no backend memory (on CUDA a buffer grown frees the
// old one, which retires every recorded decode graph, so a step that allocates undoes the warm-up's
// recordings): the step metadata is reserved at its largest and the workspace sized by the largest step.
// Without the warm-up the first steps do allocate (the check can fail).
TEST_F(DecodeGraphsCpu, AfterTheWarmUpServedStepsAllocateNothing) {
  struct CountingBackend final : ForwardingBackend {
    explicit CountingBackend(Backend& inner) : ForwardingBackend(inner) {}
    std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override {
      ++allocations;
      return ForwardingBackend::allocate(bytes);
    }
    int64_t allocations = 0;
  };
  CountingBackend counting(*backend_);
  auto model = Model::load("dummy:tiny", counting);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<GenerationParams> params;
  // Prompts of 5..805 tokens (chunked at 64), 6 at a time: block tables up to 51 blocks wide, past what the
  // warm-up's own steps (one block per sequence) size the step metadata for.
  for (int i = 0; i < 9; ++i) {
    prompts.push_back(testing::test_prompt(5 + 100 * i, i));
    params.push_back(testing::greedy_tokens(20 + 5 * (i % 4)));
  }
  for (bool warm_up : {true, false}) {
    SCOPED_TRACE(warm_up);
    const PaddedGraphs pad(true);
    int64_t after_construction = -1;
    EngineStats stats;
    EngineConfig cfg = small_engine_config(warm_up);
    cfg.max_model_len = 1024;
    testing::run_requests(*model, cfg, prompts, params, &stats,
                          [&](Engine&) { after_construction = counting.allocations; });
    EXPECT_GT(stats.decode_graph_steps, 10);
    if (warm_up) {
      EXPECT_EQ(counting.allocations, after_construction) << "a served step allocated after the warm-up";
    } else {
      EXPECT_GT(counting.allocations, after_construction);
    }
  }
}

TEST_F(DecodeGraphsCpu, EngineWithPaddedDecodeStepsGivesTheSameGreedyText) {
  // Padded, the engine warms up first (EngineConfig::warm_up: the step sizes 64, 32, 16, 8 and every
  // decode bucket) unless told not to.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<GenerationParams> params;
  for (int i = 0; i < 7; ++i) {  // 7 requests, 6 at a time: the batch size changes as they finish
    prompts.push_back(testing::test_prompt(5 + 11 * i, i));
    params.push_back(testing::greedy_tokens(6 + 3 * i));
  }
  auto run = [&](bool pad, bool warm_up = true) {
    const PaddedGraphs padded(pad);
    EngineStats stats;
    const auto tokens =
        testing::run_requests(*model_, small_engine_config(warm_up), prompts, params, &stats,
                              [&](Engine& e) { EXPECT_EQ(e.stats().warm_up_seconds > 0, pad && warm_up); });
    EXPECT_EQ(stats.decode_graph_steps > 0, pad);
    EXPECT_EQ(stats.decode_graph_replays, 0) << "the CPU records no graphs";
    EXPECT_EQ(stats.kv_blocks_used, 0);
    return tokens;
  };
  const auto eager = run(false);
  const auto padded = run(true);
  EXPECT_EQ(padded, eager);
  EXPECT_EQ(run(true, false), eager);
  EXPECT_EQ(padded[6].size(), 24u);
}

}  // namespace
}  // namespace inferx
