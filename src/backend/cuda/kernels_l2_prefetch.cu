// L2 prefetch of a weight range while the kernels before its consumer leave DRAM idle: at batch 1 the
// RoPE + KV write and the decode attention read ~4 MB per layer in ~14 us, a latency chain, so the o
// projection's weights (33.5 MB BF16 / 16.8 MB FP8 for Llama-3-8B) can be in L2 before its GEMV starts.
// Runs on the backend's side stream (CudaBackend::prefetch_weights); it writes nothing and has no
// consumer, so it takes no part in the PDL chain.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kPiece = 4096;  // bytes per bulk prefetch instruction

// CTA b takes the b-th of gridDim.x contiguous shares, its threads 4 KB pieces of it: every SM's copy
// engine issues a share (a few SMs alone would not reach DRAM bandwidth).
__global__ void l2_prefetch_kernel(const char* p, int64_t bytes) {
  const int64_t share = (bytes / gridDim.x + kPiece - 1) / kPiece * kPiece;
  const int64_t begin = blockIdx.x * share, end = min(bytes, begin + share);
  for (int64_t off = begin + threadIdx.x * kPiece; off < end; off += kThreads * kPiece) {
    // A multiple of 16 bytes (PTX ISA, cp.async.bulk.prefetch); the last < 16 bytes are left to the consumer.
    const auto size = static_cast<uint32_t>(min(kPiece, end - off) & ~int64_t{15});
    if (size != 0)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(size) : "memory");
  }
}

}  // namespace

cudaError_t launch_l2_prefetch(const void* p, int64_t bytes, int sm_count, cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  // The range must start 16-byte aligned: round the start up (the skipped head is a few bytes at most).
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (addr + 15) & ~uintptr_t{15};
  bytes -= static_cast<int64_t>(aligned - addr);
  if (bytes <= 0) return cudaSuccess;
  const int64_t pieces = (bytes + kPiece - 1) / kPiece;
  const auto ctas = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(pieces, sm_count)));
  l2_prefetch_kernel<<<ctas, kThreads, 0, stream>>>(reinterpret_cast<const char*>(aligned), bytes);
  return cudaGetLastError();
}

}  // namespace inferx::cuda
