// F32 <-> BF16 conversions around a BF16 all-reduce (nccl_communicator.cpp): round to nearest even, as
// __float2bfloat16_rn; the way back is exact.
#include <cuda_bf16.h>

#include "parallel/nccl/bf16_convert.h"

namespace inferx {
namespace {

constexpr int kThreads = 256;

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

__global__ void to_f32_kernel(const __nv_bfloat16* x, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(x[i]);
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

}  // namespace

cudaError_t launch_f32_to_bf16(const float* x, int64_t n, void* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t launch_bf16_to_f32(const void* x, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n, out);
  return cudaGetLastError();
}

}  // namespace inferx
