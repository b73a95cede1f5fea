#pragma once
// Every CUDA runtime and cuBLAS(Lt) call goes through these macros: a failing call throws inferx::Error
// naming the call, the source location and the library's own error string, so a user sees which
// operation failed instead of a later, unrelated crash. Host code only (.cpp files compiled by the C++
// compiler); kernels report back through the launchers' cudaError_t return values (kernels.h).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace inferx::cuda {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(status), cudaGetErrorString(status), call,
         file, line);
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS error {} ({}) in {} at {}:{}", static_cast<int>(status), cublasLtGetStatusString(status),
         call, file, line);
}

}  // namespace inferx::cuda

#define CUDA_CHECK(call) ::inferx::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::inferx::cuda::check_cublas((call), #call, __FILE__, __LINE__)
