#pragma once
// Host switch for programmatic dependent launch (cuda_common.cuh's launch_pdl): on unless INFERX_PDL=0.
// Tests turn it off and on to check that overlapping launches change no result.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

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

// The shared-memory carve-out (percent of the unified L1 / shared memory, cudaFuncAttributePreferred-
// SharedMemoryCarveout) that launch_with (and the selection kernels' cluster launcher) asks for on every
// kernel it launches: -1 (the default) leaves each kernel to the driver. An experiment
// (INFERX_SMEM_CARVEOUT=0..100, read once): consecutive kernels whose carve-outs differ cannot share an SM
// until it drains and is reconfigured, which may cost the PDL overlap between a decode step's kernels (a
// guess from GEMV v3's staged INT4 weights, kernels_gemv.cu).
inline int smem_carveout() {
  static const int value = [] {
    const char* e = std::getenv("INFERX_SMEM_CARVEOUT");
    if (e == nullptr || *e == 0) return -1;
    const int v = std::atoi(e);
    return v >= 0 && v <= 100 ? v : -1;
  }();
  return value;
}
// Sets the carve-out on `kernel` once (later calls for the same kernel return at once).
inline cudaError_t apply_smem_carveout(const void* kernel, int percent) {
  static std::mutex mu;
  static std::unordered_set<const void*> done;
  const std::lock_guard<std::mutex> lock(mu);
  if (done.count(kernel) != 0) return cudaSuccess;
  const cudaError_t st =
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent);
  if (st == cudaSuccess) done.insert(kernel);
  return st;
}
// What launchers call before each launch: the carve-out of INFERX_SMEM_CARVEOUT on `kernel`, if set.
inline cudaError_t apply_launch_carveout(const void* kernel) {
  const int percent = smem_carveout();
  return percent < 0 ? cudaSuccess : apply_smem_carveout(kernel, percent);
}

}  // namespace inferx::cuda
