#pragma once
// A CPU backend that also "samples on the device" (Backend::sample_tokens on host memory), so the
// engine's device-sampling decisions run without a GPU. Greedy rows pick the lowest index among equal
// maxima (what the CUDA kernel and the host sampler do); sampled rows draw from softmax(logits / T) with
// the given uniform (top-k/top-p/min-p are ignored: the tests check routing and batch invariance, the
// CUDA kernel itself is tested in tests/cuda).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"
#include "core/error.h"

namespace inferx::testing {

class DeviceSamplingCpuBackend final : public ForwardingBackend {
 public:
  explicit DeviceSamplingCpuBackend(bool can_sample = true)
      : DeviceSamplingCpuBackend(make_cpu_backend({2}), can_sample) {}
  std::string name() const override { return "cpu+device-sampling"; }
  void copy_to_host(void* d, const void* s, size_t n) override {
    ++host_copies;
    ForwardingBackend::copy_to_host(d, s, n);
  }

  bool sample_tokens(const Tensor& logits, const TokenSampleParams* params, int32_t* ids) override {
    if (!can_sample_) return false;
    maybe_fail();
    ++sample_calls;
    const int64_t rows = logits.rows(), vocab = logits.cols();
    sampled_rows += rows;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = static_cast<const float*>(logits.data) + r * vocab;
      int64_t best = 0;
      for (int64_t i = 1; i < vocab; ++i)
        if (row[i] > row[best]) best = i;
      ids[r] = static_cast<int32_t>(best);
      if (!params || !(params[r].temperature > 0.0f)) continue;
      const float t = params[r].temperature;
      double total = 0;
      for (int64_t i = 0; i < vocab; ++i) total += std::exp((row[i] - row[best]) / t);
      const double target = params[r].uniform * total;
      double cum = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        cum += std::exp((row[i] - row[best]) / t);
        if (cum > target) {
          ids[r] = static_cast<int32_t>(i);
          break;
        }
      }
    }
    return true;
  }

  // Logit edits (logit_bias and penalties on the device) with the rounding the CUDA kernel uses: one IEEE
  // operation at a time, in the host processors' order.
  bool edit_logits(Tensor& logits, const LogitEdit* edits, int64_t n) override {
    if (!can_sample_ || !can_edit) return false;
    ++edit_calls;
    float* l = static_cast<float*>(logits.data);
    for (int64_t i = 0; i < n; ++i) {
      float& x = l[edits[i].row * logits.cols() + edits[i].token];
      x = apply_logit_edit(x, edits[i]);
    }
    return true;
  }
  bool can_edit = true;
  int64_t edit_calls = 0;

  // Asynchronous sampling (overlapped decode steps): the ids are chosen at once into the slot (host memory
  // is this backend's device memory); a wait only hands them out, a gather reads them where they are.
  bool async_sampling() const override { return can_sample_; }
  // A slot is sampled into again only after its previous ids were waited for: on CUDA the wait is what
  // makes reusing the step's host-side buffers safe (the engine's retire() of a step nothing wants). A
  // call that throws has queued nothing.
  void sample_tokens_async(const Tensor& logits, const TokenSampleParams* params, int slot) override {
    maybe_fail();
    EXPECT_FALSE(unwaited_.at(static_cast<size_t>(slot))) << "slot " << slot << " reused before a wait";
    auto& ids = slots_.at(static_cast<size_t>(slot));
    ids.assign(static_cast<size_t>(logits.rows()), -1);
    if (!ids.empty()) sample_tokens(logits, params, ids.data());
    unwaited_.at(static_cast<size_t>(slot)) = true;
    ++async_calls;
  }
  void wait_sampled_tokens(int slot, int32_t* host_ids, int64_t rows) override {
    unwaited_.at(static_cast<size_t>(slot)) = false;
    const auto& ids = slots_.at(static_cast<size_t>(slot));
    ASSERT_EQ(static_cast<int64_t>(ids.size()), rows) << "slot " << slot;
    std::copy(ids.begin(), ids.end(), host_ids);
  }
  void gather_sampled_tokens(int slot, const int32_t* rows, int64_t n, int32_t* out) override {
    const auto& ids = slots_.at(static_cast<size_t>(slot));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(rows[i] >= 0 && static_cast<size_t>(rows[i]) < ids.size()) << "row " << rows[i];
      out[i] = ids[static_cast<size_t>(rows[i])];
    }
  }

  // A new engine on this backend: what an engine destroyed with a step in flight left unwaited is gone.
  void reset_slots() { unwaited_ = {}; }

  int64_t sample_calls = 0, sampled_rows = 0, host_copies = 0, async_calls = 0;
  // > 0: the fail_after-th sampling call from now (synchronous or not) throws, as a failing device would.
  int fail_after = 0;

 private:
  void maybe_fail() {
    if (fail_after > 0 && --fail_after == 0) throw Error("injected device failure");
  }
  DeviceSamplingCpuBackend(std::unique_ptr<Backend> cpu, bool can_sample)
      : ForwardingBackend(*cpu), cpu_(std::move(cpu)), can_sample_(can_sample) {}
  std::unique_ptr<Backend> cpu_;
  bool can_sample_;
  std::array<std::vector<int32_t>, 2> slots_;
  std::array<bool, 2> unwaited_{};
};

}  // namespace inferx::testing
