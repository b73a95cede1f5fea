#pragma once
// Owning host memory, 64-byte aligned (one cache line, one AVX-512 vector).
#include <cstddef>
#include <memory>

namespace inferx {

class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);  // zero-filled; throws inferx::Error on failure
  void* data() const { return ptr_.get(); }
  size_t size() const { return size_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
  size_t size_ = 0;
};

}  // namespace inferx
