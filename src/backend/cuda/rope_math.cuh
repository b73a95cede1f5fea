#pragma once
// The RoPE arithmetic and the cache element store shared by the RoPE + KV write kernels
// (kernels_rope_kv.cu) and the decode attention kernel that does their work itself in decode steps
// (kernels_decode_attention_v3.cu, DecodeRope): one definition, so that both write the same rotated values
// and the same cache codes.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {

// Pair (x0, x1) rotated by the angle whose cosine / sine are (cs, sn), with the fused multiply-adds spelled
// out so that every kernel rounds the same way (left to the compiler's contraction, two kernels could
// differ in the last bit).
__device__ __forceinline__ void rope_rotate(float x0, float x1, float cs, float sn, float& y0, float& y1) {
  y0 = __fmaf_rn(x0, cs, -__fmul_rn(x1, sn));
  y1 = __fmaf_rn(x1, cs, __fmul_rn(x0, sn));
}

// Pair i's elements: (2i, 2i + 1) interleaved, (i, i + hd / 2) NeoX.
__device__ __forceinline__ int rope_pair_a(bool interleaved, int i) { return interleaved ? 2 * i : i; }
__device__ __forceinline__ int rope_pair_b(bool interleaved, int i, int hd) {
  return interleaved ? 2 * i + 1 : i + hd / 2;
}

// Element offset of the paged-cache slot that the key and value at position `pos` of sequence s go to:
// block_tables[s][pos / block_size], offset pos % block_size, kv_row elements per slot. -1 for slots the
// engine never produces (a position past the table, an invalid block): the write is skipped rather than
// corrupt other blocks.
__device__ __forceinline__ int64_t kv_cache_slot(const BatchArgs& batch, int s, int32_t pos,
                                                 int64_t block_size, int64_t num_blocks, int64_t kv_row) {
  if (pos < 0 || pos / block_size >= batch.max_blocks_per_seq) return -1;
  const int32_t block =
      batch.block_tables[static_cast<int64_t>(s) * batch.max_blocks_per_seq + pos / block_size];
  return block >= 0 && block < num_blocks ? (block * block_size + pos % block_size) * kv_row : -1;
}

// One cache element: the value in the cache's type, or for FP8 (uint8_t) caches E4M3 of v * inv_scale,
// rounded to nearest even and saturated to +-448.
template <class CacheT>
__device__ __forceinline__ void store_kv(CacheT* dst, float v, float /*inv_scale*/) {
  *dst = from_float<CacheT>(v);
}
template <>
__device__ __forceinline__ void store_kv<uint8_t>(uint8_t* dst, float v, float inv_scale) {
  *dst = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * inv_scale, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace inferx::cuda
