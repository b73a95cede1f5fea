#include <algorithm>

#include "core/error.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace inferx {

int64_t KvCache::bytes_per_block(const ModelConfig& c, int64_t block_size, DType dtype) {
  return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * dtype_info(dtype).block_bytes;
}

int64_t KvCache::bytes_per_block(const Model& model, int64_t block_size) {
  const TensorParallel* tp = model.tensor_parallel();
  if (tp == nullptr) return bytes_per_block(model.config(), block_size, model.backend().kv_cache_dtype());
  int64_t sum = 0, largest = 0;
  for (int r = 0; r < tp->size(); ++r) {
    const int64_t b =
        bytes_per_block(tp->rank_model(r).config(), block_size, tp->rank_backend(r).kv_cache_dtype());
    sum += b;
    largest = std::max(largest, b);
  }
  return model.backend().device() == Device::CPU ? sum : largest;
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

namespace {
// A tensor-parallel model's own cache holds no layers: its ranks' caches do.
ModelConfig layers_held_by(const Model& model) {
  ModelConfig c = model.config();
  if (model.tensor_parallel() != nullptr) c.num_layers = 0;
  return c;
}
}  // namespace

KvCache::KvCache(const Model& model, int64_t num_blocks, int64_t block_size)
    : KvCache(model.backend(), layers_held_by(model), num_blocks, block_size) {
  if (const TensorParallel* tp = model.tensor_parallel()) {
    for (int r = 0; r < tp->size(); ++r)
      shards_.push_back(
          std::make_unique<KvCache>(tp->rank_backend(r), tp->rank_model(r).config(), num_blocks, block_size));
  }
}

}  // namespace inferx
