#pragma once
// The persistent batch-1 decode kernel's attention phase (kernels_decode_stack.cu, the only includer): the
// CTA's work item and its cached keys/values as ring stages (KvSpan: the producer streams them, the phase
// reads them), RoPE of the queries and of the new key (written to the paged cache), online-softmax
// partials per split and their merge by the last split of each KV head.
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/decode_stack_ring.cuh"

namespace inferx::cuda::stack {

// ---- the attention's keys and values as ring stages -------------------------------------------------------
// CTA i < hkv * splits owns item (kv head g = i / splits, split s = i % splits): the cached keys of its
// share of the context. They depend on nothing computed in the step (only on the block table), so the
// producer streams them through the ring right after the layer's qkv rows, and the attention phase finds
// them in shared memory instead of waiting on dependent loads. The new token's key and value (position
// pos, written to the cache by the owning split during the phase) are not streamed.
// With the layers' tensor maps (DecodeStackParams::kv_maps) the span streams whole blocks: splits of a
// multiple of block_size keys, from k0's block start to k1's block end (`first`, ntok a multiple of the block
// size, stages too), the producer copying one block of one KV head per tensor copy; keys outside [k0, k1)
// and the new position are marked invalid like missing block-table entries.
struct KvSpan {
  int g, s;
  int32_t k0, k1, pos;
  bool active, owner, tiled;
  int32_t first;      // the first streamed token (k0, or its block's start when tiled)
  int32_t ntok;       // tokens streamed: [k0, k1) without pos; tiled: whole blocks from `first`
  int32_t row;        // bytes of one key (and of one value) row
  int32_t per_stage;  // keys per stage: keys first, then their values
  uint32_t nstages;
};

__device__ __forceinline__ KvSpan kv_span(const DecodeStackParams& p, int32_t stage_bytes) {
  KvSpan k{};
  const int splits = p.splits;
  k.active = static_cast<int>(blockIdx.x) < p.hkv * splits;
  k.g = blockIdx.x / splits;
  k.s = blockIdx.x % splits;
  k.pos = p.batch.positions[0];
  const int32_t len = p.batch.seq_lens[0];
  const int32_t lo = p.window > 0 ? max(0, k.pos + 1 - p.window) : 0;
  const int32_t bs = p.block_size;
  k.tiled = p.kv_maps != nullptr;
  int32_t per = (max(len - lo, 0) + splits - 1) / splits;
  if (k.tiled) per = (per + bs - 1) / bs * bs;
  k.k0 = lo + k.s * per;
  k.k1 = min(len, k.k0 + per);
  k.owner = k.active && k.pos >= k.k0 && k.pos < k.k1;
  k.row = p.hd * (p.kv_fp8 ? 1 : 2);
  k.per_stage = min(stage_bytes / (2 * k.row), kMaxKeysPerStage);
  if (k.tiled) {
    k.per_stage = k.per_stage / bs * bs;  // at least one block (the host checks)
    k.first = k.k0 / bs * bs;
    k.ntok = k.active && k.k1 > k.k0 ? (k.k1 + bs - 1) / bs * bs - k.first : 0;
  } else {
    k.first = k.k0;
    k.ntok = k.active ? max(0, k.k1 - k.k0) - (k.owner ? 1 : 0) : 0;
  }
  k.nstages = static_cast<uint32_t>((k.ntok + k.per_stage - 1) / k.per_stage);
  return k;
}

// Cache element offset of (token t, kv head g, dim 0); -1 when the block table has no valid entry.
__device__ __forceinline__ int64_t kv_offset(const DecodeStackParams& p, int32_t t, int32_t g, int hd) {
  const int32_t b = t / p.block_size;
  if (t < 0 || b >= p.batch.max_blocks_per_seq) return -1;
  const int32_t block = p.batch.block_tables[b];
  if (block < 0 || block >= p.num_blocks) return -1;
  return ((static_cast<int64_t>(block) * p.block_size + t % p.block_size) * p.hkv + g) * hd;
}

// Position of the i-th streamed key (per key: the new position skipped; tiled: every position).
__device__ __forceinline__ int32_t kv_token(const KvSpan& k, int32_t i) {
  const int32_t t = k.first + i;
  return !k.tiled && k.owner && t >= k.pos ? t + 1 : t;
}

// Whether the i-th streamed key is one the attention reads: a valid block-table entry and, tiled, inside
// [k0, k1) and not the new position (whose key the owning split adds itself).
__device__ __forceinline__ bool kv_streamed_valid(const DecodeStackParams& p, const KvSpan& k, int32_t i) {
  const int32_t t = kv_token(k, i);
  if (k.tiled && (t < k.k0 || t >= k.k1 || t == k.pos)) return false;
  return kv_offset(p, t, k.g, p.hd) >= 0;
}

// ---- attention ------------------------------------------------------------------------------------------
template <int kDims>  // head dims per lane
__device__ __forceinline__ void load_kv(const void* cache, bool fp8, int64_t off, float scale, float* out) {
  if (fp8) {
    const auto* p = static_cast<const uint8_t*>(cache) + off;
    if constexpr (kDims == 4) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
      const __half2_raw lo =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3);
      const __half2_raw hi =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
      const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
      out[0] = a.x * scale, out[1] = a.y * scale, out[2] = b.x * scale, out[3] = b.y * scale;
    } else {
      const uint16_t w = *reinterpret_cast<const uint16_t*>(p);
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w), __NV_E4M3);
      const float2 a = __half22float2(__half2(h));
      out[0] = a.x * scale, out[1] = a.y * scale;
    }
  } else {
    const auto* p = static_cast<const __nv_bfloat16*>(cache) + off;
    if constexpr (kDims == 4) {
      const uint2 w = *reinterpret_cast<const uint2*>(p);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.y));
      out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
    } else {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
      out[0] = a.x, out[1] = a.y;
    }
  }
}

