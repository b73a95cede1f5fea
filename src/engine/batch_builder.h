#pragma once
// Scheduler output -> the flattened BatchView the model runs: every scheduled token of every sequence,
// unpadded, with positions, query offsets, KV lengths, block tables and the rows that need logits. The
// arrays are laid out in one host buffer and copied to the backend in one transfer; both buffers only
// grow, so a steady stream of steps allocates nothing.
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/scheduler.h"

namespace inferx {

class BatchBuilder {
 public:
  explicit BatchBuilder(Backend& backend) : backend_(backend) {}
  // The view points into backend memory owned by this builder (valid until the next build()).
  // Row i of the logits belongs to the i-th scheduled sequence with sample == true.
  BatchView build(const SchedulerOutput& out);
  // Sizes both buffers for the largest batch the scheduler can produce, so that no later build()
  // allocates (the engine's warm-up: on CUDA a grown buffer frees the old one, which retires the recorded
  // decode graphs).
  void reserve(int32_t tokens, int32_t seqs, int32_t max_blocks, int32_t logits);
  // Host copy of the last batch's arrays (tests).
  const std::vector<int32_t>& host() const { return host_; }

 private:
  Backend& backend_;
  std::vector<int32_t> host_;
  std::unique_ptr<DeviceBuffer> device_;
  void ensure_device(size_t bytes);
};

}  // namespace inferx
