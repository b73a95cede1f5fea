// The tensor-parallel model's backend (model/tensor_parallel_backend.h) spreads graph capture over the
// ranks: all of them record or none does, a recording replays on every rank or on none (a rank replayed
// alone would wait in its first collective forever), and a failing rank still lets the others end their
// capture. Checked with rank backends that only log the graph calls (the CUDA side runs in
// tests/cuda/cuda_tensor_parallel_test.cpp).
#include "model/tensor_parallel_backend.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"
#include "core/error.h"

namespace inferx {
namespace {

Backend& shared_cpu() {
  static const std::unique_ptr<Backend> cpu = make_cpu_backend({1});
  return *cpu;
}

// A CPU backend that pretends to record graphs: it keeps the keys it ended with keep = true.
class GraphLogBackend final : public ForwardingBackend {
 public:
  explicit GraphLogBackend(std::string tag) : ForwardingBackend(shared_cpu()), tag_(std::move(tag)) {}
  bool begin_graph_capture() override {
    if (fail_begin) throw Error(tag_ + ": begin failed");
    if (decline) return false;
    capturing = true;
    log += "begin ";
    return true;
  }
  void end_graph_capture(uint64_t key, bool keep) override {
    if (!capturing) return;  // the Backend contract: nothing to end (CudaBackend does the same)
    capturing = false;
    log += keep ? "end " : "discard ";
    if (fail_end) throw Error(tag_ + ": end failed");
    if (keep && !lose_recording) graphs.insert(key);
  }
  bool has_graph(uint64_t key) const override { return graphs.count(key) > 0; }
  bool replay_graph(uint64_t key) override {
    if (fail_replay) throw Error(tag_ + ": launch failed");
    if (!graphs.count(key)) return false;
    log += "replay ";
    return true;
  }
  void drop_graph(uint64_t key) override { graphs.erase(key); }
  void synchronize() override { log += "sync "; }
  void clear_graphs() override { graphs.clear(); }

  bool decline = false, fail_begin = false, fail_end = false, lose_recording = false, fail_replay = false;
  bool capturing = false;
  std::string log;
  std::set<uint64_t> graphs;

 private:
  std::string tag_;
};

struct Ranks {
  explicit Ranks(int n) {
    for (int r = 0; r < n; ++r)
      owned.push_back(std::make_unique<GraphLogBackend>("rank " + std::to_string(r)));
    for (auto& b : owned) ptrs.push_back(b.get());
    tp = std::make_unique<TensorParallelBackend>(ptrs);
  }
  GraphLogBackend& operator[](int r) { return *owned[static_cast<size_t>(r)]; }
  std::vector<std::unique_ptr<GraphLogBackend>> owned;
  std::vector<Backend*> ptrs;
  std::unique_ptr<TensorParallelBackend> tp;
};

TEST(TensorParallelBackend, EveryRankRecordsAndReplays) {
  Ranks r(3);
  ASSERT_TRUE(r.tp->begin_graph_capture());
  r.tp->end_graph_capture(7);
  EXPECT_TRUE(r.tp->has_graph(7));
  EXPECT_TRUE(r.tp->replay_graph(7));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r[i].log, "begin end replay ") << "rank " << i;
  EXPECT_FALSE(r.tp->replay_graph(8));  // never recorded
  r.tp->clear_graphs();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(r[i].graphs.empty());
  EXPECT_NE(r.tp->name().find("rank 0 of 3"), std::string::npos) << r.tp->name();
}

TEST(TensorParallelBackend, SynchronizeWaitsForEveryRank) {
  Ranks r(3);
  r.tp->synchronize();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r[i].log, "sync ") << "rank " << i;
}

TEST(TensorParallelBackend, ARankThatDeclinesOrFailsEndsTheOthersCaptures) {
  Ranks declines(3);
  declines[2].decline = true;
  EXPECT_FALSE(declines.tp->begin_graph_capture());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(declines[i].log, "begin discard ") << "rank " << i;
    EXPECT_FALSE(declines[i].capturing);
  }
  Ranks fails(3);
  fails[1].fail_begin = true;
  EXPECT_THROW(fails.tp->begin_graph_capture(), Error);
  EXPECT_EQ(fails[0].log, "begin discard ");
  EXPECT_EQ(fails[2].log, "");
}

TEST(TensorParallelBackend, AFailingEndStillEndsEveryRankAndKeepsNothing) {
  Ranks r(3);
  ASSERT_TRUE(r.tp->begin_graph_capture());
  r[0].fail_end = true;
  EXPECT_THROW(r.tp->end_graph_capture(5), Error);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(r[i].capturing) << "rank " << i;
    EXPECT_TRUE(r[i].graphs.empty()) << "rank " << i << " kept a recording its peers lack";
  }
}

TEST(TensorParallelBackend, ARecordingMissingOnOneRankReplaysNowhere) {
  Ranks r(2);
  ASSERT_TRUE(r.tp->begin_graph_capture());
  r[1].lose_recording = true;  // e.g. a buffer of rank 1 moved during the capture
  r.tp->end_graph_capture(3);
  EXPECT_FALSE(r.tp->has_graph(3));
  EXPECT_TRUE(r[0].graphs.empty()) << "dropped where it was kept";
  // Recorded on both, then voided on rank 1 only: no rank replays, and rank 0's copy goes too.
  r[1].lose_recording = false;
  ASSERT_TRUE(r.tp->begin_graph_capture());
  r.tp->end_graph_capture(4);
  r[1].graphs.clear();
  EXPECT_FALSE(r.tp->replay_graph(4));
  EXPECT_EQ(r[0].log.find("replay"), std::string::npos) << r[0].log;
  EXPECT_TRUE(r[0].graphs.empty());
}

// A replay that launched ranks 0..k-1 and then failed on rank k leaves those ranks waiting in a collective
// for good: the group is failed (TensorParallel drops the graphs and aborts the communicators). A failure
// on rank 0 launched nothing and fails only the call.
TEST(TensorParallelBackend, APartialReplayFailsTheGroup) {
  Ranks r(3);
  std::vector<std::string> failed;
  r.tp->set_on_partial_replay([&](const std::string& why) { failed.push_back(why); });
  ASSERT_TRUE(r.tp->begin_graph_capture());
  r.tp->end_graph_capture(9);
  r[2].fail_replay = true;
  EXPECT_THROW(r.tp->replay_graph(9), Error);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].find("rank 2"), std::string::npos) << failed[0];
  EXPECT_NE(failed[0].find("launch failed"), std::string::npos) << failed[0];
  r[2].fail_replay = false;
  r[0].fail_replay = true;
  EXPECT_THROW(r.tp->replay_graph(9), Error);
  EXPECT_EQ(failed.size(), 1u) << "rank 0 launched nothing: no peer waits";
}

// Whether a capture ever began on every rank: from then on a communicator's abort waits for the graphs.
TEST(TensorParallelBackend, RemembersThatGraphsWereRecorded) {
  Ranks declines(2);
  declines[1].decline = true;
  EXPECT_FALSE(declines.tp->begin_graph_capture());
  EXPECT_FALSE(declines.tp->ever_captured());  // the CPU group: no capture, per-rank aborts stay
  Ranks r(2);
  EXPECT_FALSE(r.tp->ever_captured());
  ASSERT_TRUE(r.tp->begin_graph_capture());
  EXPECT_TRUE(r.tp->ever_captured());
  r.tp->end_graph_capture(1, false);
  EXPECT_TRUE(r.tp->ever_captured());
}

}  // namespace
}  // namespace inferx
