// Probes of what synchronization costs by itself, for bench/gpu/bench_kernels.cpp (INFERX_BENCH_ONLY=
// grid_barrier and =boundary): a grid-wide barrier, and the boundary between two dependent kernels.
//
// What a grid-wide barrier costs by itself (INFERX_BENCH_ONLY=grid_barrier):
// the persistent batch-1 decode kernel (kernels_decode_stack.cu) spent 2.1-6.5 us per barrier, five per
// layer, in its per-phase profile (H200, 2026-12-03), and whether that is the barrier or the slowest CTA's
// work before it was never separated. Here every CTA arrives at once, so the time per round is the barrier's
// own: the persistent kernel's (one counter, a release add and an acquire spin by one thread per CTA), the
// same with the cooperative-groups fence before the add, and a generation flag (the last arriver, known
// from the add's return value, publishes the round; the others spin on the flag, not the counter).
//
// The same barrier while the CTA's own producer warp keeps Q bytes of bulk copies in flight
// (INFERX_BENCH_ONLY=grid_barrier, "under a stream"): the persistent kernel's barriers cost 4-9 us inside
// it with every CTA arriving within 0.2 us, against ~1 us alone, and fell to 3 us with its producer held
// to one 32 KB stage (H100, 2026-12-05). The model to test (docs/architecture.md): a barrier's control
// messages come back to a streaming SM behind the bytes it has requested, so a round should cost about
// the barrier alone plus twice Q over the SM's share of bandwidth, while the stream's rate follows Little's
// law in Q.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/decode_stack_ring.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void spin_until(const uint32_t* p, uint32_t target) {
  const uint64_t start = gpu_ns();
  while (load_acquire(p) < target)
    if (gpu_ns() - start > kHangNs) __trap();
}

// kVariant 0: stack::grid_barrier as the persistent kernel runs it; 1: __threadfence() before the add;
// 2: a generation flag. The persistent kernel's shape: stack::kThreads threads, the consumer warps take
// part, the last warp (its producer) leaves at once.
template <int kVariant>
__global__ void __launch_bounds__(stack::kThreads, 1)
    barrier_probe_kernel(uint32_t* counter, uint32_t* flag, int rounds) {
  if (threadIdx.x >= stack::kConsumers) return;
  for (uint32_t r = 1; r <= static_cast<uint32_t>(rounds); ++r) {
    const uint32_t target = r * gridDim.x;
    if constexpr (kVariant == 0) {
      stack::grid_barrier(counter, target);
    } else {
      stack::consumer_sync();
      if (threadIdx.x == 0) {
        if constexpr (kVariant == 1) {
          __threadfence();
          atomicAdd(counter, 1u);
          spin_until(counter, target);
        } else {
          uint32_t before;
          asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                       : "=r"(before)
                       : "l"(counter)
                       : "memory");
          if (before + 1 == target)
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(r) : "memory");
          else
            spin_until(flag, r);
        }
      }
      stack::consumer_sync();
    }
  }
}

// The barrier under a stream: the consumer warps run `rounds` of stack::grid_barrier, while lane 0 of the
// last warp streams the CTA's own slice of `src` (slice_bytes, cycled) into a shared-memory ring of
// `depth` stages of kProbeStage bytes, issuing stage i once stage i - depth has landed (so depth stages are
// in flight), until the consumers are done. streamed[CTA] receives the bytes it copied. depth 0: no stream.
constexpr uint32_t kProbeStage = 16 * 1024;
constexpr int kProbeMaxDepth = 12;  // 192 KB, the persistent kernel's ring

// The probes' stream (lane 0 of the producer warp): stage i of the CTA's slice (cycled) into ring slot
// i % depth once stage i - depth has landed, so `depth` stages are in flight, until `done`; then every
// copy lands before the CTA exits (its shared memory is the destination). Returns the bytes copied.
__device__ unsigned long long stream_until_done(uint8_t* ring, uint64_t* full, int depth,
                                                const uint8_t* slice, int64_t slice_bytes,
                                                const volatile int& done) {
  int64_t at = 0;
  uint32_t it = 0;
  while (done == 0) {
    const uint32_t slot = it % static_cast<uint32_t>(depth);
    if (it >= static_cast<uint32_t>(depth)) mbar_wait(&full[slot], (it / depth - 1) & 1);
    mbar_expect_tx(&full[slot], kProbeStage);
    bulk_copy(ring + slot * kProbeStage, slice + at, kProbeStage, &full[slot]);
    at = at + kProbeStage >= slice_bytes ? 0 : at + kProbeStage;
    ++it;
  }
  const uint32_t first = it > static_cast<uint32_t>(depth) ? it - depth : 0;
  for (uint32_t j = first; j < it; ++j) mbar_wait(&full[j % depth], (j / depth) & 1);
  return static_cast<unsigned long long>(it) * kProbeStage;
}

