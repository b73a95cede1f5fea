// Kernels of the quantized GEMM path and of dummy quantized weights (kernels_quant.h). All are simple
// grid-stride or row-per-block kernels: they are bandwidth-bound passes next to the GEMMs they feed.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels_quant.h"
#include "backend/cuda/kernels_quant_math.h"
#include "backend/cuda/quant_codes.cuh"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void quantize_fp8_rows_kernel(const float* x, int64_t t, int64_t k, uint8_t* q, float* scale,
                                         __nv_bfloat16* q_bf16) {
  __shared__ float scratch[kWarp];
  for (int64_t r = blockIdx.x; r < t; r += gridDim.x) {
    const float* row = x + r * k;
    float amax = 0.0f;
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) amax = fmaxf(amax, fabsf(row[c]));
    const float s = fp8_row_scale(block_max(amax, scratch));
    const float inv = fp8_inverse(s);
    if (threadIdx.x == 0) scale[r] = s;
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
      const uint8_t code = fp8_code(row[c], inv);
      if (q) q[r * k + c] = code;
      if (q_bf16) q_bf16[r * k + c] = __float2bfloat16_rn(fp8_to_float(code) * s);
    }
  }
}

// The same per-row quantization for rows of whole float4s (k % 4 == 0, 16-byte aligned rows), up to kVec
// float4s per thread held in registers: one read of the row instead of two scalar passes, four codes per
// 32-bit store. The H200 profile of a 2048-token FP8 step (ncu, 2026-12-03) had the scalar kernel at 40 us
// per 2048 x 4096 input, about 1 TB/s.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_rows_vec_kernel(const float* x, int64_t t, int64_t k, uint8_t* q, float* scale,
                                 __nv_bfloat16* q_bf16) {
  __shared__ float scratch[kWarp];
  const int64_t n4 = k / 4;
  for (int64_t r = blockIdx.x; r < t; r += gridDim.x) {
    const float4* row = reinterpret_cast<const float4*>(x + r * k);
    float4 v[kVec];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
      v[j] = i < n4 ? row[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      amax = fmaxf(amax, abs_max4(v[j]));
    }
    const float s = fp8_row_scale(block_max(amax, scratch));
    const float inv = fp8_inverse(s);
    if (threadIdx.x == 0) scale[r] = s;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kThreads;
      if (i >= n4) continue;
      const uint8_t c0 = fp8_code(v[j].x, inv), c1 = fp8_code(v[j].y, inv), c2 = fp8_code(v[j].z, inv),
                    c3 = fp8_code(v[j].w, inv);
      if (q) reinterpret_cast<uint32_t*>(q + r * k)[i] = pack_codes(c0, c1, c2, c3);
      if (q_bf16)
        store_bf16x4(q_bf16 + r * k + 4 * i, fp8_to_float(c0) * s, fp8_to_float(c1) * s, fp8_to_float(c2) * s,
                     fp8_to_float(c3) * s);
    }
  }
}

template <int V>
__device__ __forceinline__ void store_v(float* p, const float (&v)[V]) {
  if constexpr (V == 4)
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  else
    *p = v[0];
}

// The W8A8 epilogue over acc [t, n] (F32 or BF16) (Fp8Epilogue in kernels_quant.h): value(r, c) = acc *
// x_scale[r] * w_scale[c or 0] (+ bias[c]), written to the output that owns column c, or, for SiLU,
// silu(value(r, c)) * value(r, f + c) to out[0][r, c] with f = n / 2. Grid (column blocks, row blocks); V = 4
// moves float4s (every column count a multiple of 4, 16-byte aligned rows), V = 1 scalars. No 64-bit division
// per element (the first epilogue's i / n and i % n ran at ~1.7 TB/s on the H200).
template <int V, class Acc>
__global__ void __launch_bounds__(kThreads) fp8_epilogue_kernel(const __grid_constant__ Fp8Epilogue e) {
  const Acc* acc = static_cast<const Acc*>(e.acc);
  const int64_t width = e.silu ? e.n / 2 : e.n;  // output columns per row, all outputs together
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (c >= width) return;
  int j = 0;
  int64_t local = c;
  while (!e.silu && j + 1 < e.num_outs && local >= e.cols[j]) local -= e.cols[j++];
  float ws[V], bs[V] = {}, ws2[V], bs2[V] = {};
#pragma unroll
  for (int u = 0; u < V; ++u) {
    ws[u] = e.w_scale[e.per_channel ? c + u : 0];
    if (e.bias) bs[u] = e.bias[c + u];
    if (e.silu) {
      ws2[u] = e.w_scale[e.per_channel ? width + c + u : 0];
      if (e.bias) bs2[u] = e.bias[width + c + u];
    }
  }
  for (int64_t r = blockIdx.y; r < e.t; r += gridDim.y) {
    const float xs = e.x_scale[r];
    float a[V], y[V];
    load_v<V>(acc + r * e.n + c, a);
    if (e.silu) {
      float b[V];
      load_v<V>(acc + r * e.n + width + c, b);
#pragma unroll
      for (int u = 0; u < V; ++u) y[u] = w8a8_silu_up(a[u], b[u], xs, ws[u], bs[u], ws2[u], bs2[u]);
      store_v<V>(e.out[0] + r * width + c, y);
    } else {
#pragma unroll
      for (int u = 0; u < V; ++u) y[u] = w8a8_value(a[u], xs, ws[u], bs[u]);
      store_v<V>(e.out[j] + r * e.cols[j] + local, y);
    }
  }
}

