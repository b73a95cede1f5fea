// StepSampler: which rows are sampled on the device (Backend::sample_tokens) and which on the host, the
// seed-and-index keyed draws, and the engine end to end on a CPU backend that can "sample on the device"
// (device_backend_fake.h): greedy output equal to the host path, seeded output independent of the batch.
#include "engine/step_sampler.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>

#include "device_backend_fake.h"
#include "engine/logits_processors.h"
#include "engine_test_requests.h"
#include "inferx/engine.h"
#include "model/model.h"

namespace inferx {
namespace {

using testing::DeviceSamplingCpuBackend;

// Sequences with their requests, scheduled for one sampling step each.
struct Rows {
  std::vector<std::unique_ptr<RequestState>> reqs;
  SchedulerOutput out;

  Sequence& add(const GenerationParams& p, uint64_t seed) {
    auto r = std::make_unique<RequestState>();
    r->req.params = p;
    r->req.prompt = {1, 2, 3};
    auto s = std::make_unique<Sequence>();
    s->request = r.get();
    s->tokens = r->req.prompt;
    s->num_prompt = 3;
    s->sampler.emplace(SamplingParams{p.temperature, p.top_k, p.top_p, p.min_p, seed});
    s->seed = seed;
    s->penalties = PenaltyState(p, r->req.prompt);
    Sequence& ref = *s;
    out.seqs.push_back({s.get(), 0, 3, true});
    r->seqs.push_back(std::move(s));
    reqs.push_back(std::move(r));
    return ref;
  }
};

GenerationParams greedy_params() {
  GenerationParams p;
  p.temperature = 0.0f;
  return p;
}

std::vector<float> random_logits(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(rows * vocab));
  for (float& x : v) x = n(rng);
  return v;
}

TEST(StepSampler, DeviceEligibilityFollowsOnlyTheRequestsOwnParameters) {
  Rows rows;
  GenerationParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  EXPECT_TRUE(samples_on_device(rows.add(p, 1)));
  EXPECT_TRUE(samples_on_device(rows.add(greedy_params(), 1)));
  EXPECT_FALSE(needs_logit_edits(rows.add(p, 1)));
  GenerationParams lp = greedy_params();
  lp.logprobs = 0;
  EXPECT_FALSE(samples_on_device(rows.add(lp, 1)));
  // logit_bias and penalties run on the device too, as edits of the row.
  GenerationParams bias = p;
  bias.logit_bias = {{5, 1.0f}};
  GenerationParams rep = p;
  rep.repetition_penalty = 1.1f;
  GenerationParams pres = p;
  pres.presence_penalty = 0.5f;
  GenerationParams freq = p;
  freq.frequency_penalty = -0.5f;
  for (const GenerationParams* q : {&bias, &rep, &pres, &freq}) {
    Sequence& s = rows.add(*q, 1);
    EXPECT_TRUE(samples_on_device(s));
    EXPECT_TRUE(needs_logit_edits(s));
  }
}

// The edits of a row, applied with one IEEE operation at a time, give exactly the host processors' row
// (apply_logit_bias, then PenaltyState::apply), for every penalty mix, tokens outside the vocabulary
// ignored; a token twice in the bias is refused.
TEST(StepSampler, LogitEditsEqualTheHostProcessorsExactly) {
  constexpr int64_t kVocab = 500;
  std::mt19937 rng(4);
  std::uniform_int_distribution<int32_t> tok(-3, kVocab + 3);
  for (int trial = 0; trial < 40; ++trial) {
    GenerationParams p;
    p.repetition_penalty = trial % 2 ? 1.3f : 1.0f;
    p.presence_penalty = trial % 3 ? 0.7f : 0.0f;
    p.frequency_penalty = trial % 5 ? -0.4f : 0.0f;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 30; ++i) prompt.push_back(std::clamp(tok(rng), 0, int32_t{kVocab - 1}));
    PenaltyState st(p, prompt);
    for (int i = 0; i < 25; ++i) st.add_generated(std::clamp(tok(rng), 0, int32_t{kVocab - 1}));
    std::vector<std::pair<int32_t, float>> bias;
    for (int i = 0; i < trial % 7; ++i) bias.emplace_back(tok(rng), 0.37f * static_cast<float>(i - 3));
    std::sort(bias.begin(), bias.end());
    bias.erase(std::unique(bias.begin(), bias.end(),
                           [](const auto& a, const auto& b) { return a.first == b.first; }),
               bias.end());
    std::vector<float> host = random_logits(1, kVocab, 100 + static_cast<uint32_t>(trial)), dev = host;
    apply_logit_bias(host.data(), kVocab, bias);
    st.apply(host.data(), kVocab);
    std::vector<LogitEdit> edits;
    ASSERT_TRUE(st.append_edits(0, bias, kVocab, edits));
    for (const LogitEdit& e : edits) {
      ASSERT_TRUE(e.row == 0 && e.token >= 0 && e.token < kVocab);
      float& x = dev[static_cast<size_t>(e.token)];
      x = apply_logit_edit(x, e);
    }
    for (int64_t t = 0; t < kVocab; ++t)
      ASSERT_EQ(dev[static_cast<size_t>(t)], host[static_cast<size_t>(t)])
          << "trial " << trial << " token " << t;
  }
  PenaltyState none;
  std::vector<LogitEdit> edits;
  EXPECT_FALSE(none.append_edits(0, {{4, 1.0f}, {4, 2.0f}}, kVocab, edits));
  EXPECT_TRUE(edits.empty());
}

