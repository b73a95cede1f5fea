#pragma once
// How to generate a dummy weight where it is placed (Backend::fill_random) instead of copying host bytes:
// element (r, c) of the filled tensor (rows of its last dimension) is offset + uniform(-amplitude,
// amplitude) drawn from a counter hash of (seed, (row0 + r) * full_cols + col0 + c), i.e. it is the block
// at (row0, col0) of a larger [*, full_cols] tensor; full_cols 0 means the tensor itself (index r * cols
// + c). So a tensor-parallel rank generates exactly its slice of the values one device generates for the
// whole tensor. Regions count elements (INT4 codes too: its columns and offsets even, two codes a byte).
#include <cstdint>

namespace inferx {

struct RandomFill {
  float amplitude = 0, offset = 0;
  uint64_t seed = 0;
  int64_t full_cols = 0, row0 = 0, col0 = 0;

  // The fill of the block at (row0, col0) of the tensor this fill describes ([*, cols] when full_cols is
  // 0).
  RandomFill block(int64_t cols, int64_t r0, int64_t c0) const {
    RandomFill f = *this;
    if (f.full_cols == 0) f.full_cols = cols;
    f.row0 += r0;
    f.col0 += c0;
    return f;
  }
};

}  // namespace inferx
