// Prefill / chunked-prefill attention on tensor cores, FlashAttention-2 style (Dao 2023, Algorithm 1).
// Four kernels, picked per process by INFERX_PREFILL_ATTN (kernels.h): v4 ("g3", the default, and "g2",
// wgmma on sm_90a, BF16 and FP8 caches), v3 ("m2"), v2 ("w8" / "w4") and v1 ("v1"; FP8 caches under
// any choice but v4), described below in the order v1, v2, v3, v4. H200, T8192 causal 32/8 heads x 128:
// v4 g3 331 TFLOP/s (FP8 cache 300), v3 257, v2 212, v1 117 (FP8 103).
//
// v1:
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

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/wgmma.cuh"

namespace inferx::cuda {
namespace {

using attn::KvTileLoader;
using attn::KvTileSmem;

constexpr int kThreads = 128;
constexpr int kBM = 64;  // query rows per CTA (16 per warp)
constexpr int kBN = 64;  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

// Kernel choices of launch_prefill_attention (see variant_of below).
enum Variant : int {
  kV1 = 1,    // "v1"
  kM2 = 2,    // "m2": v3
  kW4 = 4,    // "w4": v2, 4 warps
  kW8 = 8,    // "w8": v2, 8 warps
  kG3 = 13,   // "g3": v4, 3 warpgroups x 64 rows, 64-key tiles, 3 stages
  kG2 = 12,   // "g2": v4, 2 warpgroups x 64 rows, 128-key tiles, 2 stages
  kG2s = 14,  // "g2s": v4, 2 warpgroups x 64 rows, 64-key tiles, 3 stages
};

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

// v2 (BF16 caches; the default): the same FA2 tile math as above, with kWarps warps of 16 query rows
// sharing each 64-key tile (kWarps = 8: 128 queries per CTA, half the K/V gather per FLOP of v1), and
// the paged-address arithmetic done once per key instead of once per 16-byte chunk: threads 0..63 read
// the block table for the tile after next at the top of an iteration (the load is in flight during the
// tile's MMAs), publish the 64 row offsets in shared memory at its end, and the next iteration's
// cp.async issue only reads them (v1 did a 64-bit division and a dependent table load per chunk).
// A warp whose 16 rows see none of a tile's keys (the causal diagonal, the window's start) skips its
// MMAs; exp2 is the approximate ex2 instruction (the scale is folded into Q, in the log2 domain).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int HD, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    prefill_attention_v2(const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                         const __nv_bfloat16* __restrict__ v_cache, int64_t num_blocks, int block_size,
                         const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                         int64_t window, float* __restrict__ out) {
  constexpr int kT = kWarps * 32, kRows = kWarps * 16;
  constexpr int kLd = HD + 8, kChunks = HD / 8;
  constexpr int kPer = kBN * kChunks / kT;
  static_assert(kBN * kChunks % kT == 0 && kT >= kBN, "chunks must divide evenly; one key per thread");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<KvTileSmem<HD, kBN>*>(smem_raw);
  __shared__ int64_t s_off[2][kBN];  // element offset of each key's row of kv head kvh; -1: invalid
  __shared__ int s_min_pos, s_max_pos;

  const int h = blockIdx.x, s = blockIdx.y, tile = gridDim.z - 1 - blockIdx.z;
  const int q0 = batch.query_start[s];
  const int q_len = batch.query_start[s + 1] - q0;
  if (tile * kRows >= q_len) return;
  const int64_t seq_len = batch.seq_lens[s];
  const int kvh = h / (hq / hkv);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int gid = lane / 4, tig = lane % 4;
  const int rows = min(kRows, q_len - tile * kRows);

  if (threadIdx.x == 0) {
    s_min_pos = INT_MAX;
    s_max_pos = INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int p = batch.positions[q0 + tile * kRows + threadIdx.x];
    atomicMin(&s_min_pos, p);
    atomicMax(&s_max_pos, p);
  }
  __syncthreads();
  const int64_t kv_begin = window > 0 ? max(static_cast<int64_t>(0), s_min_pos - window + 1) : 0;
  const int64_t kv_end = min(seq_len, static_cast<int64_t>(s_max_pos) + 1);

  const int r0 = warp * 16 + gid, r1 = r0 + 8;
  const bool valid0 = r0 < rows, valid1 = r1 < rows;
  const int64_t tok0 = q0 + tile * kRows + r0, tok1 = q0 + tile * kRows + r1;
  const int64_t pos0 = valid0 ? batch.positions[tok0] : -1;
  const int64_t pos1 = valid1 ? batch.positions[tok1] : -1;
  // The warp's position range (rows past the sequence excluded): a tile outside it is skipped.
  const int wmax = __reduce_max_sync(0xffffffffu, static_cast<int>(max(pos0, pos1)));
  const int wmin =
      __reduce_min_sync(0xffffffffu, static_cast<int>(min(valid0 ? pos0 : INT_MAX, valid1 ? pos1 : INT_MAX)));

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

  const int32_t* table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
  const int64_t kv_row = static_cast<int64_t>(hkv) * HD, head_off = static_cast<int64_t>(kvh) * HD;
  const int64_t n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBN - 1) / kBN : 0;
  // Key threadIdx.x of tile t: its table entry (prefetch) and then its row offset (publish).
  int pf_block = -1, pf_in = 0;
  auto prefetch = [&](int64_t t) {
    pf_block = -1;
    if (threadIdx.x < kBN && t < n_tiles) {
      const int64_t j = kv_begin + t * kBN + threadIdx.x;  // < 2^31: positions are int32
      if (j < kv_end) {
        const unsigned bs = static_cast<unsigned>(block_size);
        const unsigned bi = static_cast<unsigned>(j) / bs;
        pf_in = static_cast<int>(static_cast<unsigned>(j) - bi * bs);
        if (bi < static_cast<unsigned>(batch.max_blocks_per_seq)) pf_block = table[bi];
      }
    }
  };
  auto publish = [&](int buf) {
    if (threadIdx.x < kBN)
      s_off[buf][threadIdx.x] =
          pf_block >= 0 && pf_block < num_blocks
              ? (static_cast<int64_t>(pf_block) * block_size + pf_in) * kv_row + head_off
              : int64_t{-1};
  };
  // cp.async of a tile into `stage` from the offsets in s_off[buf]; one commit group. Returns whether
  // every key this thread copied was valid.
  auto issue = [&](int buf, int stage) {
    bool all = true;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = threadIdx.x + i * kT;
      const int key = idx / kChunks, c = idx % kChunks;
      const int64_t off = s_off[buf][key];
      all = all && off >= 0;
      if (c == 0) sm.ok[stage][key] = off >= 0;
      attn::cp_async16(&sm.k[stage][key * kLd + c * 8], off >= 0 ? k_cache + off + c * 8 : k_cache,
                       off >= 0 ? 16 : 0);
      attn::cp_async16(&sm.v[stage][key * kLd + c * 8], off >= 0 ? v_cache + off + c * 8 : v_cache,
                       off >= 0 ? 16 : 0);
    }
    attn::cp_async_commit();
    return all;
  };

  prefetch(0);
  publish(0);
  prefetch(1);
  publish(1);
  __syncthreads();
  bool ok_cur = true, ok_next = true;
  if (n_tiles > 0) ok_cur = issue(0, 0);
  const int k_row = (lane >> 4) * 8 + (lane & 7), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = lane & 15, v_col = (lane >> 4) * 8;
  for (int64_t it = 0; it < n_tiles; ++it) {
    const int st = static_cast<int>(it & 1);
    const int64_t kt0 = kv_begin + it * kBN;
    const bool more = it + 1 < n_tiles;
    if (more) ok_next = issue(st ^ 1, st ^ 1);  // tile it+1's offsets are in s_off[(it+1) & 1]
    prefetch(it + 2);
    if (more)
      attn::cp_async_wait<1>();
    else
      attn::cp_async_wait<0>();
    const bool all_ok = __syncthreads_and(ok_cur);
    const bool full = all_ok && kt0 + kBN - 1 <= s_min_pos && (window <= 0 || kt0 > s_max_pos - window);
    ok_cur = ok_next;
    // Nothing of the tile visible to any row of this warp: j > p for all, or (window) j <= p - window.
    const bool skip = kt0 > wmax || (window > 0 && kt0 + kBN - 1 <= static_cast<int64_t>(wmin) - window);
    if (!skip) {
      const __nv_bfloat16* k_s = sm.k[st];
      const __nv_bfloat16* v_s = sm.v[st];
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
      const float base0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, base1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
      const float corr0 = fast_exp2(m0 - base0), corr1 = fast_exp2(m1 - base1);
      m0 = mn0;
      m1 = mn1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) {
        sc[nt][0] = fast_exp2(sc[nt][0] - base0);
        sc[nt][1] = fast_exp2(sc[nt][1] - base0);
        sc[nt][2] = fast_exp2(sc[nt][2] - base1);
        sc[nt][3] = fast_exp2(sc[nt][3] - base1);
        sum0 += sc[nt][0] + sc[nt][1];
        sum1 += sc[nt][2] + sc[nt][3];
      }
      l0 = l0 * corr0 + sum0;
      l1 = l1 * corr1 + sum1;
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt) {
        o[nt][0] *= corr0;
        o[nt][1] *= corr0;
        o[nt][2] *= corr1;
        o[nt][3] *= corr1;
      }
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
    }
    publish(st);      // tile it+2's offsets into s_off[(it+2) & 1]; tile it's were last read before a barrier
    __syncthreads();  // the next iteration overwrites this stage and reads s_off[st]
  }

  l0 = attn::quad_sum(l0);
  l1 = attn::quad_sum(l1);
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
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

