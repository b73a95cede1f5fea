// The one-shot peer-to-peer all-reduce (p2p_all_reduce.h): the kernel and the buffers it reads.
#include <cstdio>

#include "core/error.h"
#include "parallel/nccl/p2p_all_reduce.h"

namespace inferx {
namespace p2p {
namespace {

// A peer that never signals: trap, not hang. Generous: a peer's host thread may be seconds late on a
// first step (GEMM autotuning, lazy module loading), and a trap ends the CUDA context.
constexpr uint64_t kHangNs = 60'000'000'000ull;

__device__ __forceinline__ uint64_t gpu_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void signal_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block b of every rank takes the same elements (a grid-stride walk over a fixed grid): its copy into
// the staging slot, its signal, and its sums need only block b of the peers.
__global__ void __launch_bounds__(kThreads) one_shot_kernel(const __grid_constant__ Args a) {
  __shared__ uint32_t s_call;
  const int b = blockIdx.x;
  if (threadIdx.x == 0) s_call = ++a.calls[b];  // this rank's memory, this block only: kernels run in order
  __syncthreads();
  const uint32_t call = s_call;
  const int64_t slot = (call & 1u) * a.slot_floats;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(b) * blockDim.x + threadIdx.x;
  float* mine = a.staging[a.rank] + slot;
  // 1. Our elements into our staging slot. With count % 4 == 0 (the same on every rank) a thread takes
  // groups of 4 elements, read as one 16-byte load where this rank's x allows it.
  if (a.groups) {
    const int64_t n4 = a.count / 4;
    for (int64_t i = first; i < n4; i += stride)
      reinterpret_cast<float4*>(mine)[i] =
          a.x_aligned ? reinterpret_cast<const float4*>(a.x)[i]
                      : make_float4(a.x[4 * i], a.x[4 * i + 1], a.x[4 * i + 2], a.x[4 * i + 3]);
  } else {
    for (int64_t i = first; i < a.count; i += stride) mine[i] = a.x[i];
  }
  __syncthreads();
  // 2. Tell every peer that block b's elements of this call are staged (the fence makes the block's stores,
  // ordered before it by the barrier, visible system-wide first), then wait for every peer's.
  if (threadIdx.x < a.nranks) {
    __threadfence_system();
    signal_sys(a.signals[threadIdx.x] + b * P2pAllReduce::kMaxRanks + a.rank, call);
    // At least `call`: a peer that saw our signal may finish this call and signal the next one before we
    // look (it cannot get further: that needs our next signal).
    const uint32_t* theirs = a.signals[a.rank] + b * P2pAllReduce::kMaxRanks + threadIdx.x;
    auto arrived = [&] { return static_cast<int32_t>(acquire_sys(theirs) - call) >= 0; };
    if (!arrived()) {
      const uint64_t start = gpu_ns();
      while (!arrived())
        if (gpu_ns() - start > kHangNs) __trap();
    }
  }
  __syncthreads();
  // 3. The sums, in rank order on every rank; peers' staging read past L1 (over NVLink).
  if (a.groups) {
    const int64_t n4 = a.count / 4;
    for (int64_t i = first; i < n4; i += stride) {
      float4 s = __ldcg(reinterpret_cast<const float4*>(a.staging[0] + slot) + i);
      for (int r = 1; r < a.nranks; ++r) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(a.staging[r] + slot) + i);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      if (a.x_aligned) {
        reinterpret_cast<float4*>(a.x)[i] = s;
      } else {
        a.x[4 * i] = s.x;
        a.x[4 * i + 1] = s.y;
        a.x[4 * i + 2] = s.z;
        a.x[4 * i + 3] = s.w;
      }
    }
  } else {
    for (int64_t i = first; i < a.count; i += stride) {
      float s = __ldcg(a.staging[0] + slot + i);
      for (int r = 1; r < a.nranks; ++r) s += __ldcg(a.staging[r] + slot + i);
      a.x[i] = s;
    }
  }
}

}  // namespace

cudaError_t launch_one_shot(const Args& a, cudaStream_t stream) {
  one_shot_kernel<<<kMaxBlocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace p2p

namespace {
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("p2p all-reduce: {}: {}", what, cudaGetErrorString(status));
}
}  // namespace

bool P2pAllReduce::available(const std::vector<int>& devices) {
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0) return false;
    }
  return true;
}

