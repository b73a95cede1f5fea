#pragma once
// The CPU backend: host memory, F32 activations, kernels parallelised over the backend's ThreadPool.
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace inferx {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options);

  Device device() const override { return Device::CPU; }
  std::string name() const override;

  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override;
  std::unique_ptr<DeviceBuffer> allocate_upload(size_t bytes) override { return allocate(bytes); }
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override {}

  void embedding(const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) override;
  void embedding_shard(const Tensor& table, const int32_t* ids, int64_t n, int64_t first_id,
                       Tensor& out) override;
  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rmsnorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void head_rmsnorm(Tensor& x, int64_t head_dim, const Tensor& weight, float eps) override;
  void matmul(const Tensor& x, const Linear& w, Tensor& out) override;
  void rope_and_write_kv(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch,
                         const RopeParams& rope, KvCacheLayer& cache) override;
  void attention(const Tensor& q, const KvCacheLayer& cache, const BatchView& batch,
                 const AttentionParams& params, Tensor& out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, int64_t n, Tensor& out) override;
  void interleave_row_blocks(const Tensor& x, int64_t blocks, Tensor& out) override;

  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool pool_;
  // RoPE tables are recomputed only when the parameters change.
  std::vector<float> inv_freq_;
  RopeParams inv_freq_params_;
};

}  // namespace inferx
