// Prefill / chunked-prefill attention on tensor cores, FlashAttention-2 style (Dao 2023, Algorithm 1):
// a CTA keeps a 64-query tile of one sequence and one query head in registers and walks 64-key tiles,
// S = Q K^T and O += P V through mma.sync.m16n8k16 (BF16 operands, F32 accumulators), with the online
// softmax rescaling O between tiles. Each of the 4 warps owns 16 query rows.
//
// Varlen over the flattened batch: grid (query head, sequence, query tile); a tile past the sequence's
// query count exits at once. Tiles are launched last-first: under the causal mask the last query tiles
// walk the most keys, so starting them first keeps the tail of the grid short.
// Keys are gathered from the paged cache through the block table into a double-buffered shared tile
// (attention_tiles.cuh): the next tile's loads (cp.async for BF16, register loads for FP8) are in
// flight while the current one is multiplied. Fragments come from shared memory through ldmatrix (x4:
// two 8-key column blocks of K, or two 8-dim column blocks of V transposed, per instruction).
// Masking per (query position p, key j): j <= p, j < seq_len, and j > p - window when window > 0. The
// key range walked is [min over the tile of the window start, max position of the tile].
#include <math_constants.h>

#include <climits>

#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

using attn::KvTileLoader;
using attn::KvTileSmem;

constexpr int kThreads = 128;
constexpr int kBM = 64;  // query rows per CTA (16 per warp)
constexpr int kBN = 64;  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