template <int HD, int kWarps>
cudaError_t launch_v2(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                      float scale, int64_t window, int64_t max_query_len, float* out, cudaStream_t stream) {
  static unsigned smem_set = 0;
  constexpr int kSmem = sizeof(attn::KvTileSmem<HD, kBN>);
  const cudaError_t st = attn::allow_dynamic_smem(prefill_attention_v2<HD, kWarps>, kSmem, smem_set);
  if (st != cudaSuccess) return st;
  constexpr int kRows = kWarps * 16;
  const dim3 grid(static_cast<unsigned>(hq), static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>((max_query_len + kRows - 1) / kRows));
  prefill_attention_v2<HD, kWarps><<<grid, kWarps * 32, kSmem, stream>>>(
      q, static_cast<const __nv_bfloat16*>(cache.k), static_cast<const __nv_bfloat16*>(cache.v),
      cache.num_blocks, static_cast<int>(cache.block_size), batch, hq, hkv, scale * kLog2e, window, out);
  return cudaGetLastError();
}

// v3: FA2's shape: 4 warps of 32 query rows (two m16 tiles each) = 128 queries per CTA, Q staged once in
// shared memory as BF16 (pre-scaled) and read through ldmatrix per 16-dim step, so that each K / V
// fragment loaded from shared memory feeds 4 MMAs instead of 2 (v1/v2 are bound by ldmatrix bandwidth:
// 0.5 ldmatrix.x4 per MMA there, 0.31 here). Loader, masking and skipping as in v2.
template <int HD>
struct V3Smem {
  KvTileSmem<HD, kBN> kv;
  __nv_bfloat16 q[128 * (HD + 8)];
};

