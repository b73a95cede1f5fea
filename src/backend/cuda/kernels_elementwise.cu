// Element-wise and row-copy kernels: embedding gather, SwiGLU's silu(gate) * up (Shazeer 2020),
// gather_rows, the F32 -> 16-bit activation conversion before a GEMM, and the bias add after one.
// Grid-stride loops; silu_mul and the BF16 conversion use 16-byte accesses when sizes and alignment allow.
// fill_random generates dummy weights in device memory.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_kernel(const T* table, int64_t rows, int64_t dim, const int32_t* ids, int64_t n,
                                 int64_t first_id, float* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = n * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / dim, c = i % dim;
    const int64_t row = ids[t] - first_id;
    out[i] = (row >= 0 && row < rows) ? to_float(table[row * dim + c]) : 0.0f;
  }
}

// Scalar form: any n, any alignment.
__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out,
                                __nv_bfloat16* out_bf16) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float y = silu(gate[i]) * up[i];
    out[i] = y;
    if (out_bf16) out_bf16[i] = __float2bfloat16_rn(y);
  }
}

// 16-byte form: n4 groups of 4 floats, every pointer 16-byte aligned (8 for the BF16 output).
__global__ void silu_mul_vec_kernel(const float4* gate, const float4* up, int64_t n4, float4* out,
                                    uint2* out_bf16) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 g = gate[i], u = up[i];
    const float4 y = make_float4(silu(g.x) * u.x, silu(g.y) * u.y, silu(g.z) * u.z, silu(g.w) * u.w);
    out[i] = y;
    if (out_bf16) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(y.x, y.y), hi = __floats2bfloat162_rn(y.z, y.w);
      out_bf16[i] =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
  }
}

// The stacked [gate | up] product in BF16 ([t, 2f], as the GEMM writes it) -> silu(gate) * up in F32 and
// BF16 ([t, f]). 8 columns per thread and step (16-byte loads) when f % 8 == 0, else one.
__global__ void silu_mul_stacked_bf16_kernel(const __nv_bfloat16* gu, int64_t t, int64_t f, bool vec,
                                             float* out, __nv_bfloat16* out_bf16) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t per_row = vec ? f / 8 : f, total = t * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i % per_row) * (vec ? 8 : 1);
    const __nv_bfloat16* g = gu + r * 2 * f + c;
    const __nv_bfloat16* u = g + f;
    float* o = out + r * f + c;
    __nv_bfloat16* ob = out_bf16 + r * f + c;
    if (vec) {
      const uint4 gv = *reinterpret_cast<const uint4*>(g), uv = *reinterpret_cast<const uint4*>(u);
      const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
      const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
      float y[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 gf = __bfloat1622float2(g2[j]), uf = __bfloat1622float2(u2[j]);
        y[2 * j] = silu(gf.x) * uf.x;
        y[2 * j + 1] = silu(gf.y) * uf.y;
      }
      reinterpret_cast<float4*>(o)[0] = make_float4(y[0], y[1], y[2], y[3]);
      reinterpret_cast<float4*>(o)[1] = make_float4(y[4], y[5], y[6], y[7]);
      uint4 packed;
      auto* p2 = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
      for (int j = 0; j < 4; ++j) p2[j] = __floats2bfloat162_rn(y[2 * j], y[2 * j + 1]);
      *reinterpret_cast<uint4*>(ob) = packed;
    } else {
      const float y = silu(__bfloat162float(*g)) * __bfloat162float(*u);
      *o = y;
      *ob = __float2bfloat16_rn(y);
    }
  }
}

template <class T>
__global__ void fill_random_kernel(T* t, int64_t n, RandomIndex index, float amp, float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(index.bits(i) >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    t[i] = from_float<T>(offset + (2.0f * u - 1.0f) * amp);
  }
}

// Byte rows of any dtype; a whole block copies one output row (4-byte words when aligned).
__global__ void gather_rows_kernel(const char* x, int64_t num_rows, int64_t row_bytes, const int32_t* rows,
                                   char* out) {
  pdl_wait();
  pdl_launch_dependents();
  const int32_t r = rows[blockIdx.x];
  char* dst = out + blockIdx.x * row_bytes;
  const bool valid = r >= 0 && r < num_rows;
  const char* src = x + (valid ? r : 0) * row_bytes;
  if (row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0 &&
      reinterpret_cast<uintptr_t>(dst) % 4 == 0) {
    const int64_t words = row_bytes / 4;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
      reinterpret_cast<uint32_t*>(dst)[i] = valid ? reinterpret_cast<const uint32_t*>(src)[i] : 0u;
  } else {
    for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) dst[i] = valid ? src[i] : char(0);
  }
}

template <class T>
__global__ void convert_kernel(const float* x, int64_t n, T* out) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(x[i]);
}

// F32 -> BF16, 4 elements (16 bytes in, 8 out) per thread and step.
__global__ void convert_bf16_vec_kernel(const float4* x, int64_t n4, uint2* out) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    out[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

__global__ void add_bias_kernel(float* out, const float* bias, int64_t rows, int64_t cols) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] += bias[i % cols];
}

// After the wait: the caller's graph edge into this kernel may be programmatic (replace_workspace_memsets),
// so the predecessor may still run, and it may be the previous product on the same workspace.
__global__ void workspace_zero_kernel_impl(unsigned char* dst, unsigned bytes) {
  pdl_wait();
  for (unsigned i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = 0;
}

}  // namespace

