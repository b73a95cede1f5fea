// Paged causal attention over the flattened batch (v0: simple and correct, not yet fast).
// One CTA of 4 warps per (query token, query head). Each warp walks a strided subset of the token's
// visible keys, keeping its own online-softmax state (Milakov & Gimelshein 2018: running max m, running
// denominator l, rescaled accumulator); the warps' states are merged at the end through shared memory.
// Visible keys of token t (sequence s, position p): j in [max(0, p - window + 1) if window > 0 else 0,
// min(p, seq_len[s] - 1)], read from block_tables[s][j / bs] slot j % bs. GQA: head h reads kv head
// h / (hq / hkv). A token with no visible key gets a zero output (as the CPU backend).
#include <cuda_fp8.h>
#include <math_constants.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kDimsPerLane = kMaxAttentionHeadDim / kWarp;  // registers per lane for q and the accumulator

// A cache element as float; FP8 (E4M3 bytes) is unscaled here: the scales are folded into q and the output.
template <class CacheT>
__device__ __forceinline__ float cache_float(CacheT v) {
  return to_float(v);
}
template <>
__device__ __forceinline__ float cache_float<uint8_t>(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(__half(h));
}

template <class CacheT>
__global__ void __launch_bounds__(kAttnWarps* kWarp)
    paged_attention_kernel(const float* q, const CacheT* k_cache, const CacheT* v_cache, int64_t num_blocks,
                           int64_t block_size, const __grid_constant__ BatchArgs batch, int hq, int hkv,
                           int hd, float scale, float out_scale, int64_t window, float* out) {
  __shared__ float warp_max[kAttnWarps];
  __shared__ float warp_den[kAttnWarps];
  __shared__ float warp_acc[kAttnWarps][kMaxAttentionHeadDim];

  const int t = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int s = find_sequence(batch.query_start, batch.num_seqs, t);
  const int64_t pos = batch.positions[t];
  const int64_t last = min(pos, static_cast<int64_t>(batch.seq_lens[s]) - 1);
  const int64_t first = window > 0 ? max(static_cast<int64_t>(0), pos - window + 1) : 0;
  const int kvh = h / (hq / hkv);
  const int64_t kv_row = static_cast<int64_t>(hkv) * hd;
  const int32_t* table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;

  // q pre-scaled, lane-strided: lane holds dims lane, lane + 32, ... (compile-time register indices).
  const float* q_head = q + (static_cast<int64_t>(t) * hq + h) * hd;
  float qr[kDimsPerLane], acc[kDimsPerLane];
#pragma unroll
  for (int c = 0; c < kDimsPerLane; ++c) {
    const int d = lane + c * kWarp;
    qr[c] = d < hd ? q_head[d] * scale : 0.0f;
    acc[c] = 0.0f;
  }

  float m = -CUDART_INF_F, l = 0.0f;
  for (int64_t j = first + warp; j <= last; j += kAttnWarps) {
    const int64_t block_index = j / block_size;
    if (block_index >= batch.max_blocks_per_seq) break;
    const int32_t block = table[block_index];
    if (block < 0 || block >= num_blocks) continue;  // never produced by the engine; skip, do not fault
    const int64_t offset = (block * block_size + j % block_size) * kv_row + static_cast<int64_t>(kvh) * hd;
    const CacheT* kj = k_cache + offset;
    const CacheT* vj = v_cache + offset;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + c * kWarp;
      if (d < hd) dot += qr[c] * cache_float(kj[d]);
    }
    dot = warp_sum(dot);
    const float m_new = fmaxf(m, dot);
    const float correction = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float p = expf(dot - m_new);
    l = l * correction + p;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) {
      const int d = lane + c * kWarp;
      if (d < hd) acc[c] = acc[c] * correction + p * cache_float(vj[d]);
    }
    m = m_new;
  }

  if (lane == 0) {
    warp_max[warp] = m;
    warp_den[warp] = l;
  }
#pragma unroll
  for (int c = 0; c < kDimsPerLane; ++c) {
    const int d = lane + c * kWarp;
    if (d < hd) warp_acc[warp][d] = acc[c];
  }
  __syncthreads();

  float m_all = -CUDART_INF_F;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) m_all = fmaxf(m_all, warp_max[w]);
  float* out_head = out + (static_cast<int64_t>(t) * hq + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    if (m_all != -CUDART_INF_F) {
#pragma unroll
      for (int w = 0; w < kAttnWarps; ++w) {
        const float f = warp_max[w] == -CUDART_INF_F ? 0.0f : expf(warp_max[w] - m_all);
        num += warp_acc[w][d] * f;
        den += warp_den[w] * f;
      }
    }
    out_head[d] = den > 0.0f ? num / den * out_scale : 0.0f;
  }
}

template <class CacheT>
cudaError_t launch_typed(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                         int64_t hkv, int64_t hd, float scale, int64_t sliding_window, float* out,
                         cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(batch.num_tokens), static_cast<unsigned>(hq));
  const bool fp8 = cache.dtype == DType::F8_E4M3;
  paged_attention_kernel<CacheT><<<grid, kAttnWarps * kWarp, 0, stream>>>(
      q, static_cast<const CacheT*>(cache.k), static_cast<const CacheT*>(cache.v), cache.num_blocks,
      cache.block_size, batch, static_cast<int>(hq), static_cast<int>(hkv), static_cast<int>(hd),
      scale * (fp8 ? cache.k_scale : 1.0f), fp8 ? cache.v_scale : 1.0f, sliding_window, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_paged_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                   int64_t hkv, int64_t hd, float scale, int64_t sliding_window, float* out,
                                   cudaStream_t stream) {
  if (batch.num_tokens == 0 || hq == 0) return cudaSuccess;
  if (cache.dtype == DType::F32)
    return launch_typed<float>(q, cache, batch, hq, hkv, hd, scale, sliding_window, out, stream);
  if (cache.dtype == DType::BF16)
    return launch_typed<__nv_bfloat16>(q, cache, batch, hq, hkv, hd, scale, sliding_window, out, stream);
  if (cache.dtype == DType::F8_E4M3)
    return launch_typed<uint8_t>(q, cache, batch, hq, hkv, hd, scale, sliding_window, out, stream);
  return cudaErrorInvalidValue;  // the caller validates the cache dtype first
}

}  // namespace inferx::cuda
