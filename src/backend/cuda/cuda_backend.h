#pragma once
// The CUDA backend (NVIDIA Hopper, sm_90a): device memory, one stream, kernels in kernels_*.cu and
// matrix products through cuBLASLt. This header includes no CUDA header, so code above backend/ (the
// CLI, tests) can create the backend without the CUDA toolkit's headers on its include path.
// All work is enqueued on the backend's stream in call order; copy_to_host and synchronize wait for it.
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

struct CUstream_st;  // = cudaStream_t's pointee (cuda_runtime_api.h)

namespace inferx {

namespace cuda {
class CublasLtGemm;
}

// CUDA devices this process can use; 0 without a driver or a GPU. Never throws.
int cuda_device_count();

// A backend on CUDA device `device`; throws inferx::Error when the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }

  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override;

  void embedding(const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) override;
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

 private:
  // Makes device_ current on the calling thread (the engine loop may run on another thread than the one
  // that created the backend; the current device is per thread).
  void use_device() const;
  const std::vector<float>& inverse_frequencies(const RopeParams& rope);

  int device_ = 0;
  CUstream_st* stream_ = nullptr;
  std::string name_;
  std::unique_ptr<cuda::CublasLtGemm> gemm_;
  // RoPE inverse frequencies (backend/rope.h), recomputed only when the parameters change.
  std::vector<float> inv_freq_;
  RopeParams inv_freq_params_;
};

}  // namespace inferx
