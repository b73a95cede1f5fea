// Weight-streaming GEMV for decode (kernels_gemv.h). Memory-bound: the weight is read once, so the kernels
// are built around keeping enough bytes in flight per SM (each lane issues several independent 16-byte
// weight loads before it converts any) and around not spending L1 on the weights (ld.global.nc with
// L1::no_allocate), so that x, which every warp re-reads, stays in L1, and around spending few
// instructions per weight once it arrives. Five kernels, in files of their own (this one: the choice between
// them and the entry points; kernels_gemv_impl.cuh: what they share):
//   v1 (gemv_kernel, kernels_gemv_v1v2.cu): one warp per output row, four warps per CTA; a lane takes one
//      granule of a format per load (16 bytes: 8 to 32 columns) and expands it to floats element by
//      element.
//   v2 (gemv8_kernel, kernels_gemv_v1v2.cu; decoders in kernels_gemv_decode.h): a lane takes 8
//      consecutive columns per step, so that the warp's x loads are contiguous, decodes without
//      integer-to-float conversions and applies block scales once per step.
//   v3 (gemv_tc_kernel, kernels_gemv_tc.cu): 16 weight rows per CTA, K split among its warps; the weights
//      are decoded to exact BF16 and multiplied on tensor cores (mma.m16n8k16, weights as the A operand,
//      x as B), so a weight costs its decode only (BF16 none, E4M3 ~2.5 instructions, INT4 1.5), and up
//      to 16 rows of x cost about the same.
//   v4 (gemv_stream_kernel, kernels_gemv_stream.cu): v1's BF16 / FP8 decoders, and INT4 runs of 32
//      columns at ~2.5 instructions per weight (StreamInt4: no conversion or subtraction per weight, x
//      from shared memory; slower than v3 for INT4, so opt-in: INFERX_GEMV_KERNEL=int4=v4), on one wave
//      of persistent warps, each streaming rows w, w + W, ... (plain products: pairs of rows) with the
//      next batch of loads in flight while it multiplies the current one. One activation row.
//   v5 (gemv_tc_stream_kernel, kernels_gemv_tc_stream.cu; layout in gemv_tc_stream_layout.h): FP8 only,
//      as W8A8 - x quantized per token to E4M3 in shared memory, mma.m16n8k32.e4m3, no instruction per
//      weight - on v4's plan (one wave of persistent warps taking 16-row tiles, the next batch in flight,
//      the first batches staged before the PDL wait, a K split for products with few tiles). Up to 16
//      activation rows. Opt-in (INFERX_GEMV_KERNEL=fp8=v5): at batch 1 (8B fp8:lm_head) 2.4% faster than
//      v4 on one H200 node (2026-12-05 22:45), 1.5% slower on an H100 (2026-12-06 00:42).
// Which one runs a format: kernel_for (measured default, INFERX_GEMV_KERNEL, set_gemv_kernel). Every
// kernel issues its first weight loads, then calls pdl_wait() before it reads x or stores, and
// pdl_launch_dependents() once its weights are streamed, and is launched with launch_pdl (cuda_common.cuh).
// Triggering at the kernel's start instead measured 4.6% slower end to end (H200, 2026-12-03 04:44,
// batch-1 decode at 1k context: 180.3 vs 188.6 tok/s); the cause was not profiled.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels_gemv.h"
#include "backend/cuda/kernels_gemv_impl.cuh"

