// The read-only streaming ceiling (bench/gpu/bench_kernels.cpp reports kernels against it): every byte of
// a buffer read once with 16-byte loads that skip L1 (as the decode attention and the GEMVs stream their
// operands), folded (XOR) so the loads cannot be dropped (load_stream, cuda_common.cuh). The device copy
// ceiling moves read + write bytes; a kernel that only reads (decode attention over the KV cache) can go past
// half of it, so its bandwidth is reported against this one too.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

// Four loads in flight per thread before any is used, over a grid-stride loop; the folded value is returned.
__device__ __forceinline__ uint32_t read_and_fold(const uint4* __restrict__ p, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      v[u] = i + u * stride < n ? load_stream(p + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  return acc;
}

// A grid of sms * 8 blocks of 256 threads keeps ~17 MB in flight, several times what the bandwidth-latency
// product needs.
__global__ void read_stream_kernel(const uint4* __restrict__ p, int64_t n, uint32_t* __restrict__ sink) {
  const uint32_t acc = read_and_fold(p, n);
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never: keeps the loads live without a write stream
}

// One CTA per SM (a whole SM's threads, and shared memory that no second CTA could share: kConfineSmem),
// so that a grid of `sms` CTAs runs on exactly that many SMs: what a kernel confined to part of the GPU (an
// overlap of the memory-bound attention with compute-bound GEMMs on the other SMs) could stream.
constexpr int kConfineSmem = 150 * 1024;
__global__ void __launch_bounds__(1024, 1)
    read_stream_confined_kernel(const uint4* __restrict__ p, int64_t n, uint32_t* __restrict__ sink) {
  extern __shared__ unsigned char unused[];
  const uint32_t acc = read_and_fold(p, n);
  if (acc == 0x9e3779b9u) *sink = acc + unused[0];
}

}  // namespace

cudaError_t launch_read_stream_on_sms(const void* p, size_t bytes, uint32_t* sink, int sms,
                                      cudaStream_t stream) {
  static unsigned smem_set = 0;
  const cudaError_t st = allow_dynamic_smem(read_stream_confined_kernel, kConfineSmem, smem_set);
  if (st != cudaSuccess) return st;
  const int64_t n = static_cast<int64_t>(bytes / 16);
  read_stream_confined_kernel<<<sms, 1024, kConfineSmem, stream>>>(static_cast<const uint4*>(p), n, sink);
  return cudaGetLastError();
}

cudaError_t launch_read_stream(const void* p, size_t bytes, uint32_t* sink, int sms, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(bytes / 16);
  read_stream_kernel<<<sms * 8, 256, 0, stream>>>(static_cast<const uint4*>(p), n, sink);
  return cudaGetLastError();
}

}  // namespace inferx::cuda
