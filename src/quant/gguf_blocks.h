#pragma once
// GGUF block-quantized weight formats (layouts as in ggml's ggml-common.h, described in the GGUF docs):
// reference (scalar) quantizers and dequantizers. The fast dot-product kernels that read these blocks
// live in backend/cpu; the dequantizers here are their reference in tests.
#include <cstdint>

#include "core/dtype.h"

namespace inferx {

// Dequantizes one row of n elements (n a multiple of the block size) of type t to f32.
// Also handles F32/F16/BF16 so callers can use it for any weight type.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes one row with the reference algorithm of each format (round-to-nearest for Q8_0/Q4_0,
// ggml's make_qkx2/make_qx search for Q4_K/Q6_K, without importance weights). F32/F16/BF16 convert.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace inferx
