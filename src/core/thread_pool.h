#pragma once
// Fork-join pool for data-parallel kernels. The calling thread takes part, so a pool of N threads has
// N-1 workers. Workers spin briefly before sleeping: decode issues hundreds of small parallel loops per
// token, and a futex wake-up per loop would cost more than the loop.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace inferx {

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) over disjoint ranges covering [0, n), split in contiguous chunks
  // of at least `grain` items; returns when all are done. Exceptions from fn are rethrown here.
  using RangeFn = std::function<void(int64_t begin, int64_t end, int thread)>;
  void parallel_for(int64_t n, const RangeFn& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);
  void run_share(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  // current job
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int n_chunks_ = 0;
  std::exception_ptr error_;
  std::mutex error_mutex_;
};

}  // namespace inferx
