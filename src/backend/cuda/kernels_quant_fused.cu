// The passes around the FP8 GEMMs of prefill-sized steps with the per-token activation quantization folded
// in (kernels_quant.h): the RMSNorm before q/k/v and gate/up writes E4M3 codes instead of F32 rows, and the
// SiLU * up epilogue of the gate/up GEMM writes the down projection's codes. At a 16k-token step of the 8B
// shape that is ~0.5 GB less traffic per norm and ~1.9 GB per MLP, and three kernels fewer per layer
// (docs/benchmarks.md, 2026-12-03 20:55: the norms, epilogues and quantization passes were 43% of the step).
// Measured end to end (H200 2026-12-04, 8B FP8 + FP8 KV offline, same call): +1.6% at 512 x 1000/200, +1.9%
// at 1000 x 1000/1000 - half of what the bytes predict.
// Each computes its values with the same expressions as the unfused kernels (kernels_norm.cu,
// kernels_quant.cu), so the codes and scales are those of the unfused passes.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels_quant.h"
#include "backend/cuda/kernels_quant_math.h"
#include "backend/cuda/norm_rows.cuh"
#include "backend/cuda/quant_codes.cuh"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kNormMaxVec = 8;  // float4s per thread: rows up to 8192 columns (Llama-3-70B)
// Shared memory of the SiLU pass: one row of n / 2 floats (28672 for Llama-3-70B: 112 KB).
constexpr size_t kSiluMaxSmem = 200 * 1024;

// v = row + row r of a deferred product's W8A8 values (BF16 sums, fp8_epilogue_kernel's w8a8_value), written
// back to row; returns this thread's sum of squares. The same v as the F32 add of the values the epilogue
// would have written, so the same norm, codes and scales.
template <int kVec>
__device__ __forceinline__ float add_product_and_sum_squares(float* row, const Fp8Epilogue& e, int64_t r,
                                                             int64_t n4, float4 (&v)[kVec]) {
  norm_rows::load<kVec, kThreads>(row, n4, v);
  const float xs = e.x_scale[r];
  const auto* acc = static_cast<const __nv_bfloat16*>(e.acc) + r * e.n;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (i < n4) {
      float a[4];
      load_v<4>(acc + 4 * i, a);
      const int64_t c = 4 * i;
      v[j] = make_float4(v[j].x + w8a8_value(e, a[0], xs, c), v[j].y + w8a8_value(e, a[1], xs, c + 1),
                         v[j].z + w8a8_value(e, a[2], xs, c + 2), v[j].w + w8a8_value(e, a[3], xs, c + 3));
      reinterpret_cast<float4*>(row)[i] = v[j];
    }
  }
  return norm_rows::sum_squares<kVec, kThreads>(v, n4);
}

// One row per CTA iteration, held in registers (kVec float4s per thread): the residual add (of add's rows,
// or kProduct: of the deferred product e's values) and the norm through rmsnorm_regs_kernel's own steps
// (norm_rows.cuh), then quantize_fp8_rows_vec_kernel's scale and codes (quant_codes.cuh).
template <int kVec, bool kProduct>
__global__ void __launch_bounds__(kThreads)
    norm_quantize_kernel(float* x, const float* add, const __grid_constant__ Fp8Epilogue e, const float* w,
                         float eps, int64_t t, int64_t cols, uint8_t* q, float* scale) {
  __shared__ float scratch[kWarp];
  const int64_t n4 = cols / 4;
  float4 g[kVec];
  norm_rows::load<kVec, kThreads>(w, n4, g);
  for (int64_t r = blockIdx.x; r < t; r += gridDim.x) {
    float4 v[kVec];
    float ss;
    if constexpr (kProduct)
      ss = add_product_and_sum_squares<kVec>(x + r * cols, e, r, n4, v);
    else
      ss =
          norm_rows::add_and_sum_squares<kVec, kThreads>(x + r * cols, add ? add + r * cols : nullptr, n4, v);
    ss = block_sum(ss, scratch);
    norm_rows::normalize<kVec, kThreads>(v, g, rsqrtf(ss / static_cast<float>(cols) + eps), n4);
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (threadIdx.x + static_cast<int64_t>(j) * kThreads < n4) amax = fmaxf(amax, abs_max4(v[j]));
    const float s = fp8_row_scale(block_max(amax, scratch));
    const float inv = fp8_inverse(s);
    if (threadIdx.x == 0) scale[r] = s;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
      if (i < n4)
        reinterpret_cast<uint32_t*>(q + r * cols)[i] = fp8_codes4(v[j].x, v[j].y, v[j].z, v[j].w, inv);
    }
  }
}

