#pragma once
// Hopper's bulk asynchronous copies into shared memory and the mbarriers that count their bytes (PTX ISA:
// cp.async.bulk, mbarrier), shared by the persistent decode kernel's ring (decode_stack_ring.cuh) and the
// GEMVs' shared-memory staging (kernels_gemv_stream.cu, kernels_gemv_tc_stream.cu); and the per-thread
// cp.async of the attention kernels' tiles and GEMV v5's ring.
#include <cstdint>

namespace inferx::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes mbarrier.init visible to the async proxy (the bulk copies that complete on it).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// `count` arrivals at once (one thread standing for several).
__device__ __forceinline__ void mbar_arrive_count(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// A wait that never ends means a broken invariant (a copy never issued, a phase counted wrong, a grid not
// co-resident): trap after kHangNs, so the launch fails with an error the host reports instead of hanging
// the process (and a GPU job's whole time budget). A decode step takes milliseconds; the first wait of a
// step can include the previous kernels' tail.
constexpr uint64_t kHangNs = 2'000'000'000ull;
__device__ __forceinline__ uint64_t gpu_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t start = gpu_ns();
  while (!mbar_try_wait(bar, parity))
    if (gpu_ns() - start > kHangNs) __trap();
}
// bytes: a multiple of 16; dst and src 16-byte aligned.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// The box of a 2-D tensor map (tensor_map.h) at element coordinates (col, row) -> dst, completing on bar.
// The map lives in kernel parameters, constant or global memory (global: written before the launch).
__device__ __forceinline__ void tensor_copy_2d(void* dst, const void* map, int col, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_addr(bar))
      : "memory");
}

// Per-thread asynchronous copies (cp.async, Ampere's): 16 bytes global -> shared through L2 only; src_bytes 0
// writes zeros and reads nothing. A thread's groups complete in order; cp_async_wait<N> returns when at most
// N of its groups are pending, and the waiting thread reads its own copies after it (the attention kernels'
// tiles, GEMV v5's ring; other threads' copies need a barrier as well). The asm carries no memory clobber:
// callers order their shared-memory reads after the wait with a warp or CTA barrier.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace inferx::cuda