template <class CacheT, int HD>
__global__ void __launch_bounds__(kThreads)
    prefill_attention_kernel(const float* __restrict__ q, const CacheT* __restrict__ k_cache,
                             const CacheT* __restrict__ v_cache, int64_t num_blocks, int block_size,
                             const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                             float out_scale, int64_t window, float* __restrict__ out) {
  constexpr int kLd = HD + 8;
  constexpr bool kFp8 = sizeof(CacheT) == 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<KvTileSmem<HD, kBN>*>(smem_raw);
  __shared__ int s_min_pos, s_max_pos;

  const int h = blockIdx.x, s = blockIdx.y, tile = gridDim.z - 1 - blockIdx.z;
  const int q0 = batch.query_start[s];
  const int q_len = batch.query_start[s + 1] - q0;
  if (tile * kBM >= q_len) return;
  const int64_t seq_len = batch.seq_lens[s];
  const int kvh = h / (hq / hkv);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int gid = lane / 4, tig = lane % 4;
  const int rows = min(kBM, q_len - tile * kBM);

  if (threadIdx.x == 0) {
    s_min_pos = INT_MAX;
    s_max_pos = INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int p = batch.positions[q0 + tile * kBM + threadIdx.x];
    atomicMin(&s_min_pos, p);
    atomicMax(&s_max_pos, p);
  }
  __syncthreads();
  const int64_t kv_begin = window > 0 ? max(static_cast<int64_t>(0), s_min_pos - window + 1) : 0;
  const int64_t kv_end = min(seq_len, static_cast<int64_t>(s_max_pos) + 1);

  // This thread's two query rows of the warp's 16.
  const int r0 = warp * 16 + gid, r1 = r0 + 8;
  const bool valid0 = r0 < rows, valid1 = r1 < rows;
  const int64_t tok0 = q0 + tile * kBM + r0, tok1 = q0 + tile * kBM + r1;
  const int64_t pos0 = valid0 ? batch.positions[tok0] : -1;
  const int64_t pos1 = valid1 ? batch.positions[tok1] : -1;

  // Q as A fragments, pre-scaled into the log2 domain and rounded to BF16.
  uint32_t qf[HD / 16][4];
  {
    const float* qa = q + (tok0 * hq + h) * HD;
    const float* qb = q + (tok1 * hq + h) * HD;
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
      const int c = kt * 16 + tig * 2;
      float2 a_lo = make_float2(0, 0), a_hi = a_lo, b_lo = a_lo, b_hi = a_lo;
      if (valid0) {
        a_lo = *reinterpret_cast<const float2*>(qa + c);
        a_hi = *reinterpret_cast<const float2*>(qa + c + 8);
      }
      if (valid1) {
        b_lo = *reinterpret_cast<const float2*>(qb + c);
        b_hi = *reinterpret_cast<const float2*>(qb + c + 8);
      }
      qf[kt][0] = attn::pack_bf16(a_lo.x * scale_log2, a_lo.y * scale_log2);
      qf[kt][1] = attn::pack_bf16(b_lo.x * scale_log2, b_lo.y * scale_log2);
      qf[kt][2] = attn::pack_bf16(a_hi.x * scale_log2, a_hi.y * scale_log2);
      qf[kt][3] = attn::pack_bf16(b_hi.x * scale_log2, b_hi.y * scale_log2);
    }
  }

  float o[HD / 8][4];
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.0f, l1 = 0.0f;

  KvTileLoader<CacheT, HD, kBN, kThreads> loader{
      k_cache,
      v_cache,
      batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq,
      batch.max_blocks_per_seq,
      num_blocks,
      block_size,
      static_cast<int64_t>(hkv) * HD,
      static_cast<int64_t>(kvh) * HD};
  const int64_t n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBN - 1) / kBN : 0;
  bool ok_cur = true, ok_next = true;  // this thread's loads of the current / next tile were all valid
  if (n_tiles > 0) {
    ok_cur = loader.begin(sm, 0, kv_begin, kv_end);
    if constexpr (kFp8) loader.store_fp8(sm, 0);
  }
  // ldmatrix row addresses of this lane (see attention_tiles.cuh for the fragment mapping).
  const int k_row = (lane >> 4) * 8 + (lane & 7), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = lane & 15, v_col = (lane >> 4) * 8;
  for (int64_t it = 0; it < n_tiles; ++it) {
    const int st = static_cast<int>(it & 1);
    const int64_t kt0 = kv_begin + it * kBN;
    const bool more = it + 1 < n_tiles;
    if (more) ok_next = loader.begin(sm, st ^ 1, kt0 + kBN, kv_end);
    if constexpr (!kFp8) {
      if (more)
        attn::cp_async_wait<1>();
      else
        attn::cp_async_wait<0>();
    }
    // Every key of the tile valid and visible to every query row of the CTA: no mask needed (most tiles
    // of a long causal prefill).
    const bool all_ok = __syncthreads_and(ok_cur);
    const bool full = all_ok && kt0 + kBN - 1 <= s_min_pos && (window <= 0 || kt0 > s_max_pos - window);
    ok_cur = ok_next;
    const __nv_bfloat16* k_s = sm.k[st];
    const __nv_bfloat16* v_s = sm.v[st];

    // S = Q K^T for the warp's 16 rows x 64 keys.
    float sc[kBN / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t b[4];
        attn::ldmatrix_x4(b, &k_s[(np * 16 + k_row) * kLd + kt * 16 + k_col]);
        attn::mma_bf16(sc[2 * np], qf[kt], b[0], b[1]);
        attn::mma_bf16(sc[2 * np + 1], qf[kt], b[2], b[3]);
      }
    }

    // Mask, then the online softmax update (row maxima over the 4 lanes sharing a row).
    float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
      if (!full) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = nt * 8 + tig * 2 + (e & 1);
          const int64_t j = kt0 + key;
          const int64_t p = e < 2 ? pos0 : pos1;
          const bool visible = sm.ok[st][key] && j <= p && (window <= 0 || j > p - window);
          if (!visible) sc[nt][e] = -CUDART_INF_F;
        }
      }
      mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
    }
    mx0 = attn::quad_max(mx0);
    mx1 = attn::quad_max(mx1);
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with nothing visible yet keeps m = -inf; subtract 0 then so that exp2 gives 0, not NaN.
    const float base0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, base1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
    const float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
      sc[nt][0] = exp2f(sc[nt][0] - base0);
      sc[nt][1] = exp2f(sc[nt][1] - base0);
      sc[nt][2] = exp2f(sc[nt][2] - base1);
      sc[nt][3] = exp2f(sc[nt][3] - base1);
      sum0 += sc[nt][0] + sc[nt][1];
      sum1 += sc[nt][2] + sc[nt][3];
    }
    // Per-lane partial sums: the 4 lanes of a row share m, so they are summed once at the end.
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      o[nt][0] *= corr0;
      o[nt][1] *= corr0;
      o[nt][2] *= corr1;
      o[nt][3] *= corr1;
    }

    // O += P V: two adjacent C tiles of P are the A fragment of one 16-key step.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t a[4] = {attn::pack_bf16(sc[2 * kk][0], sc[2 * kk][1]),
                             attn::pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                             attn::pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                             attn::pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < HD / 16; ++np) {
        uint32_t b[4];
        attn::ldmatrix_x4_trans(b, &v_s[(kk * 16 + v_row) * kLd + np * 16 + v_col]);
        attn::mma_bf16(o[2 * np], a, b[0], b[1]);
        attn::mma_bf16(o[2 * np + 1], a, b[2], b[3]);
      }
    }
    if constexpr (kFp8) {
      if (more) loader.store_fp8(sm, st ^ 1);
    }
    __syncthreads();  // the next iteration overwrites this stage
  }

  l0 = attn::quad_sum(l0);
  l1 = attn::quad_sum(l1);
  const float inv0 = l0 > 0.0f ? out_scale / l0 : 0.0f, inv1 = l1 > 0.0f ? out_scale / l1 : 0.0f;
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) {
    const int c = nt * 8 + tig * 2;
    if (valid0)
      *reinterpret_cast<float2*>(out + (tok0 * hq + h) * HD + c) =
          make_float2(o[nt][0] * inv0, o[nt][1] * inv0);
    if (valid1)
      *reinterpret_cast<float2*>(out + (tok1 * hq + h) * HD + c) =
          make_float2(o[nt][2] * inv1, o[nt][3] * inv1);
  }
}

