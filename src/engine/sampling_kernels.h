#pragma once
// Vectorised row kernels of the samplers: one scan of a logits row for its maximum and non-finite values,
// a first-index argmax, the softmax weights exp((x - max) / T) with their sums, and the gathering and
// masked summation that find a top-p nucleus without sorting the vocabulary. Each kernel has an AVX-512
// body (x86-64-v4, guarded by #if) and a scalar fallback performing the same floating-point operations
// in the same order per element, so weights are bit-identical whichever path is compiled; sums differ
// only in summation order (fixed per build, so results are deterministic run to run).
#include <cstdint>

namespace inferx::sampling_kernels {

// exp(x) for x <= 0 within ~3 ulp: 0 below -86 (where exp is under 2^-124, far below any weight that
// can matter next to the maximum's 1), exactly 1 at 0. Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2/2, a degree-5 polynomial for exp(r) (1.1e-7 relative error), scaled by 2^n
// (Muller, "Elementary Functions", ch. 11). Used by every path below.
float exp_nonpositive(float x);

struct RowScan {
  float max = 0.0f;      // over non-NaN values; -inf when there are none
  bool has_nan = false;  // any NaN
};
RowScan scan_row(const float* x, int64_t n);

// First index of the largest value; NaN and -inf are never chosen. -1 when every value is NaN or -inf.
int64_t argmax(const float* x, int64_t n);

// Softmax weights: w[i] = exp_nonpositive((x[i] - max) * inv_t) for x[i] finite or -inf (-inf gives 0);
// `max` must be the row's maximum. Writes one double sum per block of kBlock elements (block_sums has
// (n + kBlock - 1) / kBlock entries) and returns their total. With `ids` non-null, also does what
// gather_at_least(w, n, gather_t, ids, ws) does, storing the count in *count.
inline constexpr int64_t kBlock = 256;
double softmax_weights(const float* x, int64_t n, float max, float inv_t, float* w, double* block_sums,
                       float gather_t = 0.0f, int32_t* ids = nullptr, float* ws = nullptr,
                       int64_t* count = nullptr);

// Appends to ids/ws (each with room for n + 16 entries) the indices and weights with w[i] >= t and
// w[i] > 0, in index order; returns how many.
int64_t gather_at_least(const float* w, int64_t n, float t, int32_t* ids, float* ws);

// Sum in double of the ws[i] >= t.
double sum_at_least(const float* ws, int64_t n, float t);
// Sum in double of the ws[i] > t, and in *equal how many ws[i] == t.
double sum_above(const float* ws, int64_t n, float t, int64_t* equal);

// In place, keeps the ws[i] >= t (keep_at_least) or the ws[i] < t (keep_below) in order; returns how
// many. `ws` has room for n + 16 entries.
int64_t keep_at_least(float* ws, int64_t n, float t);
int64_t keep_below(float* ws, int64_t n, float t);

// In place, keeps the pairs (ids[i], ws[i]) with ws[i] >= t in order; returns how many. Both arrays
// have room for n + 16 entries.
int64_t keep_pairs_at_least(int32_t* ids, float* ws, int64_t n, float t);

// The first index i with x[i] > t (never a NaN), or n: lets a top-k scan skip, 16 at a time, the values
// that cannot enter its heap.
int64_t first_greater(const float* x, int64_t n, float t);

}  // namespace inferx::sampling_kernels