template <int HD>
__global__ void __launch_bounds__(128)
    prefill_attention_v3(const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                         const __nv_bfloat16* __restrict__ v_cache, int64_t num_blocks, int block_size,
                         const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                         int64_t window, float* __restrict__ out) {
  constexpr int kT = 128, kRows = 128, kMT = 2;
  constexpr int kLd = HD + 8, kChunks = HD / 8;
  constexpr int kPer = kBN * kChunks / kT;
  static_assert(kBN * kChunks % kT == 0 && kT >= kBN, "chunks must divide evenly; one key per thread");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& big = *reinterpret_cast<V3Smem<HD>*>(smem_raw);
  auto& sm = big.kv;
  __shared__ int64_t s_off[2][kBN];
  __shared__ int s_min_pos, s_max_pos;

  const int h = blockIdx.x, s = blockIdx.y, tile = gridDim.z - 1 - blockIdx.z;
  const int q0 = batch.query_start[s];
  const int q_len = batch.query_start[s + 1] - q0;
  if (tile * kRows >= q_len) return;
  const int64_t seq_len = batch.seq_lens[s];
  const int kvh = h / (hq / hkv);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int gid = lane / 4, tig = lane % 4;
  const int rows = min(kRows, q_len - tile * kRows);

  if (threadIdx.x == 0) {
    s_min_pos = INT_MAX;
    s_max_pos = INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int p = batch.positions[q0 + tile * kRows + threadIdx.x];
    atomicMin(&s_min_pos, p);
    atomicMax(&s_max_pos, p);
  }
  // Q tile -> shared memory, scaled into the log2 domain, BF16; rows past the sequence are zeros.
  for (int idx = threadIdx.x; idx < kRows * HD / 4; idx += kT) {
    const int r = idx / (HD / 4), c = (idx % (HD / 4)) * 4;
    float4 v = make_float4(0, 0, 0, 0);
    if (r < rows)
      v = *reinterpret_cast<const float4*>(q + (static_cast<int64_t>(q0 + tile * kRows + r) * hq + h) * HD +
                                           c);
    *reinterpret_cast<uint2*>(&big.q[r * kLd + c]) =
        make_uint2(attn::pack_bf16(v.x * scale_log2, v.y * scale_log2),
                   attn::pack_bf16(v.z * scale_log2, v.w * scale_log2));
  }
  __syncthreads();
  const int64_t kv_begin = window > 0 ? max(static_cast<int64_t>(0), s_min_pos - window + 1) : 0;
  const int64_t kv_end = min(seq_len, static_cast<int64_t>(s_max_pos) + 1);

  // This thread's rows: m-tile mt, half e (0: gid, 1: gid + 8).
  int pos[kMT][2];  // -1: a row past the sequence (no key is visible to it)
  int pmax = -1, pmin = INT_MAX;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = warp * 32 + mt * 16 + gid + e * 8;
      pos[mt][e] = r < rows ? batch.positions[q0 + tile * kRows + r] : -1;
      if (r < rows) {
        pmax = max(pmax, pos[mt][e]);
        pmin = min(pmin, pos[mt][e]);
      }
    }
  const int wmax = __reduce_max_sync(0xffffffffu, pmax);
  const int wmin = __reduce_min_sync(0xffffffffu, pmin);

  float o[kMT][HD / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.0f;
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    m[mt][0] = m[mt][1] = -CUDART_INF_F;
    l[mt][0] = l[mt][1] = 0.0f;
  }

  const int32_t* table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
  const int64_t kv_row = static_cast<int64_t>(hkv) * HD, head_off = static_cast<int64_t>(kvh) * HD;
  const int64_t n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBN - 1) / kBN : 0;
  int pf_block = -1, pf_in = 0;
  auto prefetch = [&](int64_t t) {
    pf_block = -1;
    if (threadIdx.x < kBN && t < n_tiles) {
      const int64_t j = kv_begin + t * kBN + threadIdx.x;
      if (j < kv_end) {
        const unsigned bs = static_cast<unsigned>(block_size);
        const unsigned bi = static_cast<unsigned>(j) / bs;
        pf_in = static_cast<int>(static_cast<unsigned>(j) - bi * bs);
        if (bi < static_cast<unsigned>(batch.max_blocks_per_seq)) pf_block = table[bi];
      }
    }
  };
  auto publish = [&](int buf) {
    if (threadIdx.x < kBN)
      s_off[buf][threadIdx.x] =
          pf_block >= 0 && pf_block < num_blocks
              ? (static_cast<int64_t>(pf_block) * block_size + pf_in) * kv_row + head_off
              : int64_t{-1};
  };
  auto issue = [&](int buf, int stage) {
    bool all = true;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = threadIdx.x + i * kT;
      const int key = idx / kChunks, c = idx % kChunks;
      const int64_t off = s_off[buf][key];
      all = all && off >= 0;
      if (c == 0) sm.ok[stage][key] = off >= 0;
      attn::cp_async16(&sm.k[stage][key * kLd + c * 8], off >= 0 ? k_cache + off + c * 8 : k_cache,
                       off >= 0 ? 16 : 0);
      attn::cp_async16(&sm.v[stage][key * kLd + c * 8], off >= 0 ? v_cache + off + c * 8 : v_cache,
                       off >= 0 ? 16 : 0);
    }
    attn::cp_async_commit();
    return all;
  };

  prefetch(0);
  publish(0);
  prefetch(1);
  publish(1);
  __syncthreads();
  bool ok_cur = true, ok_next = true;
  if (n_tiles > 0) ok_cur = issue(0, 0);
  const int k_row = (lane >> 4) * 8 + (lane & 7), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = lane & 15, v_col = (lane >> 4) * 8;  // also Q's A-fragment rows / columns
  const __nv_bfloat16* q_s = big.q + (warp * 32 + v_row) * kLd + v_col;
  for (int64_t it = 0; it < n_tiles; ++it) {
    const int st = static_cast<int>(it & 1);
    const int64_t kt0 = kv_begin + it * kBN;
    const bool more = it + 1 < n_tiles;
    if (more) ok_next = issue(st ^ 1, st ^ 1);
    prefetch(it + 2);
    if (more)
      attn::cp_async_wait<1>();
    else
      attn::cp_async_wait<0>();
    const bool all_ok = __syncthreads_and(ok_cur);
    const bool full = all_ok && kt0 + kBN - 1 <= s_min_pos && (window <= 0 || kt0 > s_max_pos - window);
    ok_cur = ok_next;
    const bool skip = kt0 > wmax || (window > 0 && kt0 + kBN - 1 <= static_cast<int64_t>(wmin) - window);
    if (!skip) {
      const __nv_bfloat16* k_s = sm.k[st];
      const __nv_bfloat16* v_s = sm.v[st];
      float sc[kMT][kBN / 8][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt)
          sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.0f;
#pragma unroll
      for (int kt = 0; kt < HD / 16; ++kt) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) attn::ldmatrix_x4(a[mt], q_s + mt * 16 * kLd + kt * 16);
#pragma unroll
        for (int np = 0; np < kBN / 16; ++np) {
          uint32_t b[4];
          attn::ldmatrix_x4(b, &k_s[(np * 16 + k_row) * kLd + kt * 16 + k_col]);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            attn::mma_bf16(sc[mt][2 * np], a[mt], b[0], b[1]);
            attn::mma_bf16(sc[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
          if (!full) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = nt * 8 + tig * 2 + (e & 1);
              const int64_t j = kt0 + key;
              const int64_t p = pos[mt][e >> 1];  // -1 masks every key
              const bool visible = sm.ok[st][key] && j <= p && (window <= 0 || j > p - window);
              if (!visible) sc[mt][nt][e] = -CUDART_INF_F;
            }
          }
          mx0 = fmaxf(mx0, fmaxf(sc[mt][nt][0], sc[mt][nt][1]));
          mx1 = fmaxf(mx1, fmaxf(sc[mt][nt][2], sc[mt][nt][3]));
        }
        mx0 = attn::quad_max(mx0);
        mx1 = attn::quad_max(mx1);
        const float mn0 = fmaxf(m[mt][0], mx0), mn1 = fmaxf(m[mt][1], mx1);
        const float base0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, base1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
        const float corr0 = fast_exp2(m[mt][0] - base0), corr1 = fast_exp2(m[mt][1] - base1);
        m[mt][0] = mn0;
        m[mt][1] = mn1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
          sc[mt][nt][0] = fast_exp2(sc[mt][nt][0] - base0);
          sc[mt][nt][1] = fast_exp2(sc[mt][nt][1] - base0);
          sc[mt][nt][2] = fast_exp2(sc[mt][nt][2] - base1);
          sc[mt][nt][3] = fast_exp2(sc[mt][nt][3] - base1);
          sum0 += sc[mt][nt][0] + sc[mt][nt][1];
          sum1 += sc[mt][nt][2] + sc[mt][nt][3];
        }
        l[mt][0] = l[mt][0] * corr0 + sum0;
        l[mt][1] = l[mt][1] * corr1 + sum1;
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt) {
          o[mt][nt][0] *= corr0;
          o[mt][nt][1] *= corr0;
          o[mt][nt][2] *= corr1;
          o[mt][nt][3] *= corr1;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          a[mt][0] = attn::pack_bf16(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
          a[mt][1] = attn::pack_bf16(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
          a[mt][2] = attn::pack_bf16(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
          a[mt][3] = attn::pack_bf16(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < HD / 16; ++np) {
          uint32_t b[4];
          attn::ldmatrix_x4_trans(b, &v_s[(kk * 16 + v_row) * kLd + np * 16 + v_col]);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            attn::mma_bf16(o[mt][2 * np], a[mt], b[0], b[1]);
            attn::mma_bf16(o[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
    publish(st);
    __syncthreads();
  }

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const float s0 = attn::quad_sum(l[mt][0]), s1 = attn::quad_sum(l[mt][1]);
    const float inv0 = s0 > 0.0f ? 1.0f / s0 : 0.0f, inv1 = s1 > 0.0f ? 1.0f / s1 : 0.0f;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      const int c = nt * 8 + tig * 2;
      const int r = warp * 32 + mt * 16 + gid;
      const int64_t tok = q0 + tile * kRows + r;
      if (r < rows)
        *reinterpret_cast<float2*>(out + (tok * hq + h) * HD + c) =
            make_float2(o[mt][nt][0] * inv0, o[mt][nt][1] * inv0);
      if (r + 8 < rows)
        *reinterpret_cast<float2*>(out + ((tok + 8) * hq + h) * HD + c) =
            make_float2(o[mt][nt][2] * inv1, o[mt][nt][3] * inv1);
    }
  }
}

template <int HD>
cudaError_t launch_v3(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                      float scale, int64_t window, int64_t max_query_len, float* out, cudaStream_t stream) {
  static unsigned smem_set = 0;
  constexpr int kSmem = sizeof(V3Smem<HD>);
  const cudaError_t st = attn::allow_dynamic_smem(prefill_attention_v3<HD>, kSmem, smem_set);
  if (st != cudaSuccess) return st;
  const dim3 grid(static_cast<unsigned>(hq), static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>((max_query_len + 127) / 128));
  prefill_attention_v3<HD><<<grid, 128, kSmem, stream>>>(
      q, static_cast<const __nv_bfloat16*>(cache.k), static_cast<const __nv_bfloat16*>(cache.v),
      cache.num_blocks, static_cast<int>(cache.block_size), batch, hq, hkv, scale * kLog2e, window, out);
  return cudaGetLastError();
}

// v4 ("g3", "g2", "g2s"; BF16 and FP8 caches): warpgroup MMA (wgmma.mma_async, sm_90a; wgmma.cuh). A CTA
// has kWG warpgroups of 64 query rows; they share each tile of kBN keys, staged in kStages buffers by
// cp.async (kStages - 1 tiles in flight while one is computed). Per warpgroup and tile, S = Q K^T is
// HD / 16 wgmma m64n{kBN}k16 with Q and K read from shared memory (K-major, 128-byte swizzle); the online
// softmax runs on the accumulators, and P stays in registers as the A operand of O += P V (kBN / 16
// wgmma m64n{HD}k16, V read MN-major from the same row-major tile). The warpgroups wait for their own
// MMAs only, so while one does its softmax the tensor cores run another's products; one barrier per
// tile. FP8 caches land as raw codes in a second set of buffers; each thread converts the chunks it
// copied into the BF16 tile before the barrier that publishes it (k_scale folded into Q, v_scale into
// the output). Masking, skipping and the block-table handling are v3's, per warpgroup.
template <int HD, int kWG, int kBN, int kStages, bool kFp8>
struct WgLayout {  // byte offsets in the 1024-aligned dynamic shared memory
  static constexpr int kRows = 64 * kWG;
  static constexpr int kTile = kBN * HD * 2;        // one BF16 K (or V) stage: HD / 64 panels of kBN rows
  static constexpr int kRaw = kFp8 ? kBN * HD : 0;  // one FP8 stage, row-major codes
  static constexpr int kQ = 0;                      // HD / 64 panels of kRows rows
  static constexpr int kK = kRows * HD * 2;
  static constexpr int kV = kK + kStages * kTile;
  static constexpr int kRawK = kV + kStages * kTile;
  static constexpr int kRawV = kRawK + kStages * kRaw;
  static constexpr int kSmem = kRawV + kStages * kRaw + 1024;  // + slack to align the base
};

// Byte offset of 16-byte chunk c (0..7) of row r in a 128-byte-swizzled panel (wgmma.cuh).
__device__ __forceinline__ uint32_t sw128(int r, int c) {
  return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}
__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void pin_u32(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

template <int HD, int kWG, int kBN, int kStages, class CacheT>
__global__ void __launch_bounds__(kWG * 128, 1)
    prefill_attention_wg(const float* __restrict__ q, const CacheT* __restrict__ k_cache,
                         const CacheT* __restrict__ v_cache, int64_t num_blocks, int block_size,
                         const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                         float out_scale, int64_t window, float* __restrict__ out) {
  constexpr bool kFp8 = sizeof(CacheT) == 1;
  using L = WgLayout<HD, kWG, kBN, kStages, kFp8>;
  constexpr int kT = kWG * 128, kRows = L::kRows, kAhead = kStages - 1;
  constexpr int kPanelQ = kRows * 128, kPanelKV = kBN * 128;  // bytes of a 64-column panel
  // Copies in 16-byte chunks of one key row: 8 BF16 values or 16 FP8 codes.
  constexpr int kPerChunk = kFp8 ? 16 : 8, kRowChunks = HD / kPerChunk, kChunks = kBN * kRowChunks;
  constexpr int kPer = (kChunks + kT - 1) / kT;
  static_assert(kStages == 2 || kStages == 3, "offsets are published one tile ahead into two slots");
  static_assert(kBN <= kT && HD % 64 == 0 && kBN % 16 == 0, "one key per table lookup thread");
  extern __shared__ unsigned char smem_raw[];
  __shared__ int s_slot[2][kBN];          // cache slot (block * block_size + offset) of each key; -1: none
  __shared__ bool s_ok[kStages][kBN];     // the staged key is valid (else zeros there: masked)
  __shared__ int s_min[kWG], s_max[kWG];  // position range of each warpgroup's rows

  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw_addr + 1023u) & ~1023u;  // the swizzle pattern follows address bits 4-9
  unsigned char* const smem = smem_raw + (base - raw_addr);

  const int h = blockIdx.x, s = blockIdx.y, tile = gridDim.z - 1 - blockIdx.z;
  const int q0 = batch.query_start[s];
  const int q_len = batch.query_start[s + 1] - q0;
  if (tile * kRows >= q_len) return;
  const int rows = min(kRows, q_len - tile * kRows);
  const int64_t tok_base = q0 + static_cast<int64_t>(tile) * kRows;
  const int64_t seq_len = batch.seq_lens[s];
  const int kvh = h / (hq / hkv);
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / kWarp, lane = tid % kWarp;
  const int gid = lane / 4, tig = lane % 4;

  if (tid < kWG) {
    s_min[tid] = INT_MAX;
    s_max[tid] = INT_MIN;
  }
  __syncthreads();
  if (tid < rows) {
    const int p = batch.positions[tok_base + tid];
    atomicMin(&s_min[tid / 64], p);
    atomicMax(&s_max[tid / 64], p);
  }
  // Q tile -> shared memory: BF16, scaled into the log2 domain, swizzled; rows past the sequence are 0.
  for (int idx = tid; idx < kRows * HD / 4; idx += kT) {
    const int r = idx / (HD / 4), c = (idx % (HD / 4)) * 4;
    float4 v = make_float4(0, 0, 0, 0);
    if (r < rows) v = *reinterpret_cast<const float4*>(q + ((tok_base + r) * hq + h) * HD + c);
    const uint32_t off = L::kQ + (c / 64) * kPanelQ + sw128(r, (c % 64) / 8) + (c % 8) * 2;
    *reinterpret_cast<uint2*>(smem + off) = make_uint2(attn::pack_bf16(v.x * scale_log2, v.y * scale_log2),
                                                       attn::pack_bf16(v.z * scale_log2, v.w * scale_log2));
  }
  __syncthreads();
  int cmin = INT_MAX, cmax = INT_MIN;
#pragma unroll
  for (int w = 0; w < kWG; ++w) {
    cmin = min(cmin, s_min[w]);
    cmax = max(cmax, s_max[w]);
  }
  const int wmin = s_min[wg], wmax = s_max[wg];  // INT_MAX / INT_MIN: no rows (every tile skipped)
  const int64_t kv_begin = window > 0 ? max(static_cast<int64_t>(0), cmin - window + 1) : 0;
  const int64_t kv_end = min(seq_len, static_cast<int64_t>(cmax) + 1);
  const int64_t n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBN - 1) / kBN : 0;

  // This thread's accumulator rows (of the warpgroup's 64): r0 and r0 + 8.
  const int r0 = wg * 64 + warp * 16 + gid, r1 = r0 + 8;
  const int64_t pos0 = r0 < rows ? batch.positions[tok_base + r0] : -1;  // -1 masks every key
  const int64_t pos1 = r1 < rows ? batch.positions[tok_base + r1] : -1;

  const int32_t* table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
  const int64_t kv_row = static_cast<int64_t>(hkv) * HD, head_off = static_cast<int64_t>(kvh) * HD;
  // Key tid of tile t: its table entry is loaded early (prefetch) and its slot published in s_slot
  // later, so the load's latency hides behind a tile's MMAs.
  int pf_slot = -1;
  auto prefetch = [&](int64_t t) {
    pf_slot = -1;
    if (tid < kBN && t < n_tiles) {
      const int64_t j = kv_begin + t * kBN + tid;  // < 2^31: positions are int32
      if (j < kv_end) {
        const unsigned bs = static_cast<unsigned>(block_size);
        const unsigned bi = static_cast<unsigned>(j) / bs;
        if (bi < static_cast<unsigned>(batch.max_blocks_per_seq)) {
          const int32_t blk = table[bi];
          if (blk >= 0 && blk < num_blocks)  // slots < 2^31: the launcher checks num_blocks * block_size
            pf_slot = blk * block_size + static_cast<int>(static_cast<unsigned>(j) - bi * bs);
        }
      }
    }
  };
  auto publish = [&](int64_t t) {
    if (tid < kBN) s_slot[t & 1][tid] = pf_slot;
  };
  // cp.async of tile t into its stage (one commit group, empty past the last tile). Returns whether
  // every chunk this thread copied came from a valid key.
  auto issue = [&](int64_t t) {
    bool all = true;
    if (t < n_tiles) {
      const int st = static_cast<int>(t % kStages);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int idx = tid + i * kT;
        if (kChunks % kT == 0 || idx < kChunks) {
          const int key = idx / kRowChunks, c = idx % kRowChunks;
          const int sl = s_slot[t & 1][key];
          all = all && sl >= 0;
          if (c == 0) s_ok[st][key] = sl >= 0;
          const int64_t src = sl >= 0 ? sl * kv_row + head_off + c * kPerChunk : 0;
          const int bytes = sl >= 0 ? 16 : 0;
          uint32_t kd, vd;
          if constexpr (kFp8) {
            kd = base + L::kRawK + st * L::kRaw + key * HD + c * 16;
            vd = kd + (L::kRawV - L::kRawK);
          } else {
            kd = base + L::kK + st * L::kTile + (c / 8) * kPanelKV + sw128(key, c % 8);
            vd = kd + (L::kV - L::kK);
          }
          cp_async16_to(kd, k_cache + src, bytes);
          cp_async16_to(vd, v_cache + src, bytes);
        }
      }
    }
    attn::cp_async_commit();
    return all;
  };
  // FP8: this thread's raw chunks of tile t (complete after its cp.async wait) -> the BF16 stage.
  auto convert = [&](int64_t t) {
    if constexpr (kFp8) {
      if (t >= n_tiles) return;
      const int st = static_cast<int>(t % kStages);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int idx = tid + i * kT;
        if (kChunks % kT == 0 || idx < kChunks) {
          const int key = idx / kRowChunks, c = idx % kRowChunks;  // codes 16c..16c+15 = BF16 chunks 2c, 2c+1
          const uint32_t raw = st * L::kRaw + key * HD + c * 16;
          const uint32_t dst = st * L::kTile + (c / 4) * kPanelKV;
          const uint4 rk = *reinterpret_cast<const uint4*>(smem + L::kRawK + raw);
          const uint4 rv = *reinterpret_cast<const uint4*>(smem + L::kRawV + raw);
          const uint32_t d0 = dst + sw128(key, (2 * c) % 8), d1 = dst + sw128(key, (2 * c + 1) % 8);
          *reinterpret_cast<uint4*>(smem + L::kK + d0) = attn::e4m3x8_to_bf16x8(make_uint2(rk.x, rk.y));
          *reinterpret_cast<uint4*>(smem + L::kK + d1) = attn::e4m3x8_to_bf16x8(make_uint2(rk.z, rk.w));
          *reinterpret_cast<uint4*>(smem + L::kV + d0) = attn::e4m3x8_to_bf16x8(make_uint2(rv.x, rv.y));
          *reinterpret_cast<uint4*>(smem + L::kV + d1) = attn::e4m3x8_to_bf16x8(make_uint2(rv.z, rv.w));
        }
      }
    }
  };

  // Prologue: tiles 0 .. kAhead - 1 in flight, tile kAhead's slots published.
  for (int t = 0; t < kAhead; ++t) {
    prefetch(t);
    publish(t);
  }
  __syncthreads();
  uint32_t okmask = 0;  // bit st: every chunk this thread copied into stage st was valid
  for (int t = 0; t < kAhead; ++t) okmask |= static_cast<uint32_t>(issue(t)) << (t % kStages);
  __syncthreads();  // s_slot read before it is overwritten
  prefetch(kAhead);
  publish(kAhead);
  if constexpr (kFp8) {
    attn::cp_async_wait<kAhead - 1>();
    convert(0);
  }

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.0f, l1 = 0.0f;
  const uint32_t q_addr = base + L::kQ + wg * 64 * 128;

  for (int64_t it = 0; it < n_tiles; ++it) {
    const int st = static_cast<int>(it % kStages);
    const int64_t kt0 = kv_begin + it * kBN;
    if constexpr (!kFp8) attn::cp_async_wait<kAhead - 1>();  // tile it has landed (this thread's part)
    wgmma::fence_proxy_async();
    const bool all_ok = __syncthreads_and((okmask >> st) & 1u);
    {  // the stage of tile it - 1 is free: every warpgroup waited for its MMAs before the barrier
      const int64_t tn = it + kAhead;
      const int sn = static_cast<int>(tn % kStages);
      okmask = (okmask & ~(1u << sn)) | (static_cast<uint32_t>(issue(tn)) << sn);
      prefetch(tn + 1);
    }
    // Nothing of the tile visible to any row of this warpgroup: j > p for all, or (window) j <= p - window.
    const bool skip = kt0 > wmax || (window > 0 && kt0 + kBN - 1 <= static_cast<int64_t>(wmin) - window);
    if (!skip) {
      // Every key valid and visible to every row of the warpgroup: no mask.
      const bool full =
          all_ok && kt0 + kBN - 1 <= wmin && (window <= 0 || kt0 > static_cast<int64_t>(wmax) - window);
      float sc[kBN / 2];
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) {
        sc[i] = 0.0f;
        wgmma::pin(sc[i]);
      }
      const uint32_t k_addr = base + L::kK + st * L::kTile;
      wgmma::fence();
#pragma unroll
      for (int kt = 0; kt < HD / 16; ++kt) {
        const uint64_t da = wgmma::desc_sw128(q_addr + (kt / 4) * kPanelQ + (kt % 4) * 32, 16, 1024);
        const uint64_t db = wgmma::desc_sw128(k_addr + (kt / 4) * kPanelKV + (kt % 4) * 32, 16, 1024);
        wgmma::mma_ss<kBN>(sc, da, db, kt > 0 ? 1 : 0);
      }
      wgmma::commit();
      wgmma::wait<0>();
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) wgmma::pin(sc[i]);

      float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) {
        if (!full) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = nt * 8 + tig * 2 + (e & 1);
            const int64_t j = kt0 + key;
            const int64_t p = e < 2 ? pos0 : pos1;
            const bool visible = s_ok[st][key] && j <= p && (window <= 0 || j > p - window);
            if (!visible) sc[nt * 4 + e] = -CUDART_INF_F;
          }
        }
        mx0 = fmaxf(mx0, fmaxf(sc[nt * 4], sc[nt * 4 + 1]));
        mx1 = fmaxf(mx1, fmaxf(sc[nt * 4 + 2], sc[nt * 4 + 3]));
      }
      mx0 = attn::quad_max(mx0);
      mx1 = attn::quad_max(mx1);
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      // A row with nothing visible yet keeps m = -inf; subtract 0 then so that exp2 gives 0, not NaN.
      const float base0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, base1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
      const float corr0 = fast_exp2(m0 - base0), corr1 = fast_exp2(m1 - base1);
      m0 = mn0;
      m1 = mn1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) {
        sc[nt * 4 + 0] = fast_exp2(sc[nt * 4 + 0] - base0);
        sc[nt * 4 + 1] = fast_exp2(sc[nt * 4 + 1] - base0);
        sc[nt * 4 + 2] = fast_exp2(sc[nt * 4 + 2] - base1);
        sc[nt * 4 + 3] = fast_exp2(sc[nt * 4 + 3] - base1);
        sum0 += sc[nt * 4 + 0] + sc[nt * 4 + 1];
        sum1 += sc[nt * 4 + 2] + sc[nt * 4 + 3];
      }
      l0 = l0 * corr0 + sum0;  // per-lane partial sums; the 4 lanes of a row are summed at the end
      l1 = l1 * corr1 + sum1;
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt) {
        o[nt * 4 + 0] *= corr0;
        o[nt * 4 + 1] *= corr0;
        o[nt * 4 + 2] *= corr1;
        o[nt * 4 + 3] *= corr1;
      }
      // P as A fragments: the accumulator blocks 2kk and 2kk + 1 are the 16 keys of step kk.
      uint32_t pa[kBN / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        pa[kk][0] = attn::pack_bf16(sc[8 * kk + 0], sc[8 * kk + 1]);
        pa[kk][1] = attn::pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
        pa[kk][2] = attn::pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]);
        pa[kk][3] = attn::pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
