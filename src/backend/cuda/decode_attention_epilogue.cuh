#pragma once
// The end every split-KV decode attention kernel shares (v1 and v2: kernels_decode_attention.cu, v3:
// kernels_decode_attention_v3.cu): the CTA's warps each hold an online-softmax state over their own keys;
// those are merged through shared memory into the output rows (one split) or the split's partial
// (max, denominator, numerator), and the last CTA of a (token, group chunk) to finish - an atomic ticket
// taken with acquire-release semantics, tickets returned to zero - combines the partials.
// The combine is spread over the CTA (a warp per row weighs the splits, then every thread sums dims over
// all splits): at batch 1 it ends the kernel's critical path (v3: 16.5 -> 8.5 us per layer, H200).
#include <math_constants.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda::attn {

// Where a decode CTA's result goes.
struct DecodeResult {
  float* out;               // [tokens * hq, HD]
  __nv_bfloat16* out_bf16;  // the same rounded to BF16, or null
  float* part_acc;          // [tokens * hq, stride, HD] numerators (splits > 1)
  float* part_ml;           // [tokens * hq, stride, 2] max and denominator
  int* ticket;              // this (token, group chunk)'s merge ticket (splits > 1)
  int64_t row0;             // the CTA's first output row: token * hq + first head
  int nh;                   // rows it writes
  int splits;               // the token's splits that the merge combines (SplitKeys::used)
  int split;                // this CTA's
  int stride;               // the launch's split count: partials per output row
  float out_scale;          // FP8 caches: v_scale
};

// A split's online-softmax state for one output dim: running max (log2 domain), denominator, numerator.
struct SplitState {
  float mx, den, num;
};

// Row r, dim d of the CTA's split: the warps' states in s_o / s_m / s_l (finish_decode's layout) combined.
template <int kWarps, int kRows, int HD>
__device__ __forceinline__ SplitState combine_warps(const float* s_o, const float* s_m, const float* s_l,
                                                    int r, int d) {
  SplitState st{-CUDART_INF_F, 0.0f, 0.0f};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) st.mx = fmaxf(st.mx, s_m[w * kRows + r]);
  if (st.mx == -CUDART_INF_F) return st;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float mw = s_m[w * kRows + r];
    const float f = mw == -CUDART_INF_F ? 0.0f : exp2f(mw - st.mx);
    st.den += s_l[w * kRows + r] * f;
    st.num += s_o[(w * kRows + r) * HD + d] * f;
  }
  return st;
}

// A token's only split writes its output directly (no merge).
template <int HD>
__device__ __forceinline__ void store_single_split(const DecodeResult& res, int64_t row, int d,
                                                   const SplitState& st) {
  const float v = st.den > 0.0f ? st.num / st.den * res.out_scale : 0.0f;
  res.out[row * HD + d] = v;
  if (res.out_bf16) res.out_bf16[row * HD + d] = __float2bfloat16_rn(v);
}

// Four dims of a merged output row: the splits' weighted numerators times f (out_scale / denominator).
template <int HD>
__device__ __forceinline__ void store_merged4(const DecodeResult& res, int64_t row, int d, float4 num,
                                              float f) {
  const float4 v = make_float4(num.x * f, num.y * f, num.z * f, num.w * f);
  *reinterpret_cast<float4*>(res.out + row * HD + d) = v;
  if (res.out_bf16) store_bf16x4(res.out_bf16 + row * HD + d, v.x, v.y, v.z, v.w);
}

