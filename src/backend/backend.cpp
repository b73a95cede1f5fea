// The Backend interface's default implementations that need more than a line.
#include "backend/backend.h"

#include <memory>

#include "core/buffer.h"

namespace inferx {
namespace {

class HeapUploadBuffer final : public UploadBuffer {
 public:
  explicit HeapUploadBuffer(size_t bytes) : buffer_(bytes) {}
  void* data() const override { return buffer_.data(); }
  size_t size() const override { return buffer_.size(); }

 private:
  HostBuffer buffer_;
};

}  // namespace

std::unique_ptr<UploadBuffer> Backend::allocate_upload(size_t bytes) {
  return std::make_unique<HeapUploadBuffer>(bytes);
}

}  // namespace inferx
