// Weight-streaming GEMV for decode (kernels_gemv.h). Memory-bound: the weight is read once, so the kernels
// are built around keeping enough bytes in flight per SM (each lane issues several independent 16-byte
// weight loads before it converts any) and around not spending L1 on the weights (ld.global.nc with
// L1::no_allocate), so that x, which every warp re-reads, stays in L1, and around spending few
// instructions per weight once it arrives. Four kernels:
//   v1 (gemv_kernel): one warp per output row, four warps per CTA; a lane takes one granule of a format
//      per load (16 bytes: 8 to 32 columns) and expands it to floats element by element.
//   v2 (gemv8_kernel, kernels_gemv_decode.h): a lane takes 8 consecutive columns per step, so that the
//      warp's x loads are contiguous, decodes without integer-to-float conversions and applies block
//      scales once per step.
//   v3 (gemv_tc_kernel): 16 weight rows per CTA, K split among its warps; the weights are decoded to
//      exact BF16 and multiplied on tensor cores (mma.m16n8k16, weights as the A operand, x as B), so a
//      weight costs its decode only (BF16 none, E4M3 ~2.5 instructions, INT4 1.5), and up to 16 rows of
//      x cost about the same.
//   v4 (gemv_stream_kernel): v1's BF16 / FP8 decoders, and INT4 runs of 32 columns at ~2.5 instructions
//      per weight (StreamInt4: no conversion or subtraction per weight, x from shared memory; slower than
//      v3 for INT4, so opt-in: INFERX_GEMV_KERNEL=int4=v4), on one wave
//      of persistent warps, each streaming rows w, w + W, ... (plain products: pairs of rows) with the
//      next batch of loads in flight while it multiplies the current one. One activation row.
// Which one runs a format: kernel_for (measured default, INFERX_GEMV_KERNEL, set_gemv_kernel). Every
// kernel issues its first weight loads, then calls pdl_wait() before it reads x or stores, and
// pdl_launch_dependents() once its weights are streamed, and is launched with launch_pdl (cuda_common.cuh).
// Triggering at the kernel's start instead measured 4.6% slower end to end (H200, 2026-12-03 04:44,
// batch-1 decode at 1k context: 180.3 vs 188.6 tok/s); the cause was not profiled.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels_gemv.h"
#include "backend/cuda/kernels_gemv_decode.h"

namespace inferx::cuda {
namespace {

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * kWarp;

struct GemvParams {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  const void* scale = nullptr;
  const uint8_t* zero = nullptr;
  bool per_channel = false;
  int64_t groups_per_row = 0;  // INT4: k / group
  int group_shift = 0;         // INT4: log2(group / 32), the 32-column granules per group
  int step_group_shift = 0;    // INT4: log2(group / 8), the 8-column steps (v2 kernel) per group
  const __nv_bfloat16* x = nullptr;
  int m = 0;
  int64_t k = 0;
  const float* bias = nullptr;
  GemvOutput outs[kGemvMaxOutputs];
  int num_outs = 0;
  int64_t rows = 0;  // warps' rows: the weight's rows (store) or f (SiLU product)
  int64_t f = 0;
  __nv_bfloat16* out_bf16 = nullptr;
  int pf_batches = 0;  // v4: batches of each warp's first row(s) staged in shared memory (0: none)
  int ksplit = 1;      // v4: warps of a CTA that share a row group, each a 1/ksplit of its batches (1, 2, 4)
  // v4's norm fusion (kernels_gemv.h). Residual epilogue (one output): residual[j] += out_j (out not stored),
  // normed[j] = BF16(residual[j] * norm_weight[j]), partials[CTA] = the CTA's sum of the new residual[j]^2.
  float* residual = nullptr;
  const float* norm_weight = nullptr;
  __nv_bfloat16* normed = nullptr;
  float* partials = nullptr;
  // Prenormed input (x = a residual epilogue's normed row): the sums times rsqrt(sum(in_partials[0,
  // in_ctas)) / k + eps).
  const float* in_partials = nullptr;
  int in_ctas = 0;
  float eps = 0.0f;
  int* launched_ctas = nullptr;  // host memory, for the launcher only: receives the residual epilogue's grid
  // Experiments (INFERX_GEMV_NORM_EXP, read once; bit 1: the residual epilogue lets its dependents launch
  // only when it exits; bit 2: each warp sums the partials itself).
  bool late_trigger = false;
  bool warp_prenorm = false;
};

// 8 bytes of a streamed weight (v2 kernel).
__device__ __forceinline__ uint2 load_stream8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// 2 bytes of a streamed weight (v2 Q8_0: its blocks are 2-byte aligned).
__device__ __forceinline__ uint32_t load_stream2(const void* p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

struct DecodeBf16 {
  static constexpr int kElems = 8, kUnroll = 8;
  struct Raw {
    uint4 v;
  };
  __device__ static Raw load(const GemvParams&, const uint8_t* row, int64_t, int64_t g) {
    return {load_stream(row + g * 16)};
  }
  __device__ static void expand(const GemvParams&, const Raw& r, float* w) { bf16x8_to_float(r.v, w); }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

struct DecodeFp8 {
  static constexpr int kElems = 16, kUnroll = 8;
  struct Raw {
    uint4 v;
  };
  __device__ static Raw load(const GemvParams&, const uint8_t* row, int64_t, int64_t g) {
    return {load_stream(row + g * 16)};
  }
  __device__ static void expand(const GemvParams&, const Raw& r, float* w) {
    const uint32_t words[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const auto pair = static_cast<__nv_fp8x2_storage_t>((words[i] >> (16 * h)) & 0xffffu);
        const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const float2 f = __half22float2(__half2(raw));
        w[4 * i + 2 * h] = f.x;
        w[4 * i + 2 * h + 1] = f.y;
      }
    }
  }
  __device__ static float row_scale(const GemvParams& p, int64_t n) {
    const float* s = static_cast<const float*>(p.scale);
    return p.per_channel ? __ldg(s + n) : __ldg(s);
  }
};

// 32 columns per 16 bytes: byte j holds column j (low nibble) and column 16 + j (high nibble).
struct DecodeInt4 {
  static constexpr int kElems = 32, kUnroll = 8;
  struct Raw {
    uint4 v;
    float scale, zero;
  };
  __device__ static Raw load(const GemvParams& p, const uint8_t* row, int64_t n, int64_t g) {
    Raw r;
    r.v = load_stream(row + g * 16);
    const int64_t at = n * p.groups_per_row + (g >> p.group_shift);
    r.scale = __half2float(__ldg(static_cast<const __half*>(p.scale) + at));
    r.zero = p.zero ? static_cast<float>(__ldg(p.zero + at)) : 8.0f;
    return r;
  }
  __device__ static void expand(const GemvParams&, const Raw& r, float* w) {
    const uint32_t words[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
      w[j] = (static_cast<float>(byte & 15u) - r.zero) * r.scale;
      w[16 + j] = (static_cast<float>(byte >> 4) - r.zero) * r.scale;
    }
  }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

// GGUF Q8_0: 34-byte blocks (f16 d, 32 x int8), 2-byte aligned: read as 17 halfwords.
struct DecodeQ8_0 {
  static constexpr int kElems = 32, kUnroll = 4;
  struct Raw {
    uint16_t h[17];
  };
  __device__ static Raw load(const GemvParams&, const uint8_t* row, int64_t, int64_t g) {
    Raw r;
    const auto* b = reinterpret_cast<const unsigned short*>(row + g * 34);
#pragma unroll
    for (int i = 0; i < 17; ++i) r.h[i] = __ldg(b + i);
    return r;
  }
  __device__ static void expand(const GemvParams&, const Raw& r, float* w) {
    const float d = __half2float(__ushort_as_half(r.h[0]));
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[2 * i] = d * static_cast<float>(static_cast<int8_t>(r.h[1 + i] & 0xffu));
      w[2 * i + 1] = d * static_cast<float>(static_cast<int8_t>(r.h[1 + i] >> 8));
    }
  }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

// GGUF Q4_K: 144-byte super-blocks of 256 (16-byte aligned in a row). Granule = a quarter c of a block:
// elements 64c + l (low nibbles of qs[32c + l], sub-block 2c) and 64c + 32 + l (high nibbles, 2c + 1).
struct DecodeQ4K {
  static constexpr int kElems = 64, kUnroll = 4;
  struct Raw {
    uint4 head, q0, q1;
    int c;
  };
  __device__ static Raw load(const GemvParams&, const uint8_t* row, int64_t, int64_t g) {
    const uint8_t* block = row + (g >> 2) * 144;
    const int c = static_cast<int>(g & 3);
    Raw r;
    r.head = __ldg(reinterpret_cast<const uint4*>(block));  // shared by the block's four granules: cached
    r.q0 = load_stream(block + 16 + 32 * c);
    r.q1 = load_stream(block + 32 + 32 * c);
    r.c = c;
    return r;
  }
  __device__ static void expand(const GemvParams&, const Raw& r, float* w) {
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(r.head.x & 0xffffu)));
    const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(r.head.x >> 16)));
    const uint32_t sw[3] = {r.head.y, r.head.z, r.head.w};  // the 12 scale bytes
    auto s = [&](int i) { return (sw[i / 4] >> (8 * (i % 4))) & 0xffu; };
    float sc[2], mn[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * r.c + h;
      uint32_t a, b;
      if (j < 4) {
        a = s(j) & 63u;
        b = s(j + 4) & 63u;
      } else {
        a = (s(j + 4) & 15u) | ((s(j - 4) >> 6) << 4);
        b = (s(j + 4) >> 4) | ((s(j) >> 6) << 4);
      }
      sc[h] = d * static_cast<float>(a);
      mn[h] = dmin * static_cast<float>(b);
    }
    const uint32_t words[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const uint32_t byte = (words[l / 4] >> (8 * (l % 4))) & 0xffu;
      w[l] = sc[0] * static_cast<float>(byte & 15u) - mn[0];
      w[32 + l] = sc[1] * static_cast<float>(byte >> 4) - mn[1];
    }
  }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

// SiLU with the fast exponential: the decode GEMV's fused gate/up product (tests hold it to the CPU values
// within its BF16 tolerance); cuda_common.cuh's silu is the exact form.
__device__ __forceinline__ float silu_fast(float g) { return g / (1.0f + __expf(-g)); }

// v4's residual epilogue, lane 0: its rows' residual and norm weight, loaded when the warp starts the rows
// (their latency hidden behind the rows' weight stream), and the sum of squares of what it stored.
struct ResidualRows {
  float res[2] = {0.0f, 0.0f}, gam[2] = {0.0f, 0.0f};
  float ss = 0.0f;
};

// The warp's sums to its outputs (lane 0 stores): scale, bias, and with kSilu (R = 2: rows n and f + n)
// the SiLU product at column n; else each of the first `valid` rows wrow[r] of the stacked weight.
template <class Dec, int MR, int R, bool kSilu>
__device__ __forceinline__ void gemv_finish(const GemvParams& p, int64_t n, const int64_t (&wrow)[R],
                                            float (&acc)[R][MR], int valid, float in_scale = 1.0f,
                                            ResidualRows* rr = nullptr) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MR; ++i) acc[r][i] = warp_sum(acc[r][i]);
  if (lane != 0) return;
  float scale[R], bias[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    scale[r] = Dec::row_scale(p, wrow[r]) * in_scale;
    bias[r] = p.bias ? p.bias[wrow[r]] : 0.0f;
  }
  if constexpr (!kSilu) {
    if (rr != nullptr) {  // v4's residual epilogue: one output, one activation row
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= valid) break;
        const int64_t col = wrow[r];
        const float s = rr->res[r] + (acc[r][0] * scale[r] + bias[r]);
        p.residual[col] = s;
        p.normed[col] = __float2bfloat16_rn(s * rr->gam[r]);
        rr->ss += s * s;
      }
      return;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= valid) break;
      int o = 0;
      int64_t col = wrow[r];
      while (o + 1 < p.num_outs && col >= p.outs[o].count) col -= p.outs[o++].count;
      const GemvOutput out = p.outs[o];