__global__ void dequantize_rows_kernel(DequantWeight w, int64_t row0, int64_t rows, __nv_bfloat16* out) {
  const int64_t units_per_row = w.k / 8, total = rows * units_per_row;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = u / units_per_row, c0 = (u % units_per_row) * 8;
    float v[8];
    dequantize8(w, row0 + i, c0, v);
    __align__(16) __nv_bfloat16 b[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) b[e] = __float2bfloat16_rn(v[e]);
    *reinterpret_cast<uint4*>(out + i * w.k + c0) = *reinterpret_cast<const uint4*>(b);
  }
}

// F8_E4M3 with K not a multiple of 8: one element per thread (rows of odd length are not 16-byte aligned).
__global__ void dequantize_fp8_elements_kernel(DequantWeight w, int64_t row0, int64_t rows,
                                               __nv_bfloat16* out) {
  const int64_t total = rows * w.k;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[u] = __float2bfloat16_rn(dequantize_fp8(w, row0 + u / w.k, u % w.k));
}

__global__ void activations_bf16_kernel(const float* x, const int32_t* perm, int64_t t, int64_t k,
                                        __nv_bfloat16* out) {
  const int64_t total = t * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / k, c = i % k;
    int64_t src = c;
    if (perm) {
      const int32_t p = perm[c];
      src = p >= 0 && p < k ? p : c;  // the loader validated the permutation; never read out of the row
    }
    out[i] = __float2bfloat16_rn(x[r * k + src]);
  }
}

// mode 0: F8_E4M3 codes, 1: random bytes, 2: U8 values.
__global__ void fill_codes_kernel(uint8_t* t, int64_t n, int mode, RandomIndex index, float amp,
                                  float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t bits = index.bits(i);
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float v = offset + (2.0f * u - 1.0f) * amp;
    if (mode == 0)
      t[i] = float_to_fp8(v);
    else if (mode == 1)
      t[i] = static_cast<uint8_t>(bits >> 24);
    else
      t[i] = static_cast<uint8_t>(fminf(fmaxf(rintf(v), 0.0f), 255.0f));
  }
}

}  // namespace

