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

// One edit of one logit before device sampling (Backend::edit_logits): the request's logit_bias and
// penalties (engine/logits_processors.h) for token `token` of row `row`, applied in the host processors'
// order and rounding: x += bias; if repetition != 1: x = x > 0 ? x / repetition : x * repetition;
// x -= subtract (count * frequency + presence, computed in float by the host). Distinct (row, token) pairs.
struct LogitEdit {
  int32_t row = 0;
  int32_t token = 0;
  float bias = 0.0f;
  float repetition = 1.0f;
  float subtract = 0.0f;
};

// One edit on one value, as the backends apply it (the CUDA kernel with the same operations as rounded
// intrinsics, kernels_sampling.cu); host backends and tests call this.
inline float apply_logit_edit(float x, const LogitEdit& e) {
  x += e.bias;
  if (e.repetition != 1.0f) x = x > 0.0f ? x / e.repetition : x * e.repetition;
  return x - e.subtract;
}

}  // namespace inferx
