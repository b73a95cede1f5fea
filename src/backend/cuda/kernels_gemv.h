#pragma once
// Weight-streaming GEMV / skinny GEMM for few rows of activations (decode): out[m, n] = x[m, :] . W[n, :]
// (+ bias[n]) with x in BF16, fp32 accumulation and F32 outputs. One warp per output row (two for the
// fused SiLU product) walks the row in 16-byte granules with several loads in flight per lane; the weight
// format is a template parameter of the kernel (kernels_gemv.cu):
//   BF16;  F8_E4M3 with a per-tensor or per-channel F32 scale;  INT4 (quant/int4.h: 32-column runs of 16
//   bytes, F16 group scales, optional U8 zero points, group 32/64/128);  GGUF Q8_0 and Q4_K blocks
//   (quant/gguf_block_layouts.h), read as stored.
// Three kernels (kernels_gemv.cu): v1 (one 16-byte granule per lane and load, per-element conversions; all
// formats), v2 (8 columns per lane and step, kernels_gemv_decode.h; FP8, INT4, Q8_0, Q4_K) and v3 (the
// dot products on tensor cores, weights decoded to BF16; BF16, FP8, INT4). Each format runs on the
// fastest measured one unless set_gemv_kernel or INFERX_GEMV_KERNEL (read once: "v1", "int4=v2,fp8=v1",
// ...) says otherwise; v2 gives a warp two rows from INFERX_GEMV_V2_PAIRS rows (default 8192; 0: never).
// Rows of x beyond kGemvMaxRows are processed in chunks of kGemvMaxRows (one launch each).
// Pointers are device pointers; x is [m, k] contiguous BF16 (launch_gemv_prepare_x makes it from F32, and
// applies an INT4 input permutation).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace inferx::cuda {

constexpr int64_t kGemvMaxRows = 16;
constexpr int kGemvMaxOutputs = 3;

struct GemvWeight {
  DType dtype = DType::BF16;   // BF16, F8_E4M3, INT4, Q8_0 or Q4_K
  const void* data = nullptr;  // [n, k]: rows of row_bytes(dtype, k) bytes, 16-byte aligned (Q8_0: 2)
  // F8_E4M3: F32, one value (per tensor) or one per output row (per_channel).
  // INT4: F16 [n, k / group].
  const void* scale = nullptr;
  bool per_channel = false;
  const uint8_t* zero = nullptr;  // INT4: U8 [n, k / group] zero points; null: symmetric (zero point 8)
  int64_t group = 0;              // INT4: 32, 64 or 128
};

// One destination of a row range of the weight: weight rows [begin, begin + count) go to columns
// [0, count) of data ([m, ld] F32), where begin is the sum of the counts of the outputs before it.
struct GemvOutput {
  float* data = nullptr;
  int64_t ld = 0;
  int64_t count = 0;
};

// A residual add and RMSNorm fused into the products around it (CudaBackend::matmul_add_rmsnorm), for the
// one-launch-per-projection decode step. The producer product (launch_gemv with `residual` set) does not
// store its output: residual[i, c] += value, next_x[i, c] = BF16(residual[i, c] * weight[c]) and
// residual[i, c]^2 is added (atomically) to one of the kGemvNormSlots partial sums of row i at
// out_sumsq[i * kGemvNormSlots ..]. A consumer product (`in_sumsq` set) reads that next_x as its x and
// multiplies activation row i's dot products by rsqrt(sum of in_sumsq[i * kGemvNormSlots ..] / k + eps)
// before scale and bias: the norm's per-row scale is a scalar of the dot product, so no kernel between
// the two products has to wait for the whole row's sum. The partial sums must be zero before the producer
// runs (the backend clears them once per forward pass). A CTA adds its rows' sum to slot blockIdx mod
// kGemvNormSlots (a few atomics per address: same-address atomics serialise).
constexpr int kGemvNormSlots = 128;
struct GemvNorm {
  const float* in_sumsq = nullptr;  // consumer: [m, kGemvNormSlots] partial sums; null: x as it is
  float in_eps = 0.0f;
  float* residual = nullptr;  // producer: [m, residual_ld] F32, updated in place; null: store outputs
  int64_t residual_ld = 0;
  const float* weight = nullptr;  // the next norm's F32 weight [outputs]
  void* next_x = nullptr;         // BF16 [m, outputs]
  float* out_sumsq = nullptr;     // [m, kGemvNormSlots], zero before the launch
};

