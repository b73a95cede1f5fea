// Split-KV decode attention ("flash decoding": Dao et al. 2023, the FlashAttention-2 online softmax split
// along the keys, the partial results merged at the end) over a paged BF16 or FP8 KV cache, on tensor
// cores.
//
// Decode is memory-bound: every step reads each visible K/V row once, and the whole of it must be in
// flight to reach the memory bandwidth. So
//   - one CTA serves all query heads of one KV head (a GQA group, up to 16 heads): those heads are the 16
//     rows of the m16n8k16 A fragment (rows past the group are zeros), so K and V are read once per
//     group and S = Q K^T, O += P V run on the tensor cores like the prefill kernel's. Unlike prefill,
//     decode keeps F32 accuracy: Q and P are each split into three BF16 terms (hi + mid + lo carry the
//     24 bits of a float; the cache values are exact BF16/E4M3) and every product is summed in F32, so
//     the tensor cores do 3x the minimal work, which a memory-bound kernel has to spare;
//   - keys come in 64-key tiles gathered through the block table into a double-buffered shared tile
//     (attention_tiles.cuh: 16-byte cp.async for BF16, register loads converted to BF16 for FP8), the
//     next tile in flight while the current one is used; each of the 4 warps takes 16 keys of a tile
//     with its own online-softmax state, merged through shared memory at the end;
//   - the keys of a token are cut into `splits` slices (one CTA each, whole tiles), enough CTAs to fill
//     the chip; the slice bounds are computed on the device from seq_lens, so a CUDA graph captured once
//     works for any length. With splits > 1 each CTA writes its partial (max, denominator, numerator);
//     the last CTA of a (token, group) to finish merges them, so there is no second kernel launch
//     (decode_attention_epilogue.cuh, shared with v3).
// Two versions here: v1 below as described, and v2 (described above its code) with two BF16 terms, Q in
// registers, three BF16 tile stages and the block table read a tile ahead. The default is v3
// (kernels_decode_attention_v3.cu); INFERX_CUDA_DECODE_ATTN=v1|v2 selects these without a rebuild, and v2
// takes what v3 does not (block sizes that are not powers of two, misaligned buffers).
// Scores are kept in the log2 domain (q pre-scaled by scale * log2(e), exp2f), as FlashAttention does.
// Visible keys of token t at position p in sequence s: j in [max(0, p - window + 1) or 0, min(p,
// seq_len - 1)], block_tables[s][j / bs] slot j % bs; a token with no visible key gets a zero output.
#include <math_constants.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/decode_attention_epilogue.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

using attn::KvTileLoader;
using attn::KvTileSmem;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTile = 64;  // keys per tile, 16 per warp
constexpr int kRows = 16;  // query heads per CTA (the mma M dimension)
constexpr float kLog2e = 1.4426950408889634f;

constexpr int kTerms = 3;  // BF16 terms of a float (8 + 8 + 8 significant bits)

// INFERX_CUDA_DECODE_ATTN=v1|v2 selects an older kernel (v1: three-term splits, 64-bit index math, and its
// split count; v2: below), so a regression of v3 (kernels_decode_attention_v3.cu, the default) can be
// switched off without a rebuild. Read once.
int decode_attention_version() {
  static const int version = [] {
    const char* e = std::getenv("INFERX_CUDA_DECODE_ATTN");
    if (e != nullptr && std::strcmp(e, "v1") == 0) return 1;
    if (e != nullptr && std::strcmp(e, "v2") == 0) return 2;
    return 3;
  }();
  return version;
}
bool decode_attention_v1() { return decode_attention_version() == 1; }
// v3 finds a key's block by a shift: power-of-two block sizes only (the others take v2).
bool pow2_blocks(int64_t block_size) { return block_size > 0 && (block_size & (block_size - 1)) == 0; }

// Dynamic shared memory: the K/V tiles (reused for the warps' merge at the end), then Q's three terms.
template <int HD>
constexpr int tile_bytes() {
  constexpr int tiles = static_cast<int>(sizeof(KvTileSmem<HD, kTile>));
  constexpr int merge = (kWarps * kRows * HD + 2 * kWarps * kRows) * 4;
  return ((tiles > merge ? tiles : merge) + 15) / 16 * 16;
}
template <int HD>
constexpr int smem_bytes() {
  return tile_bytes<HD>() + kTerms * kRows * (HD + 8) * 2;
}

// x = hi + mid + lo with each term rounded to BF16 (the remainder is below 2^-24 |x|).
__device__ __forceinline__ void split3(float x, __nv_bfloat16& hi, __nv_bfloat16& mid, __nv_bfloat16& lo) {
  hi = __float2bfloat16_rn(x);
  const float r1 = x - __bfloat162float(hi);
  mid = __float2bfloat16_rn(r1);
  lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
}
__device__ __forceinline__ uint32_t pack2(__nv_bfloat16 lo_addr, __nv_bfloat16 hi_addr) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo_addr)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(hi_addr)) << 16);
}