P2pAllReduce::P2pAllReduce(const std::vector<int>& devices, size_t max_bytes)
    : max_bytes_(max_bytes / 16 * 16) {
  const int n = static_cast<int>(devices.size());
  INFERX_CHECK(n >= 1 && n <= kMaxRanks, "p2p all-reduce: {} ranks (1..{})", n, kMaxRanks);
  INFERX_CHECK(max_bytes_ > 0, "p2p all-reduce: no room for a tensor ({} bytes)", max_bytes);
  INFERX_CHECK(available(devices), "p2p all-reduce: the GPUs cannot all reach each other (no peer access)");
  for (int a : devices) {
    for (int b : devices) {
      if (a == b) continue;
      check(cudaSetDevice(a), "cudaSetDevice");
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // enabled by an earlier pair or group: fine
      } else {
        check(e, "cudaDeviceEnablePeerAccess");
      }
    }
  }
  ranks_.resize(static_cast<size_t>(n));
  try {
    for (int r = 0; r < n; ++r) {
      Rank& k = ranks_[static_cast<size_t>(r)];
      k.device = devices[static_cast<size_t>(r)];
      check(cudaSetDevice(k.device), "cudaSetDevice");
      check(cudaMalloc(&k.staging, 2 * max_bytes_), "cudaMalloc (staging)");
      const size_t signal_bytes = sizeof(uint32_t) * p2p::kMaxBlocks * kMaxRanks;
      check(cudaMalloc(&k.signals, signal_bytes), "cudaMalloc (signals)");
      check(cudaMalloc(&k.calls, sizeof(uint32_t) * p2p::kMaxBlocks), "cudaMalloc (calls)");
      check(cudaMemset(k.signals, 0, signal_bytes), "cudaMemset");
      check(cudaMemset(k.calls, 0, sizeof(uint32_t) * p2p::kMaxBlocks), "cudaMemset");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
  } catch (...) {
    release();
    throw;
  }
}

P2pAllReduce::~P2pAllReduce() { release(); }

void P2pAllReduce::release() {
  for (Rank& k : ranks_) {
    if (cudaSetDevice(k.device) != cudaSuccess) continue;
    for (void* p :
         {static_cast<void*>(k.staging), static_cast<void*>(k.signals), static_cast<void*>(k.calls)})
      if (p != nullptr && cudaFree(p) != cudaSuccess)
        std::fprintf(stderr, "warning: p2p all-reduce: cudaFree failed\n");
    k = Rank{};
  }
}

void P2pAllReduce::all_reduce(int rank, float* x, int64_t count, cudaStream_t stream) {
  INFERX_CHECK(rank >= 0 && rank < size() && takes(count),
               "p2p all-reduce: rank {} of {}, {} values (at most {})", rank, size(), count, max_bytes_ / 4);
  p2p::Args a;
  a.x = x;
  a.count = count;
  a.rank = rank;
  a.nranks = size();
  a.slot_floats = static_cast<int64_t>(max_bytes_ / 4);
  for (int r = 0; r < size(); ++r) {
    a.staging[r] = ranks_[static_cast<size_t>(r)].staging;
    a.signals[r] = ranks_[static_cast<size_t>(r)].signals;
  }
  a.calls = ranks_[static_cast<size_t>(rank)].calls;
  a.groups = count % 4 == 0;  // the same on every rank: the elements a block takes must agree
  a.x_aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  check(cudaSetDevice(ranks_[static_cast<size_t>(rank)].device), "cudaSetDevice");
  check(p2p::launch_one_shot(a, stream), "kernel launch");
}

}  // namespace inferx
