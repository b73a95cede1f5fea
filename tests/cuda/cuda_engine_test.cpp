// The serving engine on the CUDA backend: device sampling (Backend::sample_tokens) against the host
// path, rows sampled independently of their batch position, decode steps replayed from CUDA graphs
// against the same padded step run eagerly and against the unpadded step, KV sizing from
// gpu_memory_utilization (Backend::memory_info), and the out-of-memory messages. Skips without a GPU
// unless INFERX_REQUIRE_GPU is set.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../unit/engine/engine_test_requests.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/pdl.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/batch_builder.h"
#include "engine/block_table.h"
#include "engine/decode_graphs.h"
#include "engine/logits_processors.h"
#include "inferx/engine.h"
#include "model/model.h"
#include "text/json_constraint.h"

namespace inferx {
namespace {

class CudaEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (cuda_device_count() == 0) return;
    backend_ = make_cuda_backend(0).release();
    model_ = Model::load("dummy:tiny", *backend_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    model_ = nullptr;
    backend_ = nullptr;
  }
  void SetUp() override { INFERX_SKIP_WITHOUT_GPU(); }

  using Vars = std::vector<std::pair<const char*, const char*>>;
  struct Env {  // sets environment variables for one engine construction
    explicit Env(Vars vars) : vars_(std::move(vars)) {
      for (auto& [k, v] : vars_) setenv(k, v, 1);
    }
    ~Env() {
      for (auto& [k, v] : vars_) unsetenv(k);
    }
    Vars vars_;
  };

  static std::vector<int32_t> prompt(int32_t len, int32_t salt) { return testing::test_prompt(len, salt); }

  // `env` only scopes the environment the engine is built under.
  static std::vector<std::vector<int32_t>> run(const std::vector<GenerationParams>& params,
                                               const Env& /*env*/, EngineStats* stats = nullptr) {
    return testing::run_to_end(*model_, params, stats);
  }

  static GenerationParams greedy(int32_t max_tokens) { return testing::greedy_tokens(max_tokens); }

  static void graph_replay_vs_eager(int num_seqs);

