// Split-KV decode attention ("flash decoding": Dao et al. 2023, the FlashAttention-2 online softmax split
// along the keys, partial results merged by a second kernel) over a paged BF16 KV cache.
//
// Decode is memory-bound: every step reads each visible K/V row once. So
//   - one CTA serves all query heads of one KV head (GQA group, up to 8 per CTA): K/V are read once;
//   - each K/V row of head_dim BF16 is read by head_dim/8 lanes with one 16-byte load each, and every
//     thread keeps kUnroll keys' loads in flight before it uses the first;
//   - the keys of a token are cut into `splits` slices, one CTA each, so a batch of one sequence still
//     fills the chip; the slice bounds are computed on the device from seq_lens, so a CUDA graph captured
//     once works for any length.
// Scores are kept in the log2 domain (q pre-scaled by scale * log2(e), exp2f), as FlashAttention does.
// Visible keys of token t at position p in sequence s: j in [max(0, p - window + 1) or 0, min(p,
// seq_len - 1)], block_tables[s][j / bs] slot j % bs; a token with no visible key gets a zero output.
#include <math_constants.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxGroup = 8;  // query heads per CTA
constexpr int kUnroll = 4;    // keys per lane group per iteration (loads in flight)
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);  // the lower address holds the lower half
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Grid: (token, kv head * head chunks, split). Block: kThreads = (128 / (HD / 8)) lane groups of HD / 8
// lanes; lane group g handles keys k_begin + g, + kKeyGroups, ... of the CTA's slice.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    decode_attention_kernel(const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                            const __nv_bfloat16* __restrict__ v_cache, int64_t num_blocks, int block_size,
                            const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                            int64_t window, float* __restrict__ part_acc, float* __restrict__ part_ml,
                            float* __restrict__ out) {
  constexpr int kLanesPerKey = HD / 8;
  constexpr int kKeyGroups = kThreads / kLanesPerKey;
  __shared__ float s_m[kKeyGroups][kMaxGroup];
  __shared__ float s_l[kKeyGroups][kMaxGroup];
  __shared__ __align__(16) float s_acc[kKeyGroups][kMaxGroup][HD];

  const int t = blockIdx.x, split = blockIdx.z, splits = gridDim.z;
  const int group = hq / hkv;
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int kvh = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
  const int h0 = kvh * group + chunk * kMaxGroup;
  const int nh = min(kMaxGroup, group - chunk * kMaxGroup);
  const int sub = threadIdx.x % kLanesPerKey, key_group = threadIdx.x / kLanesPerKey;

  const int s = find_sequence(batch.query_start, batch.num_seqs, t);
  const int64_t pos = batch.positions[t];
  const int64_t last = min(pos, static_cast<int64_t>(batch.seq_lens[s]) - 1);
  const int64_t first = window > 0 ? max(static_cast<int64_t>(0), pos - window + 1) : 0;
  const int64_t n_keys = last >= first ? last - first + 1 : 0;
  const int64_t per_split = (n_keys + splits - 1) / splits;
  const int64_t k_begin = first + split * per_split;
  const int64_t k_end = min(last + 1, k_begin + per_split);

  float qr[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < nh) {
      const float4* src =
          reinterpret_cast<const float4*>(q + (static_cast<int64_t>(t) * hq + h0 + g) * HD + sub * 8);
      const float4 a = src[0], b = src[1];
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) qr[g][i] = v[i] * scale_log2;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) qr[g][i] = 0.0f;
    }
  }
  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -CUDART_INF_F;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }

  const int32_t* table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
  const int64_t kv_row = static_cast<int64_t>(hkv) * HD;
  const int64_t head_offset = static_cast<int64_t>(kvh) * HD + sub * 8;
  // Every lane of a warp runs the same number of iterations (the loop bound is uniform per warp only
  // when all its lane groups agree, so iterate to the CTA-wide bound and mask), because the dot-product
  // reduction below shuffles across the whole warp.
  for (int64_t j0 = k_begin; j0 < k_end; j0 += kKeyGroups * kUnroll) {
    uint4 kv[kUnroll], vv[kUnroll];
    bool ok[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + key_group + u * kKeyGroups;
      ok[u] = false;
      kv[u] = make_uint4(0, 0, 0, 0);
      vv[u] = make_uint4(0, 0, 0, 0);
      if (j < k_end && j / block_size < batch.max_blocks_per_seq) {
        const int32_t block = table[j / block_size];
        if (block >= 0 && block < num_blocks) {  // never otherwise from the engine: skip, do not fault
          const int64_t offset =
              (block * static_cast<int64_t>(block_size) + j % block_size) * kv_row + head_offset;
          kv[u] = *reinterpret_cast<const uint4*>(k_cache + offset);
          vv[u] = *reinterpret_cast<const uint4*>(v_cache + offset);
          ok[u] = true;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[8], vf[8];
      unpack_bf16x8(kv[u], kf);
      unpack_bf16x8(vv[u], vf);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= nh) continue;  // uniform across the CTA
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot += qr[g][i] * kf[i];
#pragma unroll
        for (int off = kLanesPerKey / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (!ok[u]) continue;
        const float m_new = fmaxf(m[g], dot);
        const float corr = exp2f(m[g] - m_new);  // 0 for the first key (m = -inf)
        const float p = exp2f(dot - m_new);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * corr + p * vf[i];
        m[g] = m_new;
      }
    }
  }

  // Merge the lane groups' states, then write the split's partial (or the final output).
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (sub == 0) {
      s_m[key_group][g] = m[g];
      s_l[key_group][g] = l[g];
    }
    float4* dst = reinterpret_cast<float4*>(&s_acc[key_group][g][sub * 8]);
    dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nh * HD; idx += kThreads) {
    const int g = idx / HD, d = idx % HD;
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int kg = 0; kg < kKeyGroups; ++kg) mx = fmaxf(mx, s_m[kg][g]);
    float den = 0.0f, num = 0.0f;
    if (mx != -CUDART_INF_F) {
#pragma unroll
      for (int kg = 0; kg < kKeyGroups; ++kg) {
        const float f = s_m[kg][g] == -CUDART_INF_F ? 0.0f : exp2f(s_m[kg][g] - mx);
        den += s_l[kg][g] * f;
        num += s_acc[kg][g][d] * f;
      }
    }
    const int64_t row = static_cast<int64_t>(t) * hq + h0 + g;
    if (splits == 1) {
      out[row * HD + d] = den > 0.0f ? num / den : 0.0f;
    } else {
      part_acc[(row * splits + split) * HD + d] = num;
      if (d == 0) {
        part_ml[(row * splits + split) * 2] = mx;
        part_ml[(row * splits + split) * 2 + 1] = den;
      }
    }
  }
}

