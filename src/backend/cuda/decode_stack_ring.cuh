#pragma once
// The persistent batch-1 decode kernel's plumbing (kernels_decode_stack.cu, the only includer): the CTA's
// warp roles and limits, the ring of shared-memory stages (cp.async.bulk + mbarriers, with a hang guard),
// how a matrix's rows map to stages, and the consumers' CTA- and grid-wide barriers.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/decode_stack_layout.h"
#include "backend/cuda/kernels_decode_stack.h"

namespace inferx::cuda::stack {

// 15 consumer warps: with 8 the FP8 products ran at 1.8 TB/s (H200, 2026-12-03): one warp per row is
// latency-bound on its shared-memory loads and conversions, and needs company to fill the issue slots.
// With the producer that is 16 warps, four per SM sub-partition (each has a quarter of the registers).
constexpr int kConsumerWarps = 15;
constexpr int kConsumers = kConsumerWarps * kWarp;
constexpr int kAttnWarps = 8;  // key walkers per head block the x buffer holds partials for (at least)
constexpr int kThreads = kConsumers + kWarp;  // + the producer warp
constexpr int kMaxGroup = 8;                  // query heads per KV head
constexpr int kMaxKeysPerStage = 256;  // keys (with their values) of one ring stage; validity bits per key
constexpr int kKeyWords = kMaxKeysPerStage / 32;
constexpr int kMaxStages = 12;  // ring depth (16 KB stages fill shared memory better than 32 KB ones)
// Offsets (floats) in the misc area: the consumers' reduction scratch [kConsumerWarps], the attention's flag,
// the 2 x kMaxStages mbarriers, key bits.
constexpr int kMiscKeyBits = 32 + 2 * kMaxStages * 2;
constexpr size_t kSmemLimit = 227 * 1024;  // opt-in shared memory per block on sm_90
constexpr size_t kMiscBytes = 1024;        // reduction scratch, flag, mbarriers, key bits
static_assert(kConsumerWarps + 1 <= 32 && (kMiscKeyBits + kMaxStages * kKeyWords) * 4 <= kMiscBytes,
              "the misc area's layout");

// The stage geometry (Geom, stage_geometry, stage_row) and kMaxUnits: decode_stack_layout.h.

// ---- async copies and mbarriers: bulk_copy.cuh; the producer's wait with a backoff here ----------------
// The producer's wait, sleeping sleep_ns between polls (0: spin). Added on the hypothesis that a warp
// polling without pause takes shared-memory pipe slots from the key walkers; measured (H200, 2026-12-03
// 20:52): no effect (8B bf16 4.583 ms with 256 ns, 4.580 spinning; the key phase 5.60 vs 5.92 us).
__device__ __forceinline__ void mbar_wait_backoff(uint64_t* bar, uint32_t parity, uint32_t sleep_ns) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t start = gpu_ns();
  while (!mbar_try_wait(bar, parity)) {
    if (sleep_ns > 0) __nanosleep(sleep_ns);
    if (gpu_ns() - start > kHangNs) __trap();
  }
}
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
}

// Reduction over the consumer threads with `op` (a sum, a max); every consumer gets the result. scratch:
// kConsumerWarps floats, free again on return.
__device__ __forceinline__ float consumer_sum(float v, float* scratch) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
  consumer_sync();
  float r = scratch[0];
#pragma unroll
  for (int w = 1; w < kConsumerWarps; ++w) r += scratch[w];
  consumer_sync();
  return r;
}

// Grid-wide barrier of the consumers: CTA barrier, then one thread's release-add and acquire-spin at GPU
// scope (the CTA barrier orders the other threads' writes before the release, which is cumulative).
// `target` grows by gridDim.x per barrier. The cooperative-groups pattern puts a __threadfence() before
// the add; it was dropped because barriers measured ~7 us each with it (H200, 2026-12-03) and a full fence
// may wait on this SM's outstanding memory traffic. Alone the two cost the same (the grid-barrier probe,
// H100 2026-12-06: 0.997 us per round without the fence, 1.001 with it).
__device__ __forceinline__ void grid_barrier(uint32_t* counter, uint32_t target) {
  consumer_sync();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    const uint64_t start = gpu_ns();
    for (;;) {
      uint32_t seen;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      if (seen >= target) break;
      if (gpu_ns() - start > kHangNs) __trap();
    }
  }
  consumer_sync();
}

__device__ __forceinline__ void cta_rows(int32_t rows, int32_t& r0, int32_t& r1) {
  r0 = static_cast<int32_t>(static_cast<int64_t>(rows) * blockIdx.x / gridDim.x);
  r1 = static_cast<int32_t>(static_cast<int64_t>(rows) * (blockIdx.x + 1) / gridDim.x);
}

// Stage k of the stream sits in slot k % stages.
struct Ring {
  uint8_t* data;
  uint64_t* full;
  uint64_t* empty;
  int32_t stages;
  int32_t stage_bytes;
  uint32_t inflight;    // the producer's limit on stages requested and not landed (0: the ring's depth)
  uint32_t backoff_ns;  // the producer's sleep between polls of a stage it waits for
};

// A consumed stage's release: every consumer warp arrives on the slot's "empty" barrier.
__device__ __forceinline__ void release_stage(const Ring& ring, int32_t slot) {
  __syncwarp();
  if (threadIdx.x % kWarp == 0) mbar_arrive(&ring.empty[slot]);
}

}  // namespace inferx::cuda::stack