  static Backend* backend_;
  static Model* model_;
};
Backend* CudaEngine::backend_ = nullptr;
Model* CudaEngine::model_ = nullptr;

TEST_F(CudaEngine, DeviceSamplingGreedyEqualsTheHostPath) {
  std::vector<GenerationParams> ps(10, greedy(16));
  ps[4].logprobs = 2;  // one host row in the batch
  EngineStats dev_stats, host_stats;
  const auto dev = run(ps, Env(Vars{{"INFERX_GRAPHS", "0"}}), &dev_stats);
  const auto host = run(ps, Env(Vars{{"INFERX_GRAPHS", "0"}, {"INFERX_DEVICE_SAMPLING", "0"}}), &host_stats);
  EXPECT_EQ(dev, host);
  EXPECT_EQ(dev_stats.device_sampled_tokens, 9 * 16);
  EXPECT_EQ(host_stats.device_sampled_tokens, 0);
  EXPECT_EQ(dev_stats.decode_graph_steps, 0);
}

// Structured output (JSON mode) beside device-sampled rows: the constrained rows go to the host with their
// mask, the others stay on the device, and the text is the all-host run's exactly.
TEST_F(CudaEngine, ConstrainedRowsSampleOnTheHostBesideDeviceRows) {
  const int64_t V = model_->config().vocab_size;
  const std::vector<std::string> bytes = testing::json_pieces_vocab(V);
  auto json_mode = make_json_object_constraint(std::make_shared<TokenTrie>(bytes));
  std::vector<GenerationParams> ps(8, greedy(24));
  for (size_t i = 0; i < ps.size(); i += 2) {
    ps[i].constraint = json_mode;
    ps[i].stop_token_ids = {static_cast<int32_t>(V - 1)};
  }
  EngineStats dev_stats;
  const auto dev = run(ps, Env(Vars{{"INFERX_GRAPHS", "0"}}), &dev_stats);
  const auto host = run(ps, Env(Vars{{"INFERX_GRAPHS", "0"}, {"INFERX_DEVICE_SAMPLING", "0"}}));
  EXPECT_EQ(dev, host);
  EXPECT_EQ(dev_stats.device_sampled_tokens, 4 * 24);  // the four unconstrained rows only
  for (size_t i = 0; i < ps.size(); i += 2) {
    JsonCursor cursor;
    bool prefix = true;
    for (int32_t t : dev[i])
      for (unsigned char c : bytes[static_cast<size_t>(t)]) prefix = prefix && cursor.step(c);
    EXPECT_TRUE(prefix) << i;
  }
  // With graphs and overlapped steps on (the defaults), the same text.
  EXPECT_EQ(run(ps, Env(Vars{})), host);
}

// logit_bias and the penalties as edits on the GPU (Backend::edit_logits) leave each row exactly as the host
// processors would (bit for bit: one IEEE operation at a time in the same order).
TEST_F(CudaEngine, LogitEditsEqualTheHostProcessorsExactly) {
  constexpr int64_t kRows = 6, kVocab = 32000;
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  std::vector<float> host(static_cast<size_t>(kRows * kVocab));
  for (float& x : host) x = nd(rng);
  auto buf = backend_->allocate(host.size() * 4);
  backend_->copy_to_device(buf->data(), host.data(), host.size() * 4);
  Tensor logits(DType::F32, {kRows, kVocab}, buf->data(), Device::CUDA);
  std::vector<LogitEdit> edits;
  for (int32_t r = 0; r < kRows; ++r) {
    GenerationParams p;
    p.repetition_penalty = r % 2 ? 1.25f : 0.8f;
    p.presence_penalty = r % 3 ? 0.5f : 0.0f;
    p.frequency_penalty = r == 4 ? -0.7f : 0.3f;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 200; ++i) prompt.push_back(tok(rng));
    PenaltyState st(p, prompt);
    int32_t last = 0;
    for (int i = 0; i < 150; ++i) st.add_generated(last = tok(rng) % 500);  // repeats: counts above 1
    // A random token, the last vocabulary entry, and two tokens the penalties also edit (a prompt token,
    // a generated one): bias and penalty merged into one edit.
    std::vector<std::pair<int32_t, float>> bias = {
        {tok(rng), 5.0f}, {kVocab - 1, -100.0f}, {prompt[3], 2.5f}, {last, -1.5f}};
    float* row = host.data() + static_cast<size_t>(r) * kVocab;
    apply_logit_bias(row, kVocab, bias);
    st.apply(row, kVocab);
    ASSERT_TRUE(st.append_edits(r, bias, kVocab, edits));
  }
  ASSERT_TRUE(backend_->edit_logits(logits, edits.data(), static_cast<int64_t>(edits.size())));
  std::vector<float> got(host.size());
  backend_->copy_to_host(got.data(), buf->data(), got.size() * 4);
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != host[i];
  EXPECT_EQ(differ, 0u) << "of " << edits.size() << " edits";
}

// The engine with penalties and logit_bias sampled on the GPU gives the host path's greedy text: eagerly,
// and with graphs and overlapped steps (the plain rows outlive the penalized ones, whose edits keep the
// batch in order while they run). The penalties must change the text at all (else edits that did nothing
// would pass), and a +100 bias forces its token.
TEST_F(CudaEngine, PenaltiesOnTheDeviceGiveTheHostPathsText) {
  std::vector<GenerationParams> ps(7, greedy(16));
  ps[0].repetition_penalty = 1.4f;
  ps[1].presence_penalty = 1.0f;
  ps[2].frequency_penalty = 0.8f;
  ps[3].logit_bias = {{17, 5.0f}};
  ps[4].repetition_penalty = 0.9f;
  ps[4].frequency_penalty = -0.3f;
  ps[6].logit_bias = {{23, 100.0f}};
  EngineStats dev_stats;
  const auto dev = run(ps, Env(Vars{{"INFERX_GRAPHS", "0"}}), &dev_stats);
  const auto host = run(ps, Env(Vars{{"INFERX_GRAPHS", "0"}, {"INFERX_DEVICE_SAMPLING", "0"}}));
  EXPECT_EQ(dev, host);
  EXPECT_EQ(dev_stats.device_sampled_tokens, 7 * 16);
  EXPECT_EQ(dev[6], std::vector<int32_t>(16, 23));
  const auto plain = run(std::vector<GenerationParams>(7, greedy(16)), Env(Vars{{"INFERX_GRAPHS", "0"}}));
  int changed = 0;
  for (int i = 0; i <= 4; ++i) changed += dev[static_cast<size_t>(i)] != plain[static_cast<size_t>(i)];
  EXPECT_GE(changed, 2) << "the penalties and bias barely change the dummy model's greedy text";

  std::vector<GenerationParams> mixed = ps;
  for (int i = 0; i < 4; ++i) mixed.push_back(greedy(48));
  EngineStats on, off;
  const auto graphed = run(mixed, Env(Vars{}), &on);
  const auto graphed_host = run(mixed, Env(Vars{{"INFERX_DEVICE_SAMPLING", "0"}}), &off);
  EXPECT_EQ(graphed, graphed_host);
  EXPECT_GT(on.decode_graph_replays, 10);
  EXPECT_GT(on.overlapped_steps, 0);
  EXPECT_EQ(on.device_sampled_tokens, 7 * 16 + 4 * 48);
}