#pragma unroll
        for (int r = 0; r < 4; ++r) pin_u32(pa[kk][r]);
      }
#pragma unroll
      for (int i = 0; i < HD / 2; ++i) wgmma::pin(o[i]);
      const uint32_t v_addr = base + L::kV + st * L::kTile;
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk)
        wgmma::mma_rs_tn<HD>(o, pa[kk], wgmma::desc_sw128(v_addr + kk * 16 * 128, kPanelKV, 1024));
      wgmma::commit();
      wgmma::wait<0>();
#pragma unroll
      for (int i = 0; i < HD / 2; ++i) wgmma::pin(o[i]);
    }
    if constexpr (kFp8) {
      attn::cp_async_wait<kAhead - 1>();  // tile it + 1's codes (this thread's part)
      convert(it + 1);
    }
    publish(it + kAhead + 1);  // its slot held tile it + kAhead - 1's, read before this iteration's barrier
  }

  const float s0 = attn::quad_sum(l0), s1 = attn::quad_sum(l1);
  const float inv0 = s0 > 0.0f ? out_scale / s0 : 0.0f, inv1 = s1 > 0.0f ? out_scale / s1 : 0.0f;
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) {
    const int c = nt * 8 + tig * 2;
    if (r0 < rows)
      *reinterpret_cast<float2*>(out + ((tok_base + r0) * hq + h) * HD + c) =
          make_float2(o[nt * 4 + 0] * inv0, o[nt * 4 + 1] * inv0);
    if (r1 < rows)
      *reinterpret_cast<float2*>(out + ((tok_base + r1) * hq + h) * HD + c) =
          make_float2(o[nt * 4 + 2] * inv1, o[nt * 4 + 3] * inv1);
  }
}

