#pragma once
// A one-shot all-reduce for the small sums of tensor-parallel decode (a few rows of the hidden size: 16 KB to
// ~1 MB), where NCCL's latency, not bandwidth, sets the cost: 2 per layer, 64 per token of an 8B model. The
// ranks are threads of one process, so every GPU can read its peers' memory directly (CUDA peer access,
// NVLink): each rank copies its tensor into a staging buffer of its own, signals every peer, waits for
// their signals, then sums all ranks' staging buffers in rank order 0..N-1 into its tensor (the same
// order on every rank: the ranks get bit-identical sums). One kernel per call on the rank's stream, no host
// work beyond the launch, and it records into CUDA graphs: the call counter that names a call's signals
// and staging slot lives in device memory (a replay advances it), and the grid is always the same
// kMaxBlocks blocks, so every block takes part in every call (the two staging slots alternate per call:
// a rank writes slot s of call m only after every peer has signalled call m - 1, i.e. finished call
// m - 2, the last reader of slot s). The approach of vLLM's custom all-reduce (one-shot form); own code.
//
// A rank that never arrives makes its peers' kernels trap after a minute (an error, not a hang).
// Off unless INFERX_CUSTOM_ALLREDUCE=1 (not yet measured on a multi-GPU machine); NCCL takes what it does
// not (other dtypes, larger tensors, GPUs without peer access).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace inferx {

class P2pAllReduce {
 public:
  static constexpr int kMaxRanks = 8;
  // devices[r]: rank r's CUDA device (the same device more than once: several ranks on one GPU, for
  // tests); max_bytes: the largest tensor it takes. Enables peer access between the devices; throws
  // inferx::Error when two of them cannot reach each other.
  P2pAllReduce(const std::vector<int>& devices, size_t max_bytes);
  ~P2pAllReduce();
  P2pAllReduce(const P2pAllReduce&) = delete;
  P2pAllReduce& operator=(const P2pAllReduce&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  size_t max_bytes() const { return max_bytes_; }
  // Whether it takes an F32 tensor of `count` elements (any alignment; odd counts take a scalar path).
  bool takes(int64_t count) const { return count > 0 && static_cast<size_t>(count) * 4 <= max_bytes_; }
  // x (count F32 values in rank `rank`'s device memory) = the sum over ranks of x, enqueued on `stream`.
  // Every rank calls it the same number of times, with the same count, each from its own thread.
  void all_reduce(int rank, float* x, int64_t count, cudaStream_t stream);

  // Whether every pair of `devices` has peer access (the same device always has).
  static bool available(const std::vector<int>& devices);

 private:
  struct Rank {
    int device = 0;
    float* staging = nullptr;     // two slots of max_bytes
    uint32_t* signals = nullptr;  // [kMaxBlocks][kMaxRanks] call numbers written by the peers
    uint32_t* calls = nullptr;    // [kMaxBlocks] this rank's call counter, per block
  };
  void release();  // frees every rank's buffers (the destructor; a constructor that failed part-way)

  std::vector<Rank> ranks_;
  size_t max_bytes_ = 0;
};

// The kernel's launch (p2p_all_reduce.cu).
namespace p2p {
constexpr int kMaxBlocks = 32;
constexpr int kThreads = 512;
struct Args {
  float* x = nullptr;
  int64_t count = 0;
  int rank = 0, nranks = 0;
  int64_t slot_floats = 0;                          // floats per staging slot
  float* staging[P2pAllReduce::kMaxRanks] = {};     // every rank's staging (slot 0)
  uint32_t* signals[P2pAllReduce::kMaxRanks] = {};  // every rank's signal array
  uint32_t* calls = nullptr;                        // this rank's
  bool groups = false;                              // count % 4 == 0: threads take groups of 4
  bool x_aligned = false;                           // x 16-byte aligned (this rank's)
};
cudaError_t launch_one_shot(const Args& a, cudaStream_t stream);
}  // namespace p2p

}  // namespace inferx
