// Q6_K weight rows against ActQ8_K activations. The 6-bit values q (0..63) are the unsigned operand of
// vpmaddubsw (pairs <= 2 * 63 * 127 fit int16); each 16-element group's pairs are multiplied by its
// int8 scale into int32. The -32 offset uses the activation sums per 16:
//   isum = sum_g sc_g * (sum q x - 32 * xsum_g)      (|isum| < 2^31 for 256 elements)
//   dot  = d * dx * isum
#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/simd.h"
#include "core/half.h"
#include "quant/gguf_block_layouts.h"

namespace inferx::cpu {

namespace {

#if defined(INFERX_X86_AVX512)
// AVX-512 path: a 512-bit vector covers 64 elements = four scale groups. For half h,
//   z01 = [ql[64h..] & 15 | ql[64h+32..] & 15] + high bits (qh << 4 | qh << 2)  -> elements 128h + 0..63
//   z23 = [ql[64h..] >> 4 | ql[64h+32..] >> 4] + high bits (qh      | qh >> 2)  -> elements 128h + 64..127
// with per-16-bit-lane variable shifts giving both halves' high bits from one broadcast of qh.
template <int NR>
void rows_avx512(const BlockQ6_K* w, const ActQ8_KView* a, int64_t nsb, float* out) {
  constexpr int C = NR == 1 ? 2 : 1;
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i shl01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shr23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  // Vector j (= 2h for z01, 2h + 1 for z23) covers scale groups 4j .. 4j + 3, eight int16 lanes each.
  __m512i scale_idx[4];
  for (int j = 0; j < 4; ++j) {
    alignas(64) int16_t idx[32];
    for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(4 * j + i / 8);
    scale_idx[j] = _mm512_load_si512(idx);
  }
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ6_K& bw = w[sb];
    const __m256i sc256 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bw.scales)));
    const __m512i sc512 = _mm512_zextsi256_si512(sc256);
    const float d = f16_scalar(bw.d);
    __m512i isum[NR][C];
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < C; ++i) isum[r][i] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i lq = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw.ql + 64 * h))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw.ql + 64 * h + 32)), 1);
      const __m512i hq =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw.qh + 32 * h)));
      const __m512i z01 =
          _mm512_or_si512(_mm512_and_si512(lq, low4), _mm512_and_si512(_mm512_sllv_epi16(hq, shl01), bits45));
      const __m512i z23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lq, 4), low4),
                                          _mm512_and_si512(_mm512_srlv_epi16(hq, shr23), bits45));
      const __m512i sc01 = _mm512_permutexvar_epi16(scale_idx[2 * h], sc512);
      const __m512i sc23 = _mm512_permutexvar_epi16(scale_idx[2 * h + 1], sc512);
      for (int r = 0; r < NR; ++r) {
        const int8_t* x = a[r].qs + 256 * sb + 128 * h;
        isum[r][0] = _mm512_dpwssd_epi32(isum[r][0], _mm512_maddubs_epi16(z01, _mm512_loadu_si512(x)), sc01);
        isum[r][C - 1] =
            _mm512_dpwssd_epi32(isum[r][C - 1], _mm512_maddubs_epi16(z23, _mm512_loadu_si512(x + 64)), sc23);
      }
    }
    for (int r = 0; r < NR; ++r) {
      __m512i total = isum[r][0];
      if (C > 1) total = _mm512_add_epi32(total, isum[r][C - 1]);
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r].sum16 + 16 * sb));
      const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc256, xs), 5);  // 32 * sum sc * xsum
      total = _mm512_sub_epi32(total, _mm512_zextsi256_si512(corr));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(d * a[r].d[sb]), acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = hsum(acc[r]);
}
#endif

