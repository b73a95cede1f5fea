#include "core/thread_pool.h"

#include <algorithm>

// Scheduling: a job is cut into up to kChunksPerThread chunks per thread, and every participant (the
// caller and each worker) claims chunks one at a time from a shared counter. The caller only waits for
// chunks that were actually claimed, never for a worker to wake up: on a loaded machine (other
// processes on the same cores) a worker can be descheduled for milliseconds, and with static shares
// every parallel loop would stall on it; with claiming, the caller simply runs the remaining chunks.
//
// State, one 64-bit atomic (generation_): job generation (high 32 bits) | chunk count (16 bits) |
// next unclaimed chunk (16 bits). A participant claims chunk i of generation g by a compare-exchange
// from (g, count, i) to (g, count, i + 1), so a worker that wakes late can never claim a chunk of a
// newer job by mistake. The job's fields (fn_, n_) are written before the generation is published and
// are not rewritten until every claimed chunk has finished (pending_ == 0), so a successful claim makes
// them safe to read.

namespace inferx {

namespace {
constexpr int kChunksPerThread = 4;
constexpr uint64_t kField = 0xFFFF;

uint64_t generation_of(uint64_t state) { return state >> 32; }

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    // New generation with zero chunks: wakes every worker, gives them nothing to claim.
    generation_.store((generation_of(generation_.load()) + 1) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

// Claims and runs chunks of the job of generation `gen` until none is left (or the job is gone).
void ThreadPool::run_share(int index) {
  uint64_t state = generation_.load(std::memory_order_acquire);
  const uint64_t gen = generation_of(state);
  for (;;) {
    if (generation_of(state) != gen) return;
    const auto count = static_cast<int>((state >> 16) & kField);
    const auto next = static_cast<int>(state & kField);
    if (next >= count) return;
    if (!generation_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                           std::memory_order_acquire))
      continue;  // state reloaded
    const int64_t begin = n_ * next / count;
    const int64_t end = n_ * (next + 1) / count;
    try {
      (*fn_)(begin, end, index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
    state = generation_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little (decode issues many small loops back to back), then sleep on the condition variable.
    uint64_t state = generation_.load(std::memory_order_acquire);
    for (int spin = 0; generation_of(state) == seen && spin < 20000; ++spin) {
      cpu_relax();
      state = generation_.load(std::memory_order_acquire);
    }
    if (generation_of(state) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_of(generation_.load()) != seen; });
      state = generation_.load();
    }
    seen = generation_of(state);
    // Jobs always have >= 2 chunks; a generation with none is the destructor's stop signal.
    if (((state >> 16) & kField) == 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
    }
    run_share(index);
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(int64_t{n_threads_} * kChunksPerThread, (n + grain - 1) / grain);
  if (n_threads_ <= 1 || chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  fn_ = &fn;
  n_ = n;
  n_chunks_ = static_cast<int>(chunks);
  error_ = nullptr;
  pending_.store(n_chunks_, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t gen = generation_of(generation_.load(std::memory_order_relaxed)) + 1;
    generation_.store((gen << 32) | (static_cast<uint64_t>(chunks) << 16), std::memory_order_release);
  }
  wake_.notify_all();
  run_share(0);
  // Only chunks already claimed by workers can be outstanding here.
  while (pending_.load(std::memory_order_acquire) != 0) cpu_relax();
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace inferx
