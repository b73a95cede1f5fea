// Prefill / chunked-prefill attention on tensor cores, FlashAttention-2 style (Dao 2023, Algorithm 1),
// with Hopper warpgroup MMA (wgmma, sm_90a; wgmma.cuh) for BF16 and FP8 (E4M3) caches, head_dim 64 or
// 128. Three configurations, picked per process by INFERX_PREFILL_ATTN (kernels.h): "g3" (the default:
// 3 warpgroups x 64 query rows, 64-key tiles, 3 stages), "g2" (2 x 64 rows, 128-key tiles, 2 stages) and
// "g3p" (g3 with a KV head's query heads packed into one CTA's rows; below).
// H200, T8192 causal 32/8 heads x 128: g3 331 TFLOP/s (FP8 cache 300), g2 307. The mma.sync kernels
// before it (v1 117 TFLOP/s, v2 212, v3 257 in the same run, each slower than g3 on every prefill row)
// were removed; git history has them.
//
// Varlen over the flattened batch: grid (query head, sequence, query tile); a tile past the sequence's
// query count exits at once. "g3p" packs GQA instead: grid (KV head, sequence, query tile), a CTA's rows the
// G = hq / hkv query heads of its KV head over kRows / G positions, row r = position r / G, head r % G
// (position-major: a warpgroup's 64 rows span 64 / G positions). The MMA rows are as many, but a tile
// spans G times fewer positions, so a causal CTA walks fewer keys past its rows' diagonal: for 1000-token
// prompts (G = 4) about 27% fewer key tiles per KV head than g3, whose 4 CTAs per tile of 192 positions
// each walk to the tile's last position (an estimate from the tile counts, not yet measured). Tiles are
// launched last-first: under the causal mask the last query tiles walk the most keys, so starting them first
// keeps the tail of the grid short. Keys are gathered from the paged cache through the block table (one
// lookup per key and tile, a tile ahead) into shared memory. Masking per (query position p, key j): j <= p, j
// < seq_len, and j > p - window when window > 0. The key range walked is [min over the tile of the window
// start, max position of the tile]; a warpgroup skips the tiles none of its rows sees, and only tiles not
// wholly visible to all its rows are masked. exp2 is the approximate ex2 instruction, the softmax scale
// folded into Q (log2 domain).
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

constexpr float kLog2e = 1.4426950408889634f;

// Kernel choices of launch_prefill_attention (see variant_of below).
enum Variant : int {
  kG3 = 1,   // "g3": 3 warpgroups x 64 rows, 64-key tiles, 3 stages
  kG2 = 2,   // "g2": 2 warpgroups x 64 rows, 128-key tiles, 2 stages
  kG3P = 3,  // "g3p": g3's shape with the GQA query heads of a KV head packed into a CTA's rows
};

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The kernel: a CTA has kWG warpgroups of 64 query rows; they share each tile of kBN keys, staged in kStages
// buffers by cp.async (kStages - 1 tiles in flight while one is computed). Per warpgroup and tile, S = Q K^T
// is HD / 16 wgmma m64n{kBN}k16 with Q and K read from shared memory (K-major, 128-byte swizzle); the online
// softmax runs on the accumulators, and P stays in registers as the A operand of O += P V (kBN / 16
// wgmma m64n{HD}k16, V read MN-major from the same row-major tile). The warpgroups wait for their own
// MMAs only, so while one does its softmax the tensor cores run another's products; one barrier per
// tile. FP8 caches land as raw codes in a second set of buffers; each thread converts the chunks it
// copied into the BF16 tile before the barrier that publishes it (k_scale folded into Q, v_scale into
// the output).
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

template <int HD, int kWG, int kBN, int kStages, class CacheT, bool kPacked>
__global__ void __launch_bounds__(kWG * 128, 1)
    prefill_attention_wg(const float* __restrict__ q, const CacheT* __restrict__ k_cache,
                         const CacheT* __restrict__ v_cache, int64_t num_blocks, int block_size,
                         const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                         float out_scale, int64_t window, float* __restrict__ out, bool lazy_rescale) {
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

  // Row r is query head h0 + r % G at token tok_base + r / G (unpacked: G = 1, the CTA's one head).
  const int G = kPacked ? hq / hkv : 1,
            P = kRows / G;  // P: positions per tile (the launcher checks G | kRows)
  const int s = blockIdx.y, tile = gridDim.z - 1 - blockIdx.z;
  const int kvh = kPacked ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x) / (hq / hkv);
  const int h0 = kPacked ? kvh * G : static_cast<int>(blockIdx.x);
  const int q0 = batch.query_start[s];
  const int q_len = batch.query_start[s + 1] - q0;
  if (tile * P >= q_len) return;
  const int rows = min(P, q_len - tile * P) * G;  // valid rows: a prefix (position-major)
  const int64_t tok_base = q0 + static_cast<int64_t>(tile) * P;
  const int64_t seq_len = batch.seq_lens[s];
  auto row_token = [&](int r) { return tok_base + r / G; };
  auto row_head = [&](int r) { return h0 + r % G; };
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / kWarp, lane = tid % kWarp;
  const int gid = lane / 4, tig = lane % 4;

  if (tid < kWG) {
    s_min[tid] = INT_MAX;
    s_max[tid] = INT_MIN;
  }
  __syncthreads();
  if (tid < rows) {
    const int p = batch.positions[row_token(tid)];
    atomicMin(&s_min[tid / 64], p);
    atomicMax(&s_max[tid / 64], p);
  }
  // Q tile -> shared memory: BF16, scaled into the log2 domain, swizzled; rows past the sequence are 0.
  for (int idx = tid; idx < kRows * HD / 4; idx += kT) {
    const int r = idx / (HD / 4), c = (idx % (HD / 4)) * 4;
    float4 v = make_float4(0, 0, 0, 0);
    if (r < rows) v = *reinterpret_cast<const float4*>(q + (row_token(r) * hq + row_head(r)) * HD + c);
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
  const int64_t pos0 = r0 < rows ? batch.positions[row_token(r0)] : -1;  // -1 masks every key
  const int64_t pos1 = r1 < rows ? batch.positions[row_token(r1)] : -1;

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
      // attention_lazy_rescale: skip when every factor of the warp is exactly 1 (warp-uniform).
      if (!lazy_rescale || __any_sync(0xffffffffu, corr0 != 1.0f || corr1 != 1.0f)) {
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt) {
          o[nt * 4 + 0] *= corr0;
          o[nt * 4 + 1] *= corr0;
          o[nt * 4 + 2] *= corr1;
          o[nt * 4 + 3] *= corr1;
        }
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
      *reinterpret_cast<float2*>(out + (row_token(r0) * hq + row_head(r0)) * HD + c) =
          make_float2(o[nt * 4 + 0] * inv0, o[nt * 4 + 1] * inv0);
    if (r1 < rows)
      *reinterpret_cast<float2*>(out + (row_token(r1) * hq + row_head(r1)) * HD + c) =
          make_float2(o[nt * 4 + 2] * inv1, o[nt * 4 + 3] * inv1);
  }
}