TEST_F(CudaEngine, SampledRowsDependOnlyOnTheirOwnLogitsAndParameters) {
  constexpr int64_t kRows = 8, kVocab = 32000;
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> host(static_cast<size_t>(kRows * kVocab));
  for (float& x : host) x = n(rng);
  auto buf = backend_->allocate(host.size() * sizeof(float));
  std::vector<TokenSampleParams> params(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    params[static_cast<size_t>(r)] = {0.7f + 0.1f * static_cast<float>(r), static_cast<int32_t>(r % 3) * 20,
                                      r % 2 ? 0.9f : 1.0f, r == 5 ? 0.05f : 0.0f,
                                      (static_cast<float>(r) + 0.5f) / kRows};
  }
  auto sample = [&](const std::vector<int64_t>& order) {
    std::vector<float> permuted(host.size());
    std::vector<TokenSampleParams> p(kRows);
    for (int64_t i = 0; i < kRows; ++i) {
      std::copy_n(host.data() + order[static_cast<size_t>(i)] * kVocab, kVocab, permuted.data() + i * kVocab);
      p[static_cast<size_t>(i)] = params[static_cast<size_t>(order[static_cast<size_t>(i)])];
    }
    backend_->copy_to_device(buf->data(), permuted.data(), permuted.size() * sizeof(float));
    const Tensor t(DType::F32, {kRows, kVocab}, buf->data(), Device::CUDA);
    std::vector<int32_t> ids(kRows);
    EXPECT_TRUE(backend_->sample_tokens(t, p.data(), ids.data()));
    std::vector<int32_t> by_row(kRows);
    for (int64_t i = 0; i < kRows; ++i)
      by_row[static_cast<size_t>(order[static_cast<size_t>(i)])] = ids[static_cast<size_t>(i)];
    return by_row;
  };
  const auto a = sample({0, 1, 2, 3, 4, 5, 6, 7});
  const auto b = sample({7, 3, 5, 1, 0, 6, 2, 4});
  EXPECT_EQ(a, b);
  // Different draws give different tokens somewhere (the check above can fail).
  for (auto& p : params) p.uniform = 1.0f - p.uniform;
  EXPECT_NE(sample({0, 1, 2, 3, 4, 5, 6, 7}), a);
}

