#include "core/tensor.h"

#include <fmt/format.h>

#include "core/error.h"

namespace inferx {

Tensor::Tensor(DType t, std::initializer_list<int64_t> dims, void* p, Device d)
    : dtype(t), data(p), device(d) {
  INFERX_CHECK(dims.size() <= kMaxDims, "tensor rank {} exceeds {}", dims.size(), kMaxDims);
  for (int64_t v : dims) shape[static_cast<size_t>(ndim++)] = v;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

int64_t Tensor::row_bytes() const { return inferx::row_bytes(dtype, cols()); }

Tensor Tensor::rows_view(int64_t begin, int64_t count) const {
  INFERX_CHECK(begin >= 0 && count >= 0 && begin + count <= rows(),
               "rows [{}, {}) out of range for tensor {}", begin, begin + count, shape_string());
  Tensor t = *this;
  t.ndim = 2;
  t.shape = {count, cols(), 0, 0};
  t.data = static_cast<char*>(data) + begin * row_bytes();
  return t;
}

Tensor Tensor::reshaped(std::initializer_list<int64_t> dims) const {
  Tensor t(dtype, dims, data, device);
  INFERX_CHECK(t.numel() == numel(), "cannot reshape {} to {}", shape_string(), t.shape_string());
  return t;
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[static_cast<size_t>(i)]);
  return s + "]";
}

}  // namespace inferx
