#pragma once
// Block-table arithmetic shared by the scheduler and the batch builder: a sequence's block table maps
// its logical block j (positions [j * block_size, (j + 1) * block_size)) to a physical pool block.
#include <cstdint>

namespace inferx {

// Blocks needed to hold `tokens` tokens.
inline int32_t blocks_for_tokens(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

// Leading blocks a sliding window of `window` tokens no longer needs once the first query of the step
// sits at position `first_query`: a query at p reads keys (p - window, p] (backend AttentionParams), so
// block j is dead when its last position (j + 1) * bs - 1 < first_query - window + 1.
inline int32_t blocks_outside_window(int64_t first_query, int64_t window, int32_t block_size) {
  if (window <= 0) return 0;
  const int64_t first_needed = first_query - window + 1;
  return first_needed > 0 ? static_cast<int32_t>(first_needed / block_size) : 0;
}

}  // namespace inferx
