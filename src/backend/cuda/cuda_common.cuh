#pragma once
// Device helpers shared by the kernels: warp/block reductions and conversions between the storage
// types (F32, F16, BF16) and float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "backend/cuda/pdl.h"
#include "core/random_fill.h"

namespace inferx::cuda {

constexpr int kWarp = 32;

// Programmatic dependent launch (Hopper; CUDA programming guide, "Programmatic Dependent Launch"). A
// decode step is ~300 short kernels; launched back to back each one waits for its predecessor to drain
// and then pays its own launch and ramp-up. Overlapping them measured +1.8% for the 8B bf16 batch-1 decode
// and +4% for INT4 (H200, 2026-12-03, docs/benchmarks.md). A kernel launched
// with launch_pdl may start while its predecessor still runs: it must call pdl_wait() before it reads
// anything an earlier kernel writes or writes anything an earlier kernel reads (the wait returns once the
// predecessor has completed and its writes are visible; since every kernel waits before it completes,
// that covers all earlier kernels). Work that depends on nothing earlier (streaming a weight matrix) can
// be issued before the wait. pdl_launch_dependents() lets the next kernel launch early (otherwise it
// launches when this grid exits); it does not make this kernel's writes visible - pdl_wait does that.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A tuning switch from the environment (host): the integer value of `name` when it is set and within
// [lo, hi], else `fallback`. Callers read it once (a function-local static).
inline int env_int(const char* name, int lo, int hi, int fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == 0) return fallback;
  const int v = std::atoi(e);
  return v >= lo && v <= hi ? v : fallback;
}

// An on / off switch (host): the environment variable `name` (0 or 1, read once at the first use; else
// `fallback`), unless a test set it (set: 1 on, 0 off, -1 back to the environment). Constant-initialized,
// so a namespace-scope switch is usable from any static initializer.
class EnvSwitch {
 public:
  constexpr EnvSwitch(const char* name, bool fallback) : name_(name), fallback_(fallback) {}
  bool on() const {
    const int o = override_.load(std::memory_order_relaxed);
    if (o >= 0) return o == 1;
    int e = env_.load(std::memory_order_relaxed);
    if (e < 0) {  // racing first readers compute the same value
      e = env_int(name_, 0, 1, fallback_ ? 1 : 0);
      env_.store(e, std::memory_order_relaxed);
    }
    return e == 1;
  }
  void set(int mode) { override_.store(mode, std::memory_order_relaxed); }

 private:
  const char* name_;
  bool fallback_;
  mutable std::atomic<int> env_{-1};
  std::atomic<int> override_{-1};
};

// Launches kernel<<<grid, block, smem, stream>>>(args...) with the first n of `attributes`
// (cudaLaunchKernelEx).
template <class... Params, class... Args>
cudaError_t launch_with_attributes(const cudaLaunchAttribute* attributes, unsigned n,
                                   void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = const_cast<cudaLaunchAttribute*>(attributes);
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The same with `attribute`, or none when `use` is false.
template <class... Params, class... Args>
cudaError_t launch_with(cudaLaunchAttribute attribute, bool use, void (*kernel)(Params...), dim3 grid,
                        dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  return launch_with_attributes(&attribute, use ? 1u : 0u, kernel, grid, block, smem, stream,
                                std::forward<Args>(args)...);
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) allowing programmatic dependent launch. Only for
// kernels that call pdl_wait() (every thread that touches dependent memory, before it does).
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return launch_with(attribute, pdl_enabled(), kernel, grid, block, smem, stream,
                     std::forward<Args>(args)...);
}

// launch_pdl for a grid of thread-block clusters of `cluster` CTAs (a 1x1x1 cluster: a plain launch_pdl).
// The kernel must not be compiled with __cluster_dims__; clusters above 8 CTAs need the non-portable
// attribute set on it first (cluster_launch_fits).
template <class... Params, class... Args>
cudaError_t launch_pdl_clusters(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block, size_t smem,
                                cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attributes[n].id = cudaLaunchAttributeClusterDimension;
    attributes[n].val.clusterDim.x = cluster.x;
    attributes[n].val.clusterDim.y = cluster.y;
    attributes[n++].val.clusterDim.z = cluster.z;
  }
  if (pdl_enabled()) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  return launch_with_attributes(attributes, n, kernel, grid, block, smem, stream,
                                std::forward<Args>(args)...);
}

// Whether `clusters` clusters of `cluster` CTAs of `kernel` (blocks of `threads`, `smem` bytes of dynamic
// shared memory) are all resident at once on the current device (cudaOccupancyMaxActiveClusters), for
// launchers that take a cluster form only where it runs in one wave. Sets the non-portable cluster size
// attribute on the kernel first. Per device, kernel and shape, asked once (a lookup under a lock after
// that); a refusal of the driver counts as "does not fit". Defined in cluster_launch.cu.
bool cluster_launch_fits(const void* kernel, dim3 cluster, int threads, int smem, unsigned clusters);