// The end of v1 and v2: each warp's running state (rows gid and gid + 8 of its m16 tile of O, max and
// denominator; the denominators still per lane quad) into shared memory over the tile buffers - the
// caller's loop ended on a __syncthreads() - then attn::finish_decode (merge, output or partials, combine).
template <int HD>
__device__ __forceinline__ void finish_mma_rows(unsigned char* smem_raw, const float (&o)[HD / 8][4],
                                                float m0, float l0, float m1, float l1,
                                                const attn::DecodeResult& res) {
  const int warp = threadIdx.x / kWarp, gid = (threadIdx.x % kWarp) / 4, tig = threadIdx.x % 4;
  l0 = attn::quad_sum(l0);
  l1 = attn::quad_sum(l1);
  float* s_o = reinterpret_cast<float*>(smem_raw);  // [warp][row][HD]
  float* s_m = s_o + kWarps * kRows * HD;           // [warp][row]
  float* s_l = s_m + kWarps * kRows;
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) {
    const int c = nt * 8 + tig * 2;
    *reinterpret_cast<float2*>(&s_o[(warp * kRows + gid) * HD + c]) = make_float2(o[nt][0], o[nt][1]);
    *reinterpret_cast<float2*>(&s_o[(warp * kRows + gid + 8) * HD + c]) = make_float2(o[nt][2], o[nt][3]);
  }
  if (tig == 0) {
    s_m[warp * kRows + gid] = m0;
    s_l[warp * kRows + gid] = l0;
    s_m[warp * kRows + gid + 8] = m1;
    s_l[warp * kRows + gid + 8] = l1;
  }
  __syncthreads();
  attn::finish_decode<kWarps, kRows, HD, kThreads, false>(s_o, s_m, s_l, res);
}

// Grid: (token * kv heads * head chunks, split).
template <class CacheT, int HD>
__global__ void __launch_bounds__(kThreads)
    decode_attention_kernel(const float* __restrict__ q, const CacheT* __restrict__ k_cache,
                            const CacheT* __restrict__ v_cache, int64_t num_blocks, int block_size,
                            const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                            float out_scale, int64_t window, float* __restrict__ part_acc,
                            float* __restrict__ part_ml, int* __restrict__ counters, float* __restrict__ out,
                            __nv_bfloat16* __restrict__ out_bf16) {
  constexpr int kLd = HD + 8;
  constexpr bool kFp8 = sizeof(CacheT) == 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<KvTileSmem<HD, kTile>*>(smem_raw);

  // Grid (token x group CTA, split): the CTAs of one token's KV heads are adjacent in launch order, so
  // they read the neighbouring 256-byte pieces of the same cache rows together. (Measured no faster than
  // the token-minor grid on the H200 - 404 vs 405 us per layer at 256 rows: DRAM locality was not the limit.)
  const int heads_x = hkv * ((hq / hkv + kRows - 1) / kRows);
  const int t = blockIdx.x / heads_x, head_x = blockIdx.x % heads_x, split = blockIdx.y, splits = gridDim.y;
  const int group = hq / hkv;
  const int chunks = (group + kRows - 1) / kRows;
  const int kvh = head_x / chunks, chunk = head_x % chunks;
  const int h0 = kvh * group + chunk * kRows;
  const int nh = min(kRows, group - chunk * kRows);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int tig = lane % 4;

  const int s = find_sequence(batch.query_start, batch.num_seqs, t);
  const int64_t pos = batch.positions[t];
  const int64_t last = min(pos, static_cast<int64_t>(batch.seq_lens[s]) - 1);
  const int64_t first = window > 0 ? max(static_cast<int64_t>(0), pos - window + 1) : 0;
  const int64_t n_keys = last >= first ? last - first + 1 : 0;
  const int64_t per_split = ((n_keys + splits - 1) / splits + kTile - 1) / kTile * kTile;  // whole tiles
  const int64_t k_begin = first + split * per_split;
  const int64_t k_end = min(last + 1, k_begin + per_split);

  // Q of the group's heads (row r = head h0 + r; rows past the group are zeros), pre-scaled into the log2
  // domain, as three BF16 terms in shared memory; the warps read A fragments with ldmatrix.
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw + tile_bytes<HD>());  // [term][row][kLd]
  for (int idx = threadIdx.x; idx < kRows * HD; idx += kThreads) {
    const int r = idx / HD, d = idx % HD;
    const float x = r < nh ? q[(static_cast<int64_t>(t) * hq + h0 + r) * HD + d] * scale_log2 : 0.0f;
    split3(x, q_s[r * kLd + d], q_s[(kRows + r) * kLd + d], q_s[(2 * kRows + r) * kLd + d]);
  }

  float o[HD / 8][4];
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.0f, l1 = 0.0f;

  KvTileLoader<CacheT, HD, kTile, kThreads> loader{
      k_cache,
      v_cache,
      batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq,
      batch.max_blocks_per_seq,
      num_blocks,
      block_size,
      static_cast<int64_t>(hkv) * HD,
      static_cast<int64_t>(kvh) * HD};
  const int64_t n_tiles = k_end > k_begin ? (k_end - k_begin + kTile - 1) / kTile : 0;
  if (n_tiles > 0) {
    loader.begin(sm, 0, k_begin, k_end);
    if constexpr (kFp8) loader.store_fp8(sm, 0);
  }
  const int k_row = warp * 16 + (lane >> 4) * 8 + (lane & 7), k_col = ((lane >> 3) & 1) * 8;
  const int q_row = lane & 15, q_col = (lane >> 4) * 8;
  const int v_row = warp * 16 + (lane & 15), v_col = (lane >> 4) * 8;
  for (int64_t it = 0; it < n_tiles; ++it) {
    const int st = static_cast<int>(it & 1);
    const bool more = it + 1 < n_tiles;
    if (more) loader.begin(sm, st ^ 1, k_begin + (it + 1) * kTile, k_end);
    if constexpr (!kFp8) {
      if (more)
        attn::cp_async_wait<1>();
      else
        attn::cp_async_wait<0>();
    }
    __syncthreads();  // (the first time also publishes q_s)
    const __nv_bfloat16* k_s = sm.k[st];
    const __nv_bfloat16* v_s = sm.v[st];

    // S = Q K^T for the 16 heads x this warp's 16 keys, smallest Q term first.
    float sc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
      uint32_t b[4];
      attn::ldmatrix_x4(b, &k_s[k_row * kLd + kt * 16 + k_col]);
#pragma unroll
      for (int term = kTerms - 1; term >= 0; --term) {
        uint32_t a[4];
        attn::ldmatrix_x4(a, &q_s[(term * kRows + q_row) * kLd + kt * 16 + q_col]);
        attn::mma_bf16(sc[0], a, b[0], b[1]);
        attn::mma_bf16(sc[1], a, b[2], b[3]);
      }
    }
    // Keys past the slice or in invalid blocks were loaded as zeros and are not ok: mask them.
    float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int key = warp * 16 + nt * 8 + tig * 2;
      if (!sm.ok[st][key]) sc[nt][0] = sc[nt][2] = -CUDART_INF_F;
      if (!sm.ok[st][key + 1]) sc[nt][1] = sc[nt][3] = -CUDART_INF_F;
      mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
    }
    mx0 = attn::quad_max(mx0);
    mx1 = attn::quad_max(mx1);
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float base0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, base1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
    const float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      sc[nt][0] = exp2f(sc[nt][0] - base0);
      sc[nt][1] = exp2f(sc[nt][1] - base0);
      sc[nt][2] = exp2f(sc[nt][2] - base1);
      sc[nt][3] = exp2f(sc[nt][3] - base1);
    }
    l0 = l0 * corr0 + sc[0][0] + sc[0][1] + sc[1][0] + sc[1][1];
    l1 = l1 * corr1 + sc[0][2] + sc[0][3] + sc[1][2] + sc[1][3];
    // P as three BF16 terms (A fragments: two adjacent C tiles of P are one 16-key step).
    uint32_t pa[kTerms][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x0 = sc[i / 2][(i % 2) * 2], x1 = sc[i / 2][(i % 2) * 2 + 1];
      __nv_bfloat16 h0b, m0b, l0b, h1b, m1b, l1b;
      split3(x0, h0b, m0b, l0b);
      split3(x1, h1b, m1b, l1b);
      pa[0][i] = pack2(h0b, h1b);
      pa[1][i] = pack2(m0b, m1b);
      pa[2][i] = pack2(l0b, l1b);
    }
