// BatchSampler: rows sampled on a ThreadPool give exactly the tokens and logprobs of rows sampled one
// after another, and each row equals what its own Sampler draws from the processed row.
#include "engine/batch_sampler.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "core/thread_pool.h"

namespace inferx {
namespace {

struct Batch {
  std::vector<std::unique_ptr<RequestState>> reqs;
  SchedulerOutput out;
};

// `n` sequences with a mix of greedy, temperature, top-k, top-p, min-p, penalties, logit_bias and
// logprobs; seeds depend only on the sequence number, so two batches built alike draw alike.
Batch make_batch(int n, int64_t vocab) {
  Batch b;
  for (int i = 0; i < n; ++i) {
    auto r = std::make_unique<RequestState>();
    GenerationParams& p = r->req.params;
    r->req.prompt = {1, 2, 3, static_cast<int32_t>(i % vocab)};
    p.temperature = i % 5 == 0 ? 0.0f : 0.7f + 0.1f * static_cast<float>(i % 4);
    p.top_k = i % 7 == 1 ? 20 : 0;
    p.top_p = i % 3 == 1 ? 0.9f : 1.0f;
    p.min_p = i % 11 == 2 ? 0.05f : 0.0f;
    p.repetition_penalty = i % 13 == 3 ? 1.3f : 1.0f;
    p.frequency_penalty = i % 17 == 4 ? 0.5f : 0.0f;
    if (i % 19 == 5) p.logit_bias = {{7, 5.0f}};
    p.logprobs = i % 6 == 0 ? 3 : -1;
    auto s = std::make_unique<Sequence>();
    s->request = r.get();
    s->index = 0;
    s->tokens = r->req.prompt;
    s->num_prompt = static_cast<int32_t>(r->req.prompt.size());
    s->sampler.emplace(
        SamplingParams{p.temperature, p.top_k, p.top_p, p.min_p, static_cast<uint64_t>(1000 + i)});
    s->penalties = PenaltyState(p, r->req.prompt);
    s->penalties.add_generated(9);
    b.out.seqs.push_back({s.get(), 0, 1, true});
    if (i % 9 == 8) b.out.seqs.push_back({s.get(), 0, 1, false});  // a prefill chunk: no row, no sample
    r->seqs.push_back(std::move(s));
    b.reqs.push_back(std::move(r));
  }
  return b;
}

std::vector<float> random_rows(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n * vocab));
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(BatchSampler, ParallelRowsEqualSerialRowsAndPerRowSamplers) {
  constexpr int kRows = 300;
  for (int64_t vocab : {512, 5000}) {
    Batch serial_batch = make_batch(kRows, vocab), parallel_batch = make_batch(kRows, vocab),
          reference_batch = make_batch(kRows, vocab);
    ThreadPool pool(3);
    BatchSampler serial, parallel(&pool);
    std::vector<SampledToken> a, b;
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> rows = random_rows(kRows, vocab, static_cast<uint32_t>(step));
      std::vector<float> rows_a = rows, rows_b = rows;
      serial.sample(serial_batch.out, rows_a.data(), vocab, a);
      parallel.sample(parallel_batch.out, rows_b.data(), vocab, b);
      ASSERT_EQ(a.size(), static_cast<size_t>(kRows));
      ASSERT_EQ(b.size(), a.size());
      EXPECT_EQ(rows_a, rows_b) << "in-place processing differs";
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].seq, serial_batch.reqs[i]->seqs[0].get());
        EXPECT_EQ(a[i].token, b[i].token) << "row " << i << " step " << step;
        ASSERT_EQ(a[i].has_logprob, b[i].has_logprob);
        EXPECT_EQ(a[i].logprob.logprob, b[i].logprob.logprob);
        EXPECT_EQ(a[i].logprob.top, b[i].logprob.top);
        // Reference: this sequence's own Sampler on the processed row (the rows were processed in
        // place, so rows_a holds what the sampler saw).
        Sequence& ref = *reference_batch.reqs[i]->seqs[0];
        const float* row = rows_a.data() + static_cast<int64_t>(i) * vocab;
        EXPECT_EQ(ref.sampler->sample(row, vocab), a[i].token) << "row " << i;
      }
    }
  }
}

TEST(BatchSampler, LogprobsAreRawAndTopIsOrderedWithIdTieBreak) {
  Batch batch = make_batch(1, 8);
  GenerationParams& p = batch.reqs[0]->req.params;
  p.temperature = 0.0f;
  p.logprobs = 3;
  p.logit_bias = {{0, 100.0f}};  // changes the choice, not the reported logprobs
  std::vector<float> row = {1.0f, 3.0f, 3.0f, -std::numeric_limits<float>::infinity(),
                            0.0f, 2.0f, 3.0f, 1.0f};
  const std::vector<float> raw = row;
  std::vector<SampledToken> out;
  BatchSampler().sample(batch.out, row.data(), 8, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].token, 0);
  double sum = 0;
  for (float x : raw) sum += std::exp(static_cast<double>(x));
  const double lse = std::log(sum);
  EXPECT_NEAR(out[0].logprob.logprob, 1.0 - lse, 1e-6);
  ASSERT_EQ(out[0].logprob.top.size(), 3u);
  EXPECT_EQ(out[0].logprob.top[0].first, 1);
  EXPECT_EQ(out[0].logprob.top[1].first, 2);
  EXPECT_EQ(out[0].logprob.top[2].first, 6);
  EXPECT_NEAR(out[0].logprob.top[2].second, 3.0 - lse, 1e-6);
}

}  // namespace
}  // namespace inferx