// One CTA of HD threads per (token, query head): rescales the splits' partials to a common maximum.
__global__ void decode_combine_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                      int splits, int hd, float* __restrict__ out) {
  __shared__ float s_w[kDecodeMaxSplits];
  __shared__ float s_den;
  const int64_t row = blockIdx.x;
  const float* ml = part_ml + row * splits * 2;
  if (threadIdx.x == 0) {
    float mx = -CUDART_INF_F;
    for (int i = 0; i < splits; ++i) mx = fmaxf(mx, ml[2 * i]);
    float den = 0.0f;
    for (int i = 0; i < splits; ++i) {
      const float w = (mx == -CUDART_INF_F || ml[2 * i] == -CUDART_INF_F) ? 0.0f : exp2f(ml[2 * i] - mx);
      s_w[i] = w;
      den += w * ml[2 * i + 1];
    }
    s_den = den;
  }
  __syncthreads();
  const float* acc = part_acc + row * splits * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float num = 0.0f;
    for (int i = 0; i < splits; ++i) num += s_w[i] * acc[static_cast<int64_t>(i) * hd + d];
    out[row * hd + d] = s_den > 0.0f ? num / s_den : 0.0f;
  }
}

template <int HD>
cudaError_t launch_typed(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                         float scale, int64_t window, int splits, void* scratch, float* out,
                         cudaStream_t stream) {
  const int chunks = (hq / hkv + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(static_cast<unsigned>(batch.num_tokens), static_cast<unsigned>(hkv * chunks),
                  static_cast<unsigned>(splits));
  float* part_acc = static_cast<float*>(scratch);
  float* part_ml = part_acc ? part_acc + static_cast<int64_t>(batch.num_tokens) * hq * splits * HD : nullptr;
  decode_attention_kernel<HD><<<grid, kThreads, 0, stream>>>(
      q, static_cast<const __nv_bfloat16*>(cache.k), static_cast<const __nv_bfloat16*>(cache.v),
      cache.num_blocks, static_cast<int>(cache.block_size), batch, hq, hkv, scale * kLog2e, window, part_acc,
      part_ml, out);
  if (splits > 1) {
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    decode_combine_kernel<<<static_cast<unsigned>(static_cast<int64_t>(batch.num_tokens) * hq), HD, 0,
                            stream>>>(part_acc, part_ml, splits, HD, out);
  }
  return cudaGetLastError();
}

}  // namespace

int decode_attention_splits(int64_t tokens, int64_t kv_heads, int64_t hq, int64_t max_keys, int sms) {
  const int64_t chunks = (hq / kv_heads + kMaxGroup - 1) / kMaxGroup;
  const int64_t ctas = tokens * kv_heads * chunks;
  int64_t want = (2 * static_cast<int64_t>(sms) + ctas - 1) / ctas;  // fill every SM twice
  const int64_t by_len = max_keys / 64;                              // a split of fewer keys is all overhead
  want = want < by_len ? want : by_len;
  if (want < 1) want = 1;
  return static_cast<int>(want < kDecodeMaxSplits ? want : kDecodeMaxSplits);
}

size_t decode_attention_scratch_bytes(int64_t tokens, int64_t hq, int64_t hd, int splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(tokens * hq * splits * (hd + 2)) * sizeof(float);
}

bool decode_attention_supported(const PagedKv& cache, int64_t hd) {
  return cache.dtype == DType::BF16 && (hd == 64 || hd == 128);
}

cudaError_t launch_decode_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                    int64_t hkv, int64_t hd, float scale, int64_t sliding_window, int splits,
                                    void* scratch, float* out, cudaStream_t stream) {
  if (batch.num_tokens == 0 || hq == 0) return cudaSuccess;
  if (!decode_attention_supported(cache, hd) || splits < 1 || splits > kDecodeMaxSplits ||
      (splits > 1 && scratch == nullptr))
    return cudaErrorInvalidValue;  // the caller checks these first
  if (hd == 64)
    return launch_typed<64>(q, cache, batch, static_cast<int>(hq), static_cast<int>(hkv), scale,
                            sliding_window, splits, scratch, out, stream);
  return launch_typed<128>(q, cache, batch, static_cast<int>(hq), static_cast<int>(hkv), scale,
                           sliding_window, splits, scratch, out, stream);
}

}  // namespace inferx::cuda
