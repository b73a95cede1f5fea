// Q8_0 weight rows against ActQ8_0 activations: per 32-element block, an exact int32 dot of the two
// int8 vectors, scaled by d_w * d_x in f32. vpdpbusd wants an unsigned operand, so the weights'
// signs move onto the activations (|w| * (x * sign(w)) = w * x; |-128| = 128 still fits a u8).
#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/simd.h"
#include "core/half.h"
#include "quant/gguf_block_layouts.h"

namespace inferx::cpu {

namespace {

#if defined(INFERX_X86_AVX512)
// Two blocks per 512-bit vector. AVX-512 has no vpsignb: |w| via vpabsb, and the activations are
// negated where w < 0 with a byte mask (vpmovb2m + masked subtract).
template <int NR>
void rows_avx512(const BlockQ8_0* w, const ActQ8_0View* a, int64_t nb, float* out) {
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const __m512i q = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b + 1].qs)), 1);
    const __m512i uq = _mm512_abs_epi8(q);
    const __mmask64 neg = _mm512_movepi8_mask(q);
    const __m128 dw = f16_pair(w[b].d, w[b + 1].d);
    for (int r = 0; r < NR; ++r) {
      const __m512i x = _mm512_loadu_si512(a[r].qs + 32 * b);
      const __m512i p = _mm512_dpbusd_epi32(zero, uq, _mm512_mask_sub_epi8(x, neg, zero, x));
      const __m512 scale = spread_pair(_mm_mul_ps(dw, load_pair(a[r].d + b)));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    out[r] = hsum(acc[r]);
    if (b < nb) {  // odd block count: the last block in 256-bit
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r].qs + 32 * b));
      const __m256i p = dot_u8s8_acc(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
      out[r] += hsum(_mm256_cvtepi32_ps(p)) * (f16_scalar(w[b].d) * a[r].d[b]);
    }
  }
}
#endif

#if defined(INFERX_X86_SIMD)
template <int NR>
inline void block(const BlockQ8_0& w, const ActQ8_0View* a, int64_t b, __m256* acc) {
  const float dw = f16_scalar(w.d);
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs));
  const __m256i uq = _mm256_sign_epi8(q, q);
  for (int r = 0; r < NR; ++r) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r].qs + 32 * b));
    const __m256i p = dot_u8s8_acc(_mm256_setzero_si256(), uq, _mm256_sign_epi8(x, q));
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a[r].d[b]), acc[r]);
  }
}
#endif

template <int NR>
void rows(const BlockQ8_0* w, const void* act, int64_t stride, int64_t k, float* out) {
  ActQ8_0View a[NR];
  for (int r = 0; r < NR; ++r) a[r] = act_q8_0_view(static_cast<const char*>(act) + r * stride, k);
  const int64_t nb = k / 32;
#if defined(INFERX_X86_AVX512)
  rows_avx512<NR>(w, a, nb, out);
#elif defined(INFERX_X86_SIMD)
  // Two accumulators per row (even / odd blocks) so consecutive FMAs do not wait on each other.
  __m256 acc0[NR], acc1[NR];
  for (int r = 0; r < NR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block<NR>(w[b], a, b, acc0);
    block<NR>(w[b + 1], a, b + 1, acc1);
  }
  if (b < nb) block<NR>(w[b], a, b, acc0);
  for (int r = 0; r < NR; ++r) out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
#else
  for (int r = 0; r < NR; ++r) out[r] = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const float dw = f16_to_f32(w[b].d);
    for (int r = 0; r < NR; ++r) {
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += w[b].qs[j] * a[r].qs[32 * b + j];
      out[r] += dw * a[r].d[b] * static_cast<float>(s);
    }
  }
#endif
}

}  // namespace

void dot_q8_0_rows(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  const auto* b = static_cast<const BlockQ8_0*>(w);
  dispatch_rows(nrows, [&](auto nr) { rows<decltype(nr)::value>(b, act, stride, k, out); });
}

const char* kernel_isa() {
#if defined(INFERX_X86_AVX512)
  return "avx512-vnni";
#elif defined(INFERX_X86_SIMD)
  return INFERX_VNNI_ISA;
#else
  return "scalar";
#endif
}

}  // namespace inferx::cpu
