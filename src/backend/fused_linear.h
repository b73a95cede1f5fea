#pragma once
// Row slices of a Linear: the parts of a fused projection (q/k/v stacked in one weight, gate over up) are
// contiguous row ranges of its weight in every format, with the matching slices of the bias and of
// per-channel / per-group quantization parameters (a per-tensor FP8 scale is shared).
#include <cstdint>

#include "backend/linear.h"
#include "core/error.h"

namespace inferx {

inline Linear linear_rows(const Linear& l, int64_t begin, int64_t count) {
  INFERX_CHECK(begin >= 0 && count >= 0 && begin + count <= l.out_features(),
               "linear_rows: rows [{}, {}) out of {}", begin, begin + count, l.out_features());
  Linear r = l;
  r.weight = l.weight.rows_view(begin, count);
  auto vector_slice = [&](const Tensor& t) {
    return Tensor(t.dtype, {count}, static_cast<char*>(t.data) + begin * dtype_info(t.dtype).block_bytes,
                  t.device);
  };
  if (!l.bias.empty()) r.bias = vector_slice(l.bias);
  if (l.weight.dtype == DType::F8_E4M3 && l.scale.numel() > 1) r.scale = vector_slice(l.scale);
  if (l.weight.dtype == DType::INT4) {
    r.scale = l.scale.rows_view(begin, count);
    if (!l.zero.empty()) r.zero = l.zero.rows_view(begin, count);
  }
  return r;
}

}  // namespace inferx
