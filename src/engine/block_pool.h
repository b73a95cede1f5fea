#pragma once
// The pool of fixed-size KV blocks: reference counts, and one free queue that doubles as the LRU order of
// cached blocks (vLLM v1 block_pool.py / FreeKVCacheBlockQueue). A block whose count drops to zero goes
// to the tail of the queue but keeps its prefix-cache entry; allocation takes the head (least recently
// freed) and only then forgets its hash, so eviction is O(1). A prefix hit on a free block takes it out
// of the middle of the queue in O(1) (intrusive doubly linked list).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/prefix_cache.h"

namespace inferx {

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, bool enable_prefix_caching);

  int32_t num_blocks() const { return num_blocks_; }
  // Blocks with no reference (cached ones included: they are evictable).
  int32_t num_free() const { return num_free_; }
  int32_t num_used() const { return num_blocks_ - num_free_; }
  bool prefix_caching() const { return caching_; }

  // Takes the least recently freed block (evicting its cached hash); reference count 1. Throws
  // inferx::Error when no block is free (callers check num_free() first).
  int32_t allocate();
  // One more reference (a prefix-cache hit or a forked sequence); revives a free cached block.
  void retain(int32_t block);
  // One reference less; at zero the block joins the tail of the free queue, still cached.
  void release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_[static_cast<size_t>(block)]; }

  // Registers a full, computed block under its chained hash (no-op when caching is off or the hash is
  // already taken by another block).
  void cache(int32_t block, uint64_t hash);
  // The cached block for `hash`, or -1.
  int32_t find_cached(uint64_t hash) const { return caching_ ? cache_.find(hash) : -1; }
  const PrefixCache& prefix_cache() const { return cache_; }

 private:
  void unlink(int32_t block);
  void push_tail(int32_t block);

  int32_t num_blocks_;
  bool caching_;
  int32_t num_free_ = 0;
  std::vector<int32_t> ref_;
  std::vector<uint64_t> hash_;
  std::vector<uint8_t> hashed_;
  // Free queue: prev_/next_ indexed by block; index num_blocks_ is the sentinel.
  std::vector<int32_t> prev_, next_;
  PrefixCache cache_;
};

}  // namespace inferx
