#pragma once
// Register-resident RMSNorm rows, shared by kernels_norm.cu (rmsnorm_regs_kernel) and kernels_quant_fused.cu
// (the norm that writes FP8 codes), so both form the same sums in the same order: thread t of a kThreads
// block holds the row's float4s t, t + kThreads, ... (kVec of them; those past n4 are left untouched).
#include "backend/cuda/cuda_common.cuh"

namespace inferx::cuda::norm_rows {

template <int kVec, int kThreads>
__device__ __forceinline__ void load(const float* p, int64_t n4, float4 (&v)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < n4) v[j] = reinterpret_cast<const float4*>(p)[i];
  }
}

// This thread's sum of squares of its float4s (one order for every norm of this file's users).
template <int kVec, int kThreads>
__device__ __forceinline__ float sum_squares(const float4 (&v)[kVec], int64_t n4) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < n4) ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  return ss;
}

// v = row (+ add_row, written back to row when add_row is not null); returns this thread's sum of squares.
// Every load (row and add_row) is issued before the first store: a store to row may alias add_row as far as
// the compiler knows, so interleaving them (load a, store, load the next a, ...) made each of the kVec adds
// wait for a memory round trip of its own (the PTX showed 1 + kVec dependent rounds for a decode step's
// one-row norm, which is all latency).
template <int kVec, int kThreads>
__device__ __forceinline__ float add_and_sum_squares(float* row, const float* add_row, int64_t n4,
                                                     float4 (&v)[kVec]) {
  load<kVec, kThreads>(row, n4, v);
  if (add_row) {
    float4 a[kVec];
    load<kVec, kThreads>(add_row, n4, a);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
      if (i < n4) {
        v[j] = make_float4(v[j].x + a[j].x, v[j].y + a[j].y, v[j].z + a[j].z, v[j].w + a[j].w);
        reinterpret_cast<float4*>(row)[i] = v[j];
      }
    }
  }
  return sum_squares<kVec, kThreads>(v, n4);
}

// v = v * scale * g, element by element (scale = rsqrt(mean of squares + eps), g the norm weight).
template <int kVec, int kThreads>
__device__ __forceinline__ void normalize(float4 (&v)[kVec], const float4 (&g)[kVec], float scale,
                                          int64_t n4) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < n4)
      v[j] = make_float4(v[j].x * scale * g[j].x, v[j].y * scale * g[j].y, v[j].z * scale * g[j].z,
                         v[j].w * scale * g[j].w);
  }
}

}  // namespace inferx::cuda::norm_rows
