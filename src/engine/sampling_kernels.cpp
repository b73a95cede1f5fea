// GCC 12 warns inside its own AVX-512 intrinsics that start from _mm512_undefined_*() (GCC bug 105593);
// the state applies by source location, so it is set before <immintrin.h> is first included.
#if defined(__AVX512F__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "engine/sampling_kernels.h"

namespace inferx::sampling_kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// exp_nonpositive constants. ln2 split in a high part with 16 significant bits (so n * kLn2Hi is exact
// for |n| < 2^8) and the rest. exp(r) = 1 + r + r^2 q(r), q of degree 3 with coefficients fitted for
// this file (iteratively reweighted least squares on 4000 Chebyshev nodes of [-ln2/2, ln2/2], minimising
// the largest relative error, then rounded to float): 1.06e-7 relative error before rounding, checked
// against exp in double by sampler_test.
constexpr float kMinArg = -86.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;
constexpr float kLn2Lo = 1.42860682030941723212e-6f;
constexpr float kQ0 = 0.499992311000824f, kQ1 = 0.16667114198207855f, kQ2 = 0.041890114545822144f,
                kQ3 = 0.008312525227665901f;
// The smallest positive float: `w >= kTiny` is `w > 0`.
constexpr float kTiny = std::numeric_limits<float>::denorm_min();

#if defined(__AVX512F__)
inline __m512 exp_nonpositive16(__m512 x) {
  // NaN and x < kMinArg give 0, exactly as the scalar version's !(x >= kMinArg).
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMinArg), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kQ3);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kQ2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kQ1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kQ0));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  // p * 2^n, exact: n >= -125 and p > 0.7 keep the result normal. Masked lanes (NaN, too small) are 0.
  return _mm512_maskz_scalef_ps(keep, p, n);
}

inline __mmask16 tail_mask(int64_t left) { return static_cast<__mmask16>((1u << left) - 1u); }
inline __m256 high_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
#endif

}  // namespace

float exp_nonpositive(float x) {
  if (!(x >= kMinArg)) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = kQ3;
  p = std::fma(p, r, kQ2);
  p = std::fma(p, r, kQ1);
  p = std::fma(p, r, kQ0);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return std::ldexp(p, static_cast<int>(n));
}

RowScan scan_row(const float* x, int64_t n) {
  RowScan s;
  float m = kNegInf;
  int64_t i = 0;
#if defined(__AVX512F__)
  // maxps(v, m) returns m when v is NaN (Intel SDM, MAXPS: the second operand), so NaN never wins.
  __m512 m0 = _mm512_set1_ps(kNegInf), m1 = m0;
  __mmask16 nan = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    m0 = _mm512_max_ps(a, m0);
    m1 = _mm512_max_ps(b, m1);
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
  }
  m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  s.has_nan = nan != 0;
#endif
  for (; i < n; ++i) {
    if (std::isnan(x[i])) {
      s.has_nan = true;
    } else if (x[i] > m) {
      m = x[i];
    }
  }
  s.max = m;
  return s;
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = -1;
  float best_value = kNegInf;
  int64_t i = 0;
#if defined(__AVX512F__)
  if (n >= 32 && n <= std::numeric_limits<int32_t>::max()) {
    // Per lane: the first strictly larger value wins, so each lane keeps its first maximum; two lane sets
    // (even and odd vectors) for instruction-level parallelism, merged preferring the lower index on ties.
    __m512 b0 = _mm512_set1_ps(kNegInf), b1 = b0;
    __m512i i0 = _mm512_set1_epi32(-1), i1 = i0;
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (; i + 32 <= n; i += 32) {
      const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
      const __mmask16 ka = _mm512_cmp_ps_mask(a, b0, _CMP_GT_OQ);
      b0 = _mm512_mask_mov_ps(b0, ka, a);
      i0 = _mm512_mask_mov_epi32(i0, ka, idx);
      idx = _mm512_add_epi32(idx, step);
      const __mmask16 kb = _mm512_cmp_ps_mask(b, b1, _CMP_GT_OQ);
      b1 = _mm512_mask_mov_ps(b1, kb, b);
      i1 = _mm512_mask_mov_epi32(i1, kb, idx);
      idx = _mm512_add_epi32(idx, step);
    }
    const __mmask16 take =
        _mm512_cmp_ps_mask(b1, b0, _CMP_GT_OQ) |
        (_mm512_cmp_ps_mask(b1, b0, _CMP_EQ_OQ) & _mm512_cmp_epi32_mask(i1, i0, _MM_CMPINT_LT));
    b0 = _mm512_mask_mov_ps(b0, take, b1);
    i0 = _mm512_mask_mov_epi32(i0, take, i1);
    best_value = _mm512_reduce_max_ps(b0);
    if (best_value > kNegInf) {
      const __mmask16 eq = _mm512_cmp_ps_mask(b0, _mm512_set1_ps(best_value), _CMP_EQ_OQ);
      best = _mm512_mask_reduce_min_epi32(eq, i0);
    }
  }
