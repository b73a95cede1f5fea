#pragma once
// Weight-streaming GEMV / skinny GEMM for few rows of activations (decode): out[m, n] = x[m, :] . W[n, :]
// (+ bias[n]) with x in BF16, fp32 accumulation and F32 outputs. One warp per output row (two for the
// fused SiLU product) walks the row in 16-byte granules with several loads in flight per lane; the weight
// format is a template parameter of the kernel (kernels_gemv.cu):
//   BF16;  F8_E4M3 with a per-tensor or per-channel F32 scale;  INT4 (quant/int4.h: 32-column runs of 16
//   bytes, F16 group scales, optional U8 zero points, group 32/64/128);  GGUF Q8_0 and Q4_K blocks
//   (quant/gguf_block_layouts.h), read as stored.
// Five kernels (kernels_gemv.cu): v1 (one 16-byte granule per lane and load, per-element conversions; all
// formats), v2 (8 columns per lane and step, kernels_gemv_decode.h; FP8, INT4, Q8_0, Q4_K), v3 (the
// dot products on tensor cores, weights decoded to BF16; BF16, FP8, INT4), v4 (persistent warps
// streaming rows, one activation row; BF16, FP8, INT4) and v5 (FP8 as W8A8 on E4M3 tensor cores on v4's
// streaming plan; opt-in). Each format runs on the fastest measured one unless set_gemv_kernel or
// INFERX_GEMV_KERNEL (read once: "v1", "int4=v4,fp8=v1",
// ...) says otherwise; v2 gives a warp two rows from INFERX_GEMV_V2_PAIRS rows (default 8192; 0: never). Rows
// of x beyond kGemvMaxRows are processed in chunks of kGemvMaxRows (one launch each). Pointers are device
// pointers; x is [m, k] contiguous BF16 (launch_gemv_prepare_x makes it from F32, and applies an INT4 input
// permutation).
#include <cuda_runtime_api.h>

#include <cstddef>
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

// The RMSNorm between two one-row products fused into both (decode at batch 1; v4 only, gemv_norm_fuses):
// the product before the norm (o, down) adds its output into the residual stream in its epilogue (a
// GemvResidual: the output itself is not stored) and writes the normed row's numerator BF16(residual *
// norm weight) plus one partial sum of squares per CTA; the product after it (qkv, gate/up, lm_head)
// takes that BF16 row as x and a GemvPrenorm, summing the partials (fixed order: deterministic) into
// rsqrt(mean(residual^2) + eps), which scales its sums. Against a norm kernel (x = BF16(residual * rstd *
// weight)) the BF16 rounding falls on residual * weight instead: the same relative error. Saves the norm
// kernel, its kernel boundary and the product output's round trip.
constexpr int kGemvMaxPartials = 4096;
struct GemvResidual {
  float* residual = nullptr;           // [n] F32, n = the product's rows
  const float* norm_weight = nullptr;  // [n] F32
  void* normed = nullptr;              // [n] BF16, written
  float* partials = nullptr;           // [kGemvMaxPartials] F32, written (the first `ctas`)
  int ctas = 0;                        // set by the launch: how many partials it writes
};
struct GemvPrenorm {
  const float* partials = nullptr;  // a GemvResidual's partials and ctas
  int ctas = 0;
  float eps = 0.0f;
};
// Whether the one-row products of this format and k take GemvResidual / GemvPrenorm (BF16 and FP8 on v4,
// with the fusion on: set_gemv_norm_fusion(1 / 0; -1: INFERX_GEMV_NORM=1|0, default 0, read once)).
bool gemv_norm_fuses(DType dtype, int64_t k);
void set_gemv_norm_fusion(int on);