#pragma unroll
    for (int np = 0; np < HD / 16; ++np) {
      uint32_t b[4];
      attn::ldmatrix_x4_trans(b, &v_s[v_row * kLd + np * 16 + v_col]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[2 * np][e] *= e < 2 ? corr0 : corr1;
        o[2 * np + 1][e] *= e < 2 ? corr0 : corr1;
      }
#pragma unroll
      for (int term = kTerms - 1; term >= 0; --term) {
        attn::mma_bf16(o[2 * np], pa[term], b[0], b[1]);
        attn::mma_bf16(o[2 * np + 1], pa[term], b[2], b[3]);
      }
    }
    if constexpr (kFp8) {
      if (more) loader.store_fp8(sm, st ^ 1);
    }
    __syncthreads();  // the next iteration overwrites this stage; the merge below reuses the tiles
  }

  finish_mma_rows<HD>(smem_raw, o, m0, l0, m1, l1,
                      {out, out_bf16, part_acc, part_ml,
                       counters ? counters + static_cast<int64_t>(t) * heads_x + head_x : nullptr,
                       static_cast<int64_t>(t) * hq + h0, nh, splits, split, splits, out_scale});
}

// ---- v2 (INFERX_CUDA_DECODE_ATTN=v2; the fallback of v3) -----------------------------
// The same algorithm with less serial work per CTA and per tile:
//   - two BF16 terms of Q and P instead of three (hi + lo carry 16 significant bits, a residual below
//     2^-17 |x|; a float64 simulation of the test grid gives a relative output error near 3e-6, under the
//     tests' 1e-5), so 2/3 of the tensor-core work; the terms of S accumulate in separate registers (two
//     independent mma chains instead of one);
//   - Q's fragments stay in registers for the whole loop (no ldmatrix of Q per tile), staged once through
//     the second tile stage, whose loads are only issued after that;
//   - the first tile's loads are issued before Q is read (Q with 16-byte loads), and the block-table
//     entries of tile i + 2 are loaded while tile i is computed, so a tile's data loads never wait on a
//     dependent table load; key indices are 32-bit (no 64-bit division per chunk).
constexpr int kTerms2 = 2;

// Tile stages: kStages - 1 tiles in flight (cp.async) while one is computed. BF16 tiles land in the BF16
// stages the MMAs read; FP8 tiles land as raw E4M3 bytes in their own stages (four: three in flight, 48 KiB
// per CTA) and each thread converts the chunks it loaded into the one BF16 stage just before the tile is
// used. (FP8 tiles first went through registers, one tile ahead: 16 KiB in flight per CTA, and at 256
// decode rows the FP8 cache took as long as BF16 for half the bytes - H200 ncu, 424 vs 404 us per layer.)
template <class CacheT>
constexpr int stages_v2() {
  return sizeof(CacheT) == 1 ? 4 : 3;
}
template <int HD, int kStages>
struct DecodeSmem {
  static constexpr int kLd = HD + 8;
  __nv_bfloat16 k[kStages][kTile * kLd];
  __nv_bfloat16 v[kStages][kTile * kLd];
  bool ok[kStages][kTile];
};
template <int HD, int kRawStages>
struct DecodeSmemFp8 {
  static constexpr int kLd = HD + 8;
  __nv_bfloat16 k[1][kTile * kLd];  // the tile being computed, converted
  __nv_bfloat16 v[1][kTile * kLd];
  bool ok[1][kTile];
  alignas(16) uint8_t rk[kRawStages][kTile * HD];  // raw E4M3 tiles in flight
  alignas(16) uint8_t rv[kRawStages][kTile * HD];
  bool rok[kRawStages][kTile];
};
template <class CacheT, int HD>
using DecodeSmemFor = std::conditional_t<sizeof(CacheT) == 1, DecodeSmemFp8<HD, stages_v2<CacheT>()>,
                                         DecodeSmem<HD, stages_v2<CacheT>()>>;

