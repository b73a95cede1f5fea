#pragma once
// The backend a tensor-parallel model presents to the engine (model/tensor_parallel.h): rank 0's, with
// CUDA graph capture spread over every rank. A step of N ranks is N streams, each with its own kernels
// and its side of every collective, so a recording is one graph per rank under one key: begin / end
// capture on every rank's backend (rank threads then launch into streams that are being recorded), and a
// replay launches all N or none (a rank's graph replayed without its peers would wait in its first
// collective forever). synchronize() waits for every rank (a step is done when its last rank is: the engine
// frees or reuses what the step used after it). Everything else goes to rank 0: the gathered logits, the
// sampler and the step's metadata (which the model broadcasts to the other ranks inside the step) live
// there.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"

namespace inferx {

class TensorParallelBackend final : public ForwardingBackend {
 public:
  // ranks[0] is the backend forwarded to; every rank's outlives this.
  explicit TensorParallelBackend(std::vector<Backend*> ranks);
  std::string name() const override;
  void synchronize() override;

  // All ranks or none: a rank that declines (CPU) or fails ends the captures already begun, discarded.
  bool begin_graph_capture() override;
  // Ends every rank's capture (also after one of them throws); a recording that some rank did not keep is
  // dropped on every rank. Rethrows the first rank's error.
  void end_graph_capture(uint64_t key, bool keep = true) override;
  // Replays when every rank has a valid recording (else drops the key everywhere and returns false).
  bool replay_graph(uint64_t key) override;
  bool has_graph(uint64_t key) const override;
  void drop_graph(uint64_t key) override;
  void clear_graphs() override;

  // Whether a capture was ever begun: from then on NCCL holds references for recorded collectives that
  // only destroying the graphs releases, and a communicator's abort or destroy waits for them (so the
  // ranks' graphs must go first; TensorParallel's failure and teardown paths).
  bool ever_captured() const { return ever_captured_.load(std::memory_order_acquire); }
  // Called when a replay launched some ranks' graphs but not all (their collectives now wait for peers
  // that will never join): TensorParallel fails the group (graphs dropped, communicators aborted).
  void set_on_partial_replay(std::function<void(const std::string&)> f) { on_partial_replay_ = std::move(f); }

 private:
  std::vector<Backend*> ranks_;
  std::atomic<bool> ever_captured_{false};
  std::function<void(const std::string&)> on_partial_replay_;
};

}  // namespace inferx
