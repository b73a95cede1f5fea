// Row-wise quantization of f32 activations to the Q8 layouts the integer kernels read (dot_kernels.h).
// Done once per matmul call per activation row, so it is small next to the weight stream, but it is
// vectorised anyway: for decode-sized matmuls (N = 512) a scalar loop would cost ~10% of the call.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/simd.h"

namespace inferx::cpu {

namespace {

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

#if defined(INFERX_X86_SIMD)
inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// max |x| over n (a multiple of 32) floats.
float abs_max(const float* x, int64_t n) {
  __m256 m0 = _mm256_setzero_ps(), m1 = m0;
  for (int64_t i = 0; i < n; i += 16) {
    m0 = _mm256_max_ps(m0, abs_ps(_mm256_loadu_ps(x + i)));
    m1 = _mm256_max_ps(m1, abs_ps(_mm256_loadu_ps(x + i + 8)));
  }
  m0 = _mm256_max_ps(m0, m1);
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// Quantizes 32 floats with inverse scale id into q (round to nearest even, the MXCSR default, which is
// what std::nearbyint does in the scalar path); returns the four 8-element int32 partial sums in *sums.
inline void quantize32(const float* x, float id, int8_t* q, __m256i* sums) {
  const __m256 vid = _mm256_set1_ps(id);
  __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), vid));
  __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), vid));
  __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), vid));
  __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), vid));
  sums[0] = i0;
  sums[1] = i1;
  sums[2] = i2;
  sums[3] = i3;
  // packs work within 128-bit lanes: restore element order with one cross-lane permute at the end.
  const __m256i p01 = _mm256_packs_epi32(i0, i1);
  const __m256i p23 = _mm256_packs_epi32(i2, i3);
  const __m256i p = _mm256_packs_epi16(p01, p23);
  const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
#else
float abs_max(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}
#endif

// Quantizes 32 floats; writes the sums of the two 16-element halves.
inline void quantize_block32(const float* x, float id, int8_t* q, int32_t* sum_lo, int32_t* sum_hi) {
#if defined(INFERX_X86_SIMD)
  __m256i s[4];
  quantize32(x, id, q, s);
  *sum_lo = hsum_epi32(_mm256_add_epi32(s[0], s[1]));
  *sum_hi = hsum_epi32(_mm256_add_epi32(s[2], s[3]));
#else
  int32_t lo = 0, hi = 0;
  for (int j = 0; j < 32; ++j) {
    const auto v = static_cast<int32_t>(std::nearbyint(x[j] * id));
    q[j] = static_cast<int8_t>(v);
    (j < 16 ? lo : hi) += v;
  }
  *sum_lo = lo;
  *sum_hi = hi;
#endif
}

}  // namespace

int64_t act_q8_0_row_bytes(int64_t k) { return align64(k + 8 * (k / 32)); }
int64_t act_q8_k_row_bytes(int64_t k) { return align64(k + 4 * (k / 256) + 2 * (k / 16) + 2 * (k / 32)); }

void quantize_act_q8_0(const float* x, int64_t k, void* row) {
  auto* qs = static_cast<int8_t*>(row);
  auto* d = reinterpret_cast<float*>(qs + k);
  float* dsum = d + k / 32;
  for (int64_t b = 0; b < k / 32; ++b) {
    const float amax = abs_max(x + 32 * b, 32);
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    int32_t lo, hi;
    quantize_block32(x + 32 * b, id, qs + 32 * b, &lo, &hi);
    dsum[b] = d[b] * static_cast<float>(lo + hi);
  }
}

void quantize_act_q8_k(const float* x, int64_t k, void* row) {
  ActQ8_KView v = act_q8_k_view(row, k);
  auto* qs = const_cast<int8_t*>(v.qs);
  auto* d = const_cast<float*>(v.d);
  auto* sum16 = const_cast<int16_t*>(v.sum16);
  auto* sum32 = const_cast<int16_t*>(v.sum32);
  for (int64_t sb = 0; sb < k / 256; ++sb) {
    const float amax = abs_max(x + 256 * sb, 256);
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    d[sb] = amax / 127.0f;
    for (int64_t b = 8 * sb; b < 8 * sb + 8; ++b) {
      int32_t lo, hi;
      quantize_block32(x + 32 * b, id, qs + 32 * b, &lo, &hi);
      // |sum| <= 32 * 127 fits int16.
      sum16[2 * b] = static_cast<int16_t>(lo);
      sum16[2 * b + 1] = static_cast<int16_t>(hi);
      sum32[b] = static_cast<int16_t>(lo + hi);
    }
  }
}

}  // namespace inferx::cpu
