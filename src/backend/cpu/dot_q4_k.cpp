// Q4_K weight rows against ActQ8_K activations (one activation scale per 256-element super-block).
// Per super-block: isum = sum_j sc_j * (sum over sub-block j of q * x) is exact in int32
// (<= 63 * 15 * 127 * 256 < 2^31), so the float work is one FMA per super-block:
//   dot = d * dx * isum - dmin * dx * sum_j m_j * xsum_j
// where xsum_j is the activation sum of sub-block j (precomputed). The nibbles (0..15) are the unsigned
// operand of vpmaddubsw (pairs <= 2 * 15 * 127 fit int16); the int16 pairs are then multiplied by the
// sub-block scale and summed into int32 (vpdpwssd / vpmaddwd).
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/simd.h"
#include "core/half.h"
#include "quant/gguf_block_layouts.h"

namespace inferx::cpu {

namespace {

// The 8 six-bit scales (low 4 bytes of *sc) and mins, unpacked four at a time with 32-bit masks
// (same bit layout as unpack_q4_k_scales in gguf_block_layouts.h). Unused where the build takes a
// vector path (AVX2 or AVX-512 VNNI), hence maybe_unused.
[[maybe_unused]] inline void unpack_scales_mins(const uint8_t* packed, uint32_t sc[2], uint32_t m[2]) {
  uint32_t a, b, c;
  std::memcpy(&a, packed, 4);
  std::memcpy(&b, packed + 4, 4);
  std::memcpy(&c, packed + 8, 4);
  sc[0] = a & 0x3F3F3F3Fu;
  m[0] = b & 0x3F3F3F3Fu;
  sc[1] = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
  m[1] = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
}

#if defined(INFERX_X86_SIMD)
// Vector form of unpack_scales_mins: 8 scales and 8 mins as int16 lanes. Reads 16 bytes from the
// 12-byte scales field (the 4 extra bytes are the block's qs: in bounds, ignored). With a, b, c the
// bytes 0-3, 4-7, 8-11: sc = [a & 63, (c & 15) | (a >> 6) << 4], m = [b & 63, (c >> 4) | (b >> 6) << 4].
inline void scales_mins_16(const uint8_t* packed, __m128i* sc16, __m128i* m16) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  // [a, c, b, c] and [0, a, 0, b] (32-bit groups); 0x80 selects zero.
  const __m128i acbc = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i z = _mm_setr_epi8(-128, -128, -128, -128, 0, 1, 2, 3, -128, -128, -128, -128, 4, 5, 6, 7);
  const __m128i zazb = _mm_shuffle_epi8(v, z);
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(acbc, _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(zazb, 2), _mm_set1_epi8(0x30));
  const __m128i scm = _mm_or_si128(low, high);  // bytes: sc0..sc7, m0..m7
  *sc16 = _mm_cvtepu8_epi16(scm);
  *m16 = _mm_cvtepu8_epi16(_mm_srli_si128(scm, 8));
}

// [d, dmin, 0, 0] of a Q4_K block (adjacent f16 fields) with one conversion.
inline __m128 d_dmin(const BlockQ4_K& b) {
  uint32_t both;
  std::memcpy(&both, &b.d, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(both)));
}
#endif

#if defined(INFERX_X86_SIMD) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// AVX-512 path: one 512-bit vector holds a whole 64-element chunk (32 bytes of qs: low nibbles are
// elements 0-31, high nibbles 32-63), so per chunk and row it is one activation load, one vpmaddubsw
// and one vpdpwssd against a scale vector whose int16 lanes 0-15 hold sc[2c] and 16-31 sc[2c + 1].
template <int NR>
void rows_avx512(const BlockQ4_K* w, const ActQ8_KView* a, int64_t nsb, float* out) {
  constexpr int C = NR == 1 ? 2 : 1;
  __m512 acc[NR];
  __m128 macc[NR];
  for (int r = 0; r < NR; ++r) {
    acc[r] = _mm512_setzero_ps();
    macc[r] = _mm_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i scale_idx[4];
  for (int c = 0; c < 4; ++c)
    scale_idx[c] = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(2 * c)),
                                      _mm256_set1_epi16(static_cast<int16_t>(2 * c + 1)), 1);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ4_K& bw = w[sb];
    __m128i sc8, m16;
    scales_mins_16(bw.scales, &sc8, &m16);
    const __m512i sc16 = _mm512_zextsi128_si512(sc8);
    const __m128 dd = d_dmin(bw);
    __m512i isum[NR][C];
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < C; ++i) isum[r][i] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i qq =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw.qs + 32 * c)));
      // Upper 256 bits: shift the bytes' high nibbles down (16-bit lanes 16-31 only).
      const __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(qq, 0xFFFF0000u, qq, 4), low4);
      const __m512i scv = _mm512_permutexvar_epi16(scale_idx[c], sc16);
      for (int r = 0; r < NR; ++r) {
        const __m512i x = _mm512_loadu_si512(a[r].qs + 256 * sb + 64 * c);
        __m512i& s = isum[r][c % C];
        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(q, x), scv);
      }
    }
    for (int r = 0; r < NR; ++r) {
      __m512i total = isum[r][0];
      for (int i = 1; i < C; ++i) total = _mm512_add_epi32(total, isum[r][i]);
      const __m128 scale = _mm_mul_ps(dd, _mm_set1_ps(a[r].d[sb]));  // [d dx, dmin dx]
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_broadcastss_ps(scale), acc[r]);
      const __m128i xs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[r].sum32 + 8 * sb));
      const __m128i mins = _mm_madd_epi16(xs, m16);
      macc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(mins), _mm_shuffle_ps(scale, scale, 0x55), macc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    const __m256 lo = _mm512_castps512_ps256(acc[r]);
    const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(acc[r], acc[r], 0xEE));
    out[r] = hsum(_mm256_add_ps(lo, hi)) - hsum(macc[r]);
  }
}
#endif

