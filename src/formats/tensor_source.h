#pragma once
// What a model loader needs from a weights file: named tensors in host memory (usually memory-mapped).
// GgufFile, SafetensorsModel and the random-weight DummySource all implement it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/random_fill.h"
#include "core/tensor.h"

namespace inferx {

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // PyTorch order: last dimension innermost (GGUF's ne[] reversed)
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string file;  // which file holds it, for error messages

  Tensor view() const;  // a CPU Tensor over `data` (throws if rank > kMaxDims)
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // nullptr when absent.
  virtual const TensorEntry* find(std::string_view name) const = 0;
  virtual std::vector<std::string> tensor_names() const = 0;
  // Human-readable origin ("model.gguf", "folder/ (3 shards)", "dummy:llama-3-8b (random weights)").
  virtual std::string describe() const = 0;
  // A tensor without host bytes (data == nullptr: dummy weights for a GPU) is generated where it is
  // placed; how (core/random_fill.h). nullptr for tensors with bytes.
  virtual const RandomFill* random_fill(std::string_view name) const { return nullptr; }
};

}  // namespace inferx