// The kernel generation that runs a format's products; Default: the measured choice (or the environment's).
enum class GemvKernel : uint8_t { Default, V1, V2, V3, V4 };
bool gemv_kernel_reads(GemvKernel kernel, DType dtype);
const char* gemv_kernel_name(GemvKernel kernel);
// Process-wide override for one format (tests and benchmarks compare kernels in one process); Default
// restores the normal choice; a kernel that does not read the format is ignored. Takes effect at the next
// launch (a captured CUDA graph keeps the kernel it was captured with).
void set_gemv_kernel(DType dtype, GemvKernel kernel);
// v3's largest CTA, in warps splitting K (1..8; 0: INFERX_GEMV_V3_WARPS, default 8).
void set_gemv_v3_max_warps(int warps);
// v4's weight loads per lane and batch (4 or 8; else INFERX_GEMV_V4_LOADS, default 4) and CTAs per SM
// (>= 1: at most that many; 0: as many as fit; -1: INFERX_GEMV_V4_CTAS_PER_SM, default 0).
void set_gemv_v4_shape(int loads, int ctas_per_sm);

// Whether the kernels take this format with k input columns (and, INT4, group size); the caller also
// checks alignment with gemv_aligned.
bool gemv_supports(DType dtype, int64_t k, int64_t group);
bool gemv_aligned(DType dtype, const void* weight);

// out[m, k] BF16 = x[m, perm ? perm[i] : i] from x F32 (x_bf16 false) or BF16.
cudaError_t launch_gemv_prepare_x(const void* x, bool x_bf16, const int32_t* perm, int64_t m, int64_t k,
                                  void* out, cudaStream_t stream);

// out_i[r, c] = x[r, :] . W[begin_i + c, :] + bias[begin_i + c] for the row ranges of `outs` (their
// counts sum to the weight's rows). bias: F32 [sum of counts] or null. norm (null: none): the fused
// residual add / RMSNorm above (a producer has one output and at most kGemvMaxRows rows of x).
cudaError_t launch_gemv(const GemvWeight& w, const void* x, int64_t m, int64_t k, const float* bias,
                        const GemvOutput* outs, int num_outs, cudaStream_t stream,
                        const GemvNorm* norm = nullptr);

// Fused gate/up projection: W holds 2f rows, gate rows [0, f) stacked over up rows [f, 2f) (bias the
// same, or null); out[r, j] = silu(g) * u with g = x[r] . W[j] + b[j], u = x[r] . W[f + j] + b[f + j].
// out is [m, f] contiguous; out_bf16 (null: none) receives the same values rounded to BF16.
// norm: only its consumer side (in_sumsq) applies.
cudaError_t launch_gemv_silu_mul(const GemvWeight& w, const void* x, int64_t m, int64_t k, int64_t f,
                                 const float* bias, float* out, void* out_bf16, cudaStream_t stream,
                                 const GemvNorm* norm = nullptr);

// The consumer side without a product: out[r, c] = x[r, c] * rsqrt(sum of sumsq[r * kGemvNormSlots ..] /
// cols + eps) from the producer's BF16 next_x (F32 out), for readers of a lazily normalised tensor other
// than the GEMV.
cudaError_t launch_gemv_norm_apply(const void* x_bf16, const float* sumsq, float eps, int64_t rows,
                                   int64_t cols, float* out, cudaStream_t stream);

}  // namespace inferx::cuda
