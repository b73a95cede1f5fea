#pragma once
// A linear layer's weight in whatever format it is stored: Backend::matmul dispatches on
// weight.dtype. Adding a format touches quant/ and each backend's kernel table, not model/.
#include "core/tensor.h"

namespace inferx {

struct Linear {
  Tensor weight;  // [out_features, in_features], any DType (F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q6_K/F8_E4M3/INT4)
  Tensor bias;    // [out_features] F32, or empty
  // Quantization parameters of formats whose scales are not inside the weight blocks (src/quant/):
  //   F8_E4M3: scale F32 [1] (per tensor) or [out_features] (per output channel); W = fp8 * scale.
  //   INT4:    scale F16 [out_features, in_features / group_size]; zero U8 of the same shape holds the
  //            zero points 0..15 (asymmetric), empty for symmetric (zero point 8); W = scale * (q - zero).
  Tensor scale;
  Tensor zero;
  int64_t group_size = 0;  // INT4 only: 32, 64 or 128 input columns per scale
  // Optional I32 [in_features]: the layer's input column i is x[:, input_perm[i]] (GPTQ act-order
  // checkpoints, whose groups are contiguous only after this permutation). Empty: identity.
  Tensor input_perm;
  int64_t out_features() const { return weight.dim(0); }
  int64_t in_features() const { return weight.dim(1); }
};

}  // namespace inferx