template <int HD, int kWG, int kBN, int kStages, class CacheT, bool kPacked = false>
cudaError_t launch_wg(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                      float scale, int64_t window, int64_t max_query_len, float* out, cudaStream_t stream) {
  static unsigned smem_set = 0;
  constexpr bool kFp8 = sizeof(CacheT) == 1;
  constexpr int kSmem = WgLayout<HD, kWG, kBN, kStages, kFp8>::kSmem;
  const auto kernel = prefill_attention_wg<HD, kWG, kBN, kStages, CacheT, kPacked>;
  const cudaError_t st = allow_dynamic_smem(kernel, kSmem, smem_set);
  if (st != cudaSuccess) return st;
  constexpr int kRows = 64 * kWG;
  const int positions = kPacked ? kRows / (hq / hkv) : kRows;  // per query tile
  const int64_t tiles = (max_query_len + positions - 1) / positions;
  if (tiles > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(kPacked ? hkv : hq), static_cast<unsigned>(batch.num_seqs),
                  static_cast<unsigned>(tiles));
  kernel<<<grid, kWG * 128, kSmem, stream>>>(
      q, static_cast<const CacheT*>(cache.k), static_cast<const CacheT*>(cache.v), cache.num_blocks,
      static_cast<int>(cache.block_size), batch, hq, hkv, scale * kLog2e * (kFp8 ? cache.k_scale : 1.0f),
      kFp8 ? cache.v_scale : 1.0f, window, out, attention_lazy_rescale());
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
  // g3p where the group divides g3's 192 rows (GQA 1, 2, 3, 4, 6, 8, 12, 16, ...) and its 192 / G positions
  // per tile keep the grid's z within 65535 (the caller checked only g3's 64); g3 otherwise.
  const int G = hq % hkv == 0 ? hq / hkv : 0;
  if (variant == kG3P && G > 0 && 192 % G == 0 && (max_query_len + 192 / G - 1) / (192 / G) <= 65535)
    return hd == 64 ? launch_wg<64, 3, 64, 3, CacheT, true>(q, cache, batch, hq, hkv, scale, window,
                                                            max_query_len, out, stream)
                    : launch_wg<128, 3, 64, 3, CacheT, true>(q, cache, batch, hq, hkv, scale, window,
                                                             max_query_len, out, stream);
  return hd == 64 ? launch_wg<64, 3, 64, 3, CacheT>(q, cache, batch, hq, hkv, scale, window, max_query_len,
                                                    out, stream)
                  : launch_wg<128, 3, 64, 3, CacheT>(q, cache, batch, hq, hkv, scale, window, max_query_len,
                                                     out, stream);
}

// INFERX_PREFILL_ATTN is read once per process; set_prefill_attention_variant overrides it.
int variant_of(const char* e, int fallback) {
  if (e == nullptr) return fallback;
  if (std::strcmp(e, "g3") == 0) return kG3;
  if (std::strcmp(e, "g2") == 0) return kG2;
  if (std::strcmp(e, "g3p") == 0) return kG3P;
  return fallback;
}
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
  // The kernel keeps cache slots (block * block_size + offset) in 32 bits.
  return (cache.dtype == DType::BF16 || cache.dtype == DType::F8_E4M3) && (hd == 64 || hd == 128) &&
         cache.num_blocks * cache.block_size <= INT32_MAX;
}

cudaError_t launch_prefill_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                     int64_t hkv, int64_t hd, float scale, int64_t sliding_window,
                                     int64_t max_query_len, float* out, cudaStream_t stream) {
  if (batch.num_tokens == 0 || hq == 0 || max_query_len <= 0) return cudaSuccess;
  if (!prefill_attention_supported(cache, hd) || (max_query_len + 63) / 64 > 65535)
    return cudaErrorInvalidValue;  // the caller checks first
  const int iq = static_cast<int>(hq), ikv = static_cast<int>(hkv);
  const int variant = prefill_variant();
  if (cache.dtype == DType::F8_E4M3)
    return launch_wg_variant<uint8_t>(variant, hd, q, cache, batch, iq, ikv, scale, sliding_window,
                                      max_query_len, out, stream);
  return launch_wg_variant<__nv_bfloat16>(variant, hd, q, cache, batch, iq, ikv, scale, sliding_window,
                                          max_query_len, out, stream);
}

}  // namespace inferx::cuda
