// Element-wise and row-copy kernels: embedding gather, SwiGLU's silu(gate) * up (Shazeer 2020),
// gather_rows, the F32 -> 16-bit activation conversion before a GEMM, and the bias add after one.
// Grid-stride loops over scalars: memory-bound and correct, not yet vectorised (16-byte accesses).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_kernel(const T* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                                 float* out) {
  const int64_t total = n * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / dim, c = i % dim;
    const int32_t id = ids[t];
    out[i] = (id >= 0 && id < vocab) ? to_float(table[id * dim + c]) : 0.0f;
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// Byte rows of any dtype; a whole block copies one output row (4-byte words when aligned).
__global__ void gather_rows_kernel(const char* x, int64_t num_rows, int64_t row_bytes, const int32_t* rows,
                                   char* out) {
  const int32_t r = rows[blockIdx.x];
  char* dst = out + blockIdx.x * row_bytes;
  const bool valid = r >= 0 && r < num_rows;
  const char* src = x + (valid ? r : 0) * row_bytes;
  if (row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0 &&
      reinterpret_cast<uintptr_t>(dst) % 4 == 0) {
    const int64_t words = row_bytes / 4;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
      reinterpret_cast<uint32_t*>(dst)[i] = valid ? reinterpret_cast<const uint32_t*>(src)[i] : 0u;
  } else {
    for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) dst[i] = valid ? src[i] : char(0);
  }
}

template <class T>
__global__ void convert_kernel(const float* x, int64_t n, T* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(x[i]);
}

__global__ void add_bias_kernel(float* out, const float* bias, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] += bias[i % cols];
}

}  // namespace

cudaError_t launch_embedding(DType table_dtype, const void* table, int64_t vocab, int64_t dim,
                             const int32_t* ids, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0 || dim == 0) return cudaSuccess;
  const unsigned grid = grid_for(n * dim, kThreads);
  switch (table_dtype) {
    case DType::F32:
      embedding_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(table), vocab, dim, ids, n,
                                                      out);
      break;
    case DType::F16:
      embedding_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __half*>(table), vocab, dim, ids, n,
                                                      out);
      break;
    case DType::BF16:
      embedding_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(table), vocab, dim,
                                                      ids, n, out);
      break;
    default:
      return cudaErrorInvalidValue;  // the caller validates the dtype first
  }
  return cudaGetLastError();
}

cudaError_t launch_silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  silu_mul_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const void* x, int64_t num_rows, int64_t row_bytes, const int32_t* rows,
                               int64_t n, void* out, cudaStream_t stream) {
  if (n == 0 || row_bytes == 0) return cudaSuccess;
  gather_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      static_cast<const char*>(x), num_rows, row_bytes, rows, static_cast<char*>(out));
  return cudaGetLastError();
}

cudaError_t launch_convert_f32(const float* x, int64_t n, DType to, void* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n, kThreads);
  if (to == DType::BF16)
    convert_kernel<<<grid, kThreads, 0, stream>>>(x, n, static_cast<__nv_bfloat16*>(out));
  else if (to == DType::F16)
    convert_kernel<<<grid, kThreads, 0, stream>>>(x, n, static_cast<__half*>(out));
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t launch_add_bias(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  add_bias_kernel<<<grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(out, bias, rows, cols);
  return cudaGetLastError();
}

}  // namespace inferx::cuda