#pragma unroll
      for (int i = 0; i < MR; ++i)
        if (i < p.m) out.data[i * out.ld + col] = acc[r][i] * scale[r] + bias[r];
    }
  } else {
    const GemvOutput out = p.outs[0];
#pragma unroll
    for (int i = 0; i < MR; ++i) {
      if (i < p.m) {
        const float g = acc[0][i] * scale[0] + bias[0], u = acc[1][i] * scale[1] + bias[1];
        const float v = silu_fast(g) * u;
        out.data[i * out.ld + n] = v;
        if (p.out_bf16) p.out_bf16[i * p.f + n] = __float2bfloat16_rn(v);
      }
    }
  }
}

// The weight rows a warp takes (v1, v2, v4): with kSilu (R = 2) warp row n is gate row n and up row f + n
// (p.rows = f warp rows); otherwise rows Rn .. Rn + R - 1 (ceil(rows / R) warp rows; with an odd row count
// the last warp's second row reads the first again, unstored). Returns how many of wrow are stored.
template <int R, bool kSilu>
__host__ __device__ __forceinline__ int64_t warp_row_count(const GemvParams& p) {
  return kSilu ? p.rows : (p.rows + R - 1) / R;
}
template <int R, bool kSilu>
__device__ __forceinline__ int warp_rows(const GemvParams& p, int64_t n, int64_t (&wrow)[R]) {
  static_assert(R == 1 || R == 2, "one or two weight rows per warp");
  if constexpr (kSilu) {
    wrow[0] = n;
    wrow[1] = n + p.f;
    return 2;
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) wrow[r] = n * R + r;
    if (wrow[R - 1] < p.rows) return R;
    wrow[R - 1] = wrow[0];
    return 1;
  }
}

// One batch of v1 (v4: its loads): the loads of granules g0, g0 + 32, ... (U of them, those below
// `granules`) of the R weight rows, and their products with the activation rows.
template <class Dec, int R, int U>
__device__ __forceinline__ void load_granules(const GemvParams& p, const int64_t (&wrow)[R], int64_t g0,
                                              int64_t granules, typename Dec::Raw (&raw)[R][U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t g = g0 + static_cast<int64_t>(kWarp) * u;
    if (g < granules) {
#pragma unroll
      for (int r = 0; r < R; ++r) raw[r][u] = Dec::load(p, p.w + wrow[r] * p.row_bytes, wrow[r], g);
    }
  }
}
template <class Dec, int MR, int R, int U>
__device__ __forceinline__ void dot_granules(const GemvParams& p, const typename Dec::Raw (&raw)[R][U],
                                             int64_t g0, int64_t granules, float (&acc)[R][MR]) {
  constexpr int E = Dec::kElems;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t g = g0 + static_cast<int64_t>(kWarp) * u;
    if (g >= granules) break;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float w[E];
      Dec::expand(p, raw[r][u], w);
#pragma unroll
      for (int i = 0; i < MR; ++i) {
        if (i < p.m) {
          const uint4* xp = reinterpret_cast<const uint4*>(p.x + i * p.k + g * E);
#pragma unroll
          for (int c = 0; c < E / 8; ++c) {
            float xv[8];
            bf16x8_to_float(__ldg(xp + c), xv);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][i] = fmaf(w[8 * c + e], xv[e], acc[r][i]);
          }
        }
      }
    }
  }
}

// R = 1: warp row n of the weight; R = 2: rows n (gate) and f + n (up), written as silu(g) * u.
template <class Dec, int MR, int R>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const GemvParams p) {
  constexpr int E = Dec::kElems, U = Dec::kUnroll;
  const int lane = threadIdx.x % kWarp;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  if (n >= p.rows) return;
  int64_t wrow[R];
  warp_rows<R, R == 2>(p, n, wrow);
  bool waited = false;  // the first batch of weight loads is issued before waiting for x (cuda_common.cuh)
  float acc[R][MR];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MR; ++i) acc[r][i] = 0.0f;

  const int64_t granules = p.k / E;
  for (int64_t g0 = lane; g0 < granules; g0 += kWarp * U) {
    typename Dec::Raw raw[R][U];
    load_granules<Dec, R, U>(p, wrow, g0, granules, raw);
    if (!waited) {
      pdl_wait();
      waited = true;
    }
    dot_granules<Dec, MR, R, U>(p, raw, g0, granules, acc);
  }
  if (!waited) pdl_wait();  // no granule for this lane: it still stores (lane 0) after the wait
  pdl_launch_dependents();  // after the weight stream (see the file comment)
  gemv_finish<Dec, MR, R, R == 2>(p, n, wrow, acc, 1);
}

// ---- v4: v1's decoders (BF16, FP8) and StreamInt4 (INT4), one activation row, on persistent warps that
// keep the next batch of weight loads in flight while they convert and multiply the current one. v1 gives
// each warp one row and each CTA one launch slot: an FP8 row of 4096 columns is a single batch of loads, so
// a warp loads, waits a whole DRAM latency, computes and exits, and a 6144-row product runs in 1.5 waves of
// CTAs (ncu, H200, 2026-12-03: the qkv GEMV at 38% of DRAM throughput, warps stalled on long scoreboard, 8
// CTAs per SM by registers). Here the grid is one wave (CTAs per SM from the occupancy calculator), warp w
// takes rows w, w + W, ... (W warps in all) as one stream of batches of U granules per lane, and issues
// batch i + 1's loads before it uses batch i, across row ends too.
// kSilu (R = 2): the SiLU product; R = 2 without it: a plain product two rows per warp (x converted once
// for both; INFERX_GEMV_V4_PAIRS).
//
// Shared-memory prefetch (p.pf_batches > 0, dynamic shared memory = gemv_v4_smem_bytes): before it waits for
// the previous kernel a warp asks the copy engine (cp.async.bulk) for the first pf_batches batches of its
// first row(s) into shared memory, so the stream does not stop across the kernel boundary: the registers hold
// one batch, shared memory as many as the budget gives (gemv_v4_staged_batches; at the default 96 KB half of
// an FP8 4096-column row pair for the o projection's 4 CTAs per SM), and the copy needs no registers while
// the previous kernel (RMSNorm, attention) runs. Those batches are then read from shared memory.
// Bytes of one row per batch of U 16-byte granules per lane (v4's formats: BF16, FP8, INT4).
__host__ __device__ constexpr int64_t v4_batch_row_bytes(int u) { return int64_t{kWarp} * u * 16; }
constexpr int kV4BarBytes = 128;  // the CTA's mbarriers (one per warp), then the warps' stages

// INT4 on v4 (kernels_gemv_decode.h int4_run_dot): a granule is a 32-column run, multiplied without
// per-weight conversions, given the run's sum X of x. x comes from shared memory, where each CTA puts it
// once (after the PDL wait) with every run's X: v1's way of reading x (each lane 64 bytes of x per run, at
// the run's stride: each of its four 16-byte loads touches 16 L1 lines) would take some 64 L1 wavefronts per
// 32 runs against the 4 of a row's weights (an estimate, not profiled), and converting x from BF16 costs
// half an instruction per weight at two rows per warp.
// kF32: x as F32 (8 16-byte loads per run, no conversion; 4.6 bytes of shared memory per column), else
// as its BF16 (4 loads and 32 conversions per run; 2.6 bytes per column) - the launcher takes F32 where it
// costs no CTAs per SM (v4_x_f32). Each run's x is padded by 16 bytes (144 / 80 bytes): the 8 lanes of a
// quarter-warp, whose runs are consecutive, then read 8 distinct bank groups. The group scale and zero
// point are loaded with the weights (a batch ahead; for staged batches from global memory), one word per
// run (int4_scale_zero); the run's term is scale * (S - f(z) X) and the row's sum is multiplied by 256 at
// the row's end (the scale stays outside row_scale, which is 1).
template <bool kF32>
struct StreamInt4 {
  static constexpr int kElems = 32;
  static constexpr int kXStride = kF32 ? 144 : 80;  // bytes per run of x in shared memory
  struct Raw {
    uint4 v;
    uint32_t sz;  // the run's group scale (F16 bits) | zero point << 16
  };
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }

  // Shared memory after the staging: X of every run (F32, 16-byte aligned), then x.
  __host__ __device__ static int64_t sums_bytes(int64_t k) { return (k / 32 * 4 + 15) / 16 * 16; }
  __host__ __device__ static int64_t bytes(int64_t k) { return sums_bytes(k) + k / 32 * kXStride; }

  // Run g of x (its 64 bytes of BF16) into shared memory with its X.
  __device__ static void put_x(const GemvParams& p, uint8_t* sm, int g) {
    const uint4* xp = reinterpret_cast<const uint4*>(p.x) + 4 * g;
    uint4 raw[4];
    float xv[32];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      raw[c] = __ldg(xp + c);
      bf16x8_to_float(raw[c], xv + 8 * c);
    }
    reinterpret_cast<float*>(sm)[g] = gemv::int4_run_sum(xv);
    uint8_t* at = sm + sums_bytes(p.k) + int64_t{g} * kXStride;
#pragma unroll
    for (int c = 0; c < (kF32 ? 8 : 4); ++c) {
      if constexpr (kF32)
        reinterpret_cast<float4*>(at)[c] =
            make_float4(xv[4 * c], xv[4 * c + 1], xv[4 * c + 2], xv[4 * c + 3]);
      else
        reinterpret_cast<uint4*>(at)[c] = raw[c];
    }
  }
  // Run g's x and X from shared memory (sums: the X table, x: the runs).
  __device__ static void get_x(const float* sums, const uint8_t* x, int g, float (&xv)[32], float& xsum) {
    xsum = sums[g];
    const uint8_t* at = x + g * kXStride;
#pragma unroll
    for (int c = 0; c < (kF32 ? 8 : 4); ++c) {
      if constexpr (kF32) {
        const float4 t = reinterpret_cast<const float4*>(at)[c];
        xv[4 * c] = t.x;
        xv[4 * c + 1] = t.y;
        xv[4 * c + 2] = t.z;
        xv[4 * c + 3] = t.w;
      } else {
        bf16x8_to_float(reinterpret_cast<const uint4*>(at)[c], xv + 8 * c);
      }
    }
  }
  __device__ static void dot(const Raw& r, const float (&xv)[32], float xsum, float& acc) {
    acc = gemv::int4_run_term({r.v.x, r.v.y, r.v.z, r.v.w}, r.sz, xv, xsum, acc);
  }

  // A batch's loads (granules g0, g0 + 32, ... below `granules` of the R rows): the weights (kWeights;
  // else they come from shared memory) and each run's scale and zero point (kZero; else 8). SH =
  // group_shift: 2^SH runs per group, so that the lane's successive runs (32 apart) are 32 >> SH groups
  // apart: immediate offsets. Offsets within the weight in 32 bits (the launcher checks that they fit).
  template <int SH, bool kZero, bool kWeights, int R, int U>
  __device__ static void load_batch_of(const GemvParams& p, const int64_t (&rows)[R], int64_t g0,
                                       int64_t granules, Raw (&raw)[R][U]) {
    constexpr int kGroupStride = kWarp >> SH;
    const uint32_t g = static_cast<uint32_t>(g0), runs = static_cast<uint32_t>(granules);
    const uint8_t* const wg = p.w + 16 * g0;
    const uint8_t* w[R];
    const unsigned short* s[R];
    const uint8_t* z[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t row = static_cast<uint32_t>(rows[r]);
      const uint32_t at = row * static_cast<uint32_t>(p.groups_per_row) + (g >> SH);
      w[r] = wg + static_cast<uint64_t>(row) * static_cast<uint32_t>(p.row_bytes);
      s[r] = static_cast<const unsigned short*>(p.scale) + at;
      if constexpr (kZero) z[r] = p.zero + at;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (g + kWarp * u < runs) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if constexpr (kWeights) raw[r][u].v = load_stream(w[r] + v4_batch_row_bytes(u));
          const uint32_t scale = __ldg(s[r] + u * kGroupStride);
          if constexpr (kZero)
            raw[r][u].sz = gemv::int4_scale_zero(scale, __ldg(z[r] + u * kGroupStride));
          else
            raw[r][u].sz = scale | 8u << 16;  // int4_scale_zero(scale, 8)
        }
      }
    }
  }
  template <bool kWeights, int R, int U>
  __device__ static void load_batch(const GemvParams& p, const int64_t (&rows)[R], int64_t g0,
                                    int64_t granules, Raw (&raw)[R][U]) {
    const int sh = p.group_shift;
    if (p.zero != nullptr) {
      if (sh == 0)
        load_batch_of<0, true, kWeights>(p, rows, g0, granules, raw);
      else if (sh == 1)
        load_batch_of<1, true, kWeights>(p, rows, g0, granules, raw);
      else
        load_batch_of<2, true, kWeights>(p, rows, g0, granules, raw);
    } else {
      if (sh == 0)
        load_batch_of<0, false, kWeights>(p, rows, g0, granules, raw);
      else if (sh == 1)
        load_batch_of<1, false, kWeights>(p, rows, g0, granules, raw);
      else
        load_batch_of<2, false, kWeights>(p, rows, g0, granules, raw);
    }
  }
  // Whether the 32-bit offsets of load_batch_of hold for a weight of `rows` rows.
  static bool offsets_fit(const GemvParams& p, int64_t rows) {
    return rows * p.row_bytes < (int64_t{1} << 31) && rows * p.groups_per_row < (int64_t{1} << 31);
  }
};
template <class Dec>
constexpr bool kStreamInt4 = false;
template <bool kF32>
constexpr bool kStreamInt4<StreamInt4<kF32>> = true;

