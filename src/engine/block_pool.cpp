#include "engine/block_pool.h"

#include <algorithm>

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
  owner_.assign(n, -1);
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

int32_t BlockPool::take(int32_t b) {
  const auto i = static_cast<size_t>(b);
  if (owner_[i] >= 0) {  // reserved: not in the queue, but counted free
    owner_[i] = -1;
    --num_reserved_;
    --num_free_;
  } else {
    unlink(b);
  }
  if (hashed_[i]) {  // evict: the block is about to hold other tokens
    cache_.erase(hash_[i], b);
    hashed_[i] = 0;
  }
  ref_[i] = 1;
  return b;
}

int32_t BlockPool::allocate() {
  INFERX_CHECK(num_free_ > 0, "block pool: all {} KV blocks are in use", num_blocks_);
  const int32_t head = next_[static_cast<size_t>(num_blocks_)];
  if (head != num_blocks_) return take(head);
  // Only reservations hold free blocks: the last unused one of the first reservation that has any.
  for (Run& r : runs_) {
    if (r.live && r.next < r.end) return take(--r.end);
  }
  fail("block pool: {} free blocks counted but none found", num_free_);
}

int32_t BlockPool::reserve(int32_t n) {
  if (n < 2 || num_free_ - num_reserved_ < 2) return -1;
  // The first run of n free blocks from the cursor on (wrapping once), else the longest seen: first among
  // blocks that hold no cached prefix (a reservation evicts what it takes), then among all free ones.
  int32_t best_begin = -1, best_len = 0;
  for (const bool take_cached : {false, true}) {
    if (best_len >= n || (take_cached && best_len * 2 >= n)) break;
    int32_t begin = -1, len = 0;
    for (int32_t k = 0; k < num_blocks_ && best_len < n; ++k) {
      const int32_t b = (cursor_ + k) % num_blocks_;
      if (b == 0) len = 0;  // runs do not wrap around the end of the pool
      const auto i = static_cast<size_t>(b);
      if (ref_[i] == 0 && owner_[i] < 0 && (take_cached || !hashed_[i])) {
        if (len++ == 0) begin = b;
        if (len > best_len) best_begin = begin, best_len = len;
      } else {
        len = 0;
      }
    }
  }
  if (best_len < 2) return -1;
  best_len = std::min(best_len, n);
  int32_t id;
  if (!free_runs_.empty()) {
    id = free_runs_.back();
    free_runs_.pop_back();
  } else {
    id = static_cast<int32_t>(runs_.size());
    runs_.emplace_back();
  }
  for (int32_t b = best_begin; b < best_begin + best_len; ++b) {
    const auto i = static_cast<size_t>(b);
    unlink(b);
    ++num_free_;  // still free, now held by the reservation
    owner_[i] = id;
    if (hashed_[i]) {
      cache_.erase(hash_[i], b);
      hashed_[i] = 0;
    }
  }
  num_reserved_ += best_len;
  runs_[static_cast<size_t>(id)] = Run{best_begin, best_begin + best_len, true};
  cursor_ = (best_begin + best_len) % num_blocks_;
  return id;
}

int32_t BlockPool::allocate(int32_t reservation) {
  if (reservation >= 0) {
    Run& r = runs_.at(static_cast<size_t>(reservation));
    INFERX_CHECK(r.live, "block pool: reservation {} has ended", reservation);
    if (r.next < r.end) return take(r.next++);
  }
  return allocate();
}

void BlockPool::end_reservation(int32_t reservation) {
  if (reservation < 0) return;
  Run& r = runs_.at(static_cast<size_t>(reservation));
  INFERX_CHECK(r.live, "block pool: reservation {} ended twice", reservation);
  for (int32_t b = r.next; b < r.end; ++b) {  // back to the queue, still free
    owner_[static_cast<size_t>(b)] = -1;
    --num_reserved_;
    --num_free_;
    push_tail(b);
  }
  r = Run{};
  free_runs_.push_back(reservation);
}

void BlockPool::retain(int32_t b) {
  INFERX_CHECK(b >= 0 && b < num_blocks_ && owner_[static_cast<size_t>(b)] < 0,
               "block pool: block {} out of range or reserved", b);
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
