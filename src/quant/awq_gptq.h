#pragma once
// Converters from the published INT4 checkpoint layouts to InferX's INT4 format (int4.h). Both layouts
// store w[k_in, n_out] = scale[g, n] * (q - z) with 4-bit q and z packed eight to an int32 (low nibble
// first); they differ in which axis is packed and in the zero-point convention:
//
// AWQ "GEMM" (AutoAWQ WQLinear_GEMM, casper-hansen/AutoAWQ awq/modules/linear/gemm.py):
//   qweight I32 [K, N/8]: packs 8 output columns; nibble i of a word holds column 8j + kAwqOrder[i],
//                         kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7} (the interleave its CUDA kernel reads).
//   qzeros  I32 [K/G, N/8]: zero points, packed like qweight.
//   scales  F16 [K/G, N].
// GPTQ (AutoGPTQ / GPTQModel "gptq" checkpoint format, transformers GPTQConfig):
//   qweight I32 [K/8, N]: packs 8 consecutive input rows; nibble i of word (r, n) holds row 8r + i.
//   qzeros  I32 [K/G, N/8]: packs 8 output columns in order; the stored value is z - 1 (AutoGPTQ
//                           subtracts 1 before packing, the "zero-point +1" convention on loading).
//   scales  F16 [K/G, N].
//   g_idx   I32 [K]: the group of each input row; desc_act (act-order) checkpoints assign groups in the
//                    order of decreasing activation magnitude, so a group's rows are not contiguous.
#include <cstdint>
#include <vector>

#include "quant/int4.h"

namespace inferx {

struct Int4Conversion {
  Int4Weight weight;
  // Non-empty when the groups are contiguous only after permuting the input columns: the converted
  // layer's input column i is original column input_perm[i] (Linear::input_perm).
  std::vector<int32_t> input_perm;
};

// k = in_features, n = out_features, group = the checkpoint's group size.
Int4Conversion convert_awq_gemm(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales,
                                int64_t k, int64_t n, int64_t group);
// g_idx may be nullptr (groups in order, k / group). `zero_plus_one`: the stored zero points are z - 1
// (the "gptq" checkpoint format; false for "gptq_v2").
Int4Conversion convert_gptq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales,
                            const int32_t* g_idx, int64_t k, int64_t n, int64_t group,
                            bool zero_plus_one = true);

}  // namespace inferx
