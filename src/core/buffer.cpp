#include "core/buffer.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace inferx {

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  INFERX_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded);
  ptr_.reset(p);
}

void HostBuffer::Free::operator()(void* p) const { std::free(p); }

}  // namespace inferx
