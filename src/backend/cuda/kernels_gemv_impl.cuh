#pragma once
// The decode GEMV's shared parts, for its kernel files (kernels_gemv.cu: the overview of the kernels and
// the dispatch; kernels_gemv_v1v2.cu, kernels_gemv_tc.cu (v3), kernels_gemv_stream.cu (v4),
// kernels_gemv_tc_stream.cu (v5)): the launch parameters, v1's decoders (v4 reuses them), the store epilogue,
// which rows a warp takes, and the launchers each kernel file exports to the dispatch.
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

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels_gemv.h"
#include "backend/cuda/kernels_gemv_decode.h"

namespace inferx::cuda::gemv_impl {

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

// The formats whose granule is its 16 weight bytes and nothing else (BF16, FP8): loaded as they are.
struct PlainGranule {
  struct Raw {
    uint4 v;
  };
  __device__ static Raw load(const GemvParams&, const uint8_t* row, int64_t, int64_t g) {
    return {load_stream(row + g * 16)};
  }
};

struct DecodeBf16 : PlainGranule {
  static constexpr int kElems = 8, kUnroll = 8;
  __device__ static void expand(const GemvParams&, const Raw& r, float* w) { bf16x8_to_float(r.v, w); }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

struct DecodeFp8 : PlainGranule {
  static constexpr int kElems = 16, kUnroll = 8;
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

// D += A B on tensor cores, BF16 operands, F32 sums (v3 and v5's INT4 products): a: the four A registers of
// the lane (PTX ISA fragment layout of mma.m16n8k16), b0 / b1: its two B registers.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// go(std::integral_constant<int, MR>{}) for the activation-row bucket MR (1, 2, 4, 8, 16) that holds m:
// the kernels' row loops are unrolled over MR.
template <class Go>
cudaError_t with_rows_bucket(int m, Go&& go) {
  if (m <= 1) return go(std::integral_constant<int, 1>{});
  if (m <= 2) return go(std::integral_constant<int, 2>{});
  if (m <= 4) return go(std::integral_constant<int, 4>{});
  if (m <= 8) return go(std::integral_constant<int, 8>{});
  return go(std::integral_constant<int, 16>{});
}

// ---- The kernel files' launchers (R = 1: a product; R = 2: the SiLU product of gate and up rows).
// v1, or v2 where `v2` (kernels_gemv_v1v2.cu); every format.
template <int R>
cudaError_t launch_v1v2(DType dtype, bool v2, const GemvParams& p, cudaStream_t stream);
// v3 (kernels_gemv_tc.cu): BF16, FP8, INT4.
template <int R>
cudaError_t launch_v3(DType dtype, const GemvParams& p, cudaStream_t stream);
// v4 (kernels_gemv_stream.cu) where it takes the launch - one activation row; BF16 and FP8; INT4 with K
// whole 32-column runs, offsets within 32 bits and x fitting in shared memory, not with the norm fusion -
// else cudaErrorNotSupported with nothing launched.
template <int R>
cudaError_t launch_v4(DType dtype, const GemvParams& p, cudaStream_t stream);
// v5 (kernels_gemv_tc_stream.cu) where it takes the launch - FP8 as W8A8, rows of whole 64-byte chunks, up
// to 16 activation rows whose codes fit tcs::kMaxXBytes, no norm fusion - else cudaErrorNotSupported with
// nothing launched.
template <int R>
cudaError_t launch_v5(DType dtype, const GemvParams& p, cudaStream_t stream);

// The current device's SM count, and its shared memory per SM and the system's reserve per CTA, cached per
// device (kernels_gemv_stream.cu).
cudaError_t device_sms(int& sms);
cudaError_t device_smem(int& per_sm, int& reserved);

}  // namespace inferx::cuda::gemv_impl
