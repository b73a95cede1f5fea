// Reference (scalar) quantizers and dequantizers of the GGUF block types. Layouts: gguf_block_layouts.h.
// The dequantizers evaluate exactly the float expressions of gguf-py's gguf/quants.py (one rounding per
// product, in the same order), so they match it bit for bit; the tests check that on fixtures.
#include "quant/gguf_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "quant/fp8.h"
#include "quant/gguf_block_layouts.h"

namespace inferx {

namespace {

// ---- dequantize -----------------------------------------------------------------------------------

void dequantize_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequantize_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>((b[i].qs[j] & 0xF) - 8);
      y[j + 16] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

void dequantize_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    const float dmin = f16_to_f32(b[i].dmin);
    uint8_t sc[8], m[8];
    unpack_q4_k_scales(b[i].scales, sc, m);
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = b[i].qs + 32 * c;
      const float d_lo = d * sc[2 * c], m_lo = dmin * m[2 * c];
      const float d_hi = d * sc[2 * c + 1], m_hi = dmin * m[2 * c + 1];
      for (int l = 0; l < 32; ++l) y[l] = d_lo * static_cast<float>(q[l] & 0xF) - m_lo;
      for (int l = 0; l < 32; ++l) y[32 + l] = d_hi * static_cast<float>(q[l] >> 4) - m_hi;
      y += 64;
    }
  }
}

// The 6-bit value (0..63) of element 128h + 32s + l of a Q6_K block (layout comment in the header).
inline int q6_k_value(const BlockQ6_K& b, int h, int s, int l) {
  const uint8_t low = b.ql[64 * h + 32 * (s & 1) + l];
  const int lo4 = (s < 2) ? (low & 0xF) : (low >> 4);
  const int hi2 = (b.qh[32 * h + l] >> (2 * s)) & 3;
  return lo4 | (hi2 << 4);
}

void dequantize_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 256) {
    const float d = f16_to_f32(b[i].d);
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 4; ++s)
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * h + 32 * s + l;
          const float ds = d * static_cast<float>(b[i].scales[e / 16]);
          y[e] = ds * static_cast<float>(q6_k_value(b[i], h, s, l) - 32);
        }
  }
}

// ---- quantize: Q8_0 / Q4_0 (round to nearest, bit-identical to gguf-py) ---------------------------

void quantize_q8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    // std::round rounds half away from zero, as ggml's roundf and gguf-py's np_roundf do.
    for (int j = 0; j < 32; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void quantize_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    // The signed value of largest magnitude (first one on ties) maps to -8, so the full range is used.
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) {
      const float v = std::trunc(x[j] * id + 8.5f);
      q[j] = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
    }
    for (int j = 0; j < 16; ++j) b[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
  }
}

// ---- quantize: Q4_K (affine 4-bit sub-blocks) ----------------------------------------------------

// Fits x[i] ~= a * q[i] + b with q in [0, 15] and b <= 0 (GGUF stores -b as a non-negative min),
// minimising the weighted squared error. Tries a grid of candidate step sizes around (max - min) / 15,
// rounds, and refits (a, b) by weighted least squares for each, keeping the best.
void fit_affine_4bit(const float* x, const float* w, int n, float* a_out, float* b_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);
  if (hi <= lo) {
    *a_out = 0;
    *b_out = lo;
    return;
  }
  auto error_of = [&](float a, float b) {
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const float q = std::clamp(std::round((x[i] - b) / a), 0.0f, 15.0f);
      const double diff = a * q + b - x[i];
      e += w[i] * diff * diff;
    }
    return e;
  };
  float best_a = (hi - lo) / 15.0f, best_b = lo;
  double best_e = error_of(best_a, best_b);
  for (int step = 0; step <= 20; ++step) {
    const float iscale = (15.0f - 1.0f + 0.1f * static_cast<float>(step)) / (hi - lo);
    double sw = 0, swq = 0, swq2 = 0, swx = 0, swxq = 0;
    for (int i = 0; i < n; ++i) {
      const float q = std::clamp(std::round(iscale * (x[i] - lo)), 0.0f, 15.0f);
      sw += w[i];
      swq += w[i] * q;
      swq2 += w[i] * q * q;
      swx += w[i] * x[i];
      swxq += w[i] * x[i] * q;
    }
    const double det = sw * swq2 - swq * swq;
    if (det <= 0) continue;
    double a = (sw * swxq - swq * swx) / det;
    double b = (swq2 * swx - swq * swxq) / det;
    if (b > 0) {  // the offset must be <= 0: refit the scale alone
      b = 0;
      a = swxq / swq2;
    }
    if (a <= 0) continue;
    const double e = error_of(static_cast<float>(a), static_cast<float>(b));
    if (e < best_e) {
      best_e = e;
      best_a = static_cast<float>(a);
      best_b = static_cast<float>(b);
    }
  }
  *a_out = best_a;
  *b_out = best_b;
}