TEST(StepSampler, DrawsAreKeyedBySeedAndTokenIndex) {
  std::map<float, int> seen;
  for (uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
    for (int64_t k = 0; k < 200; ++k) {
      const float u = device_uniform(seed, k);
      EXPECT_GE(u, 0.0f);
      EXPECT_LT(u, 1.0f);
      EXPECT_EQ(u, device_uniform(seed, k));
      ++seen[u];
    }
  }
  EXPECT_GT(seen.size(), 590u);  // 600 draws, distinct up to rare 24-bit collisions
  Rows rows;
  GenerationParams p;
  p.temperature = 1.0f;
  Sequence& s = rows.add(p, 42);
  EXPECT_EQ(device_sample_params(s).uniform, device_uniform(42, 0));
  s.tokens.push_back(7);
  EXPECT_EQ(device_sample_params(s).uniform, device_uniform(42, 1));
  EXPECT_EQ(device_sample_params(rows.add(greedy_params(), 42)).temperature, 0.0f);
}

TEST(StepSampler, GreedyRowsOnTheDeviceEqualTheHostPath) {
  constexpr int64_t kRows = 7, kVocab = 300;
  std::vector<float> logits = random_logits(kRows, kVocab, 3);
  logits[2 * kVocab + 10] = logits[2 * kVocab + 20] = 50.0f;  // a tie: the lower index wins everywhere
  Rows rows;
  for (int64_t i = 0; i < kRows; ++i) rows.add(greedy_params(), static_cast<uint64_t>(i));
  const Tensor t(DType::F32, {kRows, kVocab}, logits.data());

  DeviceSamplingCpuBackend dev;
  StepSampler on_device(dev, true, nullptr);
  std::vector<SampledToken> a, b;
  on_device.sample(rows.out, t, a);
  EXPECT_EQ(dev.sample_calls, 1);
  EXPECT_EQ(dev.host_copies, 0);  // only the ids came back
  EXPECT_EQ(on_device.device_rows(), kRows);

  std::vector<float> copy = random_logits(kRows, kVocab, 3);
  copy[2 * kVocab + 10] = copy[2 * kVocab + 20] = 50.0f;
  const Tensor t2(DType::F32, {kRows, kVocab}, copy.data());
  DeviceSamplingCpuBackend host_be;
  StepSampler on_host(host_be, false, nullptr);
  on_host.sample(rows.out, t2, b);
  EXPECT_EQ(host_be.sample_calls, 0);
  EXPECT_EQ(on_host.host_rows(), kRows);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].seq, rows.out.seqs[i].seq);
    EXPECT_EQ(a[i].token, b[i].token) << "row " << i;
  }
  EXPECT_EQ(a[2].token, 10);
}