// Graph replays (programmatic dependent launch on, cuda_common.cuh) against the same padded steps run
// eagerly with it off: bit-equal, so overlapping a kernel's start with its predecessor's tail changes no
// value (a missing pdl_wait would read a half-written input). num_seqs = 1 takes the GEMV path, which
// streams weights before its wait.
void CudaEngine::graph_replay_vs_eager(int num_seqs) {
  constexpr int32_t kBlocks = 64, kBs = 16, kMaxLen = 512;
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
  DecodeGraphs graphs(*model_, kv, gc);
  gc.capture = false;
  DecodeGraphs eager(*model_, kv, gc);

  std::vector<std::unique_ptr<RequestState>> reqs;
  for (int i = 0; i < num_seqs; ++i) {
    auto r = std::make_unique<RequestState>();
    r->req.prompt = prompt(9 + 21 * i, i);
    r->forked = true;
    auto s = std::make_unique<Sequence>();
    s->request = r.get();
    s->tokens = r->req.prompt;
    s->num_prompt = static_cast<int32_t>(s->tokens.size());
    scheduler.add_waiting(s.get());
    r->seqs.push_back(std::move(s));
    reqs.push_back(std::move(r));
  }
  std::vector<float> g(static_cast<size_t>(8 * vocab)), e(g.size()), u(g.size());
  int checked = 0;
  double max_diff = 0, max_abs = 0;
  for (int step = 0; step < 10; ++step) {
    const SchedulerOutput& out = scheduler.schedule();
    const auto rows = static_cast<int64_t>(out.seqs.size());
    const size_t bytes = static_cast<size_t>(rows * vocab) * sizeof(float);
    if (graphs.accepts(out)) {
      // Every run writes the same K/V values for this step's tokens, so the order does not matter.
      for (int rep = 0; rep < 2; ++rep) {  // the first records (after an eager run), the second replays
        cuda::set_pdl_enabled(true);
        const Tensor tg = graphs.run(out);
        backend_->copy_to_host(g.data(), tg.data, bytes);
        cuda::set_pdl_enabled(false);
        const Tensor te = eager.run(out);
        backend_->copy_to_host(e.data(), te.data, bytes);
        cuda::set_pdl_enabled(true);
        for (size_t i = 0; i < static_cast<size_t>(rows * vocab); ++i)
          ASSERT_EQ(g[i], e[i]) << "step " << step;
      }
      const Tensor tu = model_->forward(builder.build(out), kv);
      backend_->copy_to_host(u.data(), tu.data, bytes);
      for (size_t i = 0; i < static_cast<size_t>(rows * vocab); ++i) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(u[i] - g[i])));
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(u[i])));
      }
      ++checked;
    } else {
      const Tensor tu = model_->forward(builder.build(out), kv);
      backend_->copy_to_host(g.data(), tu.data, static_cast<size_t>(tu.rows() * vocab) * sizeof(float));
    }
    scheduler.on_step_computed(out);
    int64_t row = 0;
    for (const ScheduledSequence& s : out.seqs) {
      if (!s.sample) continue;
      const float* lr = g.data() + row++ * vocab;
      s.seq->tokens.push_back(static_cast<int32_t>(std::max_element(lr, lr + vocab) - lr));
    }
  }
  EXPECT_GE(checked, 5);
  EXPECT_GE(graphs.captures(), 1);
  EXPECT_GE(graphs.replays(), static_cast<int64_t>(checked));
  // The unpadded step may use other GEMM algorithms (another row count): close, not bit-equal. Wrong
  // metadata (another row's blocks, a wrong length) moves logits by their own size.
  EXPECT_LT(max_diff, 0.05 * max_abs) << "padded vs unpadded logits";
  std::printf(
      "graph steps checked %d, captures %lld, replays %lld, max |padded - unpadded| %.3g (max |logit| "
      "%.3g)\n",
      checked, static_cast<long long>(graphs.captures()), static_cast<long long>(graphs.replays()), max_diff,
      max_abs);
}

TEST_F(CudaEngine, GraphReplayEqualsTheSamePaddedStepRunEagerly) { graph_replay_vs_eager(5); }
TEST_F(CudaEngine, GraphReplayEqualsEagerAtBatchOne) { graph_replay_vs_eager(1); }
// The persistent kernel's MLP split sums its CTAs' partials with atomics: exactly (kernels_decode_stack.cu),
// so the replay still equals the eager step bit for bit.
TEST_F(CudaEngine, GraphReplayEqualsEagerAtBatchOneWithTheMlpSplit) {
  auto& cuda = static_cast<CudaBackend&>(*backend_);
  struct Split {  // the kernel and its split on for this test only
    explicit Split(CudaBackend& b) : b_(b) {
      b_.set_decode_stack(true);
      b_.set_decode_stack_mlp_split(true);
    }
    ~Split() {
      b_.set_decode_stack(CudaBackendOptions{}.decode_stack != DecodeStackMode::Off);
      b_.set_decode_stack_mlp_split(CudaBackendOptions{}.decode_stack_mlp_split);
    }
    CudaBackend& b_;
  } split(cuda);
  const int64_t before = cuda.decode_stack_split_launches();
  graph_replay_vs_eager(1);
  EXPECT_GT(cuda.decode_stack_split_launches(), before) << "the split did not run";
}