template <class CacheT, int HD>
struct DecodeLoader {
  static constexpr bool kFp8 = sizeof(CacheT) == 1;
  static constexpr int kElems = 16 / static_cast<int>(sizeof(CacheT));  // elements per 16-byte chunk
  static constexpr int kChunks = HD / kElems;
  // Each warp loads the 16 keys of a tile it computes (keys warp * 16 ..), so a tile needs no CTA-wide
  // barrier: the warps run through their tiles independently and hide each other's latencies (with
  // CTA-wide barriers the loop ran ~2.9 us per tile at 256 rows for BF16 and FP8 alike - H200 ncu).
  static constexpr int kKeyStep = kWarp / kChunks;  // keys per pass of the warp
  static constexpr int kPerThread = 16 / kKeyStep;
  static_assert(kWarp % kChunks == 0 && 16 % kKeyStep == 0 && kWarps * 16 == kTile,
                "a warp loads its 16 keys in whole passes");

  const CacheT* k_cache;
  const CacheT* v_cache;
  const int32_t* table;  // this sequence's block table row
  int max_blocks;
  int64_t num_blocks;
  int block_size;
  int64_t kv_row;           // hkv * HD elements per token slot
  int64_t head_off;         // kvh * HD
  int key0, c;              // this thread's first key of a tile and its chunk
  int32_t blk[kPerThread];  // block of each key of the next tile to issue (-1: none)

  // Loads the block-table entries of the tile at j0 (plain loads, consumed by the next begin()).
  __device__ __forceinline__ void prefetch(int j0, int end) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int j = j0 + key0 + i * kKeyStep;
      const int b = j / block_size;
      blk[i] = j < end && b < max_blocks ? __ldg(&table[b]) : -1;
    }
  }
  __device__ __forceinline__ int64_t offset(int i, int j0) const {
    const int32_t b = blk[i];
    if (b < 0 || b >= num_blocks) return -1;  // past the slice, or an invalid block: zeros, masked
    const int j = j0 + key0 + i * kKeyStep;
    return (static_cast<int64_t>(b) * block_size + j % block_size) * kv_row + head_off + c * kElems;
  }
  // One committed cp.async group of the tile at j0 into `stage` (BF16: the MMA stage; FP8: the raw stage).
  template <class Smem>
  __device__ __forceinline__ void begin(Smem& s, int stage, int j0) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t off = offset(i, j0);
      const int key = key0 + i * kKeyStep;
      const CacheT* kp = off >= 0 ? k_cache + off : k_cache;
      const CacheT* vp = off >= 0 ? v_cache + off : v_cache;
      if constexpr (kFp8) {
        if (c == 0) s.rok[stage][key] = off >= 0;
        attn::cp_async16(&s.rk[stage][key * HD + c * kElems], kp, off >= 0 ? 16 : 0);
        attn::cp_async16(&s.rv[stage][key * HD + c * kElems], vp, off >= 0 ? 16 : 0);
      } else {
        if (c == 0) s.ok[stage][key] = off >= 0;
        attn::cp_async16(&s.k[stage][key * (HD + 8) + c * 8], kp, off >= 0 ? 16 : 0);
        attn::cp_async16(&s.v[stage][key * (HD + 8) + c * 8], vp, off >= 0 ? 16 : 0);
      }
    }
    attn::cp_async_commit();
  }
  // FP8: this thread's chunks of raw stage `stage` (complete for it after its cp.async wait) into the BF16
  // stage; a __syncwarp() must follow before the warp's other lanes read them.
  template <class Smem>
  __device__ __forceinline__ void convert(Smem& s, int stage) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int key = key0 + i * kKeyStep;
      if (c == 0) s.ok[0][key] = s.rok[stage][key];
      const uint4 rk = *reinterpret_cast<const uint4*>(&s.rk[stage][key * HD + c * kElems]);
      const uint4 rv = *reinterpret_cast<const uint4*>(&s.rv[stage][key * HD + c * kElems]);
      __nv_bfloat16* kd = &s.k[0][key * (HD + 8) + c * kElems];
      __nv_bfloat16* vd = &s.v[0][key * (HD + 8) + c * kElems];
      *reinterpret_cast<uint4*>(kd) = attn::e4m3x8_to_bf16x8(make_uint2(rk.x, rk.y));
      *reinterpret_cast<uint4*>(kd + 8) = attn::e4m3x8_to_bf16x8(make_uint2(rk.z, rk.w));
      *reinterpret_cast<uint4*>(vd) = attn::e4m3x8_to_bf16x8(make_uint2(rv.x, rv.y));
      *reinterpret_cast<uint4*>(vd + 8) = attn::e4m3x8_to_bf16x8(make_uint2(rv.z, rv.w));
    }
  }
};

// x = hi + lo, each rounded to BF16 (the remainder is below 2^-17 |x|).
__device__ __forceinline__ void split2(float x, __nv_bfloat16& hi, __nv_bfloat16& lo) {
  hi = __float2bfloat16_rn(x);
  lo = __float2bfloat16_rn(x - __bfloat162float(hi));
}

