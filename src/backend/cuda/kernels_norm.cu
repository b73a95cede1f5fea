// RMSNorm kernels (Zhang & Sennrich 2019): out = x * rsqrt(mean(x^2) + eps) * w. One block per row;
// the sum of squares is reduced in float across the block (the CPU backend sums in double; rows of a
// few thousand elements agree to ~1e-6 relative).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_rows.cuh"

namespace inferx::cuda {
namespace {

constexpr int kNormThreads = 256;

// Rows of whole float4s up to kNormThreads * kMaxVec * 4 columns (8192: Llama-3-70B) keep their values in
// registers: every load of the row, the residual add and the weights is issued at once, so a decode step's
// one-row norm costs one memory round trip rather than a loop of them (a one-CTA kernel is all latency).
// The weights are constant, so they are read before the wait for the previous kernel.
constexpr int kMaxVec = 8;

template <int kVec>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_regs_kernel(float* x, const float* add, const float* w, float eps, int64_t cols, float* out,
                        __nv_bfloat16* out_bf16) {
  __shared__ float scratch[kWarp];
  const int64_t n4 = cols / 4;
  float4 g[kVec], v[kVec];
  norm_rows::load<kVec, kNormThreads>(w, n4, g);
  pdl_wait();  // x / add come from the previous kernels
  pdl_launch_dependents();
  float* row = x + blockIdx.x * cols;
  const float* add_row = add ? add + blockIdx.x * cols : nullptr;
  const float ss =
      block_sum(norm_rows::add_and_sum_squares<kVec, kNormThreads>(row, add_row, n4, v), scratch);
  norm_rows::normalize<kVec, kNormThreads>(v, g, rsqrtf(ss / static_cast<float>(cols) + eps), n4);
  float* out_row = out + blockIdx.x * cols;
  __nv_bfloat16* bf_row = out_bf16 ? out_bf16 + blockIdx.x * cols : nullptr;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kNormThreads;
    if (i < n4) {
      reinterpret_cast<float4*>(out_row)[i] = v[j];
      if (bf_row) store_bf16x4(bf_row + 4 * i, v[j].x, v[j].y, v[j].z, v[j].w);
    }
  }
}

// Rows too wide for the register kernel, or not whole aligned float4s (`vec`, decided by the launcher).
// Pass 1 optionally adds `add` into `x` (the residual stream) while summing squares; pass 2 scales and
// writes F32 (and BF16 when out_bf16 is set). The two passes touch the same indices from the same thread,
// so out may alias x or add. With vec, 16-byte accesses; else scalars.
__global__ void rmsnorm_kernel(float* x, const float* add, const float* w, float eps, int64_t cols,
                               float* out, __nv_bfloat16* out_bf16, bool vec) {
  __shared__ float scratch[kWarp];
  pdl_wait();  // x / add come from the previous kernels
  pdl_launch_dependents();
  float* row = x + blockIdx.x * cols;
  const float* add_row = add ? add + blockIdx.x * cols : nullptr;
  float* out_row = out + blockIdx.x * cols;
  __nv_bfloat16* bf_row = out_bf16 ? out_bf16 + blockIdx.x * cols : nullptr;
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

// Both entry points: x is only written when add != nullptr. The register kernel takes rows of whole float4s
// (16-byte aligned: the workspace rows are 64-byte aligned) up to kMaxVec per thread; others the loop.
cudaError_t launch_norm(float* x, const float* add, const float* w, float eps, int64_t rows, int64_t cols,
                        float* out, void* out_bf16, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  auto* bf = static_cast<__nv_bfloat16*>(out_bf16);
  // Whole float4s on every row follow from aligned bases: a row is cols * 4 (BF16: cols * 2) bytes.
  const bool vec = cols % 4 == 0 && is_aligned(x, 16) && is_aligned(out, 16) && is_aligned(w, 16) &&
                   is_aligned(add, 16) && is_aligned(bf, 8);
  const int64_t per_thread = (cols / 4 + kNormThreads - 1) / kNormThreads;
  const dim3 grid(static_cast<unsigned>(rows)), block(kNormThreads);
  if (vec && per_thread <= 2)
    return launch_pdl(rmsnorm_regs_kernel<2>, grid, block, 0, stream, x, add, w, eps, cols, out, bf);
  if (vec && per_thread <= 4)
    return launch_pdl(rmsnorm_regs_kernel<4>, grid, block, 0, stream, x, add, w, eps, cols, out, bf);
  if (vec && per_thread <= kMaxVec)
    return launch_pdl(rmsnorm_regs_kernel<kMaxVec>, grid, block, 0, stream, x, add, w, eps, cols, out, bf);
  return launch_pdl(rmsnorm_kernel, grid, block, 0, stream, x, add, w, eps, cols, out, bf, vec);
}

}  // namespace

cudaError_t launch_rmsnorm(const float* x, const float* w, float eps, int64_t rows, int64_t cols, float* out,
                           void* out_bf16, cudaStream_t stream) {
  // x is only read when add == nullptr; the cast keeps one kernel for both entry points.
  return launch_norm(const_cast<float*>(x), nullptr, w, eps, rows, cols, out, out_bf16, stream);
}

cudaError_t launch_add_rmsnorm(float* residual, const float* x, const float* w, float eps, int64_t rows,
                               int64_t cols, float* out, void* out_bf16, cudaStream_t stream) {
  return launch_norm(residual, x, w, eps, rows, cols, out, out_bf16, stream);
}

cudaError_t launch_head_rmsnorm(float* x, int64_t heads, int64_t head_dim, const float* w, float eps,
                                cudaStream_t stream) {
  if (heads == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  return launch_pdl(head_rmsnorm_kernel, dim3(blocks), dim3(kHeadsPerBlock * kWarp), 0, stream, x, heads,
                    head_dim, w, eps);
}

}  // namespace inferx::cuda
