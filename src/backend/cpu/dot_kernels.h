#pragma once
// Internal interface of the CPU matmul kernels (matmul_cpu.cpp drives them; tests call them directly).
//
// A row kernel computes out[r] = dot(weight row, activation row r) for r < nrows (1..kMaxRows): one
// pass over the weight row serves up to kMaxRows activation rows, so prefill reads each weight block
// once per group of rows instead of once per row.
//
// Activations of quantized weight types are first quantized row-wise (activation_quant.cpp):
//   Q8_0 / Q4_0 weights -> ActQ8_0 rows: int8 per element, one f32 scale per 32 elements;
//   Q4_K / Q6_K weights -> ActQ8_K rows: int8 per element, one f32 scale per 256 elements (a whole
//                          super-block, so the integer dot of a super-block is summed across its
//                          sub-blocks before any float work) plus int16 sums per 16 and per 32 elements
//                          for the offset terms (Q4_K's mins, Q6_K's -32).
// Both use scale d = max|x| / 127 and q = round-to-nearest-even(x * 127 / max|x|).
#include <cstdint>
#include <type_traits>

namespace inferx::cpu {

constexpr int kMaxRows = 4;

// Calls f(std::integral_constant<int, NR>) for NR = nrows (1..kMaxRows; larger counts take kMaxRows):
// each kernel is a template on its row count so that its accumulators stay in registers.
template <class F>
void dispatch_rows(int nrows, F&& f) {
  static_assert(kMaxRows == 4);
  switch (nrows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

// Row layouts in the activation workspace (each row starts 64-byte aligned):
//   ActQ8_0: int8 qs[k] | f32 d[k/32] | f32 dsum[k/32] (= d * sum of the block's qs)
//   ActQ8_K: int8 qs[k] | f32 d[k/256] | int16 sum16[k/16] | int16 sum32[k/32]
int64_t act_q8_0_row_bytes(int64_t k);
int64_t act_q8_k_row_bytes(int64_t k);
void quantize_act_q8_0(const float* x, int64_t k, void* row);
void quantize_act_q8_k(const float* x, int64_t k, void* row);

struct ActQ8_0View {
  const int8_t* qs;
  const float* d;
  const float* dsum;
};
inline ActQ8_0View act_q8_0_view(const void* row, int64_t k) {
  const auto* p = static_cast<const uint8_t*>(row);
  const auto* d = reinterpret_cast<const float*>(p + k);
  return {reinterpret_cast<const int8_t*>(p), d, d + k / 32};
}

struct ActQ8_KView {
  const int8_t* qs;
  const float* d;
  const int16_t* sum16;
  const int16_t* sum32;
};
inline ActQ8_KView act_q8_k_view(const void* row, int64_t k) {
  const auto* p = static_cast<const uint8_t*>(row);
  const auto* d = reinterpret_cast<const float*>(p + k);
  const auto* s16 = reinterpret_cast<const int16_t*>(d + k / 256);
  return {reinterpret_cast<const int8_t*>(p), d, s16, s16 + k / 16};
}

// act: first activation row (f32 for float weights, an Act* row otherwise); act_stride: bytes between
// activation rows; k: elements per row; out[r] for r < nrows.
using RowKernel = void (*)(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k,
                           float* out);

void dot_f32_rows(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);
void dot_f16_rows(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);
void dot_bf16_rows(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);
void dot_q8_0_rows(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);
void dot_q4_0_rows(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);
void dot_q4_k_rows(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);
void dot_q6_k_rows(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);

// FP8 E4M3 weights (W8A8, quant/fp8.h): activations rounded per row to E4M3 values.
//   ActF8 row: f32 q[k] (E4M3 values, exact in f32) | f32 scale (the row's x ~ q * scale).
// out[r] = scale_r * sum w_code * q_r; the layer's weight scale is applied by the caller.
int64_t act_f8_row_bytes(int64_t k);
void quantize_act_f8(const float* x, int64_t k, void* row);
void dot_f8_rows(const void* w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);
// The CUDA backend's FP8 GEMM may write its unscaled product as BF16 (INFERX_CUDA_FP8_ACC=bf16,
// backend/cuda/quantized_gemm.h): with this on (tests; else INFERX_CPU_FP8_ACC=bf16) dot_f8_rows rounds
// the unscaled sum to BF16 the same way before the row scale, so the CPU reference has the same numerics.
void set_fp8_bf16_accumulator(bool on);

// INT4 group-quantized weights (quant/int4.h) against ActQ8_0 activations: one weight row and its
// group scales / zero points (zero nullptr: symmetric, zero point 8).
struct Int4Row {
  const uint8_t* codes;
  const uint16_t* scale;  // f16, k / group entries
  const uint8_t* zero;
  int64_t group;
};
void dot_int4_rows(const Int4Row& w, const void* act, int64_t act_stride, int nrows, int64_t k, float* out);

// Name of the instruction-set path the kernels were compiled for ("avx512-vnni", "avx2", "scalar"...).
const char* kernel_isa();

}  // namespace inferx::cpu