template <class CacheT, int HD>
constexpr int smem_bytes_v2() {
  static_assert(kTerms2 * kRows * (HD + 8) <= kTile * (HD + 8), "Q's staging fits one K stage");
  constexpr int tiles = static_cast<int>(sizeof(DecodeSmemFor<CacheT, HD>));
  constexpr int merge = (kWarps * kRows * HD + 2 * kWarps * kRows) * 4;
  return ((tiles > merge ? tiles : merge) + 15) / 16 * 16;
}

// Grid: (token * kv heads * head chunks, split).
template <class CacheT, int HD>
__global__ void __launch_bounds__(kThreads, 2)
    decode_attention_kernel_v2(const float* __restrict__ q, const CacheT* __restrict__ k_cache,
                               const CacheT* __restrict__ v_cache, int64_t num_blocks, int block_size,
                               const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                               float out_scale, int64_t window, float* __restrict__ part_acc,
                               float* __restrict__ part_ml, int* __restrict__ counters,
                               float* __restrict__ out, __nv_bfloat16* __restrict__ out_bf16) {
  constexpr int kLd = HD + 8;
  constexpr bool kFp8 = sizeof(CacheT) == 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kStages = stages_v2<CacheT>(), kAhead = kStages - 1;
  static_assert(kAhead >= 1 && kAhead <= 3, "the cp.async waits below handle one to three tiles ahead");
  constexpr int kQStage = kFp8 ? 0 : kStages - 1;  // the BF16 stage that stages Q before the loop
  auto& sm = *reinterpret_cast<DecodeSmemFor<CacheT, HD>*>(smem_raw);

  // Grid (token x group CTA, split): the CTAs of one token's KV heads are adjacent in launch order, so
  // they read the neighbouring 256-byte pieces of the same cache rows together. (Measured no faster than
  // the token-minor grid on the H200 - 404 vs 405 us per layer at 256 rows: DRAM locality was not the limit.)
  const int heads_x = hkv * ((hq / hkv + kRows - 1) / kRows);
  const int t = blockIdx.x / heads_x, head_x = blockIdx.x % heads_x, split = blockIdx.y, splits = gridDim.y;
  const int group = hq / hkv;
  const int chunks = (group + kRows - 1) / kRows;
  const int kvh = head_x / chunks, chunk = head_x % chunks;
  const int h0 = kvh * group + chunk * kRows;
  const int nh = min(kRows, group - chunk * kRows);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int tig = lane % 4;

  const int s = find_sequence(batch.query_start, batch.num_seqs, t);
  const attn::SplitKeys keys =
      attn::split_keys<kTile>(batch.positions[t], batch.seq_lens[s], window, split, splits);
  const int last = keys.last, k_begin = keys.k_begin, k_end = keys.k_end, n_tiles = keys.n_tiles;

  using Loader = DecodeLoader<CacheT, HD>;
  Loader loader;
  loader.k_cache = k_cache;
  loader.v_cache = v_cache;
  loader.table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
  loader.max_blocks = batch.max_blocks_per_seq;
  loader.num_blocks = num_blocks;
  loader.block_size = block_size;
  loader.kv_row = static_cast<int64_t>(hkv) * HD;
  loader.head_off = static_cast<int64_t>(kvh) * HD;
  loader.key0 = warp * 16 + lane / Loader::kChunks;
  loader.c = lane % Loader::kChunks;
  // The first kAhead tiles into stages 0 .. kAhead - 1 (BF16: the last stage holds Q's staging for now;
  // FP8: raw stages, Q in the BF16 stage), around the wait for the previous kernel.
  attn::start_decode_tiles<kAhead, kTile>(loader, sm, n_tiles, k_begin, k_begin, last, k_end);

  // Q of the group's heads (row r = head h0 + r; rows past the group are zeros), pre-scaled into the log2
  // domain, as two BF16 terms staged in the last stage's K tile, then held as A fragments in registers.
  {
    __nv_bfloat16* q_s = sm.k[kQStage];  // [term][row][kLd]
    constexpr int kVecs = kRows * HD / 4 / kThreads;
    float4 qv[kVecs];
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int r = idx / (HD / 4), d4 = idx % (HD / 4);
      qv[i] =
          r < nh
              ? __ldg(reinterpret_cast<const float4*>(q + (static_cast<int64_t>(t) * hq + h0 + r) * HD) + d4)
              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int r = idx / (HD / 4), d = idx % (HD / 4) * 4;
      const float x[4] = {qv[i].x * scale_log2, qv[i].y * scale_log2, qv[i].z * scale_log2,
                          qv[i].w * scale_log2};
      __nv_bfloat16 hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) split2(x[e], hi[e], lo[e]);
      *reinterpret_cast<uint2*>(&q_s[r * kLd + d]) = make_uint2(pack2(hi[0], hi[1]), pack2(hi[2], hi[3]));
      *reinterpret_cast<uint2*>(&q_s[(kRows + r) * kLd + d]) =
          make_uint2(pack2(lo[0], lo[1]), pack2(lo[2], lo[3]));
    }
  }
  __syncthreads();
  uint32_t qf[kTerms2][HD / 16][4];
  {
    const int q_row = lane & 15, q_col = (lane >> 4) * 8;
    const __nv_bfloat16* q_s = sm.k[kQStage];
#pragma unroll
    for (int term = 0; term < kTerms2; ++term)
#pragma unroll
      for (int kt = 0; kt < HD / 16; ++kt)
        attn::ldmatrix_x4(qf[term][kt], &q_s[(term * kRows + q_row) * kLd + kt * 16 + q_col]);
  }
  __syncthreads();  // the Q stage is free (BF16: for tile kAhead; FP8: for tile 0's conversion)

  float o[HD / 8][4];
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.0f, l1 = 0.0f;

  const int k_row = warp * 16 + (lane >> 4) * 8 + (lane & 7), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = warp * 16 + (lane & 15), v_col = (lane >> 4) * 8;
  for (int it = 0; it < n_tiles; ++it) {
    const int st = it % kStages, st_ahead = (it + kAhead) % kStages;
    const bool more = it + kAhead < n_tiles;  // tile it + kAhead goes into the stage computed last time
    if (more) {
      loader.begin(sm, st_ahead, k_begin + (it + kAhead) * kTile);
      if (it + kAhead + 1 < n_tiles) loader.prefetch(k_begin + (it + kAhead + 1) * kTile, k_end);
    }
    // Groups committed after tile it's: the tiles up to it + kAhead that exist.
    const int after = min(kAhead, n_tiles - 1 - it);
    if (after >= 3)
      attn::cp_async_wait<(kAhead >= 3 ? 3 : 0)>();
    else if (after == 2)
      attn::cp_async_wait<2>();
    else if (after == 1)
      attn::cp_async_wait<1>();
    else
      attn::cp_async_wait<0>();
    if constexpr (kFp8) loader.convert(sm, st);
    __syncwarp();                   // the warp's 16 keys of tile it, loaded (and converted) by its own lanes
    const int cst = kFp8 ? 0 : st;  // the BF16 stage holding tile it
    const __nv_bfloat16* k_s = sm.k[cst];
    const __nv_bfloat16* v_s = sm.v[cst];

    // S = Q K^T for the 16 heads x this warp's 16 keys, one accumulator per term.
    float sc[kTerms2][2][4] = {};
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
      uint32_t b[4];
      attn::ldmatrix_x4(b, &k_s[k_row * kLd + kt * 16 + k_col]);
#pragma unroll
      for (int term = 0; term < kTerms2; ++term) {
        attn::mma_bf16(sc[term][0], qf[term][kt], b[0], b[1]);
        attn::mma_bf16(sc[term][1], qf[term][kt], b[2], b[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[0][nt][e] = sc[1][nt][e] + sc[0][nt][e];
    float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int key = warp * 16 + nt * 8 + tig * 2;
      if (!sm.ok[cst][key]) sc[0][nt][0] = sc[0][nt][2] = -CUDART_INF_F;
      if (!sm.ok[cst][key + 1]) sc[0][nt][1] = sc[0][nt][3] = -CUDART_INF_F;
      mx0 = fmaxf(mx0, fmaxf(sc[0][nt][0], sc[0][nt][1]));
      mx1 = fmaxf(mx1, fmaxf(sc[0][nt][2], sc[0][nt][3]));
    }
    mx0 = attn::quad_max(mx0);
    mx1 = attn::quad_max(mx1);
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float base0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, base1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
    const float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    float p[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      p[nt][0] = exp2f(sc[0][nt][0] - base0);
      p[nt][1] = exp2f(sc[0][nt][1] - base0);
      p[nt][2] = exp2f(sc[0][nt][2] - base1);
      p[nt][3] = exp2f(sc[0][nt][3] - base1);
    }
    l0 = l0 * corr0 + p[0][0] + p[0][1] + p[1][0] + p[1][1];
    l1 = l1 * corr1 + p[0][2] + p[0][3] + p[1][2] + p[1][3];
    // P as two BF16 terms (A fragments: two adjacent C tiles of P are one 16-key step).
    uint32_t pa[kTerms2][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x0 = p[i / 2][(i % 2) * 2], x1 = p[i / 2][(i % 2) * 2 + 1];
      __nv_bfloat16 h0b, l0b, h1b, l1b;
      split2(x0, h0b, l0b);
      split2(x1, h1b, l1b);
      pa[0][i] = pack2(h0b, h1b);
      pa[1][i] = pack2(l0b, l1b);
    }
#pragma unroll
    for (int np = 0; np < HD / 16; ++np) {
      uint32_t b[4];
      attn::ldmatrix_x4_trans(b, &v_s[v_row * kLd + np * 16 + v_col]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[2 * np][e] *= e < 2 ? corr0 : corr1;
        o[2 * np + 1][e] *= e < 2 ? corr0 : corr1;
      }
#pragma unroll
      for (int term = kTerms2 - 1; term >= 0; --term) {
        attn::mma_bf16(o[2 * np], pa[term], b[0], b[1]);
        attn::mma_bf16(o[2 * np + 1], pa[term], b[2], b[3]);
      }
    }
    __syncwarp();  // the warp's next loads overwrite its rows of this stage
  }
  __syncthreads();  // every warp is done with the tiles: the merge below reuses them

  finish_mma_rows<HD>(smem_raw, o, m0, l0, m1, l1,
                      {out, out_bf16, part_acc, part_ml,
                       counters ? counters + static_cast<int64_t>(t) * heads_x + head_x : nullptr,
                       static_cast<int64_t>(t) * hq + h0, nh, splits, split, splits, out_scale});
}

template <class CacheT, int HD>
cudaError_t launch_typed(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                         float scale, int64_t window, int splits, void* scratch, int* counters, float* out,
                         void* out_bf16, cudaStream_t stream) {
  // v2 reads Q with 16-byte loads; a Q that is not 16-byte aligned (never from the engine) takes v1.
  const bool v2 = !decode_attention_v1() && reinterpret_cast<uintptr_t>(q) % 16 == 0;
  static unsigned smem_set = 0, smem_set_v2 = 0;
  constexpr int kSmem = smem_bytes<HD>(), kSmem2 = smem_bytes_v2<CacheT, HD>();
  const cudaError_t st = v2 ? allow_dynamic_smem(decode_attention_kernel_v2<CacheT, HD>, kSmem2, smem_set_v2)
                            : allow_dynamic_smem(decode_attention_kernel<CacheT, HD>, kSmem, smem_set);
  if (st != cudaSuccess) return st;
  const int chunks = (hq / hkv + kRows - 1) / kRows;
  // Token-major, KV heads adjacent (see the kernels); the split count is at most kDecodeMaxSplits.
  const dim3 grid(static_cast<unsigned>(batch.num_tokens * hkv * chunks), static_cast<unsigned>(splits));
  float* part_acc = static_cast<float*>(scratch);
  float* part_ml = part_acc ? part_acc + static_cast<int64_t>(batch.num_tokens) * hq * splits * HD : nullptr;
  const bool fp8 = cache.dtype == DType::F8_E4M3;
  const float scale_log2 = scale * kLog2e * (fp8 ? cache.k_scale : 1.0f);
  const float out_scale = fp8 ? cache.v_scale : 1.0f;
  const auto* kc = static_cast<const CacheT*>(cache.k);
  const auto* vc = static_cast<const CacheT*>(cache.v);
  const int bs = static_cast<int>(cache.block_size);
  if (v2)
    return launch_pdl(decode_attention_kernel_v2<CacheT, HD>, grid, dim3(kThreads), kSmem2, stream, q, kc, vc,
                      cache.num_blocks, bs, batch, hq, hkv, scale_log2, out_scale, window, part_acc, part_ml,
                      counters, out, static_cast<__nv_bfloat16*>(out_bf16));
  else
    decode_attention_kernel<CacheT, HD><<<grid, kThreads, kSmem, stream>>>(
        q, kc, vc, cache.num_blocks, bs, batch, hq, hkv, scale_log2, out_scale, window, part_acc, part_ml,
        counters, out, static_cast<__nv_bfloat16*>(out_bf16));
  return cudaGetLastError();
}

}  // namespace