template <class Dec, int R, int U, bool kSilu>
__global__ void __launch_bounds__(kGemvThreads) gemv_stream_kernel(const GemvParams p) {
  using Raw = typename Dec::Raw;
  constexpr bool kInt4 = kStreamInt4<Dec>;  // x from shared memory, filled by the whole CTA
  extern __shared__ __align__(128) uint8_t v4_smem[];
  const int lane = threadIdx.x % kWarp, wib = threadIdx.x / kWarp;
  // K split (p.ksplit = ks): warps wib = j * ks .. j * ks + ks - 1 of a CTA take the same row groups, warp
  // seg = wib % ks batches [seg, seg + 1) * batches / ks of each; the group's first warp adds the others'
  // sums (shared memory, a named barrier per group) and stores. ks = 1: every warp its own rows.
  const int ks = p.ksplit, seg = wib % ks;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kGemvWarps / ks);  // row-group slots
  const int64_t nrows = warp_row_count<R, kSilu>(p);
  int64_t n = static_cast<int64_t>(blockIdx.x) * (kGemvWarps / ks) + wib / ks;
  // The norm fusion's CTA-wide sums and INT4's x in shared memory need every warp, rows or not.
  const bool active = n < nrows, cta_wide = p.residual != nullptr || p.in_partials != nullptr || kInt4;
  if (!active && !cta_wide) return;
  __shared__ float sums[kWarp];
  __shared__ float split_sums[2][kGemvWarps][R];  // K split: each warp's sums, by the group's round parity
  float in_scale = 1.0f;
  ResidualRows rr;
  // Lane 0 loads row group g's residual and norm weight for the epilogue (p.residual; after the PDL wait:
  // the previous kernels write the residual).
  auto load_residual_rows = [&](int64_t g) {
    if (p.residual == nullptr || lane != 0) return;
    int64_t rows[R];
    const int valid = warp_rows<R, kSilu>(p, g, rows);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < valid) {
        rr.res[r] = p.residual[rows[r]];
        rr.gam[r] = __ldg(p.norm_weight + rows[r]);
      }
    }
  };
  const int64_t n0 = n;  // the warp's first row (group): its first p.pf_batches batches are staged
  const int64_t pf_bytes = p.pf_batches * v4_batch_row_bytes(U);
  uint64_t* bar = reinterpret_cast<uint64_t*>(v4_smem) + wib;
  uint8_t* stage = v4_smem + kV4BarBytes + wib * R * pf_bytes;
  // INT4: the runs' sums X and x, after the staging (StreamInt4::bytes).
  uint8_t* const xsm = v4_smem + (p.pf_batches > 0 ? kV4BarBytes + kGemvWarps * R * pf_bytes : 0);
  // Batch b_lo + batch (batch < p.pf_batches) of row group n0 from shared memory: the same lanes' granules
  // as from global.
  auto load_staged = [&](int batch, Raw(&raw)[R][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t g = static_cast<int64_t>(batch) * kWarp * U + kWarp * u + lane;
#pragma unroll
      for (int r = 0; r < R; ++r)
        raw[r][u].v = *reinterpret_cast<const uint4*>(stage + r * pf_bytes + g * 16);
    }
  };
  const int64_t granules = p.k / Dec::kElems;
  const int batches = static_cast<int>((granules + kWarp * U - 1) / (kWarp * U));
  // This warp's batches of each row: [b_lo, b_hi) (the launcher makes ks divide batches).
  const int b_lo = seg * (batches / ks), b_hi = b_lo + batches / ks;
  auto first = [&](int batch) { return static_cast<int64_t>(batch) * kWarp * U + lane; };
  int b = b_lo;  // the batch of row n that `cur` holds
  int parity = 0;
  float acc[R][1];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;

  // Uses `cur` (batch b of row n) and fills `nxt` with the warp's next batch; false after the last.
  auto step = [&](Raw(&cur)[R][U], Raw(&nxt)[R][U]) {
    int64_t next_n = n;
    int next_b = b + 1;
    if (next_b == b_hi) {
      next_b = b_lo;
      next_n = n + warps;
    }
    const bool more = next_n < nrows;
    if (more && next_n == n0 && next_b - b_lo < p.pf_batches) {
      load_staged(next_b - b_lo, nxt);
      if constexpr (kInt4) {  // the staged runs' scales and zero points
        int64_t next_rows[R];
        warp_rows<R, kSilu>(p, next_n, next_rows);
        Dec::template load_batch<false>(p, next_rows, first(next_b), granules, nxt);
      }
    } else if (more) {
      int64_t next_rows[R];
      warp_rows<R, kSilu>(p, next_n, next_rows);
      if constexpr (kInt4)
        Dec::template load_batch<true>(p, next_rows, first(next_b), granules, nxt);
      else
        load_granules<Dec, R, U>(p, next_rows, first(next_b), granules, nxt);
    } else {
      if (!p.late_trigger) pdl_launch_dependents();  // after the weight stream (see the file comment)
    }
    // Not dot_granules (v1's order: each weight granule expanded, then x loaded per 8 columns and row): x's
    // granule loaded and converted once for the R rows, then their weights. With dot_granules v4 measured
    // 4.5% slower end to end at batch 1 (fp8:lm_head 338.3-339.7 vs 354.2-356.4 tok/s, H200 2026-12-03
    // 13:52, the same call); the cause (instruction order or the extra x conversion of R = 2) was not
    // profiled.
    if constexpr (kInt4) {  // x and the run's X from shared memory, then each row's run term (32-bit indices)
      const int g0 = static_cast<int>(first(b)), runs = static_cast<int>(granules);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int g = g0 + kWarp * u;
        if (g >= runs) break;
        float xv[32], xsum;
        Dec::get_x(reinterpret_cast<const float*>(xsm), xsm + Dec::sums_bytes(p.k), g, xv, xsum);
#pragma unroll
        for (int r = 0; r < R; ++r) Dec::dot(cur[r][u], xv, xsum, acc[r][0]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t g = first(b) + static_cast<int64_t>(kWarp) * u;
        if (g >= granules) break;
        constexpr int E = Dec::kElems;
        const uint4* xp = reinterpret_cast<const uint4*>(p.x + g * E);
        float xv[E];
#pragma unroll
        for (int c = 0; c < E / 8; ++c) bf16x8_to_float(__ldg(xp + c), xv + 8 * c);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float w[E];
          Dec::expand(p, cur[r][u], w);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[r][0] = fmaf(w[e], xv[e], acc[r][0]);
        }
      }
    }
    if (next_n != n) {  // row n is complete (this warp's part of it)
      if constexpr (kInt4) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] *= gemv::kInt4RunFactor;  // exact: the runs' terms were S / 256
      }
      if (ks > 1) {
        // The group's sums: each warp's into shared memory, the group's first warp adds them in order
        // (deterministic) and stores through gemv_finish (lane 0 holds the total, the others 0).
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] = warp_sum(acc[r][0]);
        if (lane == 0) {
#pragma unroll
          for (int r = 0; r < R; ++r) split_sums[parity][wib][r] = acc[r][0];
        }
        named_barrier_sync(1 + wib / ks, ks * kWarp);
        if (seg == 0) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float total = 0.0f;
            for (int j = 0; j < ks; ++j) total += split_sums[parity][wib + j][r];
            acc[r][0] = lane == 0 ? total : 0.0f;
          }
        }
        parity ^= 1;  // a group's warps meet at every round's barrier: two slots never race
      }
      if (seg == 0) {
        int64_t wrow[R];
        const int valid = warp_rows<R, kSilu>(p, n, wrow);
        gemv_finish<Dec, 1, R, kSilu>(p, n, wrow, acc, valid, in_scale, p.residual ? &rr : nullptr);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
      if (more) load_residual_rows(next_n);
    }
    n = next_n;
    b = next_b;
    return more;
  };

  Raw a[R][U], c[R][U];
  int64_t wrow[R];
  if (active) warp_rows<R, kSilu>(p, n, wrow);
  const bool staged = active && p.pf_batches > 0;
  if (staged) {
    if (lane == 0) {
      mbar_init(bar, 1);
      mbar_init_fence();
      mbar_expect_tx(bar, static_cast<uint32_t>(R * pf_bytes));
#pragma unroll
      for (int r = 0; r < R; ++r)
        bulk_copy(stage + r * pf_bytes, p.w + wrow[r] * p.row_bytes + b_lo * v4_batch_row_bytes(U),
                  static_cast<uint32_t>(pf_bytes), bar);
    }
    __syncwarp();
    if constexpr (kInt4) Dec::template load_batch<false>(p, wrow, first(b_lo), granules, a);  // scales, zeros
  } else if (active) {
    if constexpr (kInt4)
      Dec::template load_batch<true>(p, wrow, first(b_lo), granules, a);
    else
      load_granules<Dec, R, U>(p, wrow, first(b_lo), granules, a);
  }
  pdl_wait();  // the staged batches or the first batch are in flight (cuda_common.cuh)
  if (!active && !p.late_trigger) pdl_launch_dependents();  // no weights to stream (others: after theirs)
  if constexpr (kInt4) {  // x (written by the previous kernel) and its run sums, once per CTA
    for (int g = threadIdx.x; g < granules; g += kGemvThreads) Dec::put_x(p, xsm, g);
    __syncthreads();
  }
  if (p.in_partials != nullptr) {
    // The residual epilogue's partial sums of squares, summed in a fixed order (deterministic), while
    // the first weights arrive.
    float ss = 0.0f;
    if (p.warp_prenorm) {  // each warp on its own: no CTA barrier
#pragma unroll 4
      for (int i = lane; i < p.in_ctas; i += kWarp) ss += p.in_partials[i];
      ss = warp_sum(ss);
    } else {
#pragma unroll 4
      for (int i = threadIdx.x; i < p.in_ctas; i += kGemvThreads) ss += p.in_partials[i];
      ss = block_sum(ss, sums);
    }
    in_scale = rsqrtf(ss / static_cast<float>(p.k) + p.eps);
  }
  if (active) {
    load_residual_rows(n);
    if (staged) {
      mbar_wait(bar, 0);
      load_staged(0, a);
    }
    while (step(a, c) && step(c, a)) {
    }
  }
  if (p.residual != nullptr) {
    const float ss = block_sum(rr.ss, sums);  // lane 0 of each warp holds its rows' sum
    if (threadIdx.x == 0) p.partials[blockIdx.x] = ss;
  }
}

// ---- v2: 8 columns per lane and step (kernels_gemv_decode.h). The lanes of a warp read 512 contiguous
// bytes of x per load (v1: a granule's 32 to 128 bytes per lane, at the granule's stride: 4 to 16 L1
// wavefronts per load where 4 suffice), weights decode without integer-to-float conversions, and the
// INT4 / Q8_0 / Q4_K block scales multiply the step's 8-term partial sum once (v1: every element).
// decode() turns a step's raw bytes into W; dot() adds W . x (8 columns of one row of x) to acc.

struct StepW {
  float w[8];
  float scale, min;
};