// The weight scales and biases of gate column c and its up column f + c .. + V - 1 (biases 0 when absent),
// for both SiLU passes. kVecScales: per-channel scales as float4s (V == 4, 16-byte aligned: the launchers
// check). Read-only loads: the scales and biases are weights.
template <int V, bool kVecScales>
__device__ __forceinline__ void silu_column_terms(const Fp8Epilogue& e, int64_t f, int64_t c, float (&ws)[V],
                                                  float (&ws2)[V], float (&bs)[V], float (&bs2)[V]) {
  if constexpr (kVecScales) {
    static_assert(V == 4, "vector scales come as float4s");
    const float4 w1 = __ldg(reinterpret_cast<const float4*>(e.w_scale + c)),
                 w2 = __ldg(reinterpret_cast<const float4*>(e.w_scale + f + c));
    ws[0] = w1.x, ws[1] = w1.y, ws[2] = w1.z, ws[3] = w1.w;
    ws2[0] = w2.x, ws2[1] = w2.y, ws2[2] = w2.z, ws2[3] = w2.w;
  } else {
#pragma unroll
    for (int u = 0; u < V; ++u) {
      ws[u] = e.w_scale[e.per_channel ? c + u : 0];
      ws2[u] = e.w_scale[e.per_channel ? f + c + u : 0];
    }
  }
#pragma unroll
  for (int u = 0; u < V; ++u) bs[u] = bs2[u] = 0.0f;
  if (e.bias) {
#pragma unroll
    for (int u = 0; u < V; ++u) {
      bs[u] = e.bias[c + u];
      bs2[u] = e.bias[f + c + u];
    }
  }
}