DecodeSplitPlan decode_attention_plan(int64_t tokens, int64_t kv_heads, int64_t hq, int64_t max_keys, int sms,
                                      DType cache) {
  const int64_t chunks = (hq / kv_heads + kRows - 1) / kRows;
  const int64_t ctas = tokens * kv_heads * chunks;
  int64_t max_splits = max_keys / kTile;  // at least one full tile of keys per split
  if (max_splits > kDecodeMaxSplits) max_splits = kDecodeMaxSplits;
  if (max_splits < 1) max_splits = 1;
  // v1: about three CTAs fit on an SM (a double-buffered 64-key tile of K and V for head_dim 128 is 68 KiB):
  // enough splits to give every SM three.
  if (decode_attention_v1()) {
    const int64_t want = (3 * static_cast<int64_t>(sms) + ctas - 1) / ctas;
    return {static_cast<int>(want < 1 ? 1 : want < max_splits ? want : max_splits), 1};
  }
  if (decode_attention_version() == 2) {
    // v2: two CTAs per SM (registers and 70 KiB of tiles). Estimated time of a split count = waves of CTAs x
    // (tiles per split + one tile's worth of fixed cost: setup, partials, merge); fewer splits on ties.
    const int64_t slots = 2 * static_cast<int64_t>(sms > 0 ? sms : 1);
    int64_t best = 1, best_cost = -1;
    for (int64_t sp = 1; sp <= max_splits; ++sp) {
      const int64_t waves = (ctas * sp + slots - 1) / slots;
      const int64_t cost = waves * (((max_keys + sp - 1) / sp + kTile - 1) / kTile + 1);
      if (best_cost < 0 || cost < best_cost) best = sp, best_cost = cost;
    }
    return {static_cast<int>(best), 1};
  }
  // v3 (the default). CTAs per SM: 4 with an FP8 cache, 3 with BF16 (INFERX_DECODE_CTAS_PER_SM overrides,
  // read once). Estimated time of `sp` splits = waves x (tiles per split + a fixed cost per CTA + a merge
  // cost when split), waves the mean of ceil(CTAs / slots) and max(1, CTAs / slots): a partial last wave
  // costs less than a full one (its CTAs share the freed bandwidth) but more than its share; a larger count
  // must be 3% cheaper (the waves' rounding alone made 3-5 splits look 0.5% better at 128k keys). Fixed cost
  // 3 tiles, merge 1 tile (FP8; a BF16 tile moves twice the bytes: 1.5 and 0.5), fitted to
  // `INFERX_BENCH_ONLY=decode_splits bench_cuda_kernels` on the H200 (2026-12-04, FP8 cache, 32-512 rows x
  // 1k-4k keys, forced 1-8 splits: time ~ rows x (3.6 us + 0.032 us per key) per CTA slot): it picks the
  // fastest count at every measured point but 32 rows x 1.5k (2 splits, 1.6% slower than 1; 6% at 32 x 1k
  // and 1.5k in a later run of the same bench), where the old model (2 CTAs per SM, 1-tile cost) picked 5
  // splits at ~100 rows x 1.5k (1 split: 98 vs 153 us, ncu).
  const bool fp8 = cache == DType::F8_E4M3;
  static const int64_t per_sm_env = env_int("INFERX_DECODE_CTAS_PER_SM", 0, 8, 0);
  const int64_t per_sm = per_sm_env > 0 ? per_sm_env : fp8 ? 4 : 3;
  const double slots = static_cast<double>(per_sm * (sms > 0 ? sms : 1));
  const double fixed = fp8 ? 3.0 : 1.5, merge = fp8 ? 1.0 : 0.5;
  const int64_t cap_tiles = (max_keys + kTile - 1) / kTile;
  int64_t best = 1;
  double best_cost = -1.0;
  for (int64_t sp = 1; sp <= max_splits; ++sp) {
    const double w = static_cast<double>(ctas * sp) / slots;
    const double waves = (std::ceil(w) + (w > 1.0 ? w : 1.0)) / 2.0;
    const double tiles = static_cast<double>((cap_tiles + sp - 1) / sp);
    const double cost = waves * (tiles + fixed + (sp > 1 ? merge : 0.0));
    if (best_cost < 0.0 || cost < best_cost * 0.97) best = sp, best_cost = cost;  // more splits: 3% better
  }
  // The plan was made for max_keys (a graph's capacity); most contexts are shorter. Where its CTAs fit in one
  // wave the launch is latency-bound and each token takes all the splits its tiles allow (min_tiles 1);
  // where they do not, a token splits only as far as a max_keys context would: a 1.5k context under a
  // 4k- or 8k-key plan of 2-3 splits at ~100 rows then runs as one split, as the measurements prefer.
  const bool one_wave = static_cast<double>(ctas * best) <= slots;
  const int64_t min_tiles = one_wave || best == 1 ? 1 : (cap_tiles + best - 1) / best;
  return {static_cast<int>(best), static_cast<int>(min_tiles)};
}