__device__ __forceinline__ void store_kv(void* cache, bool fp8, int64_t off, float v, float inv_scale) {
  if (fp8) {
    static_cast<uint8_t*>(cache)[off] =
        static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * inv_scale, __NV_SATFINITE, __NV_E4M3));
  } else {
    static_cast<__nv_bfloat16*>(cache)[off] = __float2bfloat16_rn(v);
  }
}

// Value of v as the cache stores it (BF16, or E4M3 of v / scale), read back as the kernels read the cache.
__device__ __forceinline__ float cache_rounded(float v, bool fp8, float scale) {
  if (fp8) {
    const auto code =
        static_cast<__nv_fp8_storage_t>(__nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3));
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))) * scale;
  }
  return __bfloat162float(__float2bfloat16_rn(v));
}

// The online-softmax merge of n partials (max m_j, sum l_j, accumulator a_j) of one output element:
// (m_j, l_j) at ml[j * stride], ml[j * stride + 1] (shared memory), a_j = acc(j). The accumulators are read
// 8 at a time before any is used, so reads from L2 (the splits' partials) overlap.
struct Merged {
  float m, l, a;  // the largest max; l and a rescaled to it
};
template <class Acc>
__device__ __forceinline__ Merged merge_partials(const float* ml, int stride, int n, Acc acc) {
  Merged r{-INFINITY, 0.0f, 0.0f};
  for (int j = 0; j < n; ++j) r.m = fmaxf(r.m, ml[j * stride]);
  if (r.m == -INFINITY) return r;
  for (int j0 = 0; j0 < n; j0 += 8) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = j0 + u < n ? acc(j0 + u) : 0.0f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const float mj = j0 + u < n ? ml[(j0 + u) * stride] : -INFINITY;
      if (mj == -INFINITY) continue;
      const float e = __expf(mj - r.m);
      r.l += ml[(j0 + u) * stride + 1] * e;
      r.a += v[u] * e;
    }
  }
  return r;
}