// 16 bytes read once and not kept in L1 (ld.global.nc.L1::no_allocate): the weights the GEMVs stream (so
// that x, which every warp re-reads, stays in L1) and the read-only ceiling's buffer.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// load_stream with the L2 told to evict these lines first (createpolicy evict_first, fraction 1): GEMV v3's
// weights. Measured (H100, 2026-12-07 09:08, one call, two rounds each): int4:lm_head batch 1 at 1k context
// 2.371 / 2.367 -> 2.349 / 2.341 ms (-1.0%) with every weight load so marked; FP8 (GEMV v4) 3.329 / 3.329
// -> 3.340 / 3.337 (+0.3%) and bf16 level, so v4 keeps the plain load. The small kernels' times did not move
// (timeline), so the gain is v3's own (its register allocation changed too: 4-8 bytes of spills gone).
__device__ __forceinline__ uint4 load_stream_evict_first(const void* p) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(policy));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Inclusive prefix sum over the warp's lanes in lane order (Hillis-Steele: the same additions in the same
// order on every call, so two scans of the same values agree bit for bit).
__device__ __forceinline__ float warp_inclusive_sum(float v) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int off = 1; off < kWarp; off *= 2) {
    const float o = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// A barrier among `threads` threads (whole warps) of the block that use the same id (1..kIds; 0 is
// __syncthreads'), with the memory ordering of __syncthreads among them. The id reaches bar.sync as an
// immediate (one branch per possible id): a kernel that names its barrier in a register makes ptxas reserve
// all 16 hardware barriers, and on Hopper that alone caps it at 4 CTAs per SM (ncu's "Block Limit
// Barriers", H100 2026-12-07: GEMV v4's FP8 kernels, whose 80 registers allow 6).
template <int kIds, int kId = 1>
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  static_assert(kIds >= 1 && kIds <= 15, "ids 1..15");
  if (id == kId) {
    asm volatile("bar.sync %0, %1;" ::"n"(kId), "r"(threads) : "memory");
    return;
  }
  if constexpr (kId < kIds) named_barrier_sync<kIds, kId + 1>(id, threads);
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the trailing barrier lets callers reuse it at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  __syncthreads();
  return total;
}

// Largest value over the whole block (as block_sum; fmaxf, so NaN is ignored as std::fmax does). The
// quantizers pass |x|: an all-zero block gives 0.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = lane < warps ? scratch[lane] : 0.0f;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  __syncthreads();
  return m;
}

template <class T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// SwiGLU's gate activation, as the CPU backend computes it (expf, not the fast __expf).
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// Four floats rounded to BF16 and stored as one 8-byte write (dst 8-byte aligned).
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, float a, float b, float c, float d) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = packed;
}

// Sets the dynamic shared memory limit of `kernel` once per device (the attribute is per device; done_mask:
// one bit per device, a static of the caller's kernel instance).
template <class Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, int bytes, unsigned& done_mask) {
  int device = 0;
  cudaError_t st = cudaGetDevice(&device);
  if (st != cudaSuccess) return st;
  const unsigned bit = device < 32 ? 1u << device : 0u;
  if (bit != 0 && (__atomic_load_n(&done_mask, __ATOMIC_ACQUIRE) & bit)) return cudaSuccess;
  st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (st == cudaSuccess && bit != 0) __atomic_fetch_or(&done_mask, bit, __ATOMIC_RELEASE);
  return st;
}

// Whether p is a multiple of `bytes` (launchers choose vectorised kernels with it; null counts as aligned).
inline bool is_aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Launch-size helper: enough blocks of `threads` for n items, capped (kernels use grid-stride loops).
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65535) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

// Index of the sequence owning flattened token t: the s with query_start[s] <= t < query_start[s + 1] (the
// last such s if some sequences are empty). Decode rows come first in a batch and hold one token each, so
// token t < num_seqs is first tried as sequence t: two independent loads instead of the binary search's
// ~log2(num_seqs) dependent ones, which every decode-attention CTA waits for before its first K/V load.
__device__ __forceinline__ int find_sequence(const int32_t* query_start, int num_seqs, int t) {
  if (t < num_seqs && query_start[t] == t && query_start[t + 1] > t) return t;
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Dummy weights generated in device memory (core/random_fill.h): the random bits of element i of a filled
// tensor whose rows are `cols` units long, a splitmix64 finaliser (Steele et al. 2014) of (seed, the
// element's index in the full tensor): deterministic, no generator state, and a tensor-parallel slice
// draws exactly the bits of its block of the whole.
struct RandomIndex {
  uint64_t seed;
  int64_t cols, full_cols, row0, col0;
  RandomIndex(const RandomFill& f, int64_t c)
      : seed(f.seed), cols(c > 0 ? c : 1), full_cols(f.full_cols), row0(f.row0), col0(f.col0) {}
  __device__ __forceinline__ uint64_t bits(int64_t i) const {
    const int64_t at = full_cols == 0 ? i : (row0 + i / cols) * full_cols + col0 + i % cols;
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(at + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

}  // namespace inferx::cuda
