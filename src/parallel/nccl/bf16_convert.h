#pragma once
// The conversions of a BF16 all-reduce of F32 activations (nccl_communicator.cpp,
// INFERX_TP_ALLREDUCE_BF16): out[i] = bf16(x[i]) (round to nearest even) and back (exact).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace inferx {

cudaError_t launch_f32_to_bf16(const float* x, int64_t n, void* out, cudaStream_t stream);
cudaError_t launch_bf16_to_f32(const void* x, int64_t n, float* out, cudaStream_t stream);

}  // namespace inferx
