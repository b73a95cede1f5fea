#pragma once
// CPU matrix multiply for every weight type: out[M, N] = x[M, K] @ W[N, K]^T (+ bias), x and out F32.
// Per-type SIMD kernels read the weight blocks directly (no whole-matrix dequantization); quantized
// types quantize the activations row-wise once per call (to Q8 blocks, as llama.cpp does) and use
// integer dot products. Parallel over output columns (decode) or over tiles (prefill).
#include <cstdint>

#include "backend/linear.h"
#include "core/thread_pool.h"

namespace inferx {

void matmul_cpu(const float* x, int64_t m, const Linear& w, float* out, ThreadPool& pool);

// One dot product of a weight row (type t, n elements) with f32 activations, the scalar reference
// kernels in tests compare against (dequantize_row + f32 dot in double).
double dot_reference(DType t, const void* weight_row, const float* x, int64_t n);

}  // namespace inferx