size_t decode_attention_scratch_bytes(int64_t tokens, int64_t hq, int64_t hd, int splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(tokens * hq * splits * (hd + 2)) * sizeof(float);
}

bool decode_attention_rounds_once(DType dtype, int64_t block_size) {
  return dtype == DType::F8_E4M3 && decode_attention_version() == 3 && pow2_blocks(block_size) &&
         decode_attention_terms() == 1;
}

int64_t decode_attention_counters(int64_t tokens, int64_t hq, int64_t hkv) {
  return tokens * hkv * ((hq / hkv + kRows - 1) / kRows);
}

bool decode_attention_supported(const PagedKv& cache, int64_t hd) {
  return (cache.dtype == DType::BF16 || cache.dtype == DType::F8_E4M3) && (hd == 64 || hd == 128);
}

namespace {
EnvSwitch g_decode_rope("INFERX_DECODE_ROPE", true);
EnvSwitch g_decode_rope_product("INFERX_DECODE_ROPE_PRODUCT", true);
// v3 reads Q and writes outputs with vector accesses; misaligned buffers (never from the engine) take v2/v1.
bool v3_takes(const PagedKv& cache, const float* q, const float* out, const void* out_bf16) {
  return decode_attention_version() == 3 && pow2_blocks(cache.block_size) && is_aligned(q, 16) &&
         is_aligned(out, 16) && is_aligned(out_bf16, 8);
}
}  // namespace

