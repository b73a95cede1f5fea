#pragma once
// Tensor: a non-owning, contiguous, row-major view (PyTorch order: the last dimension is innermost).
// Ownership lives in Buffers held by weights, KV pools and per-step workspaces.
// Quantized dtypes are blocked along the last dimension: a row of `cols()` elements takes
// row_bytes(dtype, cols()) bytes.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"

namespace inferx {

enum class Device : uint8_t { CPU, CUDA };

constexpr int kMaxDims = 4;

struct Tensor {
  DType dtype = DType::F32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  void* data = nullptr;
  Device device = Device::CPU;

  Tensor() = default;
  Tensor(DType t, std::initializer_list<int64_t> dims, void* p, Device d = Device::CPU);

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? ndim + i : i)]; }
  int64_t numel() const;
  int64_t cols() const { return ndim == 0 ? 1 : shape[static_cast<size_t>(ndim - 1)]; }
  int64_t rows() const { return ndim == 0 ? 1 : numel() / cols(); }
  int64_t row_bytes() const;
  int64_t nbytes() const { return rows() * row_bytes(); }

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // View of rows [begin, begin + count) of the tensor seen as a 2-D [rows(), cols()] matrix.
  Tensor rows_view(int64_t begin, int64_t count) const;
  // Same data, new shape with the same number of elements (and the same last-dim blocking).
  Tensor reshaped(std::initializer_list<int64_t> dims) const;

  std::string shape_string() const;  // "[4096, 4096]"
};

}  // namespace inferx