// s_o [warp][row][HD], s_m / s_l [warp][row] (kRows rows per warp) hold every warp's numerator, running
// max (log2 domain) and denominator, written by the caller before a __syncthreads(). kVec4: the combine
// reads and writes 4 dims at a time (out 16-byte and out_bf16 8-byte aligned). Every thread calls it.
template <int kWarps, int kRows, int HD, int kThreads, bool kVec4>
__device__ __forceinline__ void finish_decode(const float* s_o, const float* s_m, const float* s_l,
                                              const DecodeResult& res) {
  static_assert(kDecodeMaxSplits <= 2 * kWarp, "two splits per lane in the combine");
  __shared__ float s_w[kRows][kDecodeMaxSplits];
  __shared__ float s_den[kRows];
  __shared__ bool s_last;
  const int splits = res.splits, stride = res.stride;
  for (int idx = threadIdx.x; idx < res.nh * HD; idx += kThreads) {
    const int r = idx / HD, d = idx % HD;
    const SplitState st = combine_warps<kWarps, kRows, HD>(s_o, s_m, s_l, r, d);
    const int64_t row = res.row0 + r;
    if (splits == 1) {
      store_single_split<HD>(res, row, d, st);
    } else {
      res.part_acc[(row * stride + res.split) * HD + d] = st.num;
      if (d == 0) {
        res.part_ml[(row * stride + res.split) * 2] = st.mx;
        res.part_ml[(row * stride + res.split) * 2 + 1] = st.den;
      }
    }
  }
  if (splits == 1) return;

  // One thread takes the ticket with an acq_rel atomic at GPU scope, after the barrier, instead of every
  // thread fencing before it and again after it: the release is cumulative over the CTA's partial stores
  // that the barrier ordered before it, and the last CTA's acquire, followed by its barrier, orders its
  // threads' reads of the partials after every split's release (cooperative groups' grid sync has this
  // shape: one thread fences and counts between two CTA barriers).
  __syncthreads();
  if (threadIdx.x == 0) {
    int before;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(before) : "l"(res.ticket) : "memory");
    s_last = before == splits - 1;
    if (s_last) *res.ticket = 0;  // ready for the next launch (stream order separates launches)
  }
  __syncthreads();
  if (!s_last) return;
  // A warp per row: lane i weighs splits i and i + 32 and the warp sums the denominator.
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int r = warp; r < res.nh; r += kWarps) {
    const float2* ml = reinterpret_cast<const float2*>(res.part_ml) + (res.row0 + r) * stride;
    const float2 a = lane < splits ? __ldcg(&ml[lane]) : make_float2(-CUDART_INF_F, 0.0f);
    const float2 b = lane + kWarp < splits ? __ldcg(&ml[lane + kWarp]) : make_float2(-CUDART_INF_F, 0.0f);
    float mx = fmaxf(a.x, b.x);
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float wa = mx == -CUDART_INF_F || a.x == -CUDART_INF_F ? 0.0f : exp2f(a.x - mx);
    const float wb = mx == -CUDART_INF_F || b.x == -CUDART_INF_F ? 0.0f : exp2f(b.x - mx);
    const float den = warp_sum(wa * a.y + wb * b.y);
    if (lane < splits) s_w[r][lane] = wa;
    if (lane + kWarp < splits) s_w[r][lane + kWarp] = wb;
    if (lane == 0) s_den[r] = den;
  }
  __syncthreads();
  constexpr int kV = kVec4 ? 4 : 1;  // dims per thread and step
  for (int idx = threadIdx.x; idx < res.nh * (HD / kV); idx += kThreads) {
    const int r = idx / (HD / kV), d = idx % (HD / kV) * kV;
    const int64_t row = res.row0 + r;
    const float* acc = res.part_acc + row * stride * HD + d;
    const float f = s_den[r] > 0.0f ? res.out_scale / s_den[r] : 0.0f;
    if constexpr (kVec4) {
      float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
      for (int i = 0; i < splits; ++i) {
        const float w = s_w[r][i];
        const float4 v = __ldcg(reinterpret_cast<const float4*>(acc + static_cast<int64_t>(i) * HD));
        num.x += w * v.x, num.y += w * v.y, num.z += w * v.z, num.w += w * v.w;
      }
      store_merged4<HD>(res, row, d, num, f);
    } else {
      float num = 0.0f;
#pragma unroll 8
      for (int i = 0; i < splits; ++i) num += s_w[r][i] * __ldcg(&acc[static_cast<int64_t>(i) * HD]);
      res.out[row * HD + d] = num * f;
      if (res.out_bf16) res.out_bf16[row * HD + d] = __float2bfloat16_rn(num * f);
    }
  }
}