template <class CacheT, int HD>
cudaError_t launch_typed(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                         float scale, int64_t window, int64_t max_query_len, float* out,
                         cudaStream_t stream) {
  static unsigned smem_set = 0;
  constexpr int kSmem = sizeof(attn::KvTileSmem<HD, kBN>);
  const cudaError_t st = attn::allow_dynamic_smem(prefill_attention_kernel<CacheT, HD>, kSmem, smem_set);
  if (st != cudaSuccess) return st;
  const dim3 grid(static_cast<unsigned>(hq), static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>((max_query_len + kBM - 1) / kBM));
  const bool fp8 = cache.dtype == DType::F8_E4M3;
  prefill_attention_kernel<CacheT, HD><<<grid, kThreads, kSmem, stream>>>(
      q, static_cast<const CacheT*>(cache.k), static_cast<const CacheT*>(cache.v), cache.num_blocks,
      static_cast<int>(cache.block_size), batch, hq, hkv, scale * kLog2e * (fp8 ? cache.k_scale : 1.0f),
      fp8 ? cache.v_scale : 1.0f, window, out);
  return cudaGetLastError();
}

}  // namespace

bool prefill_attention_supported(const PagedKv& cache, int64_t hd) {
  return (cache.dtype == DType::BF16 || cache.dtype == DType::F8_E4M3) && (hd == 64 || hd == 128);
}

cudaError_t launch_prefill_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                     int64_t hkv, int64_t hd, float scale, int64_t sliding_window,
                                     int64_t max_query_len, float* out, cudaStream_t stream) {
  if (batch.num_tokens == 0 || hq == 0 || max_query_len <= 0) return cudaSuccess;
  if (!prefill_attention_supported(cache, hd) || (max_query_len + kBM - 1) / kBM > 65535)
    return cudaErrorInvalidValue;  // the caller checks first
  const int iq = static_cast<int>(hq), ikv = static_cast<int>(hkv);
  if (cache.dtype == DType::F8_E4M3) {
    if (hd == 64)
      return launch_typed<uint8_t, 64>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len, out,
                                       stream);
    return launch_typed<uint8_t, 128>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len, out,
                                      stream);
  }
  if (hd == 64)
    return launch_typed<__nv_bfloat16, 64>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len,
                                           out, stream);
  return launch_typed<__nv_bfloat16, 128>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len, out,
                                          stream);
}

}  // namespace inferx::cuda