#if defined(INFERX_X86_SIMD)
// Byte-shuffle mask broadcasting int16 lane j of a 128-bit lane to all eight int16 lanes.
[[maybe_unused]] inline __m256i broadcast_word_mask(int j) {
  return _mm256_set1_epi16(static_cast<int16_t>((2 * j) | ((2 * j + 1) << 8)));
}

template <int NR>
void rows_simd(const BlockQ4_K* w, const ActQ8_KView* a, int64_t nsb, float* out) {
  // Independent integer accumulators per row: with one row the vpdpwssd chain would otherwise
  // serialise the eight sub-block products of a super-block.
  constexpr int C = NR == 1 ? 4 : (NR == 2 ? 2 : 1);
  __m256 acc[NR];
  __m128 macc[NR];
  for (int r = 0; r < NR; ++r) {
    acc[r] = _mm256_setzero_ps();
    macc[r] = _mm_setzero_ps();
  }
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ4_K& bw = w[sb];
    __m128i sc16, m16;
    scales_mins_16(bw.scales, &sc16, &m16);
    const __m256i sc256 = _mm256_broadcastsi128_si256(sc16);
    const __m128 dd = d_dmin(bw);
    __m256i isum[NR][C];
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < C; ++i) isum[r][i] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw.qs + 32 * c));
      const __m256i lo = _mm256_and_si256(q, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      const __m256i s_lo = _mm256_shuffle_epi8(sc256, broadcast_word_mask(2 * c));
      const __m256i s_hi = _mm256_shuffle_epi8(sc256, broadcast_word_mask(2 * c + 1));
      for (int r = 0; r < NR; ++r) {
        const int8_t* x = a[r].qs + 256 * sb + 64 * c;
        const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
        const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32));
        __m256i& s0 = isum[r][(2 * c) % C];
        __m256i& s1 = isum[r][(2 * c + 1) % C];
        s0 = dot_s16_acc(s0, _mm256_maddubs_epi16(lo, xl), s_lo);
        s1 = dot_s16_acc(s1, _mm256_maddubs_epi16(hi, xh), s_hi);
      }
    }
    for (int r = 0; r < NR; ++r) {
      __m256i total = isum[r][0];
      for (int i = 1; i < C; ++i) total = _mm256_add_epi32(total, isum[r][i]);
      const __m128 scale = _mm_mul_ps(dd, _mm_set1_ps(a[r].d[sb]));  // [d dx, dmin dx]
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_broadcastss_ps(scale), acc[r]);
      const __m128i xs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[r].sum32 + 8 * sb));
      const __m128i mins = _mm_madd_epi16(xs, m16);  // |.| <= 2 * 63 * 4064: fits int32
      macc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(mins), _mm_shuffle_ps(scale, scale, 0x55), macc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = hsum(acc[r]) - hsum(macc[r]);
}
#else
template <int NR>
void rows_scalar(const BlockQ4_K* w, const ActQ8_KView* a, int64_t nsb, float* out) {
  for (int r = 0; r < NR; ++r) out[r] = 0;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    uint32_t scw[2], mw[2];
    unpack_scales_mins(w[sb].scales, scw, mw);
    uint8_t sc[8], m[8];
    std::memcpy(sc, scw, 8);
    std::memcpy(m, mw, 8);
    const float d = f16_to_f32(w[sb].d), dmin = f16_to_f32(w[sb].dmin);
    for (int r = 0; r < NR; ++r) {
      const int8_t* x = a[r].qs + 256 * sb;
      int32_t isum = 0, msum = 0;
      for (int c = 0; c < 4; ++c) {
        int32_t lo = 0, hi = 0;
        for (int l = 0; l < 32; ++l) {
          lo += (w[sb].qs[32 * c + l] & 0xF) * x[64 * c + l];
          hi += (w[sb].qs[32 * c + l] >> 4) * x[64 * c + 32 + l];
        }
        isum += sc[2 * c] * lo + sc[2 * c + 1] * hi;
      }
      for (int j = 0; j < 8; ++j) msum += m[j] * a[r].sum32[8 * sb + j];
      out[r] += d * a[r].d[sb] * static_cast<float>(isum) - dmin * a[r].d[sb] * static_cast<float>(msum);
    }
  }
}
#endif

template <int NR>
void rows(const BlockQ4_K* w, const void* act, int64_t stride, int64_t k, float* out) {
  ActQ8_KView a[NR];
  for (int r = 0; r < NR; ++r) a[r] = act_q8_k_view(static_cast<const char*>(act) + r * stride, k);
#if defined(INFERX_X86_SIMD) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  rows_avx512<NR>(w, a, k / 256, out);
#elif defined(INFERX_X86_SIMD)
  rows_simd<NR>(w, a, k / 256, out);
#else
  rows_scalar<NR>(w, a, k / 256, out);
#endif
}

}  // namespace

void dot_q4_k_rows(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  const auto* b = static_cast<const BlockQ4_K*>(w);
  dispatch_rows(nrows, [&](auto nr) { rows<decltype(nr)::value>(b, act, stride, k, out); });
}

}  // namespace inferx::cpu