// The attention of this CTA's item (kv_span): RoPE of the group's query heads (and, by the split holding the
// new position, of the new key, which it writes with the value to the cache), the online-softmax partials
// over the streamed keys (ring stages) and the new one, then the last CTA of the group merges the splits
// into p.attn. `sm`: the x buffer as scratch: q [kMaxGroup][hd], the new k and v [hd] each, then the warps'
// partials. Every consumer warp passes every key stage (the ring's protocol), computing or not.
// `stamp(i)` marks the profile's sub-phase boundaries: 1 rope done, 2 the first key stage landed, 3 keys
// done, 4 partials published.
template <int kHd, class Stamp>
__device__ void attention_phase(const DecodeStackParams& p, const StackLayer& L, float* sm, int* flag,
                                const Ring& ring, uint32_t& it, const uint32_t* key_bits,
                                const Stamp& stamp) {
  constexpr int kDims = kHd / kWarp, kHalf = kHd / 2, kPart = kHd + 2;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int group = p.hq / p.hkv, splits = p.splits;
  const KvSpan k = kv_span(p, ring.stage_bytes);
  if (!k.active) {  // no item, no key stages
    for (int i = 1; i <= 4; ++i) stamp(i);
    return;
  }
  const int g = k.g, s = k.s;
  const bool compute = !(p.skip & 4);
  float* q_s = sm;
  float* knew = sm + kMaxGroup * kHd;
  float* vnew = knew + kHd;
  float* wpart = vnew + kHd;
  // Key walkers per head block (below): as many as the x buffer holds partials for (the host sizes it for
  // at least kAttnWarps) and the consumer warps allow.
  const int blocks = (group + 3) / 4;
  const int nkw = min(kConsumerWarps / blocks, (p.x_bytes / 4 - (kMaxGroup + 2) * kHd) / (group * kPart));
  for (int t = threadIdx.x; compute && t < (group + 1) * kHalf; t += kConsumers) {
    const int r = t / kHalf, i = t % kHalf;
    if (r == group && !k.owner) break;
    float sn, cs;
    sincosf(static_cast<float>(k.pos) * p.inv_freq[i], &sn, &cs);
    const int a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + kHalf;
    const float* head = r < group ? p.qkv + static_cast<int64_t>(g * group + r) * kHd
                                  : p.qkv + static_cast<int64_t>(p.hq + g) * kHd;
    const float x0 = __ldcg(head + a), x1 = __ldcg(head + b);
    const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
    if (r < group) {
      q_s[r * kHd + a] = y0 * p.attn_scale;
      q_s[r * kHd + b] = y1 * p.attn_scale;
    } else {
      const float* v = p.qkv + static_cast<int64_t>(p.hq + p.hkv + g) * kHd;
      const float v0 = __ldcg(v + a), v1 = __ldcg(v + b);
      knew[a] = cache_rounded(y0, p.kv_fp8, p.k_scale);
      knew[b] = cache_rounded(y1, p.kv_fp8, p.k_scale);
      vnew[a] = cache_rounded(v0, p.kv_fp8, p.v_scale);
      vnew[b] = cache_rounded(v1, p.kv_fp8, p.v_scale);
      const int64_t off = kv_offset(p, k.pos, g, kHd);
      if (off >= 0) {
        store_kv(L.k_cache, p.kv_fp8, off + a, y0, 1.0f / p.k_scale);
        store_kv(L.k_cache, p.kv_fp8, off + b, y1, 1.0f / p.k_scale);
        store_kv(L.v_cache, p.kv_fp8, off + a, v0, 1.0f / p.v_scale);
        store_kv(L.v_cache, p.kv_fp8, off + b, v1, 1.0f / p.v_scale);
      }
    }
  }
  for (int t = group * kHd + threadIdx.x; t < kMaxGroup * kHd; t += kConsumers) q_s[t] = 0.0f;
  consumer_sync();  // q, and the new k / v, in shared memory
  stamp(1);

  // Each warp runs the online softmax of one block of 4 query heads (warp % blocks) over every nkw-th key
  // (its walker index kw = warp / blocks): one copy of the per-key code, 4 heads of state in registers.
  // (Before: 8 heads of state per warp and the per-key code inlined twice, ~45 KB of SASS for the phase;
  // the key walk then took 7.4 us per layer, now 6.2, 8B bf16 on an H200.) q_s rows past the group are zero.
  const int hb = warp % blocks, kw = warp / blocks;
  const bool walker = kw < nkw && compute;
  float m[4], l[4], acc[4][kDims];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    m[u] = -INFINITY;
    l[u] = 0.0f;
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[u][d] = 0.0f;
  }
  const float* qb = q_s + hb * 4 * kHd + lane * kDims;
  // Stages 0 .. nstages - 1 are ring stages; one more pseudo-stage holds the new key (knew / vnew, already
  // rounded as the cache stores it) for the owning split.
  for (uint32_t st = 0; st <= k.nstages; ++st) {
    const bool ring_stage = st < k.nstages;
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    if (ring_stage) mbar_wait(&ring.full[slot], (it / ring.stages) & 1);
    if (st == 0) stamp(2);
    const int32_t n =
        ring_stage ? min(k.per_stage, k.ntok - static_cast<int32_t>(st) * k.per_stage) : (k.owner ? 1 : 0);
    const uint8_t* stage = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
    // One key per pass. (Two keys per pass - independent score chains, one rescale per head - measured on an
    // H100, 12-06 10:40, same call: 1k context 6.053 / 6.025 ms against 6.004 / 6.002, 4k 6.315 / 6.322
    // against 6.417 / 6.409; the kernel runs at <= 2048 tokens, so one key.)
    for (int32_t j = kw; walker && j < n; j += nkw) {
      float kf[kDims], vf[kDims];
      if (ring_stage) {
        if (!((key_bits[slot * kKeyWords + j / kWarp] >> (j % kWarp)) & 1u)) continue;  // invalid entry
        load_kv<kDims>(stage, p.kv_fp8, static_cast<int64_t>(j) * kHd + lane * kDims, p.k_scale, kf);
        load_kv<kDims>(stage, p.kv_fp8, static_cast<int64_t>(k.per_stage + j) * kHd + lane * kDims, p.v_scale,
                       vf);
      } else {
#pragma unroll
        for (int d = 0; d < kDims; ++d) kf[d] = knew[lane * kDims + d], vf[d] = vnew[lane * kDims + d];
      }
      float sc[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        sc[u] = 0.0f;
#pragma unroll
        for (int d = 0; d < kDims; ++d) sc[u] = fmaf(qb[u * kHd + d], kf[d], sc[u]);
      }
#pragma unroll
      for (int o = kWarp / 2; o > 0; o /= 2)
#pragma unroll
        for (int u = 0; u < 4; ++u) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float mn = fmaxf(m[u], sc[u]), corr = __expf(m[u] - mn), pr = __expf(sc[u] - mn);
        l[u] = l[u] * corr + pr;
#pragma unroll
        for (int d = 0; d < kDims; ++d) acc[u][d] = fmaf(acc[u][d], corr, pr * vf[d]);
        m[u] = mn;
      }
    }
    if (ring_stage) {
      release_stage(ring, slot);
      ++it;
    }
  }
  stamp(3);
  if (!compute) {
    stamp(4);
    return;
  }
  // The walkers' partials ([kw][r] in wpart), then their merge into this split's partial.
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int r = hb * 4 + u;
    if (!walker || r >= group) break;
    float* wp = wpart + (kw * group + r) * kPart;
    if (lane == 0) wp[0] = m[u], wp[1] = l[u];
