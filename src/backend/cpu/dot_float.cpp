// F32 / F16 / BF16 weight rows against f32 activations: FMA in f32. F16 converts with F16C
// (vcvtph2ps); BF16 is the top half of an f32, so it converts by a 16-bit left shift.
#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/simd.h"
#include "core/half.h"

namespace inferx::cpu {

namespace {

struct F32W {
  static float scalar(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
#if defined(INFERX_X86_SIMD)
  static __m256 load8(const void* w, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(w) + i); }
#endif
};

struct F16W {
  static float scalar(const void* w, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(w)[i]); }
#if defined(INFERX_X86_SIMD)
  static __m256 load8(const void* w, int64_t i) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
  }
#endif
};

struct BF16W {
  static float scalar(const void* w, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(w)[i]); }
#if defined(INFERX_X86_SIMD)
  static __m256 load8(const void* w, int64_t i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
#endif
};

template <class W, int NR>
void rows(const void* w, const void* act, int64_t stride, int64_t k, float* out) {
  const float* x[NR];
  for (int r = 0; r < NR; ++r)
    x[r] = reinterpret_cast<const float*>(static_cast<const char*>(act) + r * stride);
  int64_t i = 0;
#if defined(INFERX_X86_SIMD)
  // Two independent accumulators per row hide the FMA latency; the weight vector is loaded once.
  __m256 acc0[NR], acc1[NR];
  for (int r = 0; r < NR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (; i + 16 <= k; i += 16) {
    const __m256 w0 = W::load8(w, i), w1 = W::load8(w, i + 8);
    for (int r = 0; r < NR; ++r) {
      acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + i), acc0[r]);
      acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[r] + i + 8), acc1[r]);
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r]));
#else
  for (int r = 0; r < NR; ++r) out[r] = 0;
#endif
  for (; i < k; ++i) {
    const float wi = W::scalar(w, i);
    for (int r = 0; r < NR; ++r) out[r] += wi * x[r][i];
  }
}

template <class W>
void dispatch(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  dispatch_rows(nrows, [&](auto nr) { rows<W, decltype(nr)::value>(w, act, stride, k, out); });
}

}  // namespace

void dot_f32_rows(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  dispatch<F32W>(w, act, stride, nrows, k, out);
}
void dot_f16_rows(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  dispatch<F16W>(w, act, stride, nrows, k, out);
}
void dot_bf16_rows(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  dispatch<BF16W>(w, act, stride, nrows, k, out);
}

}  // namespace inferx::cpu