// The cluster form of finish_decode (v3 at batch 1: kernels_decode_attention_v3.cu,
// decode_attention_cluster): the splits of a (token, group chunk) are the CTAs of one thread-block cluster,
// rank = split, and instead of global partials, a ticket and a merge that reads them back from L2, each CTA
// stores its split's state into shared memory of rank 0 (distributed shared memory), arrives at the cluster
// barrier (release) and exits; rank 0 waits (acquire) and merges from its own shared memory. `area` (every
// CTA's, only rank 0's used): [stride][rows][HD] numerators, then [stride][rows] (max, denominator) pairs,
// rows = res.nh. The kernel arrived at the barrier's first phase (relaxed) as it started; waiting on it here,
// before the first remote store, makes sure rank 0 has started (distributed shared memory of a CTA that has
// not started must not be touched) and costs nothing by now. A CTA past the token's splits exits before
// either phase; the barrier does not wait for exited threads. Why: at batch 1 the per-CTA stamps
// (INFERX_DECODE_ATTN_STAMPS, H100 2026-12-07) put 1.6 us in a split's partial and ticket and 3.3 us in the
// merging CTA's, of the kernel's 7.3 us after its PDL wait.
template <int kWarps, int kRows, int HD, int kThreads>
__device__ __forceinline__ void finish_decode_cluster(const float* s_o, const float* s_m, const float* s_l,
                                                      const DecodeResult& res, float* area) {
  const int splits = res.splits, stride = res.stride, nh = res.nh;
  float* const o_area = area;
  float2* const ml_area = reinterpret_cast<float2*>(area + static_cast<int64_t>(stride) * nh * HD);
  if (splits > 1) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // the first phase
  // Rank 0's address of a location in this CTA's area.
  auto leader = [](const void* local) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, 0;"
                 : "=r"(remote)
                 : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))));
    return remote;
  };
  for (int idx = threadIdx.x; idx < nh * HD; idx += kThreads) {
    const int r = idx / HD, d = idx % HD;
    const SplitState st = combine_warps<kWarps, kRows, HD>(s_o, s_m, s_l, r, d);
    const int64_t row = res.row0 + r;
    if (splits == 1) {  // the token's only split: no one to merge with
      store_single_split<HD>(res, row, d, st);
      continue;
    }
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(
                     leader(o_area + (static_cast<int64_t>(res.split) * nh + r) * HD + d)),
                 "f"(st.num)
                 : "memory");
    if (d == 0)
      asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(leader(ml_area + res.split * nh + r)),
                   "f"(st.mx), "f"(st.den)
                   : "memory");
  }
  if (splits == 1) return;
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  if (res.split != 0) return;
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  for (int idx = threadIdx.x; idx < nh * (HD / 4); idx += kThreads) {
    const int r = idx / (HD / 4), d = idx % (HD / 4) * 4;
    float mx = -CUDART_INF_F;
    for (int i = 0; i < splits; ++i) mx = fmaxf(mx, ml_area[i * nh + r].x);
    float den = 0.0f;
    float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (mx != -CUDART_INF_F) {
      for (int i = 0; i < splits; ++i) {
        const float2 ml = ml_area[i * nh + r];
        const float w = ml.x == -CUDART_INF_F ? 0.0f : exp2f(ml.x - mx);
        den += w * ml.y;
        const float4 v =
            *reinterpret_cast<const float4*>(o_area + (static_cast<int64_t>(i) * nh + r) * HD + d);
        num.x += w * v.x, num.y += w * v.y, num.z += w * v.z, num.w += w * v.w;
      }
    }
    const int64_t row = res.row0 + r;
    const float f = den > 0.0f ? res.out_scale / den : 0.0f;
    store_merged4<HD>(res, row, d, num, f);
  }
}

}  // namespace inferx::cuda::attn