TEST_F(CudaEngine, EngineWithGraphsGivesThePaddedEagerTextExactly) {
  std::vector<GenerationParams> ps;
  for (int i = 0; i < 12; ++i) ps.push_back(greedy(8 + 3 * i));
  ps[5].temperature = 0.9f;  // seeded sampling too: the draws are keyed by seed and index
  ps[5].seed = 17;
  EngineStats gs, ps_stats;
  const auto graphs = run(ps, Env(Vars{}), &gs);
  // The same steps padded to the same buckets, run eagerly: the same kernels on the same shapes.
  const auto padded = run(ps, Env(Vars{{"INFERX_GRAPHS", "pad"}}), &ps_stats);
  EXPECT_GT(gs.decode_graph_steps, 10);
  EXPECT_GT(gs.decode_graph_replays, 10) << "recorded graphs must run, not eager fallbacks";
  EXPECT_EQ(ps_stats.decode_graph_replays, 0);
  EXPECT_EQ(gs.decode_graph_steps, ps_stats.decode_graph_steps);
  EXPECT_EQ(graphs, padded);
  // Unpadded eager steps run the GEMMs at other row counts (other algorithms, other BF16 rounding): a
  // near-tie may flip and the sequence then diverges, so this is a figure, with only the first token
  // (a prefill step either way) required equal.
  const auto eager = run(ps, Env(Vars{{"INFERX_GRAPHS", "0"}}));
  size_t same_seqs = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(graphs[i].size(), eager[i].size());
    EXPECT_EQ(graphs[i][0], eager[i][0]);
    same_seqs += graphs[i] == eager[i];
  }
  std::printf("graphs vs unpadded eager: %zu of %zu sequences identical; %lld graph steps\n", same_seqs,
              ps.size(), static_cast<long long>(gs.decode_graph_steps));
}

// An engine allowing longer contexts than the persistent batch-1 kernel's bound (decode_stack_max_context,
// here 64 tokens against the engine's 512) still runs that kernel while a lone sequence is short: batch 1 is
// recorded once within the bound (with the kernel) and once beyond (per-op kernels), and a sequence growing
// past the bound moves from one recording to the other. Both are recorded by the warm-up (the kernel is
// launched once eagerly and once recorded, never again); the text equals the padded eager run's, which runs
// the same kernels step by step (the kernel at every step within the bound).
TEST_F(CudaEngine, BatchOneReplaysTheDecodeStackWithinItsContextBoundOnly) {
  auto& cuda = static_cast<CudaBackend&>(*backend_);
  struct Bound {  // the kernel on, with this bound, in the shared backend for this test only
    explicit Bound(CudaBackend& b) : b_(b) {
      b_.set_decode_stack(true);
      b_.set_decode_stack_max_context(64);
    }
    ~Bound() {
      b_.set_decode_stack(CudaBackendOptions{}.decode_stack != DecodeStackMode::Off);
      b_.set_decode_stack_max_context(CudaBackendOptions{}.decode_stack_max_context);
    }
    CudaBackend& b_;
  } bound(cuda);
  const std::vector<GenerationParams> ps{greedy(120)};  // a 12-token prompt grows to 132 tokens
  EngineStats gs, pads;
  const int64_t l0 = cuda.decode_stack_launches();
  const auto graphs = run(ps, Env(Vars{}), &gs);
  const int64_t l1 = cuda.decode_stack_launches();
  const auto padded = run(ps, Env(Vars{{"INFERX_GRAPHS", "pad"}}), &pads);
  const int64_t l2 = cuda.decode_stack_launches();
  EXPECT_EQ(graphs, padded);
  ASSERT_EQ(graphs[0].size(), 120u);
  EXPECT_EQ(gs.decode_graph_replays, gs.decode_graph_steps)
      << "every decode step replayed a warm-up recording";
  EXPECT_EQ(l1 - l0, 2) << "the short-context recording: one eager run, one recorded";
  // Padded eagerly: the warm-up's step and each decode step feeding positions 12..63 (lengths 13..64).
  EXPECT_EQ(l2 - l1, 1 + 52);
  std::printf("decode stack launches: graphs %lld, padded eager %lld; graph steps %lld\n",
              static_cast<long long>(l1 - l0), static_cast<long long>(l2 - l1),
              static_cast<long long>(gs.decode_graph_steps));
}

