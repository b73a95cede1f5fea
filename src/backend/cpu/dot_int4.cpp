// INT4 group-quantized weight rows (quant/int4.h layout) against ActQ8_0 activations.
// Per 32-column chunk b of group g: sum s_g (q - z_g) x = s_g d_x[b] (sum q qx) - s_g z_g dsum[b], with
// the codes q (0..15) as the unsigned operand of the integer dot (as the Q4_0 kernel) and the zero
// point applied through the activation chunk sums.
#include "backend/cpu/simd.h"
// simd.h first (see its pragma note).
#include "backend/cpu/dot_kernels.h"
#include "core/half.h"

namespace inferx::cpu {

namespace {

template <int NR>
void rows(const Int4Row& w, const void* act, int64_t stride, int64_t k, float* out) {
  ActQ8_0View a[NR];
  for (int r = 0; r < NR; ++r) a[r] = act_q8_0_view(static_cast<const char*>(act) + r * stride, k);
  const int64_t chunks_per_group = w.group / 32, groups = k / w.group;
  float corr[NR] = {};
#if defined(INFERX_X86_SIMD)
  __m256 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const float s = f16_scalar(w.scale[g]);
    const float sz = s * static_cast<float>(w.zero ? w.zero[g] : 8);
    for (int64_t c = 0; c < chunks_per_group; ++c) {
      const int64_t b = g * chunks_per_group + c;
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codes + 16 * b));
      const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
      for (int r = 0; r < NR; ++r) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r].qs + 32 * b));
        const __m256i p = dot_u8s8_acc(_mm256_setzero_si256(), u, x);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s * a[r].d[b]), acc[r]);
        corr[r] += sz * a[r].dsum[b];
      }
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = hsum(acc[r]) - corr[r];
#else
  float sum[NR] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const float s = f16_to_f32(w.scale[g]);
    const float sz = s * static_cast<float>(w.zero ? w.zero[g] : 8);
    for (int64_t c = 0; c < chunks_per_group; ++c) {
      const int64_t b = g * chunks_per_group + c;
      const uint8_t* q = w.codes + 16 * b;
      for (int r = 0; r < NR; ++r) {
        int32_t isum = 0;
        for (int j = 0; j < 16; ++j)
          isum += (q[j] & 0xF) * a[r].qs[32 * b + j] + (q[j] >> 4) * a[r].qs[32 * b + 16 + j];
        sum[r] += s * a[r].d[b] * static_cast<float>(isum);
        corr[r] += sz * a[r].dsum[b];
      }
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = sum[r] - corr[r];
#endif
}

}  // namespace

void dot_int4_rows(const Int4Row& w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  dispatch_rows(nrows, [&](auto nr) { rows<decltype(nr)::value>(w, act, stride, k, out); });
}

}  // namespace inferx::cpu
