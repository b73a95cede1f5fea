#pragma once
// out[T, N] = x[T, K] @ W[N, K]^T (+ bias) on the GPU through cuBLASLt, for F32, F16 and BF16 weights with
// F32 outputs and F32 accumulation. Activations come as F32 (rounded to a 16-bit weight's type by one
// small kernel first, since cuBLAS needs A and B of one type) or already as BF16 (the fused norm and
// SiLU kernels write them). The bias is added in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS).
// One plan (descriptors + algorithm) is cached per shape, dtype, bias and pointer alignment. For small
// row counts (decode, where the same shapes repeat every step) the heuristic's top candidates are timed
// once on the real operands and the fastest kept; larger shapes take the heuristic's first choice.
// One workspace is reused by every call. Quantized GGUF weight types are rejected with an error.
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

  // All pointers are device pointers; x [t, k] of x_dtype (F32, or BF16 with BF16 weights), w [n, k] of
  // w_dtype, bias [n] F32 or null, out [t, n] F32 (row-major).
  void matmul(const void* x, DType x_dtype, int64_t t, int64_t k, DType w_dtype, const void* w, int64_t n,
              const float* bias, float* out);
  // While a CUDA graph is being captured nothing may synchronize: no algorithm timing, no buffer growth.
  void set_capturing(bool capturing) { capturing_ = capturing; }
  // Bumped whenever a buffer a captured graph may point at is reallocated.
  uint64_t buffer_generation() const { return generation_; }

 private:
  // dtype, n, t, k, bias, and the byte alignments (capped at 256) of the weight, activation and output.
  using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, bool, int, int, int>;
  struct Plan;

  const Plan& plan_for(const PlanKey& key, cudaDataType_t w_type, const void* w, const void* x, float* out,
                       const float* bias);
  void run(const Plan& plan, const cublasLtMatmulAlgo_t* algo, const void* w, const void* x, float* out,
           const float* bias);
  const void* activations_as(const float* x, int64_t count, DType to);

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;  // fallback when cuBLASLt's heuristic offers no algorithm
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* converted_ = nullptr;  // activations rounded to 16 bits; grown stream-ordered, never shrunk
  size_t converted_bytes_ = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
  bool capturing_ = false;
  uint64_t generation_ = 0;
};

}  // namespace inferx::cuda