// A decoder's Row is a lane's cursor at its first step s0 of a batch in one weight row: the weight bytes
// of step s0 + 32u lie u * kStride bytes further (kernels_gemv_decode.h's offsets are linear in steps of
// 32), and everything decode() derives from the step depends only on s & 31, the lane's, so s0 serves.
struct StepFp8 {
  static constexpr int kUnroll = 16, kStride = gemv::kFp8Stride;
  struct Raw {
    uint2 v;
  };
  struct Row {
    const uint8_t* w;
  };
  __device__ static Row row(const GemvParams& p, int64_t n, int s0) {
    return {p.w + n * p.row_bytes + gemv::fp8_offset(s0)};
  }
  __device__ static Raw load(const Row& c, int u) { return {load_stream8(c.w + u * kStride)}; }
  __device__ static void decode(const Raw& r, int, StepW& w) { gemv::fp8x8(r.v.x, r.v.y, w.w); }
  __device__ static void dot(const StepW& w, const float* x, float& acc) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(w.w[e], x[e], acc);
  }
  __device__ static float row_scale(const GemvParams& p, int64_t n) { return DecodeFp8::row_scale(p, n); }
};

// The step's partial sum times the step's block scale.
__device__ __forceinline__ void dot_scaled(const StepW& w, const float* x, float& acc) {
  float part = w.w[0] * x[0];
#pragma unroll
  for (int e = 1; e < 8; ++e) part = fmaf(w.w[e], x[e], part);
  acc = fmaf(part, w.scale, acc);
}

// SH = log2(group / 8): a group is 2^SH steps, 32 steps span 32 >> SH groups (a template parameter so
// that the scale / zero point loads of a batch are immediate offsets).
template <int SH>
struct StepInt4 {
  static constexpr int kUnroll = 16, kStride = gemv::kInt4Stride, kGroupStride = kWarp >> SH;
  struct Raw {
    uint2 v;
    uint32_t sz;  // the group's F16 scale bits | its zero point << 16 (one register of the batch's 16)
  };
  struct Row {
    const uint8_t* w;
    const unsigned short* scale;  // the group of step s0; step s0 + 32u: u * kGroupStride further
    const uint8_t* zero;          // the same, or null
  };
  __device__ static Row row(const GemvParams& p, int64_t n, int s0) {
    const int64_t at = n * p.groups_per_row + (s0 >> SH);
    return {p.w + n * p.row_bytes + gemv::int4_offset(s0), static_cast<const unsigned short*>(p.scale) + at,
            p.zero ? p.zero + at : nullptr};
  }
  __device__ static Raw load(const Row& c, int u) {
    Raw r;
    r.v = load_stream8(c.w + u * kStride);
    const uint32_t zero = c.zero ? static_cast<uint32_t>(__ldg(c.zero + u * kGroupStride)) : 8u;
    r.sz = static_cast<uint32_t>(__ldg(c.scale + u * kGroupStride)) | (zero << 16);
    return r;
  }
  __device__ static void decode(const Raw& r, int s0, StepW& w) {
    gemv::int4x8(r.v.x, r.v.y, gemv::int4_shift(s0), gemv::magic(r.sz >> 16), w.w);
    w.scale = gemv::half_float(static_cast<uint16_t>(r.sz & 0xffffu));
  }
  __device__ static void dot(const StepW& w, const float* x, float& acc) { dot_scaled(w, x, acc); }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

struct StepQ8_0 {
  static constexpr int kUnroll = 8, kStride = gemv::kQ8_0Stride;
  struct Raw {
    uint32_t d, q[4];  // f16 bits of the block scale; the step's 8 quants as 4 halfwords
  };
  struct Row {
    const uint8_t* d;  // the block of step s0
    const uint8_t* q;  // its 8 quants
  };
  __device__ static Row row(const GemvParams& p, int64_t n, int s0) {
    const uint8_t* r = p.w + n * p.row_bytes;
    return {r + gemv::q8_0_block_offset(s0), r + gemv::q8_0_offset(s0)};
  }
  __device__ static Raw load(const Row& c, int u) {
    Raw r;
    r.d = __ldg(reinterpret_cast<const unsigned short*>(c.d + u * kStride));
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = load_stream2(c.q + u * kStride + 2 * i);
    return r;
  }
  __device__ static void decode(const Raw& r, int, StepW& w) {
    gemv::q8x8(r.q[0] | (r.q[1] << 16), r.q[2] | (r.q[3] << 16), w.w);
    w.scale = gemv::half_float(static_cast<uint16_t>(r.d));
  }
  __device__ static void dot(const StepW& w, const float* x, float& acc) { dot_scaled(w, x, acc); }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

struct StepQ4K {
  static constexpr int kUnroll = 8, kStride = gemv::kQ4KStride;
  struct Raw {
    uint4 head;  // d, dmin, the 12 scale bytes: one block for the whole warp's step (cached)
    uint2 v;
  };
  struct Row {
    const uint8_t* head;  // the block of step s0
    const uint8_t* q;     // its 8 quant bytes
  };
  __device__ static Row row(const GemvParams& p, int64_t n, int s0) {
    const uint8_t* r = p.w + n * p.row_bytes;
    return {r + gemv::q4_k_block_offset(s0), r + gemv::q4_k_offset(s0)};
  }
  __device__ static Raw load(const Row& c, int u) {
    Raw r;
    r.head = __ldg(reinterpret_cast<const uint4*>(c.head + u * kStride));
    r.v = load_stream8(c.q + u * kStride);
    return r;
  }
  __device__ static void decode(const Raw& r, int s0, StepW& w) {
    gemv::q4_k_x8(r.v.x, r.v.y, gemv::q4_k_shift(s0), w.w);
    gemv::q4_k_scale_min(r.head.x, r.head.y, r.head.z, r.head.w, gemv::q4_k_sub_block(s0), &w.scale, &w.min);
  }
  // sum (scale q - min) x = scale (sum q x) - min (sum x)
  __device__ static void dot(const StepW& w, const float* x, float& acc) {
    float part = w.w[0] * x[0], sx = x[0];
#pragma unroll
    for (int e = 1; e < 8; ++e) {
      part = fmaf(w.w[e], x[e], part);
      sx += x[e];
    }
    acc = fmaf(part, w.scale, fmaf(-w.min, sx, acc));
  }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

// kSilu (R = 2): warp n takes rows n (gate) and f + n (up), written as silu(g) * u. Else warp n takes the
// R rows Rn.. of the weight (those below p.rows; a missing second row reads the first again, unstored).
// Lane l takes steps l, l + 32, ... (8 columns each); the weight loads of kUnroll (R = 2: half as many)
// steps are issued before any is decoded; x is read once per step and row of x for the R weight rows.
template <class Dec, int MR, int R, bool kSilu>
__global__ void __launch_bounds__(kGemvThreads) gemv8_kernel(const GemvParams p) {
  constexpr int U = R == 1 ? Dec::kUnroll : Dec::kUnroll / 2;
  const int lane = threadIdx.x % kWarp;
  bool waited = false;  // as gemv_kernel: the first weight loads go out before the wait
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  if (n >= warp_row_count<R, kSilu>(p)) return;
  int64_t wrow[R];
  const int valid = warp_rows<R, kSilu>(p, n, wrow);
  float acc[R][MR];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MR; ++i) acc[r][i] = 0.0f;

  const int steps = static_cast<int>(p.k / 8);
  for (int s0 = lane; s0 < steps; s0 += kWarp * U) {
    typename Dec::Raw raw[R][U];
    typename Dec::Row rc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rc[r] = Dec::row(p, wrow[r], s0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s0 + kWarp * u < steps) {
#pragma unroll
        for (int r = 0; r < R; ++r) raw[r][u] = Dec::load(rc[r], u);
      }
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s0 + kWarp * u >= steps) break;
      StepW w[R];
#pragma unroll
      for (int r = 0; r < R; ++r) Dec::decode(raw[r][u], s0, w[r]);
#pragma unroll
      for (int i = 0; i < MR; ++i) {
        if (i < p.m) {
          // step s0 + 32u of row i of x: 8 BF16 = one uint4
          const uint4* xr = reinterpret_cast<const uint4*>(p.x + i * p.k) + s0;
          float xv[8];
          bf16x8_to_float(__ldg(xr + kWarp * u), xv);
#pragma unroll
          for (int r = 0; r < R; ++r) Dec::dot(w[r], xv, acc[r][i]);
        }
      }
    }
  }
  if (!waited) pdl_wait();
  pdl_launch_dependents();  // after the weight stream (see the file comment)
  gemv_finish<Dec, MR, R, kSilu>(p, n, wrow, acc, valid);
}

// ---- v3: the dot products on tensor cores (kernels_gemv_decode.h, "v3"). A CTA takes 16 weight rows, the
// A operand of mma.m16n8k16 (lane (g, t) streams rows g and g + 8), and splits K among its warps, which
// meet in shared memory at the end. x is the B operand: column n holds activation row n / S on the
// columns of subset n % S (S = 1, or the INT4 groups of a 128-column set; other columns and subsets are
// zeros), so at M = 1 the product wastes 7 of 8 columns and costs one instruction per 256 weights: what
// remains per weight is its decode to BF16 (none for BF16, ~2.5 instructions per E4M3 code, 1.5 per INT4
// code) instead of v1's conversions and FMAs, and rows of x up to 16 / S ride along (16: two products).
// A chunk's products accumulate in a fresh F32 fragment that is then added (INT4: times its group scale)
// to the running sum, so that each tensor-core sum is short.