TEST(StepSampler, RowsThatNeedTheHostAreCopiedAndSampledThere) {
  constexpr int64_t kVocab = 256;
  std::vector<float> logits = random_logits(4, kVocab, 9);
  Rows rows;
  rows.add(greedy_params(), 1);
  GenerationParams lp = greedy_params();
  lp.logprobs = 2;
  rows.add(lp, 2);
  GenerationParams bias = greedy_params();
  bias.logit_bias = {{77, 100.0f}};
  rows.add(bias, 3);
  GenerationParams sampled;
  sampled.temperature = 0.8f;
  rows.add(sampled, 4);
  const Tensor t(DType::F32, {4, kVocab}, logits.data());
  DeviceSamplingCpuBackend dev;
  StepSampler s(dev, true, nullptr);
  std::vector<SampledToken> out;
  s.sample(rows.out, t, out);
  ASSERT_EQ(out.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(out[i].seq, rows.out.seqs[i].seq);
  EXPECT_EQ(s.device_rows(), 3);
  EXPECT_EQ(s.host_rows(), 1);
  EXPECT_EQ(dev.host_copies, 1);  // the logprobs row only
  EXPECT_EQ(dev.edit_calls, 1);
  EXPECT_FALSE(out[0].has_logprob);
  EXPECT_TRUE(out[1].has_logprob);
  EXPECT_EQ(out[1].logprob.top.size(), 2u);
  EXPECT_EQ(out[2].token, 77);  // logit_bias applied on the device
  const float* r1 = logits.data() + kVocab;
  EXPECT_EQ(out[1].token, static_cast<int32_t>(std::max_element(r1, r1 + kVocab) - r1));

  // A backend that cannot edit: the bias row goes to the host, with the same result.
  std::vector<float> again = random_logits(4, kVocab, 9);
  const Tensor t2(DType::F32, {4, kVocab}, again.data());
  DeviceSamplingCpuBackend no_edit;
  no_edit.can_edit = false;
  StepSampler s2(no_edit, true, nullptr);
  std::vector<SampledToken> out2;
  s2.sample(rows.out, t2, out2);
  EXPECT_EQ(s2.device_rows(), 2);
  EXPECT_EQ(s2.host_rows(), 2);
  EXPECT_EQ(no_edit.host_copies, 2);
  ASSERT_EQ(out2.size(), 4u);
  EXPECT_EQ(out2[2].token, 77);
  EXPECT_EQ(out2[0].token, out[0].token);
}

TEST(StepSampler, ABackendWithoutDeviceSamplingGetsTheHostPath) {
  std::vector<float> logits = random_logits(3, 64, 1);
  Rows rows;
  for (int i = 0; i < 3; ++i) rows.add(greedy_params(), 1);
  const Tensor t(DType::F32, {3, 64}, logits.data());
  DeviceSamplingCpuBackend cpu(/*can_sample=*/false);
  StepSampler s(cpu, true, nullptr);
  std::vector<SampledToken> out;
  s.sample(rows.out, t, out);
  s.sample(rows.out, t, out);
  EXPECT_EQ(s.device_rows(), 0);
  EXPECT_EQ(s.host_rows(), 6);
  EXPECT_EQ(cpu.host_copies, 2);  // the whole block once per step
}

// The engine on a backend that samples "on the device" ------------------------------------------------

class DeviceSamplingEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dev_ = new DeviceSamplingCpuBackend();
    cpu_ = make_cpu_backend({2}).release();
    dev_model_ = Model::load("dummy:tiny", *dev_).release();
    cpu_model_ = Model::load("dummy:tiny", *cpu_).release();
  }
  static void TearDownTestSuite() {
    delete dev_model_;
    delete cpu_model_;
    delete dev_;
    delete cpu_;
  }
  static std::vector<int32_t> prompt(int32_t len, int32_t salt) { return testing::test_prompt(len, salt); }
  // Runs the requests to the end on `model`; returns each request's tokens.
  // Request i's prompt is prompt(.., salts[i]) (default: i).
  static std::vector<std::vector<int32_t>> run(Model& model, const std::vector<GenerationParams>& params,
                                               EngineStats* stats = nullptr,
                                               std::vector<int32_t> salts = {}) {
    for (auto i = static_cast<int32_t>(salts.size()); i < static_cast<int32_t>(params.size()); ++i)
      salts.push_back(i);
    EngineConfig cfg;
    cfg.max_model_len = 256;
    cfg.max_num_batched_tokens = 64;
    std::vector<std::vector<int32_t>> prompts;
    for (const int32_t salt : salts) prompts.push_back(prompt(10 + 9 * salt, salt));
    return testing::run_requests(model, cfg, prompts, params, stats);
  }
  static DeviceSamplingCpuBackend* dev_;
  static Backend* cpu_;
  static Model *dev_model_, *cpu_model_;
};
DeviceSamplingCpuBackend* DeviceSamplingEngine::dev_ = nullptr;
Backend* DeviceSamplingEngine::cpu_ = nullptr;
Model* DeviceSamplingEngine::dev_model_ = nullptr;
Model* DeviceSamplingEngine::cpu_model_ = nullptr;