const void* workspace_zero_kernel() { return reinterpret_cast<const void*>(&workspace_zero_kernel_impl); }

cudaError_t launch_embedding(DType table_dtype, const void* table, int64_t rows, int64_t dim,
                             const int32_t* ids, int64_t n, int64_t first_id, float* out,
                             cudaStream_t stream) {
  if (n == 0 || dim == 0) return cudaSuccess;
  const unsigned grid = grid_for(n * dim, kThreads);
  switch (table_dtype) {
    case DType::F32:
      return launch_pdl(embedding_kernel<float>, dim3(grid), dim3(kThreads), 0, stream,
                        static_cast<const float*>(table), rows, dim, ids, n, first_id, out);
    case DType::F16:
      return launch_pdl(embedding_kernel<__half>, dim3(grid), dim3(kThreads), 0, stream,
                        static_cast<const __half*>(table), rows, dim, ids, n, first_id, out);
    case DType::BF16:
      return launch_pdl(embedding_kernel<__nv_bfloat16>, dim3(grid), dim3(kThreads), 0, stream,
                        static_cast<const __nv_bfloat16*>(table), rows, dim, ids, n, first_id, out);
    default:
      return cudaErrorInvalidValue;  // the caller validates the dtype first
  }
}

cudaError_t launch_silu_mul(const float* gate, const float* up, int64_t n, float* out, void* out_bf16,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n % 4 == 0 && is_aligned(gate, 16) && is_aligned(up, 16) && is_aligned(out, 16) &&
      is_aligned(out_bf16, 8)) {
    return launch_pdl(silu_mul_vec_kernel, dim3(grid_for(n / 4, kThreads)), dim3(kThreads), 0, stream,
                      reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up), n / 4,
                      reinterpret_cast<float4*>(out), static_cast<uint2*>(out_bf16));
  }
  return launch_pdl(silu_mul_kernel, dim3(grid_for(n, kThreads)), dim3(kThreads), 0, stream, gate, up, n, out,
                    static_cast<__nv_bfloat16*>(out_bf16));
}

cudaError_t launch_silu_mul_stacked_bf16(const void* gate_up, int64_t t, int64_t f, float* out,
                                         void* out_bf16, cudaStream_t stream) {
  if (t == 0 || f == 0) return cudaSuccess;
  // The vector path needs 16-byte aligned rows: f % 8 == 0 and 16-byte aligned buffers.
  const bool vec = f % 8 == 0 && is_aligned(gate_up, 16) && is_aligned(out, 16) && is_aligned(out_bf16, 16);
  return launch_pdl(silu_mul_stacked_bf16_kernel, dim3(grid_for(t * (vec ? f / 8 : f), kThreads)),
                    dim3(kThreads), 0, stream, static_cast<const __nv_bfloat16*>(gate_up), t, f, vec, out,
                    static_cast<__nv_bfloat16*>(out_bf16));
}

cudaError_t launch_fill_random(DType dtype, void* t, int64_t n, int64_t cols, const RandomFill& fill,
                               cudaStream_t stream) {
  const RandomIndex index(fill, cols);
  const float amp = fill.amplitude, offset = fill.offset;
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n, kThreads, 1 << 16);
  switch (dtype) {
    case DType::F32:
      fill_random_kernel<<<grid, kThreads, 0, stream>>>(static_cast<float*>(t), n, index, amp, offset);
      break;
    case DType::F16:
      fill_random_kernel<<<grid, kThreads, 0, stream>>>(static_cast<__half*>(t), n, index, amp, offset);
      break;
    case DType::BF16:
      fill_random_kernel<<<grid, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(t), n, index, amp,
                                                        offset);
      break;
    default:
      return cudaErrorInvalidValue;  // the caller validates the dtype first
  }
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const void* x, int64_t num_rows, int64_t row_bytes, const int32_t* rows,
                               int64_t n, void* out, cudaStream_t stream) {
  if (n == 0 || row_bytes == 0) return cudaSuccess;
  return launch_pdl(gather_rows_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream,
                    static_cast<const char*>(x), num_rows, row_bytes, rows, static_cast<char*>(out));
}

cudaError_t launch_convert_f32(const float* x, int64_t n, DType to, void* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n, kThreads);
  if (to == DType::BF16 && n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 8 == 0)
    return launch_pdl(convert_bf16_vec_kernel, dim3(grid_for(n / 4, kThreads)), dim3(kThreads), 0, stream,
                      reinterpret_cast<const float4*>(x), n / 4, static_cast<uint2*>(out));
  if (to == DType::BF16)
    return launch_pdl(convert_kernel<__nv_bfloat16>, dim3(grid), dim3(kThreads), 0, stream, x, n,
                      static_cast<__nv_bfloat16*>(out));
  if (to == DType::F16)
    return launch_pdl(convert_kernel<__half>, dim3(grid), dim3(kThreads), 0, stream, x, n,
                      static_cast<__half*>(out));
  return cudaErrorInvalidValue;
}

cudaError_t launch_add_bias(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return launch_pdl(add_bias_kernel, dim3(grid_for(rows * cols, kThreads)), dim3(kThreads), 0, stream, out,
                    bias, rows, cols);
}

}  // namespace inferx::cuda
