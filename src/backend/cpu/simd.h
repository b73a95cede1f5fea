#pragma once
// Small x86 SIMD helpers shared by the dot_*.cpp kernels. INFERX_X86_SIMD is set when the build
// targets AVX2 + FMA + F16C (any x86-64-v3 machine); every kernel keeps a scalar path for the rest.
// The integer dot products use VNNI (vpdpbusd / vpdpwssd) when the target has AVX-512 VNNI with VL or
// AVX-VNNI, and the AVX2 vpmaddubsw + vpmaddwd pair otherwise.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define INFERX_X86_SIMD 1
// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics that start from
// _mm256_undefined_si256() (GCC bug 105593). The state applies by source location, so it must be set
// before <immintrin.h> is first included in the translation unit: include this header first.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace inferx::cpu {

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define INFERX_VNNI_ISA "avx512-vnni (256-bit)"
#elif defined(__AVXVNNI__)
#define INFERX_VNNI_ISA "avx-vnni"
#else
#define INFERX_VNNI_ISA "avx2"
#endif

// acc + sum over groups of 4 of u[i] * s[i] (u unsigned, s signed bytes) into 8 int32 lanes.
inline __m256i dot_u8s8_acc(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  // u * s pairs fit int16 for every caller (|u| <= 128 with |s| <= 127 gives 2 * 16256 < 32768).
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

// acc + sum over pairs of a[i] * b[i] (int16) into 8 int32 lanes.
inline __m256i dot_s16_acc(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hsum(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }

// Two f16 values (lo, hi) -> [f32(lo), f32(hi), 0, 0].
inline __m128 f16_pair(uint16_t lo, uint16_t hi) {
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(lo | (static_cast<uint32_t>(hi) << 16))));
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
// Full-width kernels (two 32-element blocks or one 64-element chunk per vector).
#define INFERX_X86_AVX512 1

inline float hsum(__m512 v) {
  // No _mm512_reduce_add_ps: GCC 12 builds it from _mm256_undefined (see the pragma above).
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE));
  return hsum(_mm256_add_ps(lo, hi));
}

// [v0 x 8, v1 x 8]: per-block scalars of a two-block vector spread over the blocks' eight lanes.
inline __m512 spread_pair(__m128 v) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                               _mm512_castps128_ps512(v));
}

// Two consecutive f32 values as [p0, p1, 0, 0].
inline __m128 load_pair(const float* p) {
  // memcpy, not a double* cast: p is only 4-byte aligned (UBSan flags the misaligned double load).
  double d;
  std::memcpy(&d, p, sizeof d);
  return _mm_castpd_ps(_mm_set_sd(d));
}
#endif

}  // namespace inferx::cpu
#endif