namespace inferx::cuda {

using namespace gemv_impl;

namespace {

// ---- Which kernel runs a format: set_gemv_kernel (tests, benchmarks), else INFERX_GEMV_KERNEL, else the
// fastest measured on the H200 (bench_cuda_kernels, graph-launched, weights cycled past L2; % of the 4242
// GB/s copy; 2026-12-03 04:20, v1 / v2 / v3 in one process):
//   INT4 g128, M=1: 4096x4096 22.5 / 19.2 / 39.8, 6144x4096 27.6 / 22.1 / 34.2, 14336x4096 31.5 / 35.0 /
//     47.9, 4096x14336 26.6 / 21.9 / 53.2, gate/up+SiLU 28672x4096 28.3 / 37.8 / 50.7; M=4 9.5 / 9.0 /
//     38.2, M=16 2.4 / 2.6 / 23.8: v3 at every M.
//   FP8 per channel, M=1: 4096x4096 54.1 / 49.0 / 47.7, 6144x4096 54.0 / 48.5 / 54.2, 14336x4096 76.4 /
//     70.2 / 70.7, 4096x14336 70.1 / 59.0 / 58.8, gate/up+SiLU 83.1 / 81.6 / 73.9: v1; M=4 21.6 / 21.9 /
//     45.7, M=16 7.6 / 9.9 / 39.2: v3 from two rows on. v4 (10:41): standalone no better than v1 (4096x4096
//     51.0 vs 54.6), but in the graph at batch 1 the model decodes 344.1 vs 337.4 tok/s (fp8:lm_head 354.8
//     vs 350.2): v4 at M=1. BF16 221.9 vs 221.3 (noise): v1 stayed until v4's shared-memory prefetch
//     (v4_smem_kb), with which BF16 takes v4 at M=1 (the model 4.543 -> 4.407 ms at batch 1).
//   BF16, M=1 (more rows go to cuBLASLt): v1 and v3 equal on 4096x4096, 14336x4096 and 4096x14336, v3
//     better on 6144x4096 (80.4 vs 69.5), worse on 1024x4096 (29.0 vs 33.7), gate/up+SiLU (82.9 vs 94.5)
//     and the 128256-row lm_head (92.6 vs 104.5): v1.
//   Q8_0 / Q4_K (00:34, again at 04:20): v2 (60.6 / 47.5 and 31.2 / 20.9 at 14336x4096 / 4096x14336).
// v3 reads BF16, FP8 and INT4 with K a multiple of 32 / 64 / 128 (whole 4-chunk sets) and up to 16 / S
// activation rows per launch (other products: v1), v4 BF16, FP8 and INT4 with one activation row (more:
// v1), v2 the four quantized formats, v1 all five.
//   INT4 g128 on v4 (StreamInt4, H100 2026-12-05 18:55, % of the 3005 GB/s copy, v3 / v4 / v4 8 loads):
//     4096x4096 - / 40.5-42.0, 6144x4096 44.4 / 44.0 / 46.6, 14336x4096 64.1 / 57.0 / 55.9, gate/up+SiLU
//     68.7 / 65.1 / 56.6, 4096x14336 65.4 / 55.5 / 47.1 (asymmetric: 60.0 / 55.9, 69.2 / 54.1); in the 8B
//     model at batch 1 (int4:lm_head, TPOT p50, two runs each) v3 2.452 / 2.455 ms, v4 2.762 / 2.766: v3
//     stays INT4's default at every M. (Not profiled: each run is one 32-FFMA dependency chain per row.)
//   v3 with its INT4 chunks staged in shared memory by cp.async instead of registers (113 registers at g64:
//     two 8-warp CTAs, 64 KB in flight per SM; staged ~128 KB; both counted, not measured; cdd93db, removed).
//     H100 2026-12-07, g64, % of copy, registers / 8 sets a batch in one stage / 4 sets in two: lm_head
//     128256x4096 77.4 / 89.4 / 74.3, q/k/v 43.3 / 45.9 / 40.1, gate/up + SiLU 61.5 / 62.5 / 58.8, o 47.2 /
//     39.1 / 45.5, down 69.1 / 60.2 / 60.0; yet in the 8B int4:lm_head model at batch 1 every staged use
//     lost: registers 2.414-2.440 ms, one stage everywhere 2.540, two stages 2.504, one stage on the q/k/v,
//     gate/up and lm_head products only 2.645-2.675. Not profiled. (The guess that kernels of different
//     shared-memory carve-outs cannot share an SM did not hold up: one carve-out of 100 for every kernel made
//     every format slower, +3..+24%, H100 2026-12-07.)

int format_index(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return 0;
    case DType::F8_E4M3:
      return 1;
    case DType::INT4:
      return 2;
    case DType::Q8_0:
      return 3;
    case DType::Q4_K:
      return 4;
    default:
      return -1;
  }
}
constexpr int kFormats = 5;

// The measured choice (above) for a launch of m activation rows.
GemvKernel measured_kernel(DType dtype, int m) {
  switch (dtype) {
    case DType::F8_E4M3:
      return m >= 2 ? GemvKernel::V3 : GemvKernel::V4;
    case DType::INT4:
      return GemvKernel::V3;  // v4 reads INT4 too (StreamInt4): TPOT 13% longer in the model (above)
    case DType::Q8_0:
    case DType::Q4_K:
      return GemvKernel::V2;
    case DType::BF16:
      return GemvKernel::V4;  // with its shared-memory prefetch: see v4_smem_kb
    default:
      return GemvKernel::V1;
  }
}

std::atomic<GemvKernel> g_override[kFormats];  // Default: none

// INFERX_GEMV_KERNEL: comma-separated "v1" / "v2" / "v3" (every format that kernel reads) or
// "FORMAT=vN" with FORMAT one of bf16, fp8, int4, q8_0, q4_k; later items win. Read once.
const std::array<GemvKernel, kFormats>& env_kernels() {
  static const std::array<GemvKernel, kFormats> k = [] {
    std::array<GemvKernel, kFormats> r{};
    const char* e = std::getenv("INFERX_GEMV_KERNEL");
    if (e == nullptr) return r;
    const std::string spec(e);
    const char* names[kFormats] = {"bf16", "fp8", "int4", "q8_0", "q4_k"};
    const DType types[kFormats] = {DType::BF16, DType::F8_E4M3, DType::INT4, DType::Q8_0, DType::Q4_K};
    size_t at = 0;
    while (at <= spec.size()) {
      const size_t comma = std::min(spec.find(',', at), spec.size());
      const std::string item = spec.substr(at, comma - at);
      at = comma + 1;
      const size_t eq = item.find('=');
      const std::string kname = eq == std::string::npos ? item : item.substr(eq + 1);
      const GemvKernel kernel = kname == "v1"   ? GemvKernel::V1
                                : kname == "v2" ? GemvKernel::V2
                                : kname == "v3" ? GemvKernel::V3
                                : kname == "v4" ? GemvKernel::V4
                                : kname == "v5" ? GemvKernel::V5
                                                : GemvKernel::Default;
      for (int f = 0; f < kFormats; ++f)
        if ((eq == std::string::npos || item.compare(0, eq, names[f]) == 0) &&
            gemv_kernel_reads(kernel, types[f]))
          r[static_cast<size_t>(f)] = kernel;
    }
    return r;
  }();
  return k;
}

GemvKernel kernel_for(DType dtype, int m) {
  const int f = format_index(dtype);
  if (f < 0) return GemvKernel::V1;
  const GemvKernel o = g_override[f].load(std::memory_order_relaxed);
  if (o != GemvKernel::Default) return o;
  const GemvKernel e = env_kernels()[static_cast<size_t>(f)];
  return e != GemvKernel::Default ? e : measured_kernel(dtype, m);
}

int rows_bucket(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }

template <int R>
cudaError_t launch_format(DType dtype, const GemvParams& p, cudaStream_t stream) {
  if (p.residual != nullptr || p.in_partials != nullptr)  // the norm fusion: v4 only (gemv_norm_fuses)
    return kernel_for(dtype, 1) == GemvKernel::V4 ? launch_v4<R>(dtype, p, stream) : cudaErrorNotSupported;
  GemvKernel kernel = kernel_for(dtype, p.m);
  if (kernel == GemvKernel::V5) {
    const cudaError_t e = launch_v5<R>(dtype, p, stream);
    if (e != cudaErrorNotSupported) return e;
    kernel = measured_kernel(dtype, p.m);  // a launch v5 does not take (K not a multiple of 64, ...)
  }
  if (kernel == GemvKernel::V3) {
    const int subsets = dtype == DType::INT4 ? 4 >> p.group_shift : 1;
    if (rows_bucket(p.m) * subsets <= 16 && p.row_bytes % 64 == 0) return launch_v3<R>(dtype, p, stream);
    kernel = GemvKernel::V1;
  }
  if (kernel == GemvKernel::V4) {
    const cudaError_t e = launch_v4<R>(dtype, p, stream);
    if (e != cudaErrorNotSupported) return e;
    kernel = GemvKernel::V1;  // a launch v4 does not take (more than one activation row, ...)
  }
  return launch_v1v2<R>(dtype, kernel == GemvKernel::V2, p, stream);
}

int64_t weight_row_bytes(DType dtype, int64_t k) {
  switch (dtype) {
    case DType::BF16:
      return 2 * k;
    case DType::F8_E4M3:
      return k;
    case DType::INT4:
      return k / 2;
    case DType::Q8_0:
      return k / 32 * 34;
    case DType::Q4_K:
      return k / 256 * 144;
    default:
      return 0;
  }
}

GemvParams base_params(const GemvWeight& w, int64_t k) {
  GemvParams p;
  p.w = static_cast<const uint8_t*>(w.data);
  p.row_bytes = weight_row_bytes(w.dtype, k);
  p.scale = w.scale;
  p.zero = w.zero;
  p.per_channel = w.per_channel;
  if (w.dtype == DType::INT4) {
    p.groups_per_row = k / w.group;
    p.group_shift = w.group == 32 ? 0 : w.group == 64 ? 1 : 2;
    p.step_group_shift = p.group_shift + 2;
  }
  p.k = k;
  return p;
}

__global__ void prepare_x_kernel(const void* x, bool x_bf16, const int32_t* perm, int64_t m, int64_t k,
                                 __nv_bfloat16* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = m * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / k, c = i % k;
    const int64_t src = r * k + (perm ? perm[c] : c);
    out[i] = x_bf16 ? static_cast<const __nv_bfloat16*>(x)[src]
                    : __float2bfloat16_rn(static_cast<const float*>(x)[src]);
  }
}

}  // namespace