TEST_F(DeviceSamplingEngine, GreedyOutputEqualsTheHostPath) {
  std::vector<GenerationParams> ps(5, greedy_params());
  for (auto& p : ps) {
    p.max_tokens = 10;
    p.ignore_eos = true;
  }
  ps[3].logprobs = 1;  // a host row in the same batch
  EngineStats st;
  const auto dev = run(*dev_model_, ps, &st);
  const auto host = run(*cpu_model_, ps);
  EXPECT_EQ(dev, host);
  EXPECT_EQ(st.device_sampled_tokens, 40);  // every token but the logprobs request's
}

// logit_bias and the three penalties applied on the device (edits) give the host processors' greedy text.
TEST_F(DeviceSamplingEngine, PenaltiesAndLogitBiasOnTheDeviceEqualTheHostPath) {
  std::vector<GenerationParams> ps(5, greedy_params());
  for (auto& p : ps) {
    p.max_tokens = 16;
    p.ignore_eos = true;
  }
  ps[0].repetition_penalty = 1.5f;
  ps[1].presence_penalty = 1.2f;
  ps[2].frequency_penalty = 0.9f;
  ps[3].logit_bias = {{17, 6.0f}, {301, -4.0f}};
  ps[4].repetition_penalty = 0.8f;
  ps[4].frequency_penalty = -0.5f;
  ps[4].logit_bias = {{42, 2.5f}};
  const int64_t edits_before = dev_->edit_calls;
  EngineStats st;
  const auto dev = run(*dev_model_, ps, &st);
  const auto host = run(*cpu_model_, ps);
  EXPECT_EQ(dev, host);
  EXPECT_EQ(st.device_sampled_tokens, 80);  // every token on the device
  EXPECT_GT(dev_->edit_calls, edits_before);
  // The penalties change the text (so the comparison above can fail): the plain greedy text differs.
  std::vector<GenerationParams> plain(5, ps[0]);
  for (auto& p : plain) p.repetition_penalty = 1.0f;
  EXPECT_NE(run(*cpu_model_, plain)[0], host[0]);
}

TEST_F(DeviceSamplingEngine, SeededSamplingIsTheSameWhateverElseIsInTheBatch) {
  GenerationParams seeded;
  seeded.temperature = 1.0f;
  seeded.seed = 99;
  seeded.max_tokens = 12;
  seeded.ignore_eos = true;
  const auto alone = run(*dev_model_, {seeded});
  std::vector<GenerationParams> crowd(4, seeded);
  crowd[0].seed = 5;
  crowd[1].logprobs = 0;  // host rows mixed in
  crowd[2] = greedy_params();
  crowd[2].max_tokens = 5;
  crowd.push_back(seeded);  // the request under test, last: another batch row than when alone
  const std::vector<int32_t> salts = {1, 2, 3, 4, 0};  // ... with the same prompt (salt 0)
  const auto together = run(*dev_model_, crowd, nullptr, salts);
  EXPECT_EQ(together[4], alone[0]);
  EXPECT_EQ(together[4].size(), 12u);
  EXPECT_NE(together[0], alone[0]);  // another seed, another text (the check above can fail)
  const auto again = run(*dev_model_, crowd, nullptr, salts);
  EXPECT_EQ(again, together);  // reproducible between runs
}

}  // namespace
}  // namespace inferx