// The kernel generation that runs a format's products; Default: the measured choice (or the environment's).
// V5 reads FP8 only, as W8A8: it quantizes x per token to E4M3 (the FP8 GEMM's and the CPU backend's codes)
// where v1-v4 read x in BF16 (weight-only), so its outputs differ from theirs by x's rounding.
enum class GemvKernel : uint8_t { Default, V1, V2, V3, V4, V5 };
bool gemv_kernel_reads(GemvKernel kernel, DType dtype);
const char* gemv_kernel_name(GemvKernel kernel);
// Process-wide override for one format (tests and benchmarks compare kernels in one process); Default
// restores the normal choice; a kernel that does not read the format is ignored. Takes effect at the next
// launch (a captured CUDA graph keeps the kernel it was captured with).
void set_gemv_kernel(DType dtype, GemvKernel kernel);
// v3's largest CTA, in warps splitting K (1..8; 0: INFERX_GEMV_V3_WARPS, default 8).
void set_gemv_v3_max_warps(int warps);
// v4's weight loads per lane and batch (4 or 8; 0: by the product's shape, kernels_gemv.cu v4_loads_for;
// else INFERX_GEMV_V4_LOADS, default 0), CTAs per SM
// (>= 1: at most that many; 0: as many as fit; -1: INFERX_GEMV_V4_CTAS_PER_SM, default 0) and whether a
// warp takes two rows of a plain product (1 / 0; -1: INFERX_GEMV_V4_PAIRS, default 1), and its shared-memory
// prefetch budget per SM in KB (0: off; -1: INFERX_GEMV_V4_SMEM_KB, else 96 on an H200 and off elsewhere;
// kernels_gemv_stream.cu v4_smem_kb), its K
// split (0: gemv_v4_ksplit's choice for BF16, FP8 and INT4 unsplit; 1: off; 2, 4: forced; -1:
// INFERX_GEMV_V4_KSPLIT, default 0), and the layout of x in shared memory for INT4 (0: BF16; 1: F32 where
// that costs no CTAs per SM; 2: F32 wherever it fits; -1: INFERX_GEMV_V4_X_F32, default 1).
void set_gemv_v4_shape(int loads, int ctas_per_sm, int pairs = -1, int smem_kb = -1, int ksplit = -1,
                       int x_f32 = -1);
// v4's K split for `groups` row groups (rows, pairs or gate/up pairs) of `batches` batches each on `warps`
// warps (one wave): how many warps of a CTA share each row group, each streaming batches / ks of it, so that
// products with few rows run on more warps with fewer batches each. `requested` > 0 forces 4 / 2 / 1 (the
// largest not above it dividing `batches`); 0 picks the split with the fewest batches in the busiest warp
// where it saves at least a quarter. Always divides `batches`. (Measured, kernels_gemv.cu v4_ksplit: BF16's
// 6144-row qkv product gains 6%, FP8's products nothing: the launcher splits BF16 only unless forced.)
int gemv_v4_ksplit(int64_t groups, int64_t batches, int64_t warps, int requested);
// v4's shared-memory staging plan for a launch of `ctas` CTAs on `sms` SMs, rows_per_warp (1 or 2) rows per
// warp and `loads` 16-byte loads per lane and batch: whole batches of each warp's first row(s) (at most the
// row's whole batches) such that the CTAs sharing an SM stay within smem_kb KB; 0 when the budget is 0 or
// too small for one batch. gemv_v4_smem_bytes: the dynamic shared memory of a CTA for that many batches.
int gemv_v4_staged_batches(int64_t ctas, int sms, int rows_per_warp, int loads, int64_t row_bytes,
                           int smem_kb);
size_t gemv_v4_smem_bytes(int rows_per_warp, int loads, int batches);

// v5's staging budget per SM in KB (0: off; -1: INFERX_GEMV_V5_SMEM_KB, default 96).
void set_gemv_v5_smem_kb(int smem_kb);

// Whether the kernels take this format with k input columns (and, INT4, group size); the caller also
// checks alignment with gemv_aligned.
bool gemv_supports(DType dtype, int64_t k, int64_t group);
bool gemv_aligned(DType dtype, const void* weight);

// out[m, k] BF16 = x[m, perm ? perm[i] : i] from x F32 (x_bf16 false) or BF16.
cudaError_t launch_gemv_prepare_x(const void* x, bool x_bf16, const int32_t* perm, int64_t m, int64_t k,
                                  void* out, cudaStream_t stream);

// out_i[r, c] = x[r, :] . W[begin_i + c, :] + bias[begin_i + c] for the row ranges of `outs` (their
// counts sum to the weight's rows). bias: F32 [sum of counts] or null. resid (one output, whose data is
// then unused) / pre: the norm fusion above (m = 1; else cudaErrorNotSupported and nothing launched).
cudaError_t launch_gemv(const GemvWeight& w, const void* x, int64_t m, int64_t k, const float* bias,
                        const GemvOutput* outs, int num_outs, cudaStream_t stream,
                        GemvResidual* resid = nullptr, const GemvPrenorm* pre = nullptr);

// Fused gate/up projection: W holds 2f rows, gate rows [0, f) stacked over up rows [f, 2f) (bias the
// same, or null); out[r, j] = silu(g) * u with g = x[r] . W[j] + b[j], u = x[r] . W[f + j] + b[f + j].
// out is [m, f] contiguous; out_bf16 (null: none) receives the same values rounded to BF16.
// pre: as launch_gemv's.
cudaError_t launch_gemv_silu_mul(const GemvWeight& w, const void* x, int64_t m, int64_t k, int64_t f,
                                 const float* bias, float* out, void* out_bf16, cudaStream_t stream,
                                 const GemvPrenorm* pre = nullptr);

}  // namespace inferx::cuda
