#pragma once
// A linear layer's weight in whatever format it is stored: Backend::matmul dispatches on
// weight.dtype. Adding a format touches quant/ and each backend's kernel table, not model/.
#include "core/tensor.h"

namespace inferx {

struct Linear {
  Tensor weight;  // [out_features, in_features], any DType (F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q6_K)
  Tensor bias;    // [out_features] F32, or empty
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const { return weight.dim(1); }
};

}  // namespace inferx
