#include "engine/prefix_cache.h"

#include <algorithm>

namespace inferx {
namespace {
uint64_t mix(uint64_t z) {  // splitmix64 finalizer (Steele, Lea, Flood 2014)
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t hash_block_tokens(uint64_t parent, const int32_t* tokens, int32_t count) {
  uint64_t h = mix(parent + 0x9e3779b97f4a7c15ull);
  for (int32_t i = 0; i < count; ++i) {
    h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 0x9e3779b97f4a7c15ull));
  }
  return mix(h ^ static_cast<uint64_t>(count));
}

void extend_block_hashes(const std::vector<int32_t>& tokens, int32_t block_size, int32_t num_full_blocks,
                         std::vector<uint64_t>& hashes) {
  while (static_cast<int32_t>(hashes.size()) < num_full_blocks) {
    const size_t j = hashes.size();
    const uint64_t parent = j == 0 ? kRootBlockHash : hashes[j - 1];
    hashes.push_back(
        hash_block_tokens(parent, tokens.data() + j * static_cast<size_t>(block_size), block_size));
  }
}

bool PrefixCache::insert(uint64_t hash, int32_t block) { return map_.try_emplace(hash, block).second; }

void PrefixCache::erase(uint64_t hash, int32_t block) {
  auto it = map_.find(hash);
  if (it != map_.end() && it->second == block) map_.erase(it);
}

int32_t PrefixCache::longest_cached_prefix(const std::vector<uint64_t>& hashes, int32_t max_blocks) const {
  const int32_t n = std::min<int32_t>(max_blocks, static_cast<int32_t>(hashes.size()));
  int32_t i = 0;
  while (i < n && find(hashes[static_cast<size_t>(i)]) >= 0) ++i;
  return i;
}

}  // namespace inferx