#endif
  for (; i < n; ++i) {
    if (x[i] > best_value) {  // false for NaN; -inf never exceeds the initial -inf
      best_value = x[i];
      best = i;
    }
  }
  return best;
}

double softmax_weights(const float* x, int64_t n, float max, float inv_t, float* w, double* block_sums,
                       float gather_t, int32_t* ids, float* ws, int64_t* count) {
  double total = 0.0;
  const bool gather = ids != nullptr;
  gather_t = std::max(gather_t, kTiny);
  int64_t c = 0;
#if defined(__AVX512F__)
  const __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_t), vt = _mm512_set1_ps(gather_t);
  auto weights16 = [&](__m512 v) { return exp_nonpositive16(_mm512_mul_ps(_mm512_sub_ps(v, vmax), vinv)); };
  // Candidates compressed in registers and stored as whole vectors (ids/ws have 16 entries of room): the
  // memory-destination compress is microcoded and slow on some cores.
  // Branch-free: whether a vector holds candidates is unpredictable on flat distributions, and a
  // mispredicted branch per vector cost more than the two stores.
  auto gather16 = [&](__m512 e, int64_t i) {
    const __mmask16 k = _mm512_cmp_ps_mask(e, vt, _CMP_GE_OQ);
    const __m512i idx =
        _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(i)),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    _mm512_storeu_ps(ws + c, _mm512_maskz_compress_ps(k, e));
    _mm512_storeu_si512(ids + c, _mm512_maskz_compress_epi32(k, idx));
    c += std::popcount(static_cast<unsigned>(k));
  };
#endif
  for (int64_t b0 = 0, b = 0; b0 < n; b0 += kBlock, ++b) {
    const int64_t end = std::min(n, b0 + kBlock);
    int64_t i = b0;
    double sum = 0.0;
#if defined(__AVX512F__)
    // Two vectors per iteration with their own double accumulators: the exp chains of neighbouring
    // vectors overlap and the additions do not serialise on one register.
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 32 <= end; i += 32) {
      const __m512 e = weights16(_mm512_loadu_ps(x + i)), f = weights16(_mm512_loadu_ps(x + i + 16));
      _mm512_storeu_ps(w + i, e);
      _mm512_storeu_ps(w + i + 16, f);
      s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
      s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(high_half(e)));
      s2 = _mm512_add_pd(s2, _mm512_cvtps_pd(_mm512_castps512_ps256(f)));
      s3 = _mm512_add_pd(s3, _mm512_cvtps_pd(high_half(f)));
      if (gather) {
        gather16(e, i);
        gather16(f, i + 16);
      }
    }
    for (; i < end; i += 16) {
      const __mmask16 k = end - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(end - i);
      const __m512 e = _mm512_maskz_mov_ps(k, weights16(_mm512_maskz_loadu_ps(k, x + i)));
      _mm512_mask_storeu_ps(w + i, k, e);
      s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
      s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(high_half(e)));
      if (gather) gather16(e, i);  // masked-off lanes are 0, below the threshold
    }
    sum = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
#endif
    for (; i < end; ++i) {
      const float e = exp_nonpositive((x[i] - max) * inv_t);
      w[i] = e;
      sum += e;
      if (gather && e >= gather_t) {
        ids[c] = static_cast<int32_t>(i);
        ws[c++] = e;
      }
    }
    block_sums[b] = sum;
    total += sum;
  }
  if (gather) *count = c;
  return total;
}

int64_t gather_at_least(const float* w, int64_t n, float t, int32_t* ids, float* ws) {
  t = std::max(t, kTiny);
  int64_t count = 0, i = 0;
#if defined(__AVX512F__)
  const __m512 vt = _mm512_set1_ps(t);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; i + 16 <= n; i += 16) {
    const __m512 e = _mm512_loadu_ps(w + i);
    const __mmask16 k = _mm512_cmp_ps_mask(e, vt, _CMP_GE_OQ);
    // Compress in registers and store whole vectors (the callers leave 16 entries of room; branch-free,
    // as in softmax_weights): the memory-destination compress is microcoded and slow on some cores.
    _mm512_storeu_ps(ws + count, _mm512_maskz_compress_ps(k, e));
    _mm512_storeu_si512(ids + count, _mm512_maskz_compress_epi32(k, idx));
    count += std::popcount(static_cast<unsigned>(k));
    idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16));
  }