cudaError_t launch_quantize_fp8_rows(const float* x, int64_t t, int64_t k, uint8_t* q, float* scale,
                                     void* q_bf16, cudaStream_t stream) {
  if (t <= 0 || k <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(t < 65535 ? t : 65535);
  auto* qb = static_cast<__nv_bfloat16*>(q_bf16);
  const int64_t per_thread = (k / 4 + kThreads - 1) / kThreads;
  if (k % 4 == 0 && is_aligned(x, 16) && is_aligned(q, 4) && is_aligned(qb, 8)) {
    if (per_thread <= 4)
      quantize_fp8_rows_vec_kernel<4><<<blocks, kThreads, 0, stream>>>(x, t, k, q, scale, qb);
    else if (per_thread <= 8)
      quantize_fp8_rows_vec_kernel<8><<<blocks, kThreads, 0, stream>>>(x, t, k, q, scale, qb);
    else if (per_thread <= 16)
      quantize_fp8_rows_vec_kernel<16><<<blocks, kThreads, 0, stream>>>(x, t, k, q, scale, qb);
    else
      quantize_fp8_rows_kernel<<<blocks, kThreads, 0, stream>>>(x, t, k, q, scale, qb);
  } else {
    quantize_fp8_rows_kernel<<<blocks, kThreads, 0, stream>>>(x, t, k, q, scale, qb);
  }
  return cudaGetLastError();
}

cudaError_t launch_fp8_epilogue(const Fp8Epilogue& e, cudaStream_t stream) {
  if (e.t <= 0 || e.n <= 0) return cudaSuccess;
  const int64_t width = e.silu ? e.n / 2 : e.n;
  bool vec = e.n % 4 == 0 && width % 4 == 0 && is_aligned(e.acc, e.acc_bf16 ? 8 : 16);
  const int outs = e.silu ? 1 : e.num_outs;
  for (int j = 0; j < outs; ++j) vec = vec && (e.silu || e.cols[j] % 4 == 0) && is_aligned(e.out[j], 16);
  const int v = vec ? 4 : 1;
  const int64_t col_blocks = (width / v + kThreads - 1) / kThreads;
  // Enough row blocks to fill the GPU a few times over; each thread then walks rows at a stride.
  const int64_t row_blocks = std::min<int64_t>(e.t, std::max<int64_t>(1, 8192 / col_blocks));
  const dim3 grid(static_cast<unsigned>(col_blocks),
                  static_cast<unsigned>(std::min<int64_t>(row_blocks, 65535)));
  if (e.acc_bf16) {
    if (vec)
      fp8_epilogue_kernel<4, __nv_bfloat16><<<grid, kThreads, 0, stream>>>(e);
    else
      fp8_epilogue_kernel<1, __nv_bfloat16><<<grid, kThreads, 0, stream>>>(e);
  } else if (vec) {
    fp8_epilogue_kernel<4, float><<<grid, kThreads, 0, stream>>>(e);
  } else {
    fp8_epilogue_kernel<1, float><<<grid, kThreads, 0, stream>>>(e);
  }
  return cudaGetLastError();
}

cudaError_t launch_dequantize_rows_bf16(const DequantWeight& w, int64_t row0, int64_t rows, void* out,
                                        cudaStream_t stream) {
  if (rows <= 0 || w.k <= 0) return cudaSuccess;
  if (w.k % 8 != 0) {
    if (w.dtype != DType::F8_E4M3) return cudaErrorInvalidValue;
    dequantize_fp8_elements_kernel<<<grid_for(rows * w.k, kThreads, 8192), kThreads, 0, stream>>>(
        w, row0, rows, static_cast<__nv_bfloat16*>(out));
    return cudaGetLastError();
  }
  dequantize_rows_kernel<<<grid_for(rows * (w.k / 8), kThreads, 8192), kThreads, 0, stream>>>(
      w, row0, rows, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t launch_activations_bf16(const float* x, const int32_t* perm, int64_t t, int64_t k, void* out,
                                    cudaStream_t stream) {
  if (t <= 0 || k <= 0) return cudaSuccess;
  activations_bf16_kernel<<<grid_for(t * k, kThreads, 8192), kThreads, 0, stream>>>(
      x, perm, t, k, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t launch_fill_random_codes(DType dtype, void* t, int64_t n, int64_t cols, const RandomFill& fill,
                                     cudaStream_t stream) {
  int mode = 0;
  int64_t bytes = n;
  if (dtype == DType::F8_E4M3) {
    mode = 0;
  } else if (dtype == DType::INT4) {
    mode = 1;
    bytes = n / 2;
  } else if (dtype == DType::U8) {
    mode = 2;
  } else {
    return cudaErrorInvalidValue;
  }
  if (bytes <= 0) return cudaSuccess;
  RandomFill units = fill;  // INT4: the random bits are drawn per byte (two codes), the fill counts codes
  if (mode == 1) {
    if (cols % 2 != 0 || fill.full_cols % 2 != 0 || fill.col0 % 2 != 0) return cudaErrorInvalidValue;
    cols /= 2;
    units.full_cols /= 2;
    units.col0 /= 2;
  }
  fill_codes_kernel<<<grid_for(bytes, kThreads, 8192), kThreads, 0, stream>>>(
      static_cast<uint8_t*>(t), bytes, mode, RandomIndex(units, cols), fill.amplitude, fill.offset);
  return cudaGetLastError();
}

}  // namespace inferx::cuda
