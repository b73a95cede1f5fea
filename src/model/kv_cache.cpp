#include "core/error.h"
#include "model/model.h"

namespace inferx {

int64_t KvCache::bytes_per_block(const ModelConfig& c, int64_t block_size, DType dtype) {
  return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * dtype_info(dtype).block_bytes;
}

KvCache::KvCache(Backend& backend, const ModelConfig& c, int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  INFERX_CHECK(num_blocks > 0 && block_size > 0, "kv cache: {} blocks of {} tokens is empty", num_blocks,
               block_size);
  // The backend picks the element type (BF16 on CUDA halves the bytes per token).
  const DType dtype = backend.kv_cache_dtype();
  const size_t layer_bytes = static_cast<size_t>(num_blocks * block_size * c.num_kv_heads * c.head_dim *
                                                 dtype_info(dtype).block_bytes);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    KvCacheLayer layer;
    for (Tensor* t : {&layer.k, &layer.v}) {
      buffers_.push_back(backend.allocate(layer_bytes));
      *t = Tensor(dtype, {num_blocks, block_size, c.num_kv_heads, c.head_dim}, buffers_.back()->data(),
                  backend.device());
    }
    layers_.push_back(layer);
  }
}

}  // namespace inferx