// fp8_epilogue_kernel's SiLU * up values of row r (w8a8_silu_up, bias 0 when absent) into shared memory,
// then the row's scale and codes. V = 4: float4 / BF16x4 loads and 4 codes per store. kUnroll chunks of a
// thread are loaded before any is used (their loads in flight together: one CTA per row walks 14336 columns
// in 14 dependent rounds otherwise), and per-channel weight scales come as float4s (kVecScales). Measured
// against the form before (one chunk at a time, scalar scale loads, accurate expf and division in the
// silu; H200 2026-12-04, BF16 sums, per channel): 8192 rows 373 -> 280 us, 300 rows 20.7 -> 16.7 us;
// 8B FP8 1000 x 1000/1000 offline 15,411 -> 15,554 output tok/s in the same call.
constexpr int kUnroll = 4;
template <int V, class Acc, bool kVecScales>
__global__ void __launch_bounds__(kThreads)
    silu_quantize_kernel(const __grid_constant__ Fp8Epilogue e, uint8_t* q, float* scale) {
  extern __shared__ float vals[];
  __shared__ float scratch[kWarp];
  const Acc* acc = static_cast<const Acc*>(e.acc);
  const int64_t f = e.n / 2;
  for (int64_t r = blockIdx.x; r < e.t; r += gridDim.x) {
    const float xs = e.x_scale[r];
    const Acc* row = acc + r * e.n;
    float amax = 0.0f;
    for (int64_t c0 = static_cast<int64_t>(threadIdx.x) * V; c0 < f; c0 += kThreads * V * kUnroll) {
      float a[kUnroll][V], b[kUnroll][V];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int64_t c = c0 + static_cast<int64_t>(j) * kThreads * V;
        if (c < f) {
          load_v<V>(row + c, a[j]);
          load_v<V>(row + f + c, b[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int64_t c = c0 + static_cast<int64_t>(j) * kThreads * V;
        if (c >= f) continue;
        float ws[V], ws2[V], bs[V], bs2[V];
        silu_column_terms<V, kVecScales>(e, f, c, ws, ws2, bs, bs2);
#pragma unroll
        for (int u = 0; u < V; ++u) {
          const float y = w8a8_silu_up(a[j][u], b[j][u], xs, ws[u], bs[u], ws2[u], bs2[u]);
          vals[c + u] = y;
          amax = fmaxf(amax, fabsf(y));
        }
      }
    }
    const float s = fp8_row_scale(block_max(amax, scratch));  // block_max's barriers also publish vals
    const float inv = fp8_inverse(s);
    if (threadIdx.x == 0) scale[r] = s;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < f; c += kThreads * V) {
      if constexpr (V == 4)
        *reinterpret_cast<uint32_t*>(q + r * f + c) =
            fp8_codes4(vals[c], vals[c + 1], vals[c + 2], vals[c + 3], inv);
      else
        q[r * f + c] = fp8_code(vals[c], inv);
    }
    __syncthreads();  // the next row overwrites vals
  }
}

// The same pass with the row in registers, for rows of up to kRegsThreads * 4 * kRegsMaxChunks columns of
// BF16 sums: thread i takes the 4-column chunks i, i + kRegsThreads, ... (kC of them), issues all of its
// chunks' gate and up loads at once, turns them into the W8A8 SiLU * up values in place, and after the row's
// maximum writes the codes from the same registers: one memory round trip per row and no shared memory beyond
// the maximum's 32 floats, so two CTAs of 512 threads per SM and the per-channel weight scales (the same for
// every row) can stay in L1, where the shared-memory pass's 57 KB per CTA left them to L2. Same expressions
// as silu_quantize_kernel and an order-free maximum, so the same codes and scales to the bit. Measured on an
// H100 (2026-12-06, `INFERX_BENCH_ONLY=silu bench_cuda_kernels`, registers / shared memory): 300 rows 14.8
// / 14.6 us, 512 rows 26.2 / 25.6 us, 8192 rows 258 / 292 us (75% / 66% of copy); 8B FP8 + FP8 KV 1000 x
// 1000/1000 offline 14,706 / 14,591 output tok/s in the same call. Alone at 512 rows both forms stay at ~46%
// of copy (what bounds them there is not profiled), but inside an FP8 decode step's graph at 512 rows (CUPTI
// timeline, same day, two nodes) the register pass takes 23.4 us per layer where the shared-memory pass
// took 32.4. With the trims below (kFull, fp8_codes4, the .ftz silu_fast; H100, 2026-12-06 13:45, same
// bench, register pass): 300 rows 11.8 us, 512 rows 17.2 us (71% of copy), 8192 rows 243 us (80%); 17.0 us
// per layer in the 512-row step's graph; 1000/1000 FP8 14,867 against 14,824 before them (+0.3%, inside the
// run-to-run spread).
constexpr int kRegsThreads = 512;
constexpr int kRegsMaxChunks = 8;  // 16384 columns (Llama-3-8B's 14336: 7 chunks)
// kFull: the row is exactly kC chunks per thread (f == 4 * kRegsThreads * kC, Llama-3-8B's 14336 with kC 7),
// so no chunk needs its `c < f` guard. Column offsets are 32-bit (f <= 16384); the row's base pointers are
// formed once. With the paired E4M3 conversions (fp8_codes4) and the .ftz SiLU: 1,208 -> 872 SASS
// instructions per thread for Llama-3-8B's rows (kC 7), no spills (12 before; cuobjdump, 2026-12-06).
template <int kC, bool kVecScales, bool kFull>
__global__ void __launch_bounds__(kRegsThreads, 2)
    silu_quantize_regs_kernel(const __grid_constant__ Fp8Epilogue e, uint8_t* q, float* scale) {
  __shared__ float scratch[kWarp];
  const int f = static_cast<int>(e.n / 2);
  const auto in_row = [&](int c) { return kFull || c < f; };
  for (int64_t r = blockIdx.x; r < e.t; r += gridDim.x) {
    const __nv_bfloat16* gate = static_cast<const __nv_bfloat16*>(e.acc) + r * e.n;
    const __nv_bfloat16* up = gate + f;
    uint2 g[kC], u[kC];  // four BF16 sums each
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      const int c = 4 * (static_cast<int>(threadIdx.x) + j * kRegsThreads);
      if (in_row(c)) {
        g[j] = *reinterpret_cast<const uint2*>(gate + c);
        u[j] = *reinterpret_cast<const uint2*>(up + c);
      }
    }
    const float xs = e.x_scale[r];
    float y[kC][4];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      const int c = 4 * (static_cast<int>(threadIdx.x) + j * kRegsThreads);
      if (!in_row(c)) continue;
      float ws[4], ws2[4], bs[4], bs2[4];
      silu_column_terms<4, kVecScales>(e, f, c, ws, ws2, bs, bs2);
      const uint32_t gw[2] = {g[j].x, g[j].y}, uw[2] = {u[j].x, u[j].y};
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        // BF16 v of a pair of words: the low half first (the lower address).
        const float a = __uint_as_float(v % 2 == 0 ? gw[v / 2] << 16 : gw[v / 2] & 0xffff0000u);
        const float b = __uint_as_float(v % 2 == 0 ? uw[v / 2] << 16 : uw[v / 2] & 0xffff0000u);
        y[j][v] = w8a8_silu_up(a, b, xs, ws[v], bs[v], ws2[v], bs2[v]);
        amax = fmaxf(amax, fabsf(y[j][v]));
      }
    }
    const float s = fp8_row_scale(block_max(amax, scratch));  // its trailing barrier frees scratch
    const float inv = fp8_inverse(s);
    if (threadIdx.x == 0) scale[r] = s;
    uint8_t* out = q + r * f;
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      const int c = 4 * (static_cast<int>(threadIdx.x) + j * kRegsThreads);
      if (in_row(c))
        *reinterpret_cast<uint32_t*>(out + c) = fp8_codes4(y[j][0], y[j][1], y[j][2], y[j][3], inv);
    }
  }
}