bool gemv_supports(DType dtype, int64_t k, int64_t group) {
  if (k <= 0) return false;
  switch (dtype) {
    case DType::BF16:
      return k % 8 == 0;
    case DType::F8_E4M3:
      return k % 16 == 0;
    case DType::INT4:
      return (group == 32 || group == 64 || group == 128) && k % group == 0;
    case DType::Q8_0:
      return k % 32 == 0;
    case DType::Q4_K:
      return k % 256 == 0;
    default:
      return false;
  }
}

bool gemv_aligned(DType dtype, const void* weight) {
  const auto a = reinterpret_cast<uintptr_t>(weight);
  return dtype == DType::Q8_0 ? a % 2 == 0 : a % 16 == 0;
}

bool gemv_kernel_reads(GemvKernel kernel, DType dtype) {
  switch (kernel) {
    case GemvKernel::V1:
      return format_index(dtype) >= 0;
    case GemvKernel::V2:
      return format_index(dtype) >= 1;
    case GemvKernel::V3:
      return dtype == DType::BF16 || dtype == DType::F8_E4M3 || dtype == DType::INT4;
    case GemvKernel::V4:
      return dtype == DType::BF16 || dtype == DType::F8_E4M3 || dtype == DType::INT4;
    case GemvKernel::V5:
      return dtype == DType::F8_E4M3;
    default:
      return false;
  }
}

