#pragma once
// FP8 E4M3 weights (OCP 8-bit Floating Point Specification (OFP8) rev 1.0, format "E4M3": 1 sign bit,
// 4 exponent bits with bias 7, 3 mantissa bits, subnormals, no infinities, S.1111.111 = NaN, largest
// finite value 448, smallest subnormal 2^-9). The same encoding as torch.float8_e4m3fn, safetensors
// "F8_E4M3" and CUDA's __nv_fp8_e4m3.
//
// Scaling convention (shared by weights and activations, and by the CPU and CUDA kernels, so that both
// produce the same codes): s = amax / 448 over the scaled set (1 when amax is 0), q = fp8(x / s) with
// IEEE division and round-to-nearest-even, saturating at +-448; x is approximated by q * s.
#include <cstdint>
#include <vector>

namespace inferx {

constexpr float kFp8E4M3Max = 448.0f;

float fp8_e4m3_to_f32(uint8_t code);
// Round to nearest even; |x| > 448 saturates to +-448; NaN gives 0x7F.
uint8_t f32_to_fp8_e4m3(float x);
// x rounded to the nearest E4M3 value, as a float (= fp8_e4m3_to_f32(f32_to_fp8_e4m3(x)) but cheaper).
float round_to_fp8_e4m3(float x);

// The scale of a set whose largest magnitude is amax (amax / 448, or 1 for an all-zero set).
float fp8_scale_for(float amax);

enum class Fp8Granularity : uint8_t { PerTensor, PerChannel };

struct Fp8Weight {
  std::vector<uint8_t> codes;  // [n, k] E4M3
  std::vector<float> scale;    // [1] (per tensor) or [n] (per output channel)
};

// Quantizes a row-major [n, k] matrix.
Fp8Weight quantize_fp8_weight(const float* w, int64_t n, int64_t k, Fp8Granularity granularity);
// out[i] = fp8(codes[i]) * scale for one row of k codes.
void dequantize_fp8_row(const uint8_t* codes, float scale, float* out, int64_t k);

// W8A8 activations: quantizes one row of k activations per token: returns the row's scale s = max|x| / 448
// (1 for an all-zero row) and writes the E4M3 values of x * (1 / s) (already multiplied out, exact in f32)
// to q.
float quantize_fp8_activation_row(const float* x, int64_t k, float* q);

}  // namespace inferx