void quantize_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float scale[8], minv[8], w[32];
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      // Weights favour large-magnitude elements, offset by the sub-block RMS so small ones still count.
      float ss = 0;
      for (int l = 0; l < 32; ++l) ss += xs[l] * xs[l];
      const float rms = std::sqrt(ss / 32);
      for (int l = 0; l < 32; ++l) w[l] = rms + std::fabs(xs[l]);
      float a, off;
      fit_affine_4bit(xs, w, 32, &a, &off);
      scale[j] = a;
      minv[j] = -off;
    }
    // Super-block scales: the 6-bit codes span [0, max] of the sub-block scales and mins.
    const float max_scale = *std::max_element(scale, scale + 8);
    const float max_min = *std::max_element(minv, minv + 8);
    const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
    b[i].d = f32_to_f16(d);
    b[i].dmin = f32_to_f16(dmin);
    const float d16 = f16_to_f32(b[i].d), dmin16 = f16_to_f32(b[i].dmin);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = d16 > 0 ? static_cast<uint8_t>(std::clamp(std::round(scale[j] / d16), 0.0f, 63.0f)) : 0;
      m[j] = dmin16 > 0 ? static_cast<uint8_t>(std::clamp(std::round(minv[j] / dmin16), 0.0f, 63.0f)) : 0;
    }
    pack_q4_k_scales(sc, m, b[i].scales);
    // Requantize with the scales as they will be decoded.
    uint8_t q[256];
    for (int j = 0; j < 8; ++j) {
      const float ds = d16 * sc[j], dm = dmin16 * m[j];
      for (int l = 0; l < 32; ++l) {
        const float v = ds > 0 ? std::round((x[32 * j + l] + dm) / ds) : 0.0f;
        q[32 * j + l] = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
      }
    }
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        b[i].qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  }
}

// ---- quantize: Q6_K (symmetric 6-bit, one int8 scale per 16) -------------------------------------

// Fits x[i] ~= s * q[i] with q in [-32, 31], weighting errors by x^2. The element of largest
// magnitude maps near -32 (the wider side of the range); nearby step sizes are tried and refit.
float fit_symmetric_6bit(const float* x, int n) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  if (amax == 0) return 0;
  float best_s = max / -32.0f;
  double best_e = -1;
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -(32.0f + 0.1f * static_cast<float>(step)) / max;
    double sxq = 0, sq2 = 0;
    for (int i = 0; i < n; ++i) {
      const float q = std::clamp(std::round(iscale * x[i]), -32.0f, 31.0f);
      const double w = static_cast<double>(x[i]) * x[i];
      sxq += w * x[i] * q;
      sq2 += w * q * q;
    }
    if (sq2 <= 0) continue;
    const float s = static_cast<float>(sxq / sq2);
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const float q = std::clamp(std::round(x[i] / s), -32.0f, 31.0f);
      const double diff = s * q - x[i];
      e += static_cast<double>(x[i]) * x[i] * diff * diff;
    }
    if (best_e < 0 || e < best_e) {
      best_e = e;
      best_s = s;
    }
  }
  return best_s;
}

void quantize_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float s[16];
    float amax = 0;
    for (int j = 0; j < 16; ++j) {
      s[j] = fit_symmetric_6bit(x + 16 * j, 16);
      amax = std::max(amax, std::fabs(s[j]));
    }
    const float d = amax / 127.0f;
    b[i].d = f32_to_f16(d);
    const float d16 = f16_to_f32(b[i].d);
    for (int j = 0; j < 16; ++j)
      b[i].scales[j] = d16 > 0 ? static_cast<int8_t>(std::clamp(std::round(s[j] / d16), -128.0f, 127.0f)) : 0;
    uint8_t q[256];
    for (int e = 0; e < 256; ++e) {
      const float ds = d16 * b[i].scales[e / 16];
      const float v = ds != 0 ? std::round(x[e] / ds) : 0.0f;
      q[e] = static_cast<uint8_t>(std::clamp(v, -32.0f, 31.0f) + 32.0f);
    }
    std::memset(b[i].ql, 0, sizeof b[i].ql);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int h = 0; h < 2; ++h)
      for (int sidx = 0; sidx < 4; ++sidx)
        for (int l = 0; l < 32; ++l) {
          const int v = q[128 * h + 32 * sidx + l];
          uint8_t& low = b[i].ql[64 * h + 32 * (sidx & 1) + l];
          low = static_cast<uint8_t>(low | ((v & 0xF) << (sidx < 2 ? 0 : 4)));
          b[i].qh[32 * h + l] = static_cast<uint8_t>(b[i].qh[32 * h + l] | ((v >> 4) << (2 * sidx)));
        }
  }
}

int64_t blocks_of(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  INFERX_CHECK(n >= 0 && n % info.block_elems == 0,
               "a row of {} elements is not a whole number of {} blocks ({} elements each)", n, info.name,
               info.block_elems);
  return n / info.block_elems;
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t nb = blocks_of(t, n);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::Q8_0:
      return dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case DType::Q4_0:
      return dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::Q4_K:
      return dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case DType::Q6_K:
      return dequantize_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case DType::F8_E4M3:  // the codes' values; the layer's scale lives in Linear::scale (quant/fp8.h)
      return dequantize_fp8_row(static_cast<const uint8_t*>(src), 1.0f, dst, n);
    case DType::INT4:
      fail("dequantize_row: INT4 rows need their group scales (quant/int4.h dequantize_int4_row)");
    default:
      fail("dequantize_row: {} is not a weight type", dtype_name(t));
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const int64_t nb = blocks_of(t, n);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      return;
    case DType::Q8_0:
      return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::Q4_0:
      return quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::Q4_K:
      return quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
    case DType::Q6_K:
      return quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
    default:
      fail("quantize_row: {} is not a weight type", dtype_name(t));
  }
}

}  // namespace inferx
