#pragma once
// Automatic prefix caching: every full KV block is named by a hash of its tokens chained with the hash
// of the block before it, so equal hashes mean equal prefixes (vLLM v1 kv_cache_utils.hash_block_tokens;
// the chain makes a block's identity depend on everything before it, as attention does).
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace inferx {

// The parent hash of a sequence's first block.
inline constexpr uint64_t kRootBlockHash = 0x6a09e667f3bcc908ull;

// Hash of one full block of `count` tokens whose prefix hashes to `parent`. 64-bit mixing (splitmix64
// finalizer per token); a collision needs two different prefixes to agree on 64 bits.
uint64_t hash_block_tokens(uint64_t parent, const int32_t* tokens, int32_t count);

// Extends `hashes` to the first `num_full_blocks` full blocks of `tokens` (already computed ones kept).
void extend_block_hashes(const std::vector<int32_t>& tokens, int32_t block_size, int32_t num_full_blocks,
                         std::vector<uint64_t>& hashes);

// Hash -> physical block id of the blocks whose KV is complete and may be shared.
class PrefixCache {
 public:
  // -1 when the hash is not cached.
  int32_t find(uint64_t hash) const {
    auto it = map_.find(hash);
    return it == map_.end() ? -1 : it->second;
  }
  // Returns false (and changes nothing) when the hash already names another block: the first stays.
  bool insert(uint64_t hash, int32_t block);
  // Forgets `hash` if it names `block` (the block is being reused for other tokens).
  void erase(uint64_t hash, int32_t block);
  // How many leading hashes of `hashes` (at most max_blocks) are cached: the reusable prefix in blocks.
  int32_t longest_cached_prefix(const std::vector<uint64_t>& hashes, int32_t max_blocks) const;
  size_t size() const { return map_.size(); }
  void clear() { map_.clear(); }

 private:
  std::unordered_map<uint64_t, int32_t> map_;
};

}  // namespace inferx