namespace tc {
constexpr int kRows = 16;     // weight rows per CTA (the m of m16n8k16)
constexpr int kMaxWarps = 8;  // warps splitting K
constexpr int kUnroll = 4;    // sets per lane and batch: 8 chunk loads (two rows) in flight, 4 KB per warp
}  // namespace tc

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Per format: the chunk decoder (kernels_gemv_decode.h) and the per-row scale; INT4 also reads a zero
// point per chunk and group scales per set (kGroups).
struct TcStepBf16 : gemv::TcBf16 {
  static constexpr bool kGroups = false;
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};
struct TcStepFp8 : gemv::TcFp8 {
  static constexpr bool kGroups = false;
  __device__ static float row_scale(const GemvParams& p, int64_t n) { return DecodeFp8::row_scale(p, n); }
};
struct TcStepInt4 : gemv::TcInt4 {
  static constexpr bool kGroups = true;
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

// Weight row of the CTA's A row r: rows 16b.. (clamped: a missing row reads the last one, unstored), or
// with kSilu gate rows 8b.. (r < 8) over their up rows f + 8b.. (r >= 8).
template <bool kSilu>
__device__ __forceinline__ int64_t tc_row(const GemvParams& p, int r) {
  if constexpr (kSilu) {
    const int64_t j = static_cast<int64_t>(blockIdx.x) * 8 + (r & 7);
    return (r < 8 ? 0 : p.f) + (j < p.f ? j : p.f - 1);
  } else {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * tc::kRows + r;
    return row < p.rows ? row : p.rows - 1;
  }
}

// The CTA's sums (shared memory: per warp, A row, column) to the outputs: scale, bias, split outputs or
// the SiLU product. Warps and subsets are added in a fixed order (deterministic).
template <class Dec, int MR, int S, bool kSilu>
__device__ __forceinline__ void tc_finish(const GemvParams& p,
                                          const float (&red)[tc::kMaxWarps][tc::kRows][16], int nwarps) {
  auto value = [&](int i, int r, int64_t row) {
    float v = 0.0f;
    for (int w = 0; w < nwarps; ++w)
#pragma unroll
      for (int s = 0; s < S; ++s) v += red[w][r][i * S + s];
    return v * Dec::row_scale(p, row) + (p.bias ? p.bias[row] : 0.0f);
  };
  if constexpr (!kSilu) {
    for (int e = threadIdx.x; e < MR * tc::kRows; e += blockDim.x) {
      const int i = e / tc::kRows, r = e % tc::kRows;
      const int64_t row = static_cast<int64_t>(blockIdx.x) * tc::kRows + r;
      if (i >= p.m || row >= p.rows) continue;
      int o = 0;
      int64_t col = row;
      while (o + 1 < p.num_outs && col >= p.outs[o].count) col -= p.outs[o++].count;
      p.outs[o].data[i * p.outs[o].ld + col] = value(i, r, row);
    }
  } else {
    for (int e = threadIdx.x; e < MR * 8; e += blockDim.x) {
      const int i = e / 8, j = e % 8;
      const int64_t col = static_cast<int64_t>(blockIdx.x) * 8 + j;
      if (i >= p.m || col >= p.f) continue;
      const float v = silu_fast(value(i, j, col)) * value(i, 8 + j, p.f + col);
      p.outs[0].data[i * p.outs[0].ld + col] = v;
      if (p.out_bf16) p.out_bf16[i * p.f + col] = __float2bfloat16_rn(v);
    }
  }
}

// MR: activation rows (p.m <= MR, MR * S <= 16: NT = 1 or 2 products of 8 columns; tc_finish reads
// columns below MR * S only). A row is whole sets (row_bytes a multiple of 64: launch_format). Warp w
// takes a contiguous range of sets (4 chunks: chunk 4c + t for lane t); each batch issues kUnroll sets of
// loads per lane (two rows, plus INT4 zero points and group scales) before decoding any. Offsets within
// a batch are immediates: the lane's pointers advance once per batch.
template <class Dec, int MR, int S, bool kSilu>
__global__ void __launch_bounds__(tc::kMaxWarps* kWarp) gemv_tc_kernel(const GemvParams p) {
  static_assert(MR * S <= 16, "B columns: activation rows x subsets, two products at most");
  constexpr int U = tc::kUnroll, NT = MR * S > 8 ? 2 : 1, kX = Dec::kCols / 8;  // kX: x loads per chunk
  constexpr int kCS = S == 1 ? 1 : 2;  // distinct subsets among the C fragment's columns 2t, 2t + 1
  __shared__ float red[tc::kMaxWarps][tc::kRows][16];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = tc_row<kSilu>(p, g), row1 = tc_row<kSilu>(p, g + 8);
  const int chunks = static_cast<int>(p.row_bytes / 16), sets = (chunks + 3) / 4;
  const int per_warp = (sets + nwarps - 1) / nwarps;
  const int first = warp * per_warp, last = min(sets, first + per_warp);
  // Lane pointers at set `first`: weights (rows g, g + 8), x (B columns g and 8 + g), zero points of
  // the lane's chunks, group scales of the C fragment's columns.
  const uint4* w0 = reinterpret_cast<const uint4*>(p.w + row0 * p.row_bytes) + 4 * first + t;
  const uint4* w1 = reinterpret_cast<const uint4*>(p.w + row1 * p.row_bytes) + 4 * first + t;
  const int sub = gemv::tc_subset(t, S);
  bool xon[NT];
  const uint4* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    // B column: activation row col / S, subset col % S. Zeros where lane t's subset is another; a
    // column past the activation rows is never read, so it takes the last row (no zeros to make).
    const int col = 8 * nt + g;
    xon[nt] = S == 1 || (col % S == sub && col / S < p.m);
    const int64_t xrow = min(col / S, p.m - 1);
    xp[nt] = reinterpret_cast<const uint4*>(p.x + xrow * p.k) + (4 * first + t) * kX;
  }
  const uint8_t *z0 = nullptr, *z1 = nullptr;
  const unsigned short* sc[2][kCS] = {};
  if constexpr (Dec::kGroups) {
    const int64_t grp = static_cast<int64_t>(first) * S;
    if (p.zero) {
      z0 = p.zero + row0 * p.groups_per_row + grp + sub;
      z1 = p.zero + row1 * p.groups_per_row + grp + sub;
    }
    const auto* scale = static_cast<const unsigned short*>(p.scale);
#pragma unroll
    for (int h = 0; h < kCS; ++h) {
      sc[0][h] = scale + row0 * p.groups_per_row + grp + (2 * t + h) % S;
      sc[1][h] = scale + row1 * p.groups_per_row + grp + (2 * t + h) % S;
    }
  }
  float acc[NT][4] = {};
  bool waited = false;  // the first batch of weight loads goes out before waiting for x (cuda_common.cuh)
  for (int base = first; base < last; base += U) {
    const int nsets = last - base;  // sets left from `base`
    uint4 raw[U][2];
    uint32_t zz[U][2], gs[U][2][kCS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= nsets) break;  // warp-uniform; the compute loop stops at the same set
      raw[u][0] = load_stream(w0 + 4 * u);
      raw[u][1] = load_stream(w1 + 4 * u);
      zz[u][0] = zz[u][1] = 0;
      if constexpr (Dec::kGroups) {
        zz[u][0] = gemv::int4_zero_pair(z0 ? __ldg(z0 + u * S) : 8u);
        zz[u][1] = gemv::int4_zero_pair(z1 ? __ldg(z1 + u * S) : 8u);
#pragma unroll
        for (int h = 0; h < kCS; ++h) {
          gs[u][0][h] = __ldg(sc[0][h] + u * S);
          gs[u][1][h] = __ldg(sc[1][h] + u * S);
        }
      }
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= nsets) break;
      uint32_t f0[Dec::kMmas][2], f1[Dec::kMmas][2];
      Dec::decode({raw[u][0].x, raw[u][0].y, raw[u][0].z, raw[u][0].w}, zz[u][0], f0);
      Dec::decode({raw[u][1].x, raw[u][1].y, raw[u][1].z, raw[u][1].w}, zz[u][1], f1);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint4 xv[kX];
#pragma unroll
        for (int i = 0; i < kX; ++i)
          xv[i] = xon[nt] ? __ldg(xp[nt] + 4 * u * kX + i) : make_uint4(0, 0, 0, 0);
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < Dec::kMmas; ++j) {
          const int q = Dec::piece(j);  // columns 4q..4q+3 of the chunk: half q % 2 of x's load q / 2
          const uint32_t a[4] = {f0[j][0], f1[j][0], f0[j][1], f1[j][1]};
          mma_16816(c, a, q % 2 ? xv[q / 2].z : xv[q / 2].x, q % 2 ? xv[q / 2].w : xv[q / 2].y);
        }
        if constexpr (Dec::kGroups) {
          // c: rows g, g + 8 x columns 2t, 2t + 1 (subsets (2t) % S, (2t + 1) % S)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t bits = gs[u][i / 2][kCS == 1 ? 0 : i % 2];
            acc[nt][i] = fmaf(c[i], gemv::half_float(static_cast<uint16_t>(bits)), acc[nt][i]);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[nt][i] += c[i];
        }
      }
    }
    w0 += 4 * U;
    w1 += 4 * U;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xp[nt] += 4 * U * kX;
    if constexpr (Dec::kGroups) {
      if (z0) {
        z0 += U * S;
        z1 += U * S;
      }
#pragma unroll
      for (int h = 0; h < kCS; ++h) {
        sc[0][h] += U * S;
        sc[1][h] += U * S;
      }
    }
  }
  if (!waited) pdl_wait();  // a warp without sets still stores (after the CTA's barrier)
  pdl_launch_dependents();  // after the weight stream (see the file comment)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    red[warp][g][8 * nt + 2 * t] = acc[nt][0];
    red[warp][g][8 * nt + 2 * t + 1] = acc[nt][1];
    red[warp][g + 8][8 * nt + 2 * t] = acc[nt][2];
    red[warp][g + 8][8 * nt + 2 * t + 1] = acc[nt][3];
  }
  __syncthreads();
  tc_finish<Dec, MR, S, kSilu>(p, red, nwarps);
}

// Warps per v3 CTA: enough that each has one batch (kUnroll sets), at most INFERX_GEMV_V3_WARPS (default
// 8; set_gemv_v3_max_warps overrides).
std::atomic<int> g_v3_max_warps{0};
int v3_max_warps() {
  static const int env = env_int("INFERX_GEMV_V3_WARPS", 1, tc::kMaxWarps, tc::kMaxWarps);
  const int o = g_v3_max_warps.load(std::memory_order_relaxed);
  return o >= 1 && o <= tc::kMaxWarps ? o : env;
}

// R = 2: the SiLU product. S: subsets (INT4: 128 / group). Returns cudaErrorNotSupported (nothing
// launched) when p.m * S needs more than the 16 A rows.
template <class Dec, int R, int S>
cudaError_t launch_tc(const GemvParams& p, cudaStream_t stream) {
  const int sets = static_cast<int>((p.row_bytes / 16 + 3) / 4);
  const int warps = std::max(1, std::min(v3_max_warps(), (sets + tc::kUnroll - 1) / tc::kUnroll));
  const int64_t per_cta = R == 2 ? tc::kRows / 2 : tc::kRows;
  const dim3 grid(static_cast<unsigned>((p.rows + per_cta - 1) / per_cta)), block(warps * kWarp);
  auto go = [&](auto mr) {
    constexpr int MR = decltype(mr)::value;
    if constexpr (MR * S > 16)
      return cudaErrorNotSupported;
    else
      return launch_pdl(gemv_tc_kernel<Dec, MR, S, R == 2>, grid, block, 0, stream, p);
  };
  if (p.m <= 1) return go(std::integral_constant<int, 1>{});
  if (p.m <= 2) return go(std::integral_constant<int, 2>{});
  if (p.m <= 4) return go(std::integral_constant<int, 4>{});
  if (p.m <= 8) return go(std::integral_constant<int, 8>{});
  return go(std::integral_constant<int, 16>{});
}

// v2 products (not the SiLU one) of at least INFERX_GEMV_V2_PAIRS rows (default 8192; 0: never) give each
// warp two rows: x is then loaded and converted once per two rows. Fewer rows keep one per warp, so that
// there are warps enough to fill the GPU (8192 rows in pairs: 1024 CTAs). Read once.
bool v2_pairs(int64_t rows) {
  static const int64_t min_rows = [] {
    const char* e = std::getenv("INFERX_GEMV_V2_PAIRS");
    if (e == nullptr || *e == 0) return int64_t{8192};
    const long long v = std::atoll(e);
    return v <= 0 ? INT64_MAX : static_cast<int64_t>(v);
  }();
  return rows >= min_rows;
}

// R = 2: the SiLU product (gate and up rows per warp).
template <class Dec, int R, bool V2>
cudaError_t launch_dec(const GemvParams& p, cudaStream_t stream) {
  const bool pairs = V2 && R == 1 && v2_pairs(p.rows);
  const int64_t rows_per_cta = kGemvWarps * (pairs ? 2 : 1);
  const dim3 grid(static_cast<unsigned>((p.rows + rows_per_cta - 1) / rows_per_cta));
  auto go = [&](auto mr) {
    constexpr int MR = decltype(mr)::value;
    if constexpr (!V2)
      return launch_pdl(gemv_kernel<Dec, MR, R>, grid, dim3(kGemvThreads), 0, stream, p);
    else if constexpr (R == 2)
      return launch_pdl(gemv8_kernel<Dec, MR, 2, true>, grid, dim3(kGemvThreads), 0, stream, p);
    else if (pairs)
      return launch_pdl(gemv8_kernel<Dec, MR, 2, false>, grid, dim3(kGemvThreads), 0, stream, p);
    else
      return launch_pdl(gemv8_kernel<Dec, MR, 1, false>, grid, dim3(kGemvThreads), 0, stream, p);
  };
  if (p.m <= 1) return go(std::integral_constant<int, 1>{});
  if (p.m <= 2) return go(std::integral_constant<int, 2>{});
  if (p.m <= 4) return go(std::integral_constant<int, 4>{});
  if (p.m <= 8) return go(std::integral_constant<int, 8>{});
  return go(std::integral_constant<int, 16>{});
}