#if defined(INFERX_X86_SIMD)
template <int NR>
void rows_simd(const BlockQ6_K* w, const ActQ8_KView* a, int64_t nsb, float* out) {
  constexpr int C = NR == 1 ? 4 : (NR == 2 ? 2 : 1);
  __m256 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  // Chunk s (32 elements) of a half covers scale groups 2s (int16 lanes 0-7) and 2s + 1 (lanes 8-15):
  // per 128-bit lane, a byte shuffle broadcasting one int16 of that half's eight scales.
  __m256i scale_mask[4];
  for (int s = 0; s < 4; ++s) {
    const auto lo = static_cast<int16_t>((4 * s) | ((4 * s + 1) << 8));
    const auto hi = static_cast<int16_t>((4 * s + 2) | ((4 * s + 3) << 8));
    scale_mask[s] = _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
  }
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ6_K& bw = w[sb];
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bw.scales)));
    const float d = f16_scalar(bw.d);
    __m256i isum[NR][C];
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < C; ++i) isum[r][i] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw.ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw.ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw.qh + 32 * h));
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
      // Both 128-bit lanes hold this half's eight scales (groups 8h .. 8h + 7).
      // The lane selector must be an immediate (unoptimised builds do not fold a ternary into one).
      const __m256i sch =
          h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00) : _mm256_permute2x128_si256(sc16, sc16, 0x11);
      for (int s = 0; s < 4; ++s) {
        const __m256i scv = _mm256_shuffle_epi8(sch, scale_mask[s]);
        for (int r = 0; r < NR; ++r) {
          const __m256i x =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r].qs + 256 * sb + 128 * h + 32 * s));
          __m256i& acc_i = isum[r][(4 * h + s) % C];
          acc_i = dot_s16_acc(acc_i, _mm256_maddubs_epi16(q[s], x), scv);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      __m256i total = isum[r][0];
      for (int i = 1; i < C; ++i) total = _mm256_add_epi32(total, isum[r][i]);
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r].sum16 + 16 * sb));
      total = _mm256_sub_epi32(total, _mm256_slli_epi32(_mm256_madd_epi16(sc16, xs), 5));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * a[r].d[sb]), acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = hsum(acc[r]);
}
#else
template <int NR>
void rows_scalar(const BlockQ6_K* w, const ActQ8_KView* a, int64_t nsb, float* out) {
  for (int r = 0; r < NR; ++r) out[r] = 0;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ6_K& b = w[sb];
    int q[256];
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 4; ++s)
        for (int l = 0; l < 32; ++l) {
          const uint8_t low = b.ql[64 * h + 32 * (s & 1) + l];
          q[128 * h + 32 * s + l] =
              ((s < 2 ? low & 0xF : low >> 4) | (((b.qh[32 * h + l] >> (2 * s)) & 3) << 4)) - 32;
        }
    const float d = f16_to_f32(b.d);
    for (int r = 0; r < NR; ++r) {
      const int8_t* x = a[r].qs + 256 * sb;
      int32_t isum = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t s = 0;
        for (int l = 0; l < 16; ++l) s += q[16 * g + l] * x[16 * g + l];
        isum += b.scales[g] * s;
      }
      out[r] += d * a[r].d[sb] * static_cast<float>(isum);
    }
  }
}
#endif

template <int NR>
void rows(const BlockQ6_K* w, const void* act, int64_t stride, int64_t k, float* out) {
  ActQ8_KView a[NR];
  for (int r = 0; r < NR; ++r) a[r] = act_q8_k_view(static_cast<const char*>(act) + r * stride, k);
#if defined(INFERX_X86_AVX512)
  rows_avx512<NR>(w, a, k / 256, out);
#elif defined(INFERX_X86_SIMD)
  rows_simd<NR>(w, a, k / 256, out);
#else
  rows_scalar<NR>(w, a, k / 256, out);
#endif
}

}  // namespace

void dot_q6_k_rows(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  const auto* b = static_cast<const BlockQ6_K*>(w);
  dispatch_rows(nrows, [&](auto nr) { rows<decltype(nr)::value>(b, act, stride, k, out); });
}

}  // namespace inferx::cpu
