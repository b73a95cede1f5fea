#pragma once
// Per-row parameters of the GPU sampler (kernels_sampling.cu), shared by the kernels and the host side
// without any CUDA header. The same layout is copied to device memory as is.
#include <cstdint>

namespace inferx::cuda {

struct SampleParams {
  float temperature = 1.0f;  // <= 0: greedy (argmax)
  int32_t top_k = 0;         // <= 0 or >= vocab: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  float uniform = 0.0f;      // the draw in [0, 1); the host keeps the per-request seeded generators
};

}  // namespace inferx::cuda