// v4's weight loads per lane and batch, split over the R rows (4 or 8; 0: by the row's length, v4_loads_for),
// and its CTAs per SM (0: as many as fit): set_gemv_v4_shape, else INFERX_GEMV_V4_LOADS (4, 8, default 0) /
// INFERX_GEMV_V4_CTAS_PER_SM (default 0). Read once.
std::atomic<int> g_v4_loads{0}, g_v4_ctas{-1}, g_v4_smem_kb{-1};
int v4_loads() {
  static const int env = env_int("INFERX_GEMV_V4_LOADS", 0, 8, 0);
  const int o = g_v4_loads.load(std::memory_order_relaxed);
  return o == 4 || o == 8 ? o : env == 4 || env == 8 ? env : 0;
}
// The loads of a product of `rows` rows of row_bytes: 8 from 8 KB rows (FP8: of products of at least 8192
// rows), else 4 - an empirical rule. Measured at batch 1, 1k context, TPOT p50, each pair in one call: one
// H200 node (2026-12-05 16:55): 70B fp8:lm_head (8-28 KB rows, 8192-57344 rows) 21.632 ms with 4, 20.614
// with 8 (+4.9%; its products alone in chains: q/k/v 31.2 -> 28.7 us, gate/up + SiLU 123.9 -> 113.9, down
// 69.8 -> 66.2); 8B bf16 (8 KB rows; down on cuBLASLt) 4.688 -> 4.550 ms (+3.0%); 8B fp8:lm_head 2.992 ->
// 3.136 ms with 8 everywhere (-4.6%). An H100 (17:00), 8 from 8 KB rows: 70B 26.868 -> 26.44 ms (+1.6%), 8B
// bf16 6.026 -> 5.933 (+1.5%), 8B fp8:lm_head 3.544 -> 3.561 (-0.5%: its 4096-row down product, 14 KB rows,
// the one FP8 product that changed) - hence the row count for FP8. (On 12-03 10:41, before pairs and the
// shared-memory staging, 8 everywhere had lost in both formats.) INT4 follows FP8's rule in bytes (8 loads
// from rows of 16384 columns in products of 8192 rows; 8 loads at 8B's shapes lose 1-15% in chains).
template <class Dec>
int v4_loads_for(int64_t rows, int64_t row_bytes) {
  const int forced = v4_loads();
  if (forced != 0) return forced;
  return row_bytes >= 8192 && (std::is_same_v<Dec, DecodeBf16> || rows >= 8192) ? 8 : 4;
}
int v4_ctas_per_sm() {
  static const int env = env_int("INFERX_GEMV_V4_CTAS_PER_SM", 0, 64, 0);
  const int o = g_v4_ctas.load(std::memory_order_relaxed);
  return o >= 0 ? o : env;
}

// v4's shared-memory prefetch budget per SM in KB (0: off): set_gemv_v4_shape, else
// INFERX_GEMV_V4_SMEM_KB (0..200, default 96). Read once. Measured on the H200 (2026-12-03 21:10-21:20, 8B,
// batch 1, 1k context, TPOT p50, two runs each in one call): fp8:lm_head 2.817 / 2.803 ms off, 2.804 at 64,
// 2.748 / 2.759 at 96, 2.845 at 128, 2.899 at 160, 2.981 at 200; BF16 through v4 with 96: 4.407 / 4.417
// against v1's 4.543 / 4.546; 70B fp8:lm_head unchanged (19.15 vs 19.18 ms). Larger budgets lose (likely,
// not measured: the next kernel's CTAs no longer fit beside this one's, so its prefetch starts later). Alone
// in a chain of the same product (bench_cuda_kernels) 96 KB gains 2-3% on 6144- and 28672-row FP8 products
// and 3% on BF16 14336x4096, nothing on 4096x4096.
int v4_smem_kb() {
  static const int env = env_int("INFERX_GEMV_V4_SMEM_KB", 0, 200, 96);
  const int o = g_v4_smem_kb.load(std::memory_order_relaxed);
  return o >= 0 ? o : env;
}

// v4's K split (kernels_gemv.h gemv_v4_ksplit): set_gemv_v4_shape's ksplit, else INFERX_GEMV_V4_KSPLIT
// (0, the default: chosen per shape for BF16 weights, FP8 unsplit; 1: off; 2, 4: forced), read once.
// Measured on an H100 (2026-12-05 16:20-16:30, 8B at batch 1, 1k context, TPOT p50, two runs each in one
// call): BF16 5.906 / 5.907 ms unsplit, 5.871 / 5.872 chosen (the 6144-row qkv product 8 -> 6 batches per
// warp: 22.3 -> 20.9 us alone in a chain); FP8 (fp8:lm_head) 3.479 / 3.478 unsplit, 3.487 / 3.484 split as
// for BF16; 70B fp8:lm_head 26.08 / 26.05 vs 26.09 / 26.06 ms. So FP8 stays unsplit.
std::atomic<int> g_v4_ksplit{-1};
int v4_ksplit() {
  static const int env = env_int("INFERX_GEMV_V4_KSPLIT", 0, 4, 0);
  const int o = g_v4_ksplit.load(std::memory_order_relaxed);
  return o >= 0 ? o : env;
}
// The K split of a launch of `groups` row groups with batches of batch_elems columns on `warps` warps: only
// where K is a whole number of batches and the norm fusion's one-warp-per-row epilogue is not asked for;
// gemv_v4_ksplit's choice for BF16, FP8 and INT4 unsplit unless forced (the measurements above; INT4 not
// measured).
template <class Dec>
int v4_ksplit_for(const GemvParams& p, int64_t groups, int64_t batch_elems, int64_t warps) {
  const int requested = v4_ksplit();
  if (p.k % batch_elems != 0 || p.residual != nullptr || p.in_partials != nullptr) return 1;
  if (requested == 0 && !std::is_same_v<Dec, DecodeBf16>) return 1;
  return gemv_v4_ksplit(groups, p.k / batch_elems, warps, requested);
}

// Streaming multiprocessors of the current device, cached per device.
cudaError_t device_sms(int& sms) {
  static std::atomic<int> cache[32];
  int device = 0;
  cudaError_t st = cudaGetDevice(&device);
  if (st != cudaSuccess) return st;
  if (device >= 0 && device < 32 && (sms = cache[device].load(std::memory_order_relaxed)) > 0)
    return cudaSuccess;
  st = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (st == cudaSuccess && device >= 0 && device < 32) cache[device].store(sms, std::memory_order_relaxed);
  return st;
}

// Shared memory of the current device: per SM, and reserved by the system per CTA; cached per device.
cudaError_t device_smem(int& per_sm, int& reserved) {
  static std::atomic<int> cache[32][2];
  int device = 0;
  cudaError_t st = cudaGetDevice(&device);
  if (st != cudaSuccess) return st;
  const bool cached = device >= 0 && device < 32;
  if (cached && (per_sm = cache[device][0].load(std::memory_order_relaxed)) > 0) {
    reserved = cache[device][1].load(std::memory_order_relaxed);
    return cudaSuccess;
  }
  st = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (st == cudaSuccess)
    st = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
  if (st == cudaSuccess && cached) {
    cache[device][1].store(reserved, std::memory_order_relaxed);
    cache[device][0].store(per_sm, std::memory_order_relaxed);
  }
  return st;
}

// A v4 kernel's CTAs per SM: as many as its registers allow (the occupancy calculator, cached per instance:
// the same on every H200 / H100), at most v4_ctas_per_sm(); INT4 (StreamInt4) also as many as the shared
// memory of its x (beyond any staging) lets share an SM, and *fixed receives that memory per CTA with the
// kernel's static shared memory and the system's reserve (0: not one CTA fits). Others: *fixed = 0.
template <class Dec, int R, int L, bool kSilu>
cudaError_t v4_fit(const GemvParams& p, int& per_sm, int64_t* fixed = nullptr) {
  const auto kernel = gemv_stream_kernel<Dec, R, L / R, kSilu>;
  static std::atomic<int> fit{0};
  per_sm = fit.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    const cudaError_t st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvThreads, 0);
    if (st != cudaSuccess) return st;
    per_sm = std::max(per_sm, 1);
    fit.store(per_sm, std::memory_order_relaxed);
  }
  if (const int cap = v4_ctas_per_sm(); cap > 0) per_sm = std::min(per_sm, cap);
  if (fixed != nullptr) *fixed = 0;
  if constexpr (kStreamInt4<Dec>) {
    static std::atomic<int> static_smem{-1};
    int own = static_smem.load(std::memory_order_relaxed);
    if (own < 0) {
      cudaFuncAttributes attr{};
      if (const cudaError_t st = cudaFuncGetAttributes(&attr, kernel); st != cudaSuccess) return st;
      own = static_cast<int>(attr.sharedSizeBytes);
      static_smem.store(own, std::memory_order_relaxed);
    }
    int sm_bytes = 0, reserved = 0;
    if (const cudaError_t st = device_smem(sm_bytes, reserved); st != cudaSuccess) return st;
    const int64_t cta = Dec::bytes(p.k) + own + reserved;
    per_sm = static_cast<int>(std::min<int64_t>(per_sm, sm_bytes / cta));
    if (fixed != nullptr) *fixed = cta;
  }
  return cudaSuccess;
}

