// BatchBuilder: the flattened step metadata, including the decode-prefix hint the CUDA backend uses to
// split a mixed step between its decode and prefill attention kernels.
#include "engine/batch_builder.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"

namespace inferx {
namespace {

struct Step {
  std::vector<std::unique_ptr<Sequence>> seqs;
  SchedulerOutput out;
  // One scheduled sequence per entry of num_new (each with a 40-token history and 3 blocks).
  explicit Step(const std::vector<int32_t>& num_new) {
    for (int32_t n : num_new) {
      auto s = std::make_unique<Sequence>();
      s->tokens.assign(40 + static_cast<size_t>(n), 7);
      s->blocks = {0, 1, 2};
      out.seqs.push_back({s.get(), 40, n, true});
      out.num_tokens += n;
      seqs.push_back(std::move(s));
    }
  }
};

int32_t decode_prefix(const std::vector<int32_t>& num_new) {
  auto backend = make_cpu_backend({1});
  BatchBuilder builder(*backend);
  Step step(num_new);
  const BatchView b = builder.build(step.out);
  EXPECT_EQ(b.num_seqs, static_cast<int32_t>(num_new.size()));
  return b.num_decode_prefix;
}

TEST(BatchBuilder, CountsTheLeadingOneTokenSequences) {
  EXPECT_EQ(decode_prefix({1, 1, 1, 17, 5}), 3);  // decodes, then prefill chunks (the scheduler's order)
  EXPECT_EQ(decode_prefix({1, 1}), 2);            // a pure decode step
  EXPECT_EQ(decode_prefix({9, 1, 1}), 0);         // one-token sequences after a chunk are not a prefix
  EXPECT_EQ(decode_prefix({1, 4, 1}), 1);
  EXPECT_EQ(decode_prefix({32}), 0);
}

TEST(BatchBuilder, LaysOutTokensPositionsAndOffsets) {
  auto backend = make_cpu_backend({1});
  BatchBuilder builder(*backend);
  Step step({1, 3});
  const BatchView b = builder.build(step.out);
  ASSERT_EQ(b.num_tokens, 4);
  EXPECT_EQ(b.query_start[0], 0);
  EXPECT_EQ(b.query_start[1], 1);
  EXPECT_EQ(b.query_start[2], 4);
  EXPECT_EQ(b.positions[0], 40);
  EXPECT_EQ(b.positions[3], 42);
  EXPECT_EQ(b.seq_lens[1], 43);
  EXPECT_EQ(b.max_query_len, 3);
  EXPECT_EQ(b.num_logits, 2);
  EXPECT_EQ(b.logits_rows[1], 3);
}

}  // namespace
}  // namespace inferx