template <int HD, int kWG, int kBN, int kStages, class CacheT>
cudaError_t launch_wg(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                      float scale, int64_t window, int64_t max_query_len, float* out, cudaStream_t stream) {
  static unsigned smem_set = 0;
  constexpr bool kFp8 = sizeof(CacheT) == 1;
  constexpr int kSmem = WgLayout<HD, kWG, kBN, kStages, kFp8>::kSmem;
  const auto kernel = prefill_attention_wg<HD, kWG, kBN, kStages, CacheT>;
  const cudaError_t st = attn::allow_dynamic_smem(kernel, kSmem, smem_set);
  if (st != cudaSuccess) return st;
  constexpr int kRows = 64 * kWG;
  const dim3 grid(static_cast<unsigned>(hq), static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>((max_query_len + kRows - 1) / kRows));
  kernel<<<grid, kWG * 128, kSmem, stream>>>(
      q, static_cast<const CacheT*>(cache.k), static_cast<const CacheT*>(cache.v), cache.num_blocks,
      static_cast<int>(cache.block_size), batch, hq, hkv, scale * kLog2e * (kFp8 ? cache.k_scale : 1.0f),
      kFp8 ? cache.v_scale : 1.0f, window, out);
  return cudaGetLastError();
}

template <class CacheT>
cudaError_t launch_wg_variant(int variant, int64_t hd, const float* q, const PagedKv& cache,
                              const BatchArgs& batch, int hq, int hkv, float scale, int64_t window,
                              int64_t max_query_len, float* out, cudaStream_t stream) {
  if (variant == kG2)
    return hd == 64 ? launch_wg<64, 2, 128, 2, CacheT>(q, cache, batch, hq, hkv, scale, window, max_query_len,
                                                       out, stream)
                    : launch_wg<128, 2, 128, 2, CacheT>(q, cache, batch, hq, hkv, scale, window,
                                                        max_query_len, out, stream);
  if (variant == kG2s)
    return hd == 64 ? launch_wg<64, 2, 64, 3, CacheT>(q, cache, batch, hq, hkv, scale, window, max_query_len,
                                                      out, stream)
                    : launch_wg<128, 2, 64, 3, CacheT>(q, cache, batch, hq, hkv, scale, window, max_query_len,
                                                       out, stream);
  return hd == 64 ? launch_wg<64, 3, 64, 3, CacheT>(q, cache, batch, hq, hkv, scale, window, max_query_len,
                                                    out, stream)
                  : launch_wg<128, 3, 64, 3, CacheT>(q, cache, batch, hq, hkv, scale, window, max_query_len,
                                                     out, stream);
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

// The kernel launch_prefill_attention runs (kernels.h). INFERX_PREFILL_ATTN is read once per process;
// set_prefill_attention_variant overrides it. The v4 variants serve BF16 and FP8 caches; with any other
// choice FP8 caches run v1.
int variant_of(const char* e, int fallback) {
  if (e == nullptr) return fallback;
  static constexpr struct {
    const char* name;
    int variant;
  } kNames[] = {{"v1", kV1}, {"m2", kM2}, {"w4", kW4}, {"w8", kW8}, {"g3", kG3}, {"g2", kG2}, {"g2s", kG2s}};
  for (const auto& n : kNames)
    if (std::strcmp(e, n.name) == 0) return n.variant;
  return fallback;
}
bool is_wg(int variant) { return variant == kG3 || variant == kG2 || variant == kG2s; }
constexpr int kDefaultVariant = kG3;  // the fastest measured (H200, every prefill row)
std::atomic<int> g_variant_override{0};

int prefill_variant() {
  static const int from_env = variant_of(std::getenv("INFERX_PREFILL_ATTN"), kDefaultVariant);
  const int o = g_variant_override.load(std::memory_order_relaxed);
  return o != 0 ? o : from_env;
}

}  // namespace