// EngineConfig::warm_up: every decode bucket is run and recorded at construction, so every decode step
// of the requests replays a recording (without it, each bucket's first step runs eagerly and records);
// the recordings are of the same kernels, so the text is the same.
TEST_F(CudaEngine, WarmUpRecordsEveryDecodeSizeBeforeTheFirstRequest) {
  std::vector<GenerationParams> ps;
  for (int i = 0; i < 12; ++i) ps.push_back(greedy(8 + 3 * i));
  EngineStats warm, cold;
  const auto warmed = run(ps, Env(Vars{}), &warm);
  const auto unwarmed = run(ps, Env(Vars{{"INFERX_WARMUP", "0"}}), &cold);
  EXPECT_EQ(warmed, unwarmed);
  EXPECT_GT(warm.warm_up_seconds, 0.0);
  EXPECT_EQ(cold.warm_up_seconds, 0.0);
  EXPECT_GT(warm.decode_graph_steps, 10);
  EXPECT_EQ(warm.decode_graph_replays, warm.decode_graph_steps)
      << "a decode step ran eagerly after the warm-up";
  EXPECT_LT(cold.decode_graph_replays, cold.decode_graph_steps);
  std::printf("warm-up %.3f s; decode steps %lld, replayed %lld (without warm-up %lld of %lld)\n",
              warm.warm_up_seconds, static_cast<long long>(warm.decode_graph_steps),
              static_cast<long long>(warm.decode_graph_replays),
              static_cast<long long>(cold.decode_graph_replays),
              static_cast<long long>(cold.decode_graph_steps));
}

// The persistent kernel's own buffers (its scratch, the caches' tensor maps, the MLP split's transposed down
// copies) are made at the warm-up's batch-1 step, after the larger buckets were recorded; they replace
// nothing a recording points at, so those recordings stay: every decode step of a mixed batch replays. A
// fresh backend each time, so the buffers are made here (until 12-06 the scratch retired every recording).
TEST_F(CudaEngine, WarmUpRecordingsSurviveTheDecodeStacksOwnBuffers) {
  for (const bool split : {false, true}) {
    SCOPED_TRACE(split ? "with the MLP split" : "default");
    CudaBackendOptions opts;
    opts.decode_stack = DecodeStackMode::Bf16;
    opts.decode_stack_mlp_split = split;
    auto backend = make_cuda_backend(0, opts);
    auto& cuda = static_cast<CudaBackend&>(*backend);
    auto model = Model::load("dummy:tiny", *backend);
    std::vector<GenerationParams> ps;
    for (int i = 0; i < 12; ++i) ps.push_back(greedy(8 + 3 * i));
    EngineStats stats;
    testing::run_to_end(*model, ps, &stats);
    EXPECT_GT(cuda.decode_stack_launches(), 0);
    EXPECT_EQ(cuda.decode_stack_split_launches() > 0, split);
    EXPECT_GT(stats.decode_graph_steps, 10);
    EXPECT_EQ(stats.decode_graph_replays, stats.decode_graph_steps)
        << "a recording was retired by the warm-up";
  }
}

// Overlapped decode steps (step N + 1 launched before N's ids reach the host, its input ids gathered on the
// device from N's sampling slot) against the in-order engine: the same graphs on the same buckets, so the
// text must be identical, greedy and seeded, with more requests than the batch holds (admissions).
TEST_F(CudaEngine, OverlappedDecodeStepsGiveTheInOrderTextExactly) {
  std::vector<GenerationParams> ps;
  for (int i = 0; i < 22; ++i) ps.push_back(greedy(6 + 5 * (i % 7)));
  ps[3].temperature = 0.9f;
  ps[3].seed = 5;
  ps[9].temperature = 1.1f;
  ps[9].top_p = 0.9f;
  ps[9].seed = 6;
  EngineStats on, off;
  const auto overlapped = run(ps, Env(Vars{}), &on);
  const auto in_order = run(ps, Env(Vars{{"INFERX_ASYNC_DECODE", "0"}}), &off);
  EXPECT_EQ(overlapped, in_order);
  EXPECT_EQ(off.overlapped_steps, 0);
  EXPECT_GT(on.overlapped_steps, 20);
  EXPECT_EQ(on.decode_graph_steps, off.decode_graph_steps);
  std::printf("overlapped steps %lld of %lld graph steps\n", static_cast<long long>(on.overlapped_steps),
              static_cast<long long>(on.decode_graph_steps));
}

