#pragma once
// A CPU backend that also "samples on the device" (Backend::sample_tokens on host memory), so the
// engine's device-sampling decisions run without a GPU. Greedy rows pick the lowest index among equal
// maxima (what the CUDA kernel and the host sampler do); sampled rows draw from softmax(logits / T) with
// the given uniform (top-k/top-p/min-p are ignored: the tests check routing and batch invariance, the
// CUDA kernel itself is tested in tests/cuda).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace inferx::testing {

class DeviceSamplingCpuBackend final : public Backend {
 public:
  explicit DeviceSamplingCpuBackend(bool can_sample = true)
      : cpu_(make_cpu_backend({2})), can_sample_(can_sample) {}
  Device device() const override { return cpu_->device(); }
  std::string name() const override { return "cpu+device-sampling"; }
  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override { return cpu_->allocate(bytes); }
  void copy_to_device(void* d, const void* s, size_t n) override { cpu_->copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override {
    ++host_copies;
    cpu_->copy_to_host(d, s, n);
  }
  void synchronize() override { cpu_->synchronize(); }
  void embedding(const Tensor& t, const int32_t* ids, int64_t n, Tensor& out) override {
    cpu_->embedding(t, ids, n, out);
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    cpu_->rmsnorm(x, w, eps, out);
  }
  void add_rmsnorm(Tensor& r, const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    cpu_->add_rmsnorm(r, x, w, eps, out);
  }
  void head_rmsnorm(Tensor& x, int64_t hd, const Tensor& w, float eps) override {
    cpu_->head_rmsnorm(x, hd, w, eps);
  }
  void matmul(const Tensor& x, const Linear& w, Tensor& out) override { cpu_->matmul(x, w, out); }
  void rope_and_write_kv(Tensor& q, Tensor& k, const Tensor& v, const BatchView& b, const RopeParams& r,
                         KvCacheLayer& c) override {
    cpu_->rope_and_write_kv(q, k, v, b, r, c);
  }
  void attention(const Tensor& q, const KvCacheLayer& c, const BatchView& b, const AttentionParams& p,
                 Tensor& out) override {
    cpu_->attention(q, c, b, p, out);
  }
  void silu_mul(const Tensor& g, const Tensor& u, Tensor& out) override { cpu_->silu_mul(g, u, out); }
  void gather_rows(const Tensor& x, const int32_t* rows, int64_t n, Tensor& out) override {
    cpu_->gather_rows(x, rows, n, out);
  }
  DType kv_cache_dtype() const override { return cpu_->kv_cache_dtype(); }

  bool sample_tokens(const Tensor& logits, const TokenSampleParams* params, int32_t* ids) override {
    if (!can_sample_) return false;
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

  int64_t sample_calls = 0, sampled_rows = 0, host_copies = 0;

 private:
  std::unique_ptr<Backend> cpu_;
  bool can_sample_;
};

}  // namespace inferx::testing
