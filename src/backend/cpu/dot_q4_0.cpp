// Q4_0 weight rows against ActQ8_0 activations. The nibbles q (0..15) are the unsigned operand of the
// integer dot; the offset of 8 is applied once per block in f32 through the activation block sums:
// sum (q - 8) x = sum q x - 8 sum x, and d_w d_x sum x = d_w * dsum (precomputed per activation block).
#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/simd.h"
#include "core/half.h"
#include "quant/gguf_block_layouts.h"

namespace inferx::cpu {

namespace {

#if defined(INFERX_X86_AVX512)
// Two blocks per 512-bit vector: 128-bit lanes = [lo(b), hi(b), lo(b+1), hi(b+1)] nibbles, which is
// element order for both blocks. The offset-8 correction is a two-lane FMA per row and block pair.
template <int NR>
void rows_avx512(const BlockQ4_0* w, const ActQ8_0View* a, int64_t nb, float* out) {
  __m512 acc[NR];
  __m128 corr[NR];
  for (int r = 0; r < NR; ++r) {
    acc[r] = _mm512_setzero_ps();
    corr[r] = _mm_setzero_ps();
  }
  const __m512i zero = _mm512_setzero_si512();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i dup = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const __m256i pair = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b + 1].qs)), 1);
    const __m512i qq = _mm512_permutexvar_epi64(dup, _mm512_castsi256_si512(pair));
    // Shift the high-nibble copies (16-bit lanes 8-15 and 24-31) down by 4.
    const __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(qq, 0xFF00FF00u, qq, 4), low4);
    const __m128 dw = f16_pair(w[b].d, w[b + 1].d);
    for (int r = 0; r < NR; ++r) {
      const __m512i x = _mm512_loadu_si512(a[r].qs + 32 * b);
      const __m512i p = _mm512_dpbusd_epi32(zero, q, x);
      const __m512 scale = spread_pair(_mm_mul_ps(dw, load_pair(a[r].d + b)));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r]);
      corr[r] = _mm_fmadd_ps(dw, load_pair(a[r].dsum + b), corr[r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    float total = hsum(acc[r]) - 8.0f * hsum(corr[r]);
    if (b < nb) {  // odd block count: the last block in 256-bit
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs));
      const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r].qs + 32 * b));
      const float dw = f16_scalar(w[b].d);
      total += hsum(_mm256_cvtepi32_ps(dot_u8s8_acc(_mm256_setzero_si256(), u, x))) * (dw * a[r].d[b]) -
               8.0f * dw * a[r].dsum[b];
    }
    out[r] = total;
  }
}
#endif

#if defined(INFERX_X86_SIMD)
template <int NR>
inline void block(const BlockQ4_0& w, const ActQ8_0View* a, int64_t b, __m256* acc, float* corr) {
  const float dw = f16_scalar(w.d);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
  // Elements 0..15 are the low nibbles, 16..31 the high nibbles: one 256-bit vector in element order.
  const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
  for (int r = 0; r < NR; ++r) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r].qs + 32 * b));
    const __m256i p = dot_u8s8_acc(_mm256_setzero_si256(), u, x);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a[r].d[b]), acc[r]);
    corr[r] += dw * a[r].dsum[b];
  }
}
#endif

template <int NR>
void rows(const BlockQ4_0* w, const void* act, int64_t stride, int64_t k, float* out) {
  ActQ8_0View a[NR];
  for (int r = 0; r < NR; ++r) a[r] = act_q8_0_view(static_cast<const char*>(act) + r * stride, k);
  const int64_t nb = k / 32;
#if defined(INFERX_X86_AVX512)
  rows_avx512<NR>(w, a, nb, out);
#elif defined(INFERX_X86_SIMD)
  __m256 acc0[NR], acc1[NR];
  float corr0[NR], corr1[NR];
  for (int r = 0; r < NR; ++r) {
    acc0[r] = acc1[r] = _mm256_setzero_ps();
    corr0[r] = corr1[r] = 0;
  }
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block<NR>(w[b], a, b, acc0, corr0);
    block<NR>(w[b + 1], a, b + 1, acc1, corr1);
  }
  if (b < nb) block<NR>(w[b], a, b, acc0, corr0);
  for (int r = 0; r < NR; ++r) out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r])) - 8.0f * (corr0[r] + corr1[r]);
#else
  for (int r = 0; r < NR; ++r) out[r] = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const float dw = f16_to_f32(w[b].d);
    for (int r = 0; r < NR; ++r) {
      int32_t s = 0;
      for (int j = 0; j < 16; ++j)
        s += ((w[b].qs[j] & 0xF) - 8) * a[r].qs[32 * b + j] +
             ((w[b].qs[j] >> 4) - 8) * a[r].qs[32 * b + 16 + j];
      out[r] += dw * a[r].d[b] * static_cast<float>(s);
    }
  }
#endif
}

}  // namespace

void dot_q4_0_rows(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  const auto* b = static_cast<const BlockQ4_0*>(w);
  dispatch_rows(nrows, [&](auto nr) { rows<decltype(nr)::value>(b, act, stride, k, out); });
}

}  // namespace inferx::cpu
