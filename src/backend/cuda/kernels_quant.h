#pragma once
// Kernels of the quantized GEMM path (quantized_gemm.h) and of dummy quantized weights: per-token FP8
// activation quantization, the W8A8 scaling epilogue, tile-wise dequantization of FP8 / INT4 / Q8_0 /
// Q4_K weight rows to BF16, the BF16 activation copy (with an INT4 input permutation), and random codes.
// Launchers return cudaGetLastError(); the caller (quantized_gemm.cpp) validates shapes first.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/random_fill.h"

namespace inferx::cuda {

// W8A8 activations (quant/fp8.h convention, the same codes as the CPU backend): per row r of x [t, k] F32,
// s = amax / 448 (1 for an all-zero row), q[r, :] = e4m3(x / s) (IEEE division, round to nearest even,
// saturating); scale[r] = s. When q_bf16 is not null it also receives bf16(e4m3 value * s) (the W8A8
// values for the BF16 fallback GEMM). q may be null then.
cudaError_t launch_quantize_fp8_rows(const float* x, int64_t t, int64_t k, uint8_t* q, float* scale,
                                     void* q_bf16, cudaStream_t stream);

// The W8A8 epilogue: acc F32 or BF16 [t, n] (the unscaled FP8 GEMM product), value(r, c) = acc[r, c] *
// x_scale[r] * w_scale[per_channel ? c : 0] + (bias ? bias[c] : 0).
//   silu == false: columns are split in order among num_outs (1..3) outputs, out[j] F32 [t, cols[j]]
//     contiguous, sum of cols == n (q / k / v of a fused projection; one output may alias acc);
//   silu == true: out[0] F32 [t, n / 2] = silu(value(r, c)) * value(r, n / 2 + c) (a fused gate/up
//     projection: gate columns first), SiLU as the silu_mul kernel computes it.
struct Fp8Epilogue {
  const void* acc = nullptr;  // F32, or BF16 with acc_bf16 (the FP8 GEMM then wrote half the bytes)
  bool acc_bf16 = false;
  int64_t t = 0, n = 0;
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
  bool per_channel = false;
  const float* bias = nullptr;
  bool silu = false;
  int num_outs = 1;
  float* out[3] = {nullptr, nullptr, nullptr};
  int64_t cols[3] = {0, 0, 0};
};
cudaError_t launch_fp8_epilogue(const Fp8Epilogue& e, cudaStream_t stream);

// The passes around the FP8 GEMMs of prefill-sized steps with the activation quantization folded in
// (kernels_quant_fused.cu), so that the F32 rows the next GEMM quantizes are never written and read back:
//   norm_quantize: residual [t, k] (+= add [t, k] when add is not null, written back), h = RMSNorm(residual)
//     * w as the rmsnorm kernels compute it, quantized per row as launch_quantize_fp8_rows (codes q [t, k],
//     scale [t]). h itself is not stored. Takes k % 4 == 0 and k <= 8192 with 16-byte aligned rows
//     (fp8_norm_quantize_takes); others: cudaErrorNotSupported, nothing launched.
//   silu_quantize: the SiLU * up epilogue of a fused gate/up FP8 GEMM (e.silu, Fp8Epilogue above; e.out
//     unused) quantized per row in the same pass: codes q [t, n / 2], scale [t] - the codes and scales that
//     launch_fp8_epilogue followed by launch_quantize_fp8_rows give. One CTA per row, the row's values held
//     in registers (SiluPass below) or in shared memory (n / 2 floats: fp8_silu_quantize_takes); others:
//     cudaErrorNotSupported.
//   dequantize: out [t, k] F32 = e4m3 value of q * scale[row] (the fallback when a GEMM after a fused pass
//     is refused: the W8A8 values, which quantize back to the same codes).
//     add_product (add then null): a deferred product (quantized_gemm.h) whose values are the add - residual
//     += the values launch_fp8_epilogue(*add_product) would have written (BF16 sums, one output of k
//     columns, add_product->t == t), to the bit; its output is not written.
bool fp8_norm_quantize_takes(const float* residual, const float* add, const float* w, int64_t k,
                             const Fp8Epilogue* add_product = nullptr);
cudaError_t launch_norm_quantize_fp8_rows(float* residual, const float* add, const float* w, float eps,
                                          int64_t t, int64_t k, uint8_t* q, float* scale, cudaStream_t stream,
                                          const Fp8Epilogue* add_product = nullptr);
bool fp8_silu_quantize_takes(const Fp8Epilogue& e);
// Which SiLU pass launch_fp8_silu_quantize runs for BF16 sums of up to 16384 columns in whole 8-byte chunks
// (others take the shared-memory pass): the row in registers (the default) or in shared memory
// (INFERX_SILU_PASS=smem; tests and benchmarks set it). Same codes and scales either way.
enum class SiluPass { Registers, SharedMemory };
void set_fp8_silu_pass(SiluPass pass);
SiluPass fp8_silu_pass();
// Whether launch_fp8_silu_quantize(e, q, ...) runs the register pass (the pass chosen above and e's shape).
bool fp8_silu_registers_take(const Fp8Epilogue& e, const void* q);
cudaError_t launch_fp8_silu_quantize(const Fp8Epilogue& e, uint8_t* q, float* scale, cudaStream_t stream);
cudaError_t launch_dequantize_fp8_rows(const uint8_t* q, const float* scale, int64_t t, int64_t k, float* out,
                                       cudaStream_t stream);

// A quantized weight as the dequantizer reads it (layouts: quant/fp8.h, quant/int4.h,
// quant/gguf_block_layouts.h). Pointers are to row 0 of the whole weight.
struct DequantWeight {
  DType dtype = DType::F8_E4M3;  // F8_E4M3, INT4, Q8_0 or Q4_K
  const void* data = nullptr;
  int64_t k = 0;                     // input columns (F8_E4M3: any; others: a multiple of the block size)
  const float* fp8_scale = nullptr;  // F8_E4M3: [1] or [n]
  bool per_channel = false;
  const uint16_t* int4_scale = nullptr;  // INT4: F16 [n, k / group]
  const uint8_t* int4_zero = nullptr;    // INT4: U8 [n, k / group] or null (zero point 8)
  int64_t group = 0;
};
// out[i, :] (BF16 [rows, k], contiguous) = dequantized weight row row0 + i.
cudaError_t launch_dequantize_rows_bf16(const DequantWeight& w, int64_t row0, int64_t rows, void* out,
                                        cudaStream_t stream);

// out[r, i] = bf16(x[r, perm ? perm[i] : i]) for x F32 [t, k].
cudaError_t launch_activations_bf16(const float* x, const int32_t* perm, int64_t t, int64_t k, void* out,
                                    cudaStream_t stream);

// Random quantized payloads for dummy weights (a counter hash of the fill's seed and index, as
// launch_fill_random; rows of `cols` elements):
//   F8_E4M3: n codes of e4m3(offset + uniform(-amp, amp)) (saturating);
//   INT4:    n elements = n / 2 uniformly random bytes (every code 0..15 equally likely; the fill's
//            region counts codes, on even columns);
//   U8:      n bytes of clamp(rint(offset + uniform(-amp, amp)), 0, 255).
cudaError_t launch_fill_random_codes(DType dtype, void* t, int64_t n, int64_t cols, const RandomFill& fill,
                                     cudaStream_t stream);

}  // namespace inferx::cuda