__global__ void dequantize_fp8_rows_kernel(const uint8_t* q, const float* scale, int64_t t, int64_t k,
                                           float* out) {
  const int64_t total = t * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = fp8_to_float(q[i]) * scale[i / k];
}

unsigned row_blocks(int64_t t) { return static_cast<unsigned>(std::min<int64_t>(t, 65535)); }

// One instance of the SiLU pass, its shared-memory limit raised to kSiluMaxSmem once per device.
template <int V, class Acc, bool kVecScales = false>
cudaError_t launch_silu(const Fp8Epilogue& e, uint8_t* q, float* scale, size_t smem, cudaStream_t stream) {
  static unsigned smem_set = 0;
  const auto kernel = silu_quantize_kernel<V, Acc, kVecScales>;
  const cudaError_t st = allow_dynamic_smem(kernel, static_cast<int>(kSiluMaxSmem), smem_set);
  if (st != cudaSuccess) return st;
  kernel<<<row_blocks(e.t), kThreads, smem, stream>>>(e, q, scale);
  return cudaGetLastError();
}

// One instance of the register pass: a CTA per row up to two per SM.
template <int kC, bool kVecScales>
cudaError_t launch_silu_regs(const Fp8Epilogue& e, uint8_t* q, float* scale, cudaStream_t stream) {
  if (e.n / 2 == 4 * kRegsThreads * kC)
    silu_quantize_regs_kernel<kC, kVecScales, true>
        <<<row_blocks(e.t), kRegsThreads, 0, stream>>>(e, q, scale);
  else
    silu_quantize_regs_kernel<kC, kVecScales, false>
        <<<row_blocks(e.t), kRegsThreads, 0, stream>>>(e, q, scale);
  return cudaGetLastError();
}
template <bool kVecScales>
cudaError_t launch_silu_regs(const Fp8Epilogue& e, uint8_t* q, float* scale, cudaStream_t stream) {
  const int64_t chunks = (e.n / 2 + 4 * kRegsThreads - 1) / (4 * kRegsThreads);
  if (chunks <= 2) return launch_silu_regs<2, kVecScales>(e, q, scale, stream);
  if (chunks <= 4) return launch_silu_regs<4, kVecScales>(e, q, scale, stream);
  if (chunks <= 7) return launch_silu_regs<7, kVecScales>(e, q, scale, stream);
  return launch_silu_regs<kRegsMaxChunks, kVecScales>(e, q, scale, stream);
}

std::atomic<int> g_silu_pass{-1};  // set_fp8_silu_pass; -1: INFERX_SILU_PASS

}  // namespace

void set_fp8_silu_pass(SiluPass pass) {
  g_silu_pass.store(static_cast<int>(pass), std::memory_order_relaxed);
}
SiluPass fp8_silu_pass() {
  const int set = g_silu_pass.load(std::memory_order_relaxed);
  if (set >= 0) return static_cast<SiluPass>(set);
  static const SiluPass env = [] {
    const char* v = std::getenv("INFERX_SILU_PASS");
    return v != nullptr && std::strcmp(v, "smem") == 0 ? SiluPass::SharedMemory : SiluPass::Registers;
  }();
  return env;
}

bool fp8_silu_registers_take(const Fp8Epilogue& e, const void* q) {
  const int64_t f = e.n / 2;
  return fp8_silu_pass() == SiluPass::Registers && fp8_silu_quantize_takes(e) && e.acc_bf16 && f % 4 == 0 &&
         f <= 4 * kRegsThreads * kRegsMaxChunks && is_aligned(e.acc, 8) && is_aligned(q, 4);
}

