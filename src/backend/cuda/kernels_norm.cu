// RMSNorm kernels (Zhang & Sennrich 2019): out = x * rsqrt(mean(x^2) + eps) * w. One block per row;
// the sum of squares is reduced in float across the block (the CPU backend sums in double; rows of a
// few thousand elements agree to ~1e-6 relative).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int kNormThreads = 256;

// Pass 1 optionally adds `add` into `x` (the residual stream) while summing squares; pass 2 scales.
// The two passes touch the same indices from the same thread, so out may alias x or add.
__global__ void rmsnorm_kernel(float* x, const float* add, const float* w, float eps, int64_t cols,
                               float* out) {
  __shared__ float scratch[kWarp];
  float* row = x + blockIdx.x * cols;
  const float* add_row = add ? add + blockIdx.x * cols : nullptr;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    float v = row[i];
    if (add_row) {
      v += add_row[i];
      row[i] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float scale = rsqrtf(ss / static_cast<float>(cols) + eps);
  float* out_row = out + blockIdx.x * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out_row[i] = row[i] * scale * w[i];
}

// One warp per head: head_dim is small (64..256), so a warp reduction suffices and a block handles
// several heads.
constexpr int kHeadsPerBlock = 4;
__global__ void head_rmsnorm_kernel(float* x, int64_t heads, int64_t head_dim, const float* w, float eps) {
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
                           cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  // x is only read when add == nullptr; the cast keeps one kernel for both entry points.
  rmsnorm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(const_cast<float*>(x), nullptr, w,
                                                                           eps, cols, out);
  return cudaGetLastError();
}

cudaError_t launch_add_rmsnorm(float* residual, const float* x, const float* w, float eps, int64_t rows,
                               int64_t cols, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  rmsnorm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, stream>>>(residual, x, w, eps, cols, out);
  return cudaGetLastError();
}

cudaError_t launch_head_rmsnorm(float* x, int64_t heads, int64_t head_dim, const float* w, float eps,
                                cudaStream_t stream) {
  if (heads == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  head_rmsnorm_kernel<<<blocks, kHeadsPerBlock * kWarp, 0, stream>>>(x, heads, head_dim, w, eps);
  return cudaGetLastError();
}

}  // namespace inferx::cuda
