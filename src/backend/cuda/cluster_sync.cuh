#pragma once
// Thread-block-cluster signalling through distributed shared memory (PTX ISA: mapa, mbarrier with
// .shared::cluster addresses, barrier.cluster), shared by the barrier probes (kernels_sync_probes.cu) and
// the persistent decode kernel's two-level grid barrier (decode_stack_ring.cuh). Why a cluster at all:
// a signal between SMs of a cluster travels SM to SM inside a GPC, not back through the L2 return path,
// where a streaming SM's polls wait behind the bytes it has requested (docs/architecture.md).
#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"

namespace inferx::cuda {

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of `local` (this CTA's variable) in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_addr(const void* local, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(smem_addr(local)), "r"(rank));
  return out;
}
// One arrival on the mbarrier at a shared::cluster address (another CTA's, or this one's), releasing this
// thread's earlier writes at cluster scope.
__device__ __forceinline__ void remote_arrive(uint32_t cluster_address) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_address)
               : "memory");
}
// Waits (acquire at cluster scope) until this CTA's mbarrier `bar` completes the phase of `parity`; traps
// after kHangNs like mbar_wait.
__device__ __forceinline__ void wait_cluster_phase(uint64_t* bar, uint32_t parity) {
  const uint64_t start = gpu_ns();
  for (;;) {
    uint32_t done;
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; "
        "selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    if (done != 0) return;
    if (gpu_ns() - start > kHangNs) __trap();
  }
}
// Every thread of every CTA of the cluster (e.g. after mbarrier.init, before any remote arrival).
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace inferx::cuda
