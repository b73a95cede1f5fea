// RMSNorm kernels (Zhang & Sennrich 2019): out = x * rsqrt(mean(x^2) + eps) * w. One block per row;
// the sum of squares is reduced in float across the block (the CPU backend sums in double; rows of a
// few thousand elements agree to ~1e-6 relative).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int kNormThreads = 256;

// Pass 1 optionally adds `add` into `x` (the residual stream) while summing squares; pass 2 scales and
// writes F32 (and BF16 when out_bf16 is set). The two passes touch the same indices from the same thread,
// so out may alias x or add. Rows whose length is a multiple of 4 use 16-byte accesses (the workspace rows
// are 64-byte aligned); others fall back to scalars.
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, float a, float b, float c, float d) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = packed;
}

__global__ void rmsnorm_kernel(float* x, const float* add, const float* w, float eps, int64_t cols,
                               float* out, __nv_bfloat16* out_bf16) {
  __shared__ float scratch[kWarp];
  pdl_wait();  // x / add come from the previous kernels
  pdl_launch_dependents();
  float* row = x + blockIdx.x * cols;
  const float* add_row = add ? add + blockIdx.x * cols : nullptr;
  float* out_row = out + blockIdx.x * cols;
  __nv_bfloat16* bf_row = out_bf16 ? out_bf16 + blockIdx.x * cols : nullptr;
  const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out_row) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   (!add_row || reinterpret_cast<uintptr_t>(add_row) % 16 == 0) &&
                   (!bf_row || reinterpret_cast<uintptr_t>(bf_row) % 8 == 0);
  float ss = 0.0f;
  if (vec) {
    for (int64_t i = threadIdx.x; i < cols / 4; i += blockDim.x) {
      float4 v = reinterpret_cast<const float4*>(row)[i];
      if (add_row) {
        const float4 a = reinterpret_cast<const float4*>(add_row)[i];
        v = make_float4(v.x + a.x, v.y + a.y, v.z + a.z, v.w + a.w);
        reinterpret_cast<float4*>(row)[i] = v;
      }
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float v = row[i];
      if (add_row) {
        v += add_row[i];
        row[i] = v;
      }
      ss += v * v;
    }
  }
  ss = block_sum(ss, scratch);
  const float scale = rsqrtf(ss / static_cast<float>(cols) + eps);
  if (vec) {
    for (int64_t i = threadIdx.x; i < cols / 4; i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(row)[i], g = reinterpret_cast<const float4*>(w)[i];
      const float4 y =
          make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
      reinterpret_cast<float4*>(out_row)[i] = y;
      if (bf_row) store_bf16x4(bf_row + 4 * i, y.x, y.y, y.z, y.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      const float y = row[i] * scale * w[i];
      out_row[i] = y;
      if (bf_row) bf_row[i] = __float2bfloat16_rn(y);
    }
  }
}

// One warp per head: head_dim is small (64..256), so a warp reduction suffices and a block handles
// several heads.
constexpr int kHeadsPerBlock = 4;
__global__ void head_rmsnorm_kernel(float* x, int64_t heads, int64_t head_dim, const float* w, float eps) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t head = static_cast<int64_t>(blockIdx.x) * kHeadsPerBlock + threadIdx.x / kWarp;
  if (head >= heads) return;
  const int lane = threadIdx.x % kWarp;
  float* v = x + head * head_dim;
  float ss = 0.0f;
  for (int64_t i = lane; i < head_dim; i += kWarp) ss += v[i] * v[i];
  ss = warp_sum(ss);
  const float scale = rsqrtf(ss / static_cast<float>(head_dim) + eps);
  for (int64_t i = lane; i < head_dim; i += kWarp) v[i] = v[i] * scale * w[i];
}

}  // namespace

cudaError_t launch_rmsnorm(const float* x, const float* w, float eps, int64_t rows, int64_t cols, float* out,
                           void* out_bf16, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  // x is only read when add == nullptr; the cast keeps one kernel for both entry points.
  return launch_pdl(rmsnorm_kernel, dim3(static_cast<unsigned>(rows)), dim3(kNormThreads), 0, stream,
                    const_cast<float*>(x), nullptr, w, eps, cols, out, static_cast<__nv_bfloat16*>(out_bf16));
}

cudaError_t launch_add_rmsnorm(float* residual, const float* x, const float* w, float eps, int64_t rows,
                               int64_t cols, float* out, void* out_bf16, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_pdl(rmsnorm_kernel, dim3(static_cast<unsigned>(rows)), dim3(kNormThreads), 0, stream,
                    residual, x, w, eps, cols, out, static_cast<__nv_bfloat16*>(out_bf16));
}

cudaError_t launch_head_rmsnorm(float* x, int64_t heads, int64_t head_dim, const float* w, float eps,
                                cudaStream_t stream) {
  if (heads == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  return launch_pdl(head_rmsnorm_kernel, dim3(blocks), dim3(kHeadsPerBlock * kWarp), 0, stream, x, heads,
                    head_dim, w, eps);
}

}  // namespace inferx::cuda
