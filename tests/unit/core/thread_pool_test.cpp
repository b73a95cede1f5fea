// Tests of ThreadPool::parallel_for (src/core/thread_pool.cpp): coverage of [0, n) by disjoint ranges,
// thread indices within the pool, exceptions, and the chunk-claiming protocol under many
// back-to-back jobs (a late worker must never run a chunk of a newer job with stale parameters).
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace inferx {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 100, 1001}) {
      for (int64_t grain : {1, 3, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> bad_index{0};
        pool.parallel_for(
            n,
            [&](int64_t b, int64_t e, int t) {
              if (t < 0 || t >= threads) bad_index.fetch_add(1);
              for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
            },
            grain);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << n;
        EXPECT_EQ(bad_index.load(), 0);
      }
    }
  }
}

TEST(ThreadPool, ManyBackToBackJobsSeeTheirOwnParameters) {
  ThreadPool pool(3);
  std::vector<int64_t> data(64);
  for (int job = 0; job < 20000; ++job) {
    const int64_t n = 2 + job % 60;
    std::atomic<int64_t> sum{0};
    pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sum.fetch_add(i + job);
    });
    ASSERT_EQ(sum.load(), n * (n - 1) / 2 + n * job) << "job " << job;
  }
}

TEST(ThreadPool, RethrowsExceptionsFromChunks) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](int64_t b, int64_t, int) {
                                   if (b > 0) throw std::runtime_error("chunk failed");
                                 }),
               std::runtime_error);
  // The pool stays usable after an exception.
  std::atomic<int64_t> count{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e, int) { count.fetch_add(e - b); });
  EXPECT_EQ(count.load(), 100);
}

}  // namespace
}  // namespace inferx
