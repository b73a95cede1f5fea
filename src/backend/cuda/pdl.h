#pragma once
// Host switch for programmatic dependent launch (cuda_common.cuh's launch_pdl): on unless INFERX_PDL=0.
// Tests turn it off and on to check that overlapping launches change no result.
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace inferx::cuda {

inline std::atomic<bool>& pdl_flag() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("INFERX_PDL");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }()};
  return on;
}
inline bool pdl_enabled() { return pdl_flag().load(std::memory_order_relaxed); }
inline void set_pdl_enabled(bool on) { pdl_flag().store(on, std::memory_order_relaxed); }

}  // namespace inferx::cuda