// writes (null: none): before each round, consumer threads 0..kProbeWrites-1 store a float each into the
// CTA's row of writes, as a phase stores its outputs before the barrier that publishes them (the barrier's
// release must then wait for those stores).
constexpr int kProbeWrites = 64;
__device__ __forceinline__ void phase_writes(float* writes, uint32_t round) {
  if (writes != nullptr && threadIdx.x < kProbeWrites)
    __stcg(writes + static_cast<int64_t>(blockIdx.x) * kProbeWrites + threadIdx.x, static_cast<float>(round));
}

__global__ void __launch_bounds__(stack::kThreads, 1)
    barrier_stream_probe_kernel(uint32_t* counter, int rounds, const uint8_t* src, int64_t slice_bytes,
                                int depth, unsigned long long* streamed, float* writes) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ uint64_t full[kProbeMaxDepth];
  __shared__ volatile int done;
  if (threadIdx.x == 0) {
    done = 0;
    for (int i = 0; i < depth; ++i) mbar_init(&full[i], 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < stack::kConsumers) {
    for (uint32_t r = 1; r <= static_cast<uint32_t>(rounds); ++r) {
      phase_writes(writes, r);
      stack::grid_barrier(counter, r * gridDim.x);
    }
    if (threadIdx.x == 0) done = 1;
    return;
  }
  if (threadIdx.x != stack::kConsumers || depth == 0) return;  // the producer warp's lane 0 streams
  streamed[blockIdx.x] = stream_until_done(
      ring, full, depth, src + static_cast<int64_t>(blockIdx.x) * slice_bytes, slice_bytes, done);
}

// The boundary probe: a kernel with no work but a dependency on its predecessor (block 0's thread 0 adds one
// to a word the previous launch wrote, after the PDL wait), so that a chain of them in a CUDA graph costs
// the kernel boundary alone: launch, the previous grid's completion and the release of the wait. The
// batch-1 decode's ~4 us per boundary (docs/architecture.md) is either this or the tails of real kernels.
__global__ void boundary_probe_kernel(uint32_t* word) {
  pdl_wait();
  pdl_launch_dependents();
  if (blockIdx.x == 0 && threadIdx.x == 0) *word += 1;
}

}  // namespace

cudaError_t launch_boundary_probe(uint32_t* word, int ctas, int threads, bool pdl, cudaStream_t stream) {
  if (word == nullptr || ctas < 1 || threads < 1 || threads > 1024) return cudaErrorInvalidValue;
  if (pdl)
    return launch_pdl(boundary_probe_kernel, dim3(static_cast<unsigned>(ctas)),
                      dim3(static_cast<unsigned>(threads)), 0, stream, word);
  boundary_probe_kernel<<<ctas, threads, 0, stream>>>(word);
  return cudaGetLastError();
}

cudaError_t launch_barrier_probe(int variant, uint32_t* words, int rounds, int ctas, cudaStream_t stream) {
  if (variant < 0 || variant > 2 || rounds < 1 || ctas < 1 || words == nullptr) return cudaErrorInvalidValue;
  cudaError_t st = cudaMemsetAsync(words, 0, 2 * sizeof(uint32_t), stream);
  if (st != cudaSuccess) return st;
  uint32_t* counter = words;
  uint32_t* flag = words + 1;
  void* args[] = {&counter, &flag, &rounds};
  const void* kernel = variant == 0   ? reinterpret_cast<const void*>(barrier_probe_kernel<0>)
                       : variant == 1 ? reinterpret_cast<const void*>(barrier_probe_kernel<1>)
                                      : reinterpret_cast<const void*>(barrier_probe_kernel<2>);
  // Cooperative: every CTA resident at once, or the launch fails (a spin on absent CTAs would hang).
  return cudaLaunchCooperativeKernel(kernel, dim3(static_cast<unsigned>(ctas)), dim3(stack::kThreads), args,
                                     0, stream);
}

cudaError_t launch_barrier_stream_probe(uint32_t* counter, int rounds, int ctas, const void* src,
                                        int64_t slice_bytes, int depth, unsigned long long* streamed,
                                        float* writes, cudaStream_t stream) {
  if (counter == nullptr || rounds < 1 || ctas < 1 || depth < 0 || depth > kProbeMaxDepth ||
      (depth > 0 && (src == nullptr || streamed == nullptr || slice_bytes < kProbeStage ||
                     slice_bytes % kProbeStage != 0)))
    return cudaErrorInvalidValue;
  cudaError_t st = cudaMemsetAsync(counter, 0, sizeof(uint32_t), stream);
  if (st != cudaSuccess) return st;
  const size_t smem = static_cast<size_t>(depth) * kProbeStage;
  st = cudaFuncSetAttribute(barrier_stream_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(kProbeMaxDepth * kProbeStage));
  if (st != cudaSuccess) return st;
  const auto* bytes = static_cast<const uint8_t*>(src);
  void* args[] = {&counter, &rounds, &bytes, &slice_bytes, &depth, &streamed, &writes};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(barrier_stream_probe_kernel),
                                     dim3(static_cast<unsigned>(ctas)), dim3(stack::kThreads), args, smem,
                                     stream);
}

}  // namespace inferx::cuda
