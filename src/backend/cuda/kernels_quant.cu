// Kernels of the quantized GEMM path and of dummy quantized weights (kernels_quant.h). All are simple
// grid-stride or row-per-block kernels: they are bandwidth-bound passes next to the GEMMs they feed.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels_quant.h"
#include "backend/cuda/kernels_quant_math.h"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kFp8Max = 448.0f;  // quant/fp8.h: the largest finite E4M3 value

// Largest |x| of the row over the block (blockDim.x == kThreads); NaN is ignored as std::fmax does.
__device__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = lane < kThreads / kWarp ? scratch[lane] : 0.0f;
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  __syncthreads();
  return m;
}

__global__ void quantize_fp8_rows_kernel(const float* x, int64_t t, int64_t k, uint8_t* q, float* scale,
                                         __nv_bfloat16* q_bf16) {
  __shared__ float scratch[kWarp];
  for (int64_t r = blockIdx.x; r < t; r += gridDim.x) {
    const float* row = x + r * k;
    float amax = 0.0f;
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) amax = fmaxf(amax, fabsf(row[c]));
    amax = block_max(amax, scratch);
    const float s = amax > 0.0f ? __fdiv_rn(amax, kFp8Max) : 1.0f;
    if (threadIdx.x == 0) scale[r] = s;
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
      const uint8_t code = float_to_fp8(__fdiv_rn(row[c], s));
      if (q) q[r * k + c] = code;
      if (q_bf16) q_bf16[r * k + c] = __float2bfloat16_rn(fp8_to_float(code) * s);
    }
  }
}

__global__ void fp8_scale_epilogue_kernel(const float* acc, int64_t t, int64_t n, const float* x_scale,
                                          const float* w_scale, bool per_channel, const float* bias,
                                          float* out) {
  const int64_t total = t * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    float v = acc[i] * x_scale[r] * w_scale[per_channel ? c : 0];
    if (bias) v += bias[c];
    out[i] = v;
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

__device__ __forceinline__ uint64_t hash64(uint64_t z) {  // splitmix64 finaliser, as launch_fill_random
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// mode 0: F8_E4M3 codes, 1: random bytes, 2: U8 values.
__global__ void fill_codes_kernel(uint8_t* t, int64_t n, int mode, uint64_t seed, float amp, float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t bits = hash64(seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1));
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
  quantize_fp8_rows_kernel<<<blocks, kThreads, 0, stream>>>(x, t, k, q, scale,
                                                            static_cast<__nv_bfloat16*>(q_bf16));
  return cudaGetLastError();
}

cudaError_t launch_fp8_scale_epilogue(const float* acc, int64_t t, int64_t n, const float* x_scale,
                                      const float* w_scale, bool per_channel, const float* bias, float* out,
                                      cudaStream_t stream) {
  if (t <= 0 || n <= 0) return cudaSuccess;
  fp8_scale_epilogue_kernel<<<grid_for(t * n, kThreads, 8192), kThreads, 0, stream>>>(
      acc, t, n, x_scale, w_scale, per_channel, bias, out);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_rows_bf16(const DequantWeight& w, int64_t row0, int64_t rows, void* out,
                                        cudaStream_t stream) {
  if (rows <= 0 || w.k <= 0) return cudaSuccess;
  if (w.k % 8 != 0) return cudaErrorInvalidValue;
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

cudaError_t launch_fill_random_codes(DType dtype, void* t, int64_t n, uint64_t seed, float amp, float offset,
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
  fill_codes_kernel<<<grid_for(bytes, kThreads, 8192), kThreads, 0, stream>>>(static_cast<uint8_t*>(t), bytes,
                                                                              mode, seed, amp, offset);
  return cudaGetLastError();
}

}  // namespace inferx::cuda