// One wave of v4 CTAs (no more warps than rows). L: loads per lane and batch.
// kSilu: the SiLU product (R = 2), else a plain product with R rows per warp. INT4: cudaErrorNotSupported
// (nothing launched) where x does not fit in shared memory.
template <class Dec, int R, int L, bool kSilu>
cudaError_t launch_stream(const GemvParams& p, cudaStream_t stream) {
  const auto kernel = gemv_stream_kernel<Dec, R, L / R, kSilu>;
  int per_sm = 0;
  int64_t fixed = 0;  // INT4: shared memory per CTA besides the staging (v4_fit)
  if (const cudaError_t st = v4_fit<Dec, R, L, kSilu>(p, per_sm, &fixed); st != cudaSuccess) return st;
  if (per_sm < 1) return cudaErrorNotSupported;
  int sms = 0;
  if (const cudaError_t st = device_sms(sms); st != cudaSuccess) return st;
  const int64_t groups = warp_row_count<R, kSilu>(p);
  const int ks = v4_ksplit_for<Dec>(p, groups, int64_t{kWarp} * (L / R) * Dec::kElems,
                                    int64_t{sms} * per_sm * kGemvWarps);
  const int64_t ctas = std::min<int64_t>((groups * ks + kGemvWarps - 1) / kGemvWarps, int64_t{sms} * per_sm);
  GemvParams q = p;
  q.ksplit = ks;
  int staging_kb = v4_smem_kb();
  if constexpr (kStreamInt4<Dec>) {  // the staging gets what x leaves of the SM, at most its budget
    int sm_bytes = 0, reserved = 0;
    if (const cudaError_t st = device_smem(sm_bytes, reserved); st != cudaSuccess) return st;
    const int64_t left = sm_bytes - (ctas + sms - 1) / sms * fixed;
    staging_kb = static_cast<int>(std::clamp<int64_t>(left / 1024, 0, staging_kb));
  }
  q.pf_batches = gemv_v4_staged_batches(ctas, sms, R, L, p.row_bytes / ks, staging_kb);
  size_t smem = gemv_v4_smem_bytes(R, L, q.pf_batches);
  if constexpr (kStreamInt4<Dec>) smem += static_cast<size_t>(Dec::bytes(p.k));
  if (smem > 48 * 1024) {
    // The opt-in above 48 KB is a function attribute of the current device: once per device and instance
    // (tensor parallel ranks run other devices from the same process).
    static std::atomic<uint32_t> opted{0};
    int device = 0;
    if (const cudaError_t st = cudaGetDevice(&device); st != cudaSuccess) return st;
    const uint32_t bit = device < 32 ? 1u << device : 0u;
    if (bit == 0 || (opted.load(std::memory_order_relaxed) & bit) == 0) {
      // The most a CTA may take (227 KB on Hopper) less the kernel's static shared memory.
      cudaFuncAttributes attr{};
      cudaError_t st = cudaFuncGetAttributes(&attr, kernel);
      if (st != cudaSuccess) return st;
      st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                227 * 1024 - static_cast<int>(attr.sharedSizeBytes));
      if (st != cudaSuccess) return st;
      opted.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  if (p.residual != nullptr && ctas > kGemvMaxPartials) return cudaErrorNotSupported;
  if (p.launched_ctas != nullptr) *p.launched_ctas = static_cast<int>(ctas);
  return launch_pdl(kernel, dim3(static_cast<unsigned>(ctas)), dim3(kGemvThreads), static_cast<size_t>(smem),
                    stream, q);
}

// Plain products give each v4 warp two rows, x converted once for both (set_gemv_v4_shape, else
// INFERX_GEMV_V4_PAIRS=1|0, default 1; read once): FP8 rows of 8-28 KB ran at 62-72% of copy with one
// (ncu 2026-12-03 14:14). Measured at batch 1, fp8:lm_head (H200 2026-12-03 14:19, one call): 70B 20.112 ms
// with one row per warp, 19.504 with pairs on the down projection only, 19.064 with pairs everywhere; 8B
// 2.804 / 2.796 / 2.776 ms.
std::atomic<int> g_v4_pairs{-1};
bool v4_pairs() {
  static const int env = env_int("INFERX_GEMV_V4_PAIRS", 0, 1, 1);
  const int o = g_v4_pairs.load(std::memory_order_relaxed);
  return (o == 0 || o == 1 ? o : env) == 1;
}

// INT4 puts x into shared memory as F32 (StreamInt4<true>) or BF16: set_gemv_v4_shape's x_f32, else
// INFERX_GEMV_V4_X_F32 (read once): 1, the default: F32 where it costs no CTAs per SM against BF16 (the
// 8B model's 4096-column products, not its 14336-column down product; chains on an H100: F32 ahead by 2.5-4%
// on 4096-column products, 28% behind on 4096x14336 - the default's choice); 2: F32
// wherever one CTA fits; 0: BF16.
std::atomic<int> g_v4_x_f32{-1};
int v4_x_f32() {
  static const int env = env_int("INFERX_GEMV_V4_X_F32", 0, 2, 1);
  const int o = g_v4_x_f32.load(std::memory_order_relaxed);
  return o >= 0 && o <= 2 ? o : env;
}
template <int R, int L, bool kSilu>
cudaError_t launch_stream_int4(const GemvParams& p, cudaStream_t stream) {
  if (const int mode = v4_x_f32(); mode != 0) {
    int f32 = 0, bf16 = 0;
    cudaError_t st = v4_fit<StreamInt4<true>, R, L, kSilu>(p, f32);
    if (st == cudaSuccess && mode == 1) st = v4_fit<StreamInt4<false>, R, L, kSilu>(p, bf16);
    if (st != cudaSuccess) return st;
    if (f32 >= 1 && f32 >= bf16) return launch_stream<StreamInt4<true>, R, L, kSilu>(p, stream);
  }
  return launch_stream<StreamInt4<false>, R, L, kSilu>(p, stream);
}
template <class Dec, int R, int L, bool kSilu>
cudaError_t launch_stream_of(const GemvParams& p, cudaStream_t stream) {
  if constexpr (kStreamInt4<Dec>)
    return launch_stream_int4<R, L, kSilu>(p, stream);
  else
    return launch_stream<Dec, R, L, kSilu>(p, stream);
}

// R = 2: the SiLU product; R = 1: a plain product (in pairs of rows unless v4_pairs() says not). INT4: Dec =
// StreamInt4<false> stands for both of its x layouts (launch_stream_int4 picks one).
template <class Dec, int R>
cudaError_t launch_stream(const GemvParams& p, cudaStream_t stream) {
  const bool four = v4_loads_for<Dec>(p.rows, p.row_bytes) == 4;
  if constexpr (R == 2)
    return four ? launch_stream_of<Dec, 2, 4, true>(p, stream) : launch_stream_of<Dec, 2, 8, true>(p, stream);
  if (v4_pairs())
    return four ? launch_stream_of<Dec, 2, 4, false>(p, stream)
                : launch_stream_of<Dec, 2, 8, false>(p, stream);
  return four ? launch_stream_of<Dec, 1, 4, false>(p, stream) : launch_stream_of<Dec, 1, 8, false>(p, stream);
}

// ---- Which kernel runs a format: set_gemv_kernel (tests, benchmarks), else INFERX_GEMV_KERNEL, else the
// fastest measured on the H200 (bench_cuda_kernels, graph-launched, weights cycled past L2; % of the 4242
// GB/s copy; 2026-12-03 04:20, v1 / v2 / v3 in one process):
//   INT4 g128, M=1: 4096x4096 22.5 / 19.2 / 39.8, 6144x4096 27.6 / 22.1 / 34.2, 14336x4096 31.5 / 35.0 /
//     47.9, 4096x14336 26.6 / 21.9 / 53.2, gate/up+SiLU 28672x4096 28.3 / 37.8 / 50.7; M=4 9.5 / 9.0 /
//     38.2, M=16 2.4 / 2.6 / 23.8: v3 at every M.
//   FP8 per channel, M=1: 4096x4096 54.1 / 49.0 / 47.7, 6144x4096 54.0 / 48.5 / 54.2, 14336x4096 76.4 /
//     70.2 / 70.7, 4096x14336 70.1 / 59.0 / 58.8, gate/up+SiLU 83.1 / 81.6 / 73.9: v1; M=4 21.6 / 21.9 /
//     45.7, M=16 7.6 / 9.9 / 39.2: v3 from two rows on. v4 (10:41): standalone no better than v1 (4096x4096
//     51.0 vs 54.6), but in the graph at batch 1 the model decodes 344.1 vs 337.4 tok/s (fp8:lm_head 354.8
//     vs 350.2): v4 at M=1. BF16 221.9 vs 221.3 (noise): v1 stayed until v4's shared-memory prefetch
//     (v4_smem_kb), with which BF16 takes v4 at M=1 (the model 4.543 -> 4.407 ms at batch 1).
//   BF16, M=1 (more rows go to cuBLASLt): v1 and v3 equal on 4096x4096, 14336x4096 and 4096x14336, v3
//     better on 6144x4096 (80.4 vs 69.5), worse on 1024x4096 (29.0 vs 33.7), gate/up+SiLU (82.9 vs 94.5)
//     and the 128256-row lm_head (92.6 vs 104.5): v1.
//   Q8_0 / Q4_K (00:34, again at 04:20): v2 (60.6 / 47.5 and 31.2 / 20.9 at 14336x4096 / 4096x14336).
// v3 reads BF16, FP8 and INT4 with K a multiple of 32 / 64 / 128 (whole 4-chunk sets) and up to 16 / S
// activation rows per launch (other products: v1), v4 BF16, FP8 and INT4 with one activation row (more:
// v1), v2 the four quantized formats, v1 all five.
//   INT4 g128 on v4 (StreamInt4, H100 2026-12-05 18:55, % of the 3005 GB/s copy, v3 / v4 / v4 8 loads):
//     4096x4096 - / 40.5-42.0, 6144x4096 44.4 / 44.0 / 46.6, 14336x4096 64.1 / 57.0 / 55.9, gate/up+SiLU
//     68.7 / 65.1 / 56.6, 4096x14336 65.4 / 55.5 / 47.1 (asymmetric: 60.0 / 55.9, 69.2 / 54.1); in the 8B
//     model at batch 1 (int4:lm_head, TPOT p50, two runs each) v3 2.452 / 2.455 ms, v4 2.762 / 2.766: v3
//     stays INT4's default at every M. (Not profiled: each run is one 32-FFMA dependency chain per row.)

int format_index(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return 0;
    case DType::F8_E4M3:
      return 1;
    case DType::INT4:
      return 2;
    case DType::Q8_0:
      return 3;
    case DType::Q4_K:
      return 4;
    default:
      return -1;
  }
}
constexpr int kFormats = 5;

// The measured choice (above) for a launch of m activation rows.
GemvKernel measured_kernel(DType dtype, int m) {
  switch (dtype) {
    case DType::F8_E4M3:
      return m >= 2 ? GemvKernel::V3 : GemvKernel::V4;
    case DType::INT4:
      return GemvKernel::V3;  // v4 reads INT4 too (StreamInt4): 11% slower in the model (above)
    case DType::Q8_0:
    case DType::Q4_K:
      return GemvKernel::V2;
    case DType::BF16:
      return GemvKernel::V4;  // with its shared-memory prefetch: see v4_smem_kb
    default:
      return GemvKernel::V1;
  }
}

std::atomic<GemvKernel> g_override[kFormats];  // Default: none

// INFERX_GEMV_KERNEL: comma-separated "v1" / "v2" / "v3" (every format that kernel reads) or
// "FORMAT=vN" with FORMAT one of bf16, fp8, int4, q8_0, q4_k; later items win. Read once.
const std::array<GemvKernel, kFormats>& env_kernels() {
  static const std::array<GemvKernel, kFormats> k = [] {
    std::array<GemvKernel, kFormats> r{};
    const char* e = std::getenv("INFERX_GEMV_KERNEL");
    if (e == nullptr) return r;
    const std::string spec(e);
    const char* names[kFormats] = {"bf16", "fp8", "int4", "q8_0", "q4_k"};
    const DType types[kFormats] = {DType::BF16, DType::F8_E4M3, DType::INT4, DType::Q8_0, DType::Q4_K};
    size_t at = 0;
    while (at <= spec.size()) {
      const size_t comma = std::min(spec.find(',', at), spec.size());
      const std::string item = spec.substr(at, comma - at);
      at = comma + 1;
      const size_t eq = item.find('=');
      const std::string kname = eq == std::string::npos ? item : item.substr(eq + 1);
      const GemvKernel kernel = kname == "v1"   ? GemvKernel::V1
                                : kname == "v2" ? GemvKernel::V2
                                : kname == "v3" ? GemvKernel::V3
                                : kname == "v4" ? GemvKernel::V4
                                                : GemvKernel::Default;
      for (int f = 0; f < kFormats; ++f)
        if ((eq == std::string::npos || item.compare(0, eq, names[f]) == 0) &&
            gemv_kernel_reads(kernel, types[f]))
          r[static_cast<size_t>(f)] = kernel;
    }
    return r;
  }();
  return k;
}

GemvKernel kernel_for(DType dtype, int m) {
  const int f = format_index(dtype);
  if (f < 0) return GemvKernel::V1;
  const GemvKernel o = g_override[f].load(std::memory_order_relaxed);
  if (o != GemvKernel::Default) return o;
  const GemvKernel e = env_kernels()[static_cast<size_t>(f)];
  return e != GemvKernel::Default ? e : measured_kernel(dtype, m);
}

int rows_bucket(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }

template <int R>
cudaError_t launch_v3(DType dtype, const GemvParams& p, cudaStream_t stream) {
  switch (dtype) {
    case DType::BF16:
      return launch_tc<TcStepBf16, R, 1>(p, stream);
    case DType::F8_E4M3:
      return launch_tc<TcStepFp8, R, 1>(p, stream);
    default:  // INT4: S = 128 / group
      if (p.group_shift == 2) return launch_tc<TcStepInt4, R, 1>(p, stream);
      if (p.group_shift == 1) return launch_tc<TcStepInt4, R, 2>(p, stream);
      return launch_tc<TcStepInt4, R, 4>(p, stream);
  }
}