#endif
  for (; i < n; ++i) {
    if (w[i] >= t) {
      ids[count] = static_cast<int32_t>(i);
      ws[count++] = w[i];
    }
  }
  return count;
}

double sum_at_least(const float* ws, int64_t n, float t) {
  t = std::max(t, kTiny);
  int64_t i = 0;
  double sum = 0.0;
#if defined(__AVX512F__)
  const __m512 vt = _mm512_set1_ps(t);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  for (; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(n - i);
    const __m512 e = _mm512_maskz_loadu_ps(k, ws + i);  // zero-filled lanes are < t
    const __mmask16 ge = _mm512_cmp_ps_mask(e, vt, _CMP_GE_OQ);
    s0 = _mm512_mask_add_pd(s0, static_cast<__mmask8>(ge), s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_mask_add_pd(s1, static_cast<__mmask8>(ge >> 8), s1, _mm512_cvtps_pd(high_half(e)));
  }
  sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
#endif
  for (; i < n; ++i) {
    if (ws[i] >= t) sum += ws[i];
  }
  return sum;
}

double sum_above(const float* ws, int64_t n, float t, int64_t* equal) {
  int64_t i = 0, eq = 0;
  double sum = 0.0;
#if defined(__AVX512F__)
  const __m512 vt = _mm512_set1_ps(t);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = _mm512_loadu_ps(ws + i);
    const __mmask16 gt = _mm512_cmp_ps_mask(e, vt, _CMP_GT_OQ);
    eq += std::popcount(static_cast<unsigned>(_mm512_cmp_ps_mask(e, vt, _CMP_EQ_OQ)));
    s0 = _mm512_mask_add_pd(s0, static_cast<__mmask8>(gt), s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_mask_add_pd(s1, static_cast<__mmask8>(gt >> 8), s1, _mm512_cvtps_pd(high_half(e)));
  }
  sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
#endif
  for (; i < n; ++i) {
    if (ws[i] > t) sum += ws[i];
    eq += ws[i] == t;
  }
  *equal = eq;
  return sum;
}

namespace {
// Stable in-place compaction of the values on one side of t. Writing whole compressed vectors at
// `count` <= i only overwrites entries of the vector already loaded.
template <bool kHigh>
int64_t keep_side(float* ws, int64_t n, float t) {
  int64_t count = 0, i = 0;
#if defined(__AVX512F__)
  const __m512 vt = _mm512_set1_ps(t);
  for (; i + 16 <= n; i += 16) {
    const __m512 e = _mm512_loadu_ps(ws + i);
    const __mmask16 k = _mm512_cmp_ps_mask(e, vt, kHigh ? _CMP_GE_OQ : _CMP_LT_OQ);
    _mm512_storeu_ps(ws + count, _mm512_maskz_compress_ps(k, e));
    count += std::popcount(static_cast<unsigned>(k));
  }
#endif
  for (; i < n; ++i) {
    if ((ws[i] >= t) == kHigh) ws[count++] = ws[i];
  }
  return count;
}
}  // namespace

int64_t keep_at_least(float* ws, int64_t n, float t) { return keep_side<true>(ws, n, t); }
int64_t keep_below(float* ws, int64_t n, float t) { return keep_side<false>(ws, n, t); }

int64_t keep_pairs_at_least(int32_t* ids, float* ws, int64_t n, float t) {
  int64_t count = 0, i = 0;
#if defined(__AVX512F__)
  const __m512 vt = _mm512_set1_ps(t);
  for (; i + 16 <= n; i += 16) {
    const __m512 e = _mm512_loadu_ps(ws + i);
    const __m512i id = _mm512_loadu_si512(ids + i);
    const __mmask16 k = _mm512_cmp_ps_mask(e, vt, _CMP_GE_OQ);
    _mm512_storeu_ps(ws + count, _mm512_maskz_compress_ps(k, e));
    _mm512_storeu_si512(ids + count, _mm512_maskz_compress_epi32(k, id));
    count += std::popcount(static_cast<unsigned>(k));
  }
#endif
  for (; i < n; ++i) {
    if (ws[i] >= t) {
      ids[count] = ids[i];
      ws[count++] = ws[i];
    }
  }
  return count;
}

int64_t first_greater(const float* x, int64_t n, float t) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vt = _mm512_set1_ps(t);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vt, _CMP_GT_OQ);
    if (k != 0) return i + std::countr_zero(static_cast<unsigned>(k));
  }
#endif
  for (; i < n; ++i) {
    if (x[i] > t) return i;
  }
  return n;
}

}  // namespace inferx::sampling_kernels