void set_prefill_attention_variant(const char* name) {
  g_variant_override.store(name == nullptr ? 0 : variant_of(name, 0), std::memory_order_relaxed);
}

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
  const int variant = prefill_variant();
  // v4 keeps cache slots (block * block_size + offset) in 32 bits.
  if (is_wg(variant) && cache.num_blocks * cache.block_size <= INT32_MAX) {
    if (cache.dtype == DType::F8_E4M3)
      return launch_wg_variant<uint8_t>(variant, hd, q, cache, batch, iq, ikv, scale, sliding_window,
                                        max_query_len, out, stream);
    return launch_wg_variant<__nv_bfloat16>(variant, hd, q, cache, batch, iq, ikv, scale, sliding_window,
                                            max_query_len, out, stream);
  }
  if (cache.dtype == DType::F8_E4M3) {
    if (hd == 64)
      return launch_typed<uint8_t, 64>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len, out,
                                       stream);
    return launch_typed<uint8_t, 128>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len, out,
                                      stream);
  }
  if (variant == kM2)
    return hd == 64
               ? launch_v3<64>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len, out, stream)
               : launch_v3<128>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len, out, stream);
  if (variant == kW8 || variant == kW4) {
    if (hd == 64)
      return variant == kW8 ? launch_v2<64, 8>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len,
                                               out, stream)
                            : launch_v2<64, 4>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len,
                                               out, stream);
    return variant == kW8 ? launch_v2<128, 8>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len,
                                              out, stream)
                          : launch_v2<128, 4>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len,
                                              out, stream);
  }
  if (hd == 64)
    return launch_typed<__nv_bfloat16, 64>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len,
                                           out, stream);
  return launch_typed<__nv_bfloat16, 128>(q, cache, batch, iq, ikv, scale, sliding_window, max_query_len, out,
                                          stream);
}

}  // namespace inferx::cuda