template <int R>
cudaError_t launch_format(DType dtype, const GemvParams& p, cudaStream_t stream) {
  if (p.residual != nullptr || p.in_partials != nullptr) {  // the norm fusion: v4 only (gemv_norm_fuses)
    if (p.m != 1 || kernel_for(dtype, 1) != GemvKernel::V4) return cudaErrorNotSupported;
    if (dtype == DType::BF16) return launch_stream<DecodeBf16, R>(p, stream);
    if (dtype == DType::F8_E4M3) return launch_stream<DecodeFp8, R>(p, stream);
    return cudaErrorNotSupported;
  }
  GemvKernel kernel = kernel_for(dtype, p.m);
  if (kernel == GemvKernel::V3) {
    const int subsets = dtype == DType::INT4 ? 4 >> p.group_shift : 1;
    if (rows_bucket(p.m) * subsets <= 16 && p.row_bytes % 64 == 0) return launch_v3<R>(dtype, p, stream);
    kernel = GemvKernel::V1;
  }
  if (kernel == GemvKernel::V4) {
    if (p.m == 1 && dtype == DType::BF16) return launch_stream<DecodeBf16, R>(p, stream);
    if (p.m == 1 && dtype == DType::F8_E4M3) return launch_stream<DecodeFp8, R>(p, stream);
    if (p.m == 1 && dtype == DType::INT4 && p.k % 32 == 0 &&
        StreamInt4<false>::offsets_fit(p, R == 2 ? 2 * p.f : p.rows)) {
      const cudaError_t e = launch_stream<StreamInt4<false>, R>(p, stream);
      if (e != cudaErrorNotSupported) return e;  // else x does not fit in shared memory: v1
    }
    kernel = GemvKernel::V1;  // v4 takes one activation row
  }
  const bool v1 = kernel != GemvKernel::V2;
  switch (dtype) {
    case DType::BF16:
      return launch_dec<DecodeBf16, R, false>(p, stream);
    case DType::F8_E4M3:
      return v1 ? launch_dec<DecodeFp8, R, false>(p, stream) : launch_dec<StepFp8, R, true>(p, stream);
    case DType::INT4:
      if (v1) return launch_dec<DecodeInt4, R, false>(p, stream);
      if (p.step_group_shift == 2) return launch_dec<StepInt4<2>, R, true>(p, stream);
      if (p.step_group_shift == 3) return launch_dec<StepInt4<3>, R, true>(p, stream);
      return launch_dec<StepInt4<4>, R, true>(p, stream);
    case DType::Q8_0:
      return v1 ? launch_dec<DecodeQ8_0, R, false>(p, stream) : launch_dec<StepQ8_0, R, true>(p, stream);
    case DType::Q4_K:
      return v1 ? launch_dec<DecodeQ4K, R, false>(p, stream) : launch_dec<StepQ4K, R, true>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

int64_t weight_row_bytes(DType dtype, int64_t k) {
  switch (dtype) {
    case DType::BF16:
      return 2 * k;
    case DType::F8_E4M3:
      return k;
    case DType::INT4:
      return k / 2;
    case DType::Q8_0:
      return k / 32 * 34;
    case DType::Q4_K:
      return k / 256 * 144;
    default:
      return 0;
  }
}

GemvParams base_params(const GemvWeight& w, int64_t k) {
  GemvParams p;
  p.w = static_cast<const uint8_t*>(w.data);
  p.row_bytes = weight_row_bytes(w.dtype, k);
  p.scale = w.scale;
  p.zero = w.zero;
  p.per_channel = w.per_channel;
  if (w.dtype == DType::INT4) {
    p.groups_per_row = k / w.group;
    p.group_shift = w.group == 32 ? 0 : w.group == 64 ? 1 : 2;
    p.step_group_shift = p.group_shift + 2;
  }
  p.k = k;
  return p;
}

__global__ void prepare_x_kernel(const void* x, bool x_bf16, const int32_t* perm, int64_t m, int64_t k,
                                 __nv_bfloat16* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = m * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / k, c = i % k;
    const int64_t src = r * k + (perm ? perm[c] : c);
    out[i] = x_bf16 ? static_cast<const __nv_bfloat16*>(x)[src]
                    : __float2bfloat16_rn(static_cast<const float*>(x)[src]);
  }
}

}  // namespace

bool gemv_supports(DType dtype, int64_t k, int64_t group) {
  if (k <= 0) return false;
  switch (dtype) {
    case DType::BF16:
      return k % 8 == 0;
    case DType::F8_E4M3:
      return k % 16 == 0;
    case DType::INT4:
      return (group == 32 || group == 64 || group == 128) && k % group == 0;
    case DType::Q8_0:
      return k % 32 == 0;
    case DType::Q4_K:
      return k % 256 == 0;
    default:
      return false;
  }
}

bool gemv_aligned(DType dtype, const void* weight) {
  const auto a = reinterpret_cast<uintptr_t>(weight);
  return dtype == DType::Q8_0 ? a % 2 == 0 : a % 16 == 0;
}

bool gemv_kernel_reads(GemvKernel kernel, DType dtype) {
  switch (kernel) {
    case GemvKernel::V1:
      return format_index(dtype) >= 0;
    case GemvKernel::V2:
      return format_index(dtype) >= 1;
    case GemvKernel::V3:
      return dtype == DType::BF16 || dtype == DType::F8_E4M3 || dtype == DType::INT4;
    case GemvKernel::V4:
      return dtype == DType::BF16 || dtype == DType::F8_E4M3 || dtype == DType::INT4;
    default:
      return false;
  }
}

void set_gemv_kernel(DType dtype, GemvKernel kernel) {
  const int f = format_index(dtype);
  if (f >= 0 && (kernel == GemvKernel::Default || gemv_kernel_reads(kernel, dtype)))
    g_override[f].store(kernel, std::memory_order_relaxed);
}

const char* gemv_kernel_name(GemvKernel kernel) {
  switch (kernel) {
    case GemvKernel::V1:
      return "v1";
    case GemvKernel::V2:
      return "v2";
    case GemvKernel::V3:
      return "v3";
    case GemvKernel::V4:
      return "v4";
    default:
      return "default";
  }
}

void set_gemv_v3_max_warps(int warps) { g_v3_max_warps.store(warps, std::memory_order_relaxed); }

int gemv_v4_staged_batches(int64_t ctas, int sms, int rows_per_warp, int loads, int64_t row_bytes,
                           int smem_kb) {
  if (smem_kb <= 0 || ctas <= 0 || sms <= 0 || rows_per_warp < 1 || loads < rows_per_warp) return 0;
  const int64_t on_sm = (ctas + sms - 1) / sms;  // the CTAs that share an SM's budget
  const int64_t per_warp = (int64_t{smem_kb} * 1024 / on_sm - kV4BarBytes) / kGemvWarps;
  const int64_t batch = v4_batch_row_bytes(loads / rows_per_warp);
  return static_cast<int>(std::clamp<int64_t>(per_warp / (rows_per_warp * batch), 0, row_bytes / batch));
}

// The norm fusion's switch: set_gemv_norm_fusion, else INFERX_GEMV_NORM (0 / 1, default 0), read once.
std::atomic<int> g_norm_fusion{-1};
void set_gemv_norm_fusion(int on) { g_norm_fusion.store(on, std::memory_order_relaxed); }

bool gemv_norm_fuses(DType dtype, int64_t k) {
  static const int env = env_int("INFERX_GEMV_NORM", 0, 1, 0);
  const int o = g_norm_fusion.load(std::memory_order_relaxed);
  const bool enabled = (o == 0 || o == 1 ? o : env) == 1;
  return enabled && (dtype == DType::BF16 || dtype == DType::F8_E4M3) &&
         kernel_for(dtype, 1) == GemvKernel::V4 && gemv_supports(dtype, k, 0);
}

size_t gemv_v4_smem_bytes(int rows_per_warp, int loads, int batches) {
  return batches > 0 ? static_cast<size_t>(kV4BarBytes + int64_t{kGemvWarps} * rows_per_warp * batches *
                                                             v4_batch_row_bytes(loads / rows_per_warp))
                     : 0;
}

int gemv_v4_ksplit(int64_t groups, int64_t batches, int64_t warps, int requested) {
  if (groups <= 0 || batches <= 0 || warps <= 0) return 1;
  if (requested > 0) {  // the largest of 4, 2, 1 not above the request that divides the batches
    int ks = requested >= 4 ? 4 : requested >= 2 ? 2 : 1;
    while (ks > 1 && batches % ks != 0) ks /= 2;
    return ks;
  }
  // Chosen: the fewest batches the busiest warp streams in a row, ceil(groups * ks / warps) rounds of
  // batches / ks each, where that is at most 3/4 of the unsplit count; ties go to the smaller split (fewer
  // partial sums to add). Why the margin: splitting the 128256-row lm_head (64 -> 61 batches) or the
  // 4096x14336 down product changed nothing or lost in a chain of the same product (H100, 2026-12-05
  // 16:20: BF16 lm_head 343 -> 349 us), while the qkv product (8 -> 6) gained 6%.
  const int64_t unsplit = (groups + warps - 1) / warps * batches;
  int best = 1;
  int64_t best_cost = unsplit;
  for (int ks : {2, 4}) {
    if (batches % ks != 0) continue;
    const int64_t cost = (groups * ks + warps - 1) / warps * (batches / ks);
    if (cost < best_cost && 4 * cost <= 3 * unsplit) {
      best = ks;
      best_cost = cost;
    }
  }
  return best;
}

void set_gemv_v4_shape(int loads, int ctas_per_sm, int pairs, int smem_kb, int ksplit, int x_f32) {
  g_v4_x_f32.store(x_f32, std::memory_order_relaxed);
  g_v4_ksplit.store(ksplit, std::memory_order_relaxed);
  g_v4_loads.store(loads, std::memory_order_relaxed);
  g_v4_ctas.store(ctas_per_sm, std::memory_order_relaxed);
  g_v4_pairs.store(pairs, std::memory_order_relaxed);
  g_v4_smem_kb.store(smem_kb, std::memory_order_relaxed);
}

cudaError_t launch_gemv_prepare_x(const void* x, bool x_bf16, const int32_t* perm, int64_t m, int64_t k,
                                  void* out, cudaStream_t stream) {
  if (m * k == 0) return cudaSuccess;
  return launch_pdl(prepare_x_kernel, dim3(grid_for(m * k, 256, 4096)), dim3(256), 0, stream, x, x_bf16, perm,
                    m, k, static_cast<__nv_bfloat16*>(out));
}

namespace {
// The norm fusion's arguments into the launch's parameters (both need one activation row on v4).
bool apply_norm_fusion(DType dtype, int64_t m, int64_t k, GemvResidual* resid, const GemvPrenorm* pre,
                       GemvParams& p) {
  if (resid == nullptr && pre == nullptr) return true;
  if (m != 1 || !gemv_norm_fuses(dtype, k)) return false;
  static const int exp = env_int("INFERX_GEMV_NORM_EXP", 0, 3, 0);
  p.late_trigger = resid != nullptr && (exp & 1) != 0;
  p.warp_prenorm = (exp & 2) != 0;
  if (resid != nullptr) {
    if (!resid->residual || !resid->norm_weight || !resid->normed || !resid->partials) return false;
    p.residual = resid->residual;
    p.norm_weight = resid->norm_weight;
    p.normed = static_cast<__nv_bfloat16*>(resid->normed);
    p.partials = resid->partials;
    p.launched_ctas = &resid->ctas;
  }
  if (pre != nullptr) {
    if (!pre->partials || pre->ctas < 1) return false;
    p.in_partials = pre->partials;
    p.in_ctas = pre->ctas;
    p.eps = pre->eps;
  }
  return true;
}
}  // namespace

cudaError_t launch_gemv(const GemvWeight& w, const void* x, int64_t m, int64_t k, const float* bias,
                        const GemvOutput* outs, int num_outs, cudaStream_t stream, GemvResidual* resid,
                        const GemvPrenorm* pre) {
  if (num_outs < 1 || num_outs > kGemvMaxOutputs) return cudaErrorInvalidValue;
  GemvParams p = base_params(w, k);
  if (resid != nullptr && num_outs != 1) return cudaErrorNotSupported;
  if (!apply_norm_fusion(w.dtype, m, k, resid, pre, p)) return cudaErrorNotSupported;
  p.bias = bias;
  p.num_outs = num_outs;
  for (int i = 0; i < num_outs; ++i) {
    p.outs[i] = outs[i];
    p.rows += outs[i].count;
  }
  if (p.rows == 0) return cudaSuccess;
  for (int64_t r0 = 0; r0 < m; r0 += kGemvMaxRows) {
    p.m = static_cast<int>(m - r0 < kGemvMaxRows ? m - r0 : kGemvMaxRows);
    p.x = static_cast<const __nv_bfloat16*>(x) + r0 * k;
    for (int i = 0; i < num_outs; ++i) p.outs[i].data = outs[i].data + r0 * outs[i].ld;
    const cudaError_t e = launch_format<1>(w.dtype, p, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t launch_gemv_silu_mul(const GemvWeight& w, const void* x, int64_t m, int64_t k, int64_t f,
                                 const float* bias, float* out, void* out_bf16, cudaStream_t stream,
                                 const GemvPrenorm* pre) {
  GemvParams p = base_params(w, k);
  if (!apply_norm_fusion(w.dtype, m, k, nullptr, pre, p)) return cudaErrorNotSupported;
  p.bias = bias;
  p.num_outs = 1;
  p.rows = p.f = f;
  if (f == 0) return cudaSuccess;
  for (int64_t r0 = 0; r0 < m; r0 += kGemvMaxRows) {
    p.m = static_cast<int>(m - r0 < kGemvMaxRows ? m - r0 : kGemvMaxRows);
    p.x = static_cast<const __nv_bfloat16*>(x) + r0 * k;
    p.outs[0] = {out + r0 * f, f, f};
    p.out_bf16 = out_bf16 ? static_cast<__nv_bfloat16*>(out_bf16) + r0 * f : nullptr;
    const cudaError_t e = launch_format<2>(w.dtype, p, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace inferx::cuda
