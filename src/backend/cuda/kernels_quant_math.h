#pragma once
// The element formats of the quantized GEMM path as host+device functions (kernels_quant.cu uses them in
// its kernels; tests/cuda/cuda_qgemm_test.cpp runs the very same code on the host against quant/):
// E4M3 <-> float with cuda_fp8.h's conversions, and the dequantization of 8 consecutive weight columns.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/kernels_quant.h"

#if defined(__CUDACC__)
#define INFERX_HD __host__ __device__ __forceinline__
#else
#define INFERX_HD inline
#endif

namespace inferx::cuda {

INFERX_HD float fp8_to_float(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(h));
}

// Round to nearest even, saturating to +-448 (NaN stays NaN, 0x7F): the same codes as f32_to_fp8_e4m3.
INFERX_HD uint8_t float_to_fp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

INFERX_HD float half_bits_to_float(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}

// Column c of an F8_E4M3 weight's row `row` (any K).
INFERX_HD float dequantize_fp8(const DequantWeight& w, int64_t row, int64_t c) {
  return fp8_to_float(static_cast<const uint8_t*>(w.data)[row * w.k + c]) *
         w.fp8_scale[w.per_channel ? row : 0];
}

// Eight consecutive columns [c0, c0 + 8) of weight row `row` (c0 a multiple of 8: never crosses a group,
// an INT4 run half, a Q8_0 block or a Q4_K sub-block).
INFERX_HD void dequantize8(const DequantWeight& w, int64_t row, int64_t c0, float* v) {
  const int64_t k = w.k;
  switch (w.dtype) {
    case DType::F8_E4M3:
      for (int e = 0; e < 8; ++e) v[e] = dequantize_fp8(w, row, c0 + e);
      return;
    case DType::INT4: {
      // quant/int4.h: per 32-column run, byte j holds column j (low nibble) and column 16 + j (high).
      const auto* p = static_cast<const uint8_t*>(w.data) + row * (k / 2) + (c0 / 32) * 16;
      const int j0 = static_cast<int>(c0 % 32);
      const int64_t groups = k / w.group, g = c0 / w.group;
      const float s = half_bits_to_float(w.int4_scale[row * groups + g]);
      const int z = w.int4_zero ? w.int4_zero[row * groups + g] : 8;
      for (int e = 0; e < 8; ++e) {
        const int j = j0 + e;
        const uint8_t b = p[j & 15];
        const int q = j < 16 ? (b & 15) : (b >> 4);
        v[e] = s * static_cast<float>(q - z);
      }
      return;
    }
    case DType::Q8_0: {
      // 34-byte blocks of 32: f16 d, then 32 int8 (quant/gguf_block_layouts.h BlockQ8_0).
      const auto* blk = static_cast<const uint8_t*>(w.data) + row * (k / 32 * 34) + (c0 / 32) * 34;
      const float d = half_bits_to_float(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      const auto* qs = reinterpret_cast<const int8_t*>(blk + 2) + (c0 % 32);
      for (int e = 0; e < 8; ++e) v[e] = d * static_cast<float>(qs[e]);
      return;
    }
    case DType::Q4_K: {
      // 144-byte super-blocks of 256 (BlockQ4_K): f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 qs.
      const auto* blk = static_cast<const uint8_t*>(w.data) + row * (k / 256 * 144) + (c0 / 256) * 144;
      const float d = half_bits_to_float(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      const float dmin = half_bits_to_float(static_cast<uint16_t>(blk[2] | (blk[3] << 8)));
      const uint8_t* s = blk + 4;
      const uint8_t* qs = blk + 16;
      const int e0 = static_cast<int>(c0 % 256);
      const int j = e0 / 32;  // sub-block (unpack_q4_k_scales)
      int sc, m;
      if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
      } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      }
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      const int chunk = e0 / 64, l0 = e0 % 32;
      const bool high = (e0 % 64) >= 32;
      for (int e = 0; e < 8; ++e) {
        const uint8_t b = qs[32 * chunk + l0 + e];
        const int q = high ? (b >> 4) : (b & 15);
        v[e] = dl * static_cast<float>(q) - ml;
      }
      return;
    }
    default:
      for (int e = 0; e < 8; ++e) v[e] = 0.0f;
  }
}

}  // namespace inferx::cuda
