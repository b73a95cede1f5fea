#include "engine/block_pool.h"

#include "core/error.h"

namespace inferx {

BlockPool::BlockPool(int32_t num_blocks, bool enable_prefix_caching)
    : num_blocks_(num_blocks), caching_(enable_prefix_caching) {
  INFERX_CHECK(num_blocks > 0, "block pool: {} blocks is empty", num_blocks);
  const auto n = static_cast<size_t>(num_blocks);
  ref_.assign(n, 0);
  hash_.assign(n, 0);
  hashed_.assign(n, 0);
  prev_.assign(n + 1, num_blocks);
  next_.assign(n + 1, num_blocks);
  for (int32_t b = 0; b < num_blocks; ++b) push_tail(b);
}

void BlockPool::unlink(int32_t b) {
  const auto i = static_cast<size_t>(b);
  next_[static_cast<size_t>(prev_[i])] = next_[i];
  prev_[static_cast<size_t>(next_[i])] = prev_[i];
  --num_free_;
}

void BlockPool::push_tail(int32_t b) {
  const auto s = static_cast<size_t>(num_blocks_);
  const int32_t last = prev_[s];
  prev_[static_cast<size_t>(b)] = last;
  next_[static_cast<size_t>(b)] = num_blocks_;
  next_[static_cast<size_t>(last)] = b;
  prev_[s] = b;
  ++num_free_;
}

int32_t BlockPool::allocate() {
  INFERX_CHECK(num_free_ > 0, "block pool: all {} KV blocks are in use", num_blocks_);
  const int32_t b = next_[static_cast<size_t>(num_blocks_)];
  unlink(b);
  const auto i = static_cast<size_t>(b);
  if (hashed_[i]) {  // evict: the block is about to hold other tokens
    cache_.erase(hash_[i], b);
    hashed_[i] = 0;
  }
  ref_[i] = 1;
  return b;
}

void BlockPool::retain(int32_t b) {
  INFERX_CHECK(b >= 0 && b < num_blocks_, "block pool: block {} out of range", b);
  if (ref_[static_cast<size_t>(b)]++ == 0) unlink(b);
}

void BlockPool::release(int32_t b) {
  INFERX_CHECK(b >= 0 && b < num_blocks_ && ref_[static_cast<size_t>(b)] > 0,
               "block pool: release of block {} that holds no reference", b);
  if (--ref_[static_cast<size_t>(b)] == 0) push_tail(b);
}

void BlockPool::cache(int32_t b, uint64_t hash) {
  const auto i = static_cast<size_t>(b);
  if (!caching_ || hashed_[i]) return;  // a block's hash is write-once
  if (cache_.insert(hash, b)) {
    hash_[i] = hash;
    hashed_[i] = 1;
  }
}

}  // namespace inferx