bool decode_rope_fused() { return g_decode_rope.on(); }
void set_decode_rope_fused(int mode) { g_decode_rope.set(mode); }
bool decode_rope_product() { return g_decode_rope_product.on(); }
void set_decode_rope_product(int mode) { g_decode_rope_product.set(mode); }

bool decode_attention_takes_rope(const PagedKv& cache, int64_t hq, int64_t hkv, int64_t hd, const float* q,
                                 const float* out, const void* out_bf16) {
  return decode_rope_fused() && decode_attention_supported(cache, hd) && hd / 2 <= kDecodeRopeMaxPairs &&
         hkv > 0 && hq % hkv == 0 && hq / hkv <= 16 && v3_takes(cache, q, out, out_bf16);
}

cudaError_t launch_decode_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                    int64_t hkv, int64_t hd, float scale, int64_t sliding_window,
                                    DecodeSplitPlan plan, void* scratch, int* counters, float* out,
                                    void* out_bf16, cudaStream_t stream, const DecodeRope* rope) {
  if (batch.num_tokens == 0 || hq == 0) return cudaSuccess;
  const int splits = plan.splits;
  if (!decode_attention_supported(cache, hd) || splits < 1 || splits > kDecodeMaxSplits ||
      plan.min_tiles < 1 || (splits > 1 && (scratch == nullptr || counters == nullptr)) ||
      (rope && (rope->k == nullptr || rope->v == nullptr ||
                !decode_attention_takes_rope(cache, hq, hkv, hd, q, out, out_bf16) ||
                (rope->product && !rope_takes_product(*rope->product, hq, hkv, hd, batch.num_tokens)))))
    return cudaErrorInvalidValue;  // the caller checks these first
  const int iq = static_cast<int>(hq), ikv = static_cast<int>(hkv);
  if (v3_takes(cache, q, out, out_bf16))
    return launch_decode_attention_v3(q, cache, batch, iq, ikv, static_cast<int>(hd), scale, sliding_window,
                                      plan, scratch, counters, out, out_bf16, stream, rope);
  if (cache.dtype == DType::F8_E4M3) {
    if (hd == 64)
      return launch_typed<uint8_t, 64>(q, cache, batch, iq, ikv, scale, sliding_window, splits, scratch,
                                       counters, out, out_bf16, stream);
    return launch_typed<uint8_t, 128>(q, cache, batch, iq, ikv, scale, sliding_window, splits, scratch,
                                      counters, out, out_bf16, stream);
  }
  if (hd == 64)
    return launch_typed<__nv_bfloat16, 64>(q, cache, batch, iq, ikv, scale, sliding_window, splits, scratch,
                                           counters, out, out_bf16, stream);
  return launch_typed<__nv_bfloat16, 128>(q, cache, batch, iq, ikv, scale, sliding_window, splits, scratch,
                                          counters, out, out_bf16, stream);
}

}  // namespace inferx::cuda
