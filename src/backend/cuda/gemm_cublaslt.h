#pragma once
// out[T, N] = x[T, K] @ W[N, K]^T on the GPU through cuBLASLt, for F32, F16 and BF16 weights with F32
// activations and outputs. 16-bit weights: the activations are first rounded to the weight's type (one
// small kernel) because cuBLAS needs A and B of one type; accumulation is F32 either way.
// One plan (descriptors + the heuristic's algorithm) is cached per shape, dtype and pointer alignment;
// one workspace is reused by every call. Quantized GGUF weight types are rejected with an error.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "core/dtype.h"

namespace inferx::cuda {

class CublasLtGemm {
 public:
  explicit CublasLtGemm(cudaStream_t stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // All pointers are device pointers; x [t, k] F32, w [n, k] of w_dtype, out [t, n] F32 (row-major).
  void matmul(const float* x, int64_t t, int64_t k, DType w_dtype, const void* w, int64_t n, float* out);

 private:
  // dtype, n, t, k and the byte alignments (capped at 256) of the weight, activation and output pointers.
  using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int, int, int>;
  struct Plan;

  const Plan& plan_for(const PlanKey& key, cudaDataType_t w_type);
  const void* activations_as(const float* x, int64_t count, DType to);

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;  // fallback when cuBLASLt's heuristic offers no algorithm
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* converted_ = nullptr;  // activations rounded to 16 bits; grown stream-ordered, never shrunk
  size_t converted_bytes_ = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace inferx::cuda