// The sampled ids' copy to the host on its own stream (CudaBackendOptions::sample_copy_stream): the main
// stream goes on to the next step without it, and the host still reads each step's ids only after their copy.
// Two backends with the environment's options, the copy on the main stream and on its own: the same
// overlapped text exactly (greedy and seeded, with admissions), over enough steps that both slots are reused
// many times.
// The switches that shorten the gap between batch-1 decode steps, each against none: the sampled ids' copy to
// the host on a side stream, then also the next step's metadata upload on a side stream after the previous
// forward, then also the selection (argmax, and the sampler for the one seeded request) on a cluster of CTAs
// per row (up to 16 rows: the steps as the batch drains). All three are the defaults; variant 0 turns them
// off. The text must not change, and the counters show each path really ran.
TEST_F(CudaEngine, SideStreamCopiesAndClusterSelectionGiveTheSameText) {
  std::vector<GenerationParams> ps;
  for (int i = 0; i < 22; ++i) ps.push_back(greedy(6 + 5 * (i % 7)));
  ps[4].temperature = 0.8f;
  ps[4].seed = 11;
  constexpr int kVariants = 4;
  std::vector<std::vector<int32_t>> text[kVariants];
  EngineStats stats[kVariants];
  int64_t side_copies[kVariants] = {}, side_uploads[kVariants] = {}, cluster_select[kVariants] = {};
  for (int v = 0; v < kVariants; ++v) {
    CudaBackendOptions opts = cuda_options_from_environment();
    opts.sample_copy_stream = v >= 1;
    opts.upload_side_stream = v >= 2;
    opts.select_cluster_rows = v >= 3 ? 16 : 0;
    auto backend = make_cuda_backend(0, opts);
    auto model = Model::load("dummy:tiny", *backend);
    text[v] = testing::run_to_end(*model, ps, &stats[v]);
    const auto& cuda = static_cast<CudaBackend&>(*backend);
    side_copies[v] = cuda.sample_side_copies();
    side_uploads[v] = cuda.side_uploads();
    cluster_select[v] = cuda.cluster_select_launches();
  }
  EXPECT_GT(stats[0].overlapped_steps, 20);
  for (int v = 0; v < kVariants; ++v) {
    SCOPED_TRACE(::testing::Message() << "variant " << v);
    EXPECT_EQ(text[v], text[0]);
    EXPECT_EQ(stats[v].decode_graph_steps, stats[0].decode_graph_steps);
    // Every overlapped step's ids took the side stream.
    if (v >= 1)
      EXPECT_GE(side_copies[v], stats[v].overlapped_steps);
    else
      EXPECT_EQ(side_copies[v], 0);
    // Every decode-graph step after the first found a mark (the first has no forward before it).
    if (v >= 2)
      EXPECT_GE(side_uploads[v], stats[v].decode_graph_steps - 1);
    else
      EXPECT_EQ(side_uploads[v], 0);
    if (v >= 3)
      EXPECT_GT(cluster_select[v], 0);
    else
      EXPECT_EQ(cluster_select[v], 0);
  }
}

TEST_F(CudaEngine, KvCacheIsSizedFromGpuMemoryUtilization) {
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(backend_->memory_info(free_bytes, total_bytes));
  EXPECT_GT(total_bytes, 0u);
  EXPECT_LE(free_bytes, total_bytes);
  EngineConfig cfg;
  cfg.max_model_len = 1024;
  cfg.gpu_memory_utilization = 0.3f;
  {
    Engine engine(*model_, nullptr, cfg);
    const int64_t per_block =
        KvCache::bytes_per_block(model_->config(), cfg.block_size, backend_->kv_cache_dtype());
    const int64_t kv_bytes = engine.stats().kv_blocks_total * per_block;
    const auto in_use = static_cast<int64_t>(total_bytes - free_bytes);
    EXPECT_LE(kv_bytes, static_cast<int64_t>(0.3 * static_cast<double>(total_bytes)) - in_use);
    EXPECT_GT(kv_bytes,
              static_cast<int64_t>(0.3 * static_cast<double>(total_bytes)) - in_use - (int64_t{2} << 30));
    std::printf("KV pool at 0.3 of %zu MiB: %lld blocks, %lld MiB\n", total_bytes >> 20,
                static_cast<long long>(engine.stats().kv_blocks_total),
                static_cast<long long>(kv_bytes >> 20));
  }
  // Less than what is in use already: a clear error with the numbers.
  cfg.gpu_memory_utilization = 0.001f;
  try {
    Engine engine(*model_, nullptr, cfg);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no device memory left for the KV cache"), std::string::npos)
        << e.what();
  }
}

TEST_F(CudaEngine, OutOfMemorySaysWhatWasWantedAndWhatWasFree) {
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(backend_->memory_info(free_bytes, total_bytes));
  try {
    auto b = backend_->allocate(total_bytes * 2);
    FAIL() << "allocating twice the device memory succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("wanted {} bytes", total_bytes * 2)), std::string::npos) << m;
    EXPECT_NE(m.find("free of"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace inferx
