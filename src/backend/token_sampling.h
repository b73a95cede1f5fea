#pragma once
// Per-row parameters of device-side token selection (Backend::sample_tokens), backend-neutral and free of
// any CUDA header: the CUDA sampler (backend/cuda/kernels_sampling.cu) copies this layout to device
// memory as is (cuda::SampleParams is this struct).
#include <cstdint>

namespace inferx {

struct TokenSampleParams {
  float temperature = 1.0f;  // <= 0: greedy (argmax, lowest index among equal maxima)
  int32_t top_k = 0;         // <= 0 or >= vocab: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  float uniform = 0.0f;      // the draw in [0, 1); the caller keeps the per-request seeded generators
};

}  // namespace inferx
