// FP8 E4M3 weight rows against FP8-rounded activations (W8A8 emulated on the CPU, quant/fp8.h).
//
// The activations arrive already rounded to E4M3 values (times the row's scale, kept apart), stored as
// f32, so every product of two E4M3 values is exact in f32 as on the tensor cores; sums are f32.
// Weights are widened without a table: an E4M3 byte s.eeee.mmm re-read as the f16 s.0eeee.mmm0000000
// is the same number times 2^-8 (both exponent fields hold e; the biases are 7 and 15), subnormals
// included, so one shift-and-mask plus the F16C conversion widens 8 or 16 codes; the 2^8 goes into the
// final scale. The NaN codes (0x7F, 0xFF) are never produced by our quantizers.
#include "backend/cpu/simd.h"
// simd.h first (see its pragma note).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "core/half.h"
#include "quant/fp8.h"

namespace inferx::cpu {

namespace {

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

// set_fp8_bf16_accumulator, else INFERX_CPU_FP8_ACC=bf16.
std::atomic<bool> g_bf16_accumulator{[] {
  const char* v = std::getenv("INFERX_CPU_FP8_ACC");
  return v != nullptr && std::strcmp(v, "bf16") == 0;
}()};

#if defined(INFERX_X86_SIMD) && !defined(INFERX_X86_AVX512)  // the AVX-512 path converts 16 at once
// 8 codes -> 8 f16 bit patterns (value / 256).
inline __m128i fp8x8_to_f16_bits(const uint8_t* w) {
  const __m128i u = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
  return _mm_or_si128(_mm_and_si128(_mm_slli_epi16(u, 8), _mm_set1_epi16(static_cast<short>(0x8000))),
                      _mm_and_si128(_mm_slli_epi16(u, 7), _mm_set1_epi16(0x3F80)));
}
#endif

template <int NR>
void rows(const uint8_t* w, const void* act, int64_t stride, int64_t k, float* out) {
  const float* a[NR];
  float scale[NR];
  for (int r = 0; r < NR; ++r) {
    a[r] = reinterpret_cast<const float*>(static_cast<const char*>(act) + r * stride);
    scale[r] = a[r][k];
  }
  int64_t i = 0;
  float vec[NR] = {};
#if defined(INFERX_X86_AVX512)
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  for (; i + 16 <= k; i += 16) {
    const __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    const __m256i h = _mm256_or_si256(
        _mm256_and_si256(_mm256_slli_epi16(u, 8), _mm256_set1_epi16(static_cast<short>(0x8000))),
        _mm256_and_si256(_mm256_slli_epi16(u, 7), _mm256_set1_epi16(0x3F80)));
    const __m512 wf = _mm512_maskz_cvtph_ps(0xFFFF, h);  // maskz: GCC 12 warns on the unmasked form
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_fmadd_ps(wf, _mm512_loadu_ps(a[r] + i), acc[r]);
  }
  for (int r = 0; r < NR; ++r) {  // stored and summed: GCC 12 flags hsum(__m512)'s shuffles here
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[r]);
    for (float v : lanes) vec[r] += v;
  }
#elif defined(INFERX_X86_SIMD)
  __m256 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
  for (; i + 8 <= k; i += 8) {
    const __m256 wf = _mm256_cvtph_ps(fp8x8_to_f16_bits(w + i));
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_fmadd_ps(wf, _mm256_loadu_ps(a[r] + i), acc[r]);
  }
  for (int r = 0; r < NR; ++r) vec[r] = hsum(acc[r]);
#endif
  float tail[NR] = {};
  for (; i < k; ++i) {
    const float wv = fp8_e4m3_to_f32(w[i]);
    for (int r = 0; r < NR; ++r) tail[r] += wv * a[r][i];
  }
  const bool bf16 = g_bf16_accumulator.load(std::memory_order_relaxed);
  for (int r = 0; r < NR; ++r) {
    float sum = vec[r] * 256.0f + tail[r];  // the unscaled product, as the FP8 GEMM forms it
    if (bf16) sum = bf16_to_f32(f32_to_bf16(sum));
    out[r] = sum * scale[r];
  }
}

}  // namespace

int64_t act_f8_row_bytes(int64_t k) { return align64(4 * k + 4); }

void quantize_act_f8(const float* x, int64_t k, void* row) {
  auto* q = static_cast<float*>(row);
  q[k] = quantize_fp8_activation_row(x, k, q);
}

void set_fp8_bf16_accumulator(bool on) { g_bf16_accumulator.store(on, std::memory_order_relaxed); }

void dot_f8_rows(const void* w, const void* act, int64_t stride, int nrows, int64_t k, float* out) {
  const auto* b = static_cast<const uint8_t*>(w);
  dispatch_rows(nrows, [&](auto nr) { rows<decltype(nr)::value>(b, act, stride, k, out); });
}

}  // namespace inferx::cpu