bool fp8_norm_quantize_takes(const float* residual, const float* add, const float* w, int64_t k,
                             const Fp8Epilogue* add_product) {
  if (add_product) {
    const Fp8Epilogue& e = *add_product;
    if (add || !e.acc_bf16 || e.silu || e.num_outs != 1 || e.n != k || !is_aligned(e.acc, 8) ||
        e.x_scale == nullptr || e.w_scale == nullptr)
      return false;
  }
  return k > 0 && k % 4 == 0 && k / 4 <= int64_t{kThreads} * kNormMaxVec && is_aligned(residual, 16) &&
         is_aligned(add, 16) && is_aligned(w, 16);
}

namespace {

template <bool kProduct>
void launch_norm_quantize(float* residual, const float* add, const Fp8Epilogue& e, const float* w, float eps,
                          int64_t t, int64_t k, uint8_t* q, float* scale, cudaStream_t stream) {
  const int64_t per_thread = (k / 4 + kThreads - 1) / kThreads;
  const unsigned blocks = row_blocks(t);
  if (per_thread <= 2)
    norm_quantize_kernel<2, kProduct>
        <<<blocks, kThreads, 0, stream>>>(residual, add, e, w, eps, t, k, q, scale);
  else if (per_thread <= 4)
    norm_quantize_kernel<4, kProduct>
        <<<blocks, kThreads, 0, stream>>>(residual, add, e, w, eps, t, k, q, scale);
  else
    norm_quantize_kernel<kNormMaxVec, kProduct>
        <<<blocks, kThreads, 0, stream>>>(residual, add, e, w, eps, t, k, q, scale);
}

}  // namespace

cudaError_t launch_norm_quantize_fp8_rows(float* residual, const float* add, const float* w, float eps,
                                          int64_t t, int64_t k, uint8_t* q, float* scale, cudaStream_t stream,
                                          const Fp8Epilogue* add_product) {
  if (!fp8_norm_quantize_takes(residual, add, w, k, add_product) || !is_aligned(q, 4))
    return cudaErrorNotSupported;
  if (add_product && add_product->t != t) return cudaErrorInvalidValue;
  if (t <= 0) return cudaSuccess;
  if (add_product)
    launch_norm_quantize<true>(residual, nullptr, *add_product, w, eps, t, k, q, scale, stream);
  else
    launch_norm_quantize<false>(residual, add, Fp8Epilogue{}, w, eps, t, k, q, scale, stream);
  return cudaGetLastError();
}

bool fp8_silu_quantize_takes(const Fp8Epilogue& e) {
  return e.silu && e.n > 0 && e.n % 2 == 0 && static_cast<size_t>(e.n / 2) * sizeof(float) <= kSiluMaxSmem;
}

cudaError_t launch_fp8_silu_quantize(const Fp8Epilogue& e, uint8_t* q, float* scale, cudaStream_t stream) {
  if (!fp8_silu_quantize_takes(e)) return cudaErrorNotSupported;
  if (e.t <= 0) return cudaSuccess;
  const int64_t f = e.n / 2;
  const bool vec = f % 4 == 0 && is_aligned(e.acc, e.acc_bf16 ? 8 : 16) && is_aligned(q, 4);
  const size_t smem = static_cast<size_t>(f) * sizeof(float);
  if (fp8_silu_registers_take(e, q)) {
    if (e.per_channel && is_aligned(e.w_scale, 16)) return launch_silu_regs<true>(e, q, scale, stream);
    return launch_silu_regs<false>(e, q, scale, stream);
  }
  if (e.acc_bf16 && vec && e.per_channel && is_aligned(e.w_scale, 16))
    return launch_silu<4, __nv_bfloat16, true>(e, q, scale, smem, stream);
  if (e.acc_bf16)
    return vec ? launch_silu<4, __nv_bfloat16>(e, q, scale, smem, stream)
               : launch_silu<1, __nv_bfloat16>(e, q, scale, smem, stream);
  return vec ? launch_silu<4, float>(e, q, scale, smem, stream)
             : launch_silu<1, float>(e, q, scale, smem, stream);
}

cudaError_t launch_dequantize_fp8_rows(const uint8_t* q, const float* scale, int64_t t, int64_t k, float* out,
                                       cudaStream_t stream) {
  if (t <= 0 || k <= 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((t * k + kThreads - 1) / kThreads, 8192);
  dequantize_fp8_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(q, scale, t, k, out);
  return cudaGetLastError();
}

}  // namespace inferx::cuda
