#include "formats/tensor_source.h"

#include "core/error.h"

namespace inferx {

Tensor TensorEntry::view() const {
  INFERX_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "{}: tensor {} has rank {} (max {})", file,
               name, shape.size(), kMaxDims);
  Tensor t;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  t.data = const_cast<uint8_t*>(data);
  return t;
}

}  // namespace inferx