void set_gemv_kernel(DType dtype, GemvKernel kernel) {
  const int f = format_index(dtype);
  if (f >= 0 && (kernel == GemvKernel::Default || gemv_kernel_reads(kernel, dtype)))
    g_override[f].store(kernel, std::memory_order_relaxed);
}

const char* gemv_kernel_name(GemvKernel kernel) {
  switch (kernel) {
    case GemvKernel::V1:
      return "v1";
    case GemvKernel::V2:
      return "v2";
    case GemvKernel::V3:
      return "v3";
    case GemvKernel::V4:
      return "v4";
    case GemvKernel::V5:
      return "v5";
    default:
      return "default";
  }
}

// The norm fusion's switch: set_gemv_norm_fusion, else INFERX_GEMV_NORM (0 / 1, default 0), read once.
EnvSwitch g_norm_fusion("INFERX_GEMV_NORM", false);
void set_gemv_norm_fusion(int on) { g_norm_fusion.set(on); }

bool gemv_norm_fuses(DType dtype, int64_t k) {
  return g_norm_fusion.on() && (dtype == DType::BF16 || dtype == DType::F8_E4M3) &&
         kernel_for(dtype, 1) == GemvKernel::V4 && gemv_supports(dtype, k, 0);
}

cudaError_t launch_gemv_prepare_x(const void* x, bool x_bf16, const int32_t* perm, int64_t m, int64_t k,
                                  void* out, cudaStream_t stream) {
  if (m * k == 0) return cudaSuccess;
  return launch_pdl(prepare_x_kernel, dim3(grid_for(m * k, 256, 4096)), dim3(256), 0, stream, x, x_bf16, perm,
                    m, k, static_cast<__nv_bfloat16*>(out));
}