#pragma unroll
    for (int d = 0; d < kDims; ++d) wp[2 + lane * kDims + d] = acc[u][d];
  }
  consumer_sync();
  for (int idx = threadIdx.x; idx < group * kHd; idx += kConsumers) {
    const int r = idx / kHd, d = idx % kHd;
    const float* wr = wpart + r * kPart;  // walker w's partial of head r at wr + w * group * kPart
    const Merged mg =
        merge_partials(wr, group * kPart, nkw, [&](int w) { return wr[w * group * kPart + 2 + d]; });
    float* part = p.partials + (static_cast<int64_t>(g * group + r) * splits + s) * kPart;
    __stcg(part + 2 + d, mg.a);
    if (d == 0) __stcg(part, mg.m), __stcg(part + 1, mg.l);
  }
  __threadfence();
  consumer_sync();
  if (threadIdx.x == 0) *flag = atomicAdd(&p.control[1 + g], 1u) == static_cast<uint32_t>(splits - 1);
  consumer_sync();
  stamp(4);
  if (*flag) {  // the group's last split: merge all of them
    // Every split's (max, sum) into shared memory in one round of loads (wpart is free again), then each
    // output element's sum over the splits with its loads issued together (merge_partials): one L2 round
    // trip per split in turn would each wait behind the other SMs' weight stream.
    __threadfence();
    float* ml = wpart;  // [group][splits][2]
    for (int i = threadIdx.x; i < group * splits; i += kConsumers) {
      const float* part = p.partials + (static_cast<int64_t>(g * group) * splits + i) * kPart;
      ml[2 * i] = __ldcg(part);
      ml[2 * i + 1] = __ldcg(part + 1);
    }
    consumer_sync();
    for (int idx = threadIdx.x; idx < group * kHd; idx += kConsumers) {
      const int r = idx / kHd, d = idx % kHd;
      const float* part = p.partials + static_cast<int64_t>(g * group + r) * splits * kPart + 2 + d;
      const Merged mg =
          merge_partials(ml + 2 * r * splits, 2, splits, [&](int j) { return __ldcg(part + j * kPart); });
      __stcg(p.attn + static_cast<int64_t>(g * group + r) * kHd + d, mg.l > 0.0f ? mg.a / mg.l : 0.0f);
    }
    if (threadIdx.x == 0) p.control[1 + g] = 0;  // ready for the next layer
  }
  consumer_sync();  // flag and scratch reused by the next phase
}

}  // namespace inferx::cuda::stack
