// Large host-to-device copies (weights at load) through two page-locked staging buffers: the host copy
// of chunk i + 1 into one buffer overlaps the DMA of chunk i from the other. A copy from pageable memory
// is staged by the driver in small pieces without that overlap, and a weight file's bytes come from a
// memory map (pageable) or a loader's vector.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace inferx {

void CudaBackend::upload_staged(void* dst, const void* host_src, size_t bytes) {
  use_device();
  for (int i = 0; i < 2; ++i) {
    pinned(upload_[i], kUploadChunk);
    if (upload_events_[i] == nullptr) {
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      upload_events_[i] = e;
    }
  }
  const auto* src = static_cast<const char*>(host_src);
  auto* out = static_cast<char*>(dst);
  bool pending[2] = {false, false};
  int b = 0;
  for (size_t done = 0; done < bytes; done += kUploadChunk, b ^= 1) {
    const size_t n = std::min(kUploadChunk, bytes - done);
    if (pending[b]) CUDA_CHECK(cudaEventSynchronize(upload_events_[b]));  // its last DMA has finished
    std::memcpy(upload_[b].data, src + done, n);
    CUDA_CHECK(cudaMemcpyAsync(out + done, upload_[b].data, n, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(upload_events_[b], stream_));
    pending[b] = true;
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::release_upload_staging() {
  for (int i = 0; i < 2; ++i) {
    if (upload_events_[i] && cudaEventDestroy(upload_events_[i]) != cudaSuccess)
      std::fprintf(stderr, "inferx cuda: releasing an upload event failed\n");
    upload_events_[i] = nullptr;
    release_pinned(upload_[i]);
  }
}

}  // namespace inferx
