// The in-process CPU group: N ranks are N threads of this process sharing memory. A collective publishes
// each rank's pointer, meets at a barrier, does its share of the work reading the other ranks' buffers
// directly, and meets again so that no buffer is reused while another rank may still read it.
//
// all_reduce_sum is a reduce-scatter + all-gather in one pass: rank r sums chunk r of every buffer in rank
// order 0, 1, ..., N-1 and writes the sum back into all N buffers. The order is fixed, so the result is
// bit-identical on every rank and in every run, whatever the threads' timing.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "parallel/communicator.h"

namespace inferx {
namespace {

class CpuGroup {
 public:
  explicit CpuGroup(int size) : size_(size), slots_(static_cast<size_t>(size)) {}

  int size() const { return size_; }

  // A generation-counting barrier; throws when the group is aborted while waiting or before.
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) fail_aborted();
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    if (generation_ == generation) fail_aborted();
  }

  void abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

  struct Slot {
    void* data = nullptr;
    int64_t bytes = 0;
  };
  // Written by its own rank only between the barriers that bracket a collective.
  Slot& slot(int rank) { return slots_[static_cast<size_t>(rank)]; }

  // Every rank passed the same number of bytes (all ranks see the same slots, so all throw together).
  void check_same_bytes(const char* what) const {
    for (int r = 1; r < size_; ++r)
      INFERX_CHECK(slots_[static_cast<size_t>(r)].bytes == slots_[0].bytes,
                   "{}: rank {} passed {} bytes but rank 0 passed {} (every rank must pass the same shape)",
                   what, r, slots_[static_cast<size_t>(r)].bytes, slots_[0].bytes);
  }

 private:
  [[noreturn]] static void fail_aborted() {
    fail("tensor parallel: the collective was aborted because another rank failed");
  }

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<Slot> slots_;
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  Device device() const override { return Device::CPU; }

  void all_reduce_sum(Tensor& x) override {
    INFERX_CHECK(x.dtype == DType::F32 && x.device == Device::CPU,
                 "all_reduce_sum: expects an F32 CPU tensor, got {} on {}", dtype_name(x.dtype),
                 x.device == Device::CPU ? "cpu" : "a GPU");
    const int n = size();
    if (n == 1) return;
    group_->slot(rank_) = {x.data, x.nbytes()};
    group_->arrive_and_wait();
    group_->check_same_bytes("all_reduce_sum");
    const int64_t count = x.numel();
    // Chunks start on 16-float (64-byte) boundaries so that two ranks never write one cache line.
    const int64_t lines = (count + 15) / 16;
    const int64_t begin = std::min(count, lines * rank_ / n * 16);
    const int64_t end = std::min(count, lines * (rank_ + 1) / n * 16);
    float* buffers[64];
    INFERX_CHECK(n <= 64, "all_reduce_sum: at most 64 ranks, got {}", n);
    for (int r = 0; r < n; ++r) buffers[r] = static_cast<float*>(group_->slot(r).data);
    for (int64_t i = begin; i < end; ++i) {
      float sum = buffers[0][i];
      for (int r = 1; r < n; ++r) sum += buffers[r][i];
      for (int r = 0; r < n; ++r) buffers[r][i] = sum;
    }
    group_->arrive_and_wait();  // every chunk written before anyone reads or reuses its buffer
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    INFERX_CHECK(in.device == Device::CPU && out.device == Device::CPU, "all_gather: expects CPU tensors");
    const int n = size();
    const int64_t bytes = in.nbytes();
    INFERX_CHECK(out.nbytes() == bytes * n, "all_gather: out has {} bytes, expected {} ranks x {} bytes",
                 out.nbytes(), n, bytes);
    group_->slot(rank_) = {in.data, bytes};
    group_->arrive_and_wait();
    group_->check_same_bytes("all_gather");
    char* dst = static_cast<char*>(out.data);
    for (int r = 0; r < n; ++r) {
      const void* src = group_->slot(r).data;
      if (dst + r * bytes != src && bytes > 0) std::memmove(dst + r * bytes, src, static_cast<size_t>(bytes));
    }
    group_->arrive_and_wait();  // every rank has copied every input before any input is reused
  }

  void broadcast(Tensor& x, int root) override {
    INFERX_CHECK(x.device == Device::CPU, "broadcast: expects a CPU tensor");
    const int n = size();
    INFERX_CHECK(root >= 0 && root < n, "broadcast: root {} is not a rank of a group of {}", root, n);
    if (n == 1) return;
    group_->slot(rank_) = {x.data, x.nbytes()};
    group_->arrive_and_wait();
    group_->check_same_bytes("broadcast");
    const void* src = group_->slot(root).data;
    if (rank_ != root && x.nbytes() > 0 && src != x.data)
      std::memmove(x.data, src, static_cast<size_t>(x.nbytes()));
    group_->arrive_and_wait();  // every rank has copied before the root's buffer is reused
  }

  void barrier() override {
    if (size() > 1) group_->arrive_and_wait();
  }

  void abort() override { group_->abort(); }

 private:
  std::shared_ptr<CpuGroup> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int size) {
  INFERX_CHECK(size >= 1 && size <= 64, "cpu communicator: group size must be in [1, 64], got {}", size);
  auto group = std::make_shared<CpuGroup>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<CpuCommunicator>(group, r));
  return out;
}

}  // namespace inferx