namespace {
// The norm fusion's arguments into the launch's parameters (both need one activation row on v4).
bool apply_norm_fusion(DType dtype, int64_t m, int64_t k, GemvResidual* resid, const GemvPrenorm* pre,
                       GemvParams& p) {
  if (resid == nullptr && pre == nullptr) return true;
  if (m != 1 || !gemv_norm_fuses(dtype, k)) return false;
  static const int exp = env_int("INFERX_GEMV_NORM_EXP", 0, 3, 0);
  p.late_trigger = resid != nullptr && (exp & 1) != 0;
  p.warp_prenorm = (exp & 2) != 0;
  if (resid != nullptr) {
    if (!resid->residual || !resid->norm_weight || !resid->normed || !resid->partials) return false;
    p.residual = resid->residual;
    p.norm_weight = resid->norm_weight;
    p.normed = static_cast<__nv_bfloat16*>(resid->normed);
    p.partials = resid->partials;
    p.launched_ctas = &resid->ctas;
  }
  if (pre != nullptr) {
    if (!pre->partials || pre->ctas < 1) return false;
    p.in_partials = pre->partials;
    p.in_ctas = pre->ctas;
    p.eps = pre->eps;
  }
  return true;
}
}  // namespace

cudaError_t launch_gemv(const GemvWeight& w, const void* x, int64_t m, int64_t k, const float* bias,
                        const GemvOutput* outs, int num_outs, cudaStream_t stream, GemvResidual* resid,
                        const GemvPrenorm* pre) {
  if (num_outs < 1 || num_outs > kGemvMaxOutputs) return cudaErrorInvalidValue;
  GemvParams p = base_params(w, k);
  if (resid != nullptr && num_outs != 1) return cudaErrorNotSupported;
  if (!apply_norm_fusion(w.dtype, m, k, resid, pre, p)) return cudaErrorNotSupported;
  p.bias = bias;
  p.num_outs = num_outs;
  for (int i = 0; i < num_outs; ++i) {
    p.outs[i] = outs[i];
    p.rows += outs[i].count;
  }
  if (p.rows == 0) return cudaSuccess;
  for (int64_t r0 = 0; r0 < m; r0 += kGemvMaxRows) {
    p.m = static_cast<int>(m - r0 < kGemvMaxRows ? m - r0 : kGemvMaxRows);
    p.x = static_cast<const __nv_bfloat16*>(x) + r0 * k;
    for (int i = 0; i < num_outs; ++i) p.outs[i].data = outs[i].data + r0 * outs[i].ld;
    const cudaError_t e = launch_format<1>(w.dtype, p, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t launch_gemv_silu_mul(const GemvWeight& w, const void* x, int64_t m, int64_t k, int64_t f,
                                 const float* bias, float* out, void* out_bf16, cudaStream_t stream,
                                 const GemvPrenorm* pre) {
  GemvParams p = base_params(w, k);
  if (!apply_norm_fusion(w.dtype, m, k, nullptr, pre, p)) return cudaErrorNotSupported;
  p.bias = bias;
  p.num_outs = 1;
  p.rows = p.f = f;
  if (f == 0) return cudaSuccess;
  for (int64_t r0 = 0; r0 < m; r0 += kGemvMaxRows) {
    p.m = static_cast<int>(m - r0 < kGemvMaxRows ? m - r0 : kGemvMaxRows);
    p.x = static_cast<const __nv_bfloat16*>(x) + r0 * k;
    p.outs[0] = {out + r0 * f, f, f};
    p.out_bf16 = out_bf16 ? static_cast<__nv_bfloat16*>(out_bf16) + r0 * f : nullptr;
    const cudaError_t e = launch_format<2>(w.dtype, p, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace inferx::cuda
