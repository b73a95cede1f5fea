// The in-process CPU communicator: sums and gathers of odd sizes for 1..8 ranks, bit-identical to a
// rank-order reference and from run to run, the barrier, and errors instead of hangs (abort, mismatched
// shapes).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"

namespace inferx {
namespace {

// Runs fn(rank, comm) on one thread per rank; returns each rank's error message ("" when none).
std::vector<std::string> run_ranks(std::vector<std::unique_ptr<Communicator>>& comms,
                                   const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(static_cast<int>(r), *comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

// Values whose sum depends on the order of addition (large and small magnitudes mixed).
float value(int rank, int64_t i) {
  const float big = (i % 3 == 0) ? 1e8f : 1.0f;
  return (rank % 2 == 0 ? big : -big) + 0.37f * static_cast<float>(rank + 1) +
         1e-3f * static_cast<float>(i % 97);
}

TEST(CpuCommunicator, AllReduceSumOddSizesMatchesRankOrderSum) {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    for (int64_t count : {1, 3, 15, 16, 17, 33, 1000, 4099}) {
      auto comms = make_cpu_communicators(n);
      std::vector<std::vector<float>> data(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(r)].push_back(value(r, i));
      std::vector<float> expected(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        float s = data[0][static_cast<size_t>(i)];
        for (int r = 1; r < n; ++r) s += data[static_cast<size_t>(r)][static_cast<size_t>(i)];
        expected[static_cast<size_t>(i)] = s;
      }
      auto errors = run_ranks(comms, [&](int r, Communicator& c) {
        EXPECT_EQ(c.rank(), r);
        EXPECT_EQ(c.size(), n);
        Tensor x(DType::F32, {count}, data[static_cast<size_t>(r)].data());
        c.all_reduce_sum(x);
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(errors[static_cast<size_t>(r)], "");
        // Bit-identical to the rank-order reference on every rank.
        ASSERT_EQ(std::memcmp(data[static_cast<size_t>(r)].data(), expected.data(), expected.size() * 4), 0)
            << "ranks " << n << ", count " << count << ", rank " << r;
      }
    }
  }
}

TEST(CpuCommunicator, AllReduceIsReproducibleAcrossRuns) {
  const int n = 4;
  const int64_t count = 777;
  std::vector<float> first;
  for (int run = 0; run < 20; ++run) {
    auto comms = make_cpu_communicators(n);
    std::vector<std::vector<float>> data(n);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(r)].push_back(value(r, i * 7 + run % 2));
    run_ranks(comms, [&](int r, Communicator& c) {
      // Stagger the ranks so that their arrival order varies between runs.
      if ((r + run) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      Tensor x(DType::F32, {count}, data[static_cast<size_t>(r)].data());
      for (int k = 0; k < 3; ++k) c.all_reduce_sum(x);
    });
    if (run % 2 == 0) {
      if (first.empty()) {
        first = data[0];
      } else {
        ASSERT_EQ(std::memcmp(first.data(), data[0].data(), first.size() * 4), 0) << "run " << run;
      }
    }
  }
}

TEST(CpuCommunicator, AllGatherConcatenatesInRankOrder) {
  for (int n : {1, 2, 3, 5}) {
    for (int64_t count : {1, 7, 64, 129}) {
      auto comms = make_cpu_communicators(n);
      std::vector<std::vector<float>> out(static_cast<size_t>(n),
                                          std::vector<float>(static_cast<size_t>(n * count)));
      // Bytes too: an odd number of 1-byte elements.
      std::vector<std::vector<uint8_t>> out8(static_cast<size_t>(n),
                                             std::vector<uint8_t>(static_cast<size_t>(n * count)));
      auto errors = run_ranks(comms, [&](int r, Communicator& c) {
        std::vector<float> in(static_cast<size_t>(count));
        std::vector<uint8_t> in8(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) {
          in[static_cast<size_t>(i)] = value(r, i);
          in8[static_cast<size_t>(i)] = static_cast<uint8_t>(r * 31 + i);
        }
        Tensor a(DType::F32, {count}, in.data()),
            b(DType::F32, {n * count}, out[static_cast<size_t>(r)].data());
        c.all_gather(a, b);
        Tensor a8(DType::U8, {count}, in8.data()),
            b8(DType::U8, {n * count}, out8[static_cast<size_t>(r)].data());
        c.all_gather(a8, b8);
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(errors[static_cast<size_t>(r)], "");
        for (int src = 0; src < n; ++src)
          for (int64_t i = 0; i < count; ++i) {
            ASSERT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(src * count + i)], value(src, i));
            ASSERT_EQ(out8[static_cast<size_t>(r)][static_cast<size_t>(src * count + i)],
                      static_cast<uint8_t>(src * 31 + i));
          }
      }
    }
  }
}

TEST(CpuCommunicator, BroadcastCopiesTheRootsBytesToEveryRank) {
  for (int n : {1, 2, 3, 5}) {
    for (int root = 0; root < n; ++root) {
      auto comms = make_cpu_communicators(n);
      const int64_t count = 37;  // odd bytes
      std::vector<std::vector<uint8_t>> buf(static_cast<size_t>(n), std::vector<uint8_t>(count));
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i)
          buf[static_cast<size_t>(r)][static_cast<size_t>(i)] = static_cast<uint8_t>(r * 50 + i);
      auto errors = run_ranks(comms, [&](int r, Communicator& c) {
        Tensor x(DType::U8, {count}, buf[static_cast<size_t>(r)].data());
        c.broadcast(x, root);
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(errors[static_cast<size_t>(r)], "");
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(buf[static_cast<size_t>(r)][static_cast<size_t>(i)], static_cast<uint8_t>(root * 50 + i))
              << "n " << n << " root " << root << " rank " << r;
      }
    }
  }
  auto comms = make_cpu_communicators(2);
  std::vector<uint8_t> a(4), b(5);
  auto errors = run_ranks(comms, [&](int r, Communicator& c) {
    Tensor x = r == 0 ? Tensor(DType::U8, {4}, a.data()) : Tensor(DType::U8, {5}, b.data());
    c.broadcast(x, 0);
  });
  for (const std::string& e : errors) EXPECT_NE(e.find("same shape"), std::string::npos) << e;
  Tensor x(DType::U8, {4}, a.data());
  EXPECT_THROW(comms[0]->broadcast(x, 2), Error);  // no rank 2
}

TEST(CpuCommunicator, BarrierWaitsForEveryRank) {
  const int n = 5;
  auto comms = make_cpu_communicators(n);
  std::atomic<int> arrived{0};
  std::vector<int> seen(n);
  run_ranks(comms, [&](int r, Communicator& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(r * 5));
    arrived.fetch_add(1);
    c.barrier();
    seen[static_cast<size_t>(r)] = arrived.load();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], n) << "rank " << r;
}

TEST(CpuCommunicator, AbortWakesRanksWaitingInACollective) {
  auto comms = make_cpu_communicators(3);
  std::vector<float> buf(3 * 8, 1.0f);
  auto errors = run_ranks(comms, [&](int r, Communicator& c) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the others are waiting by now
      c.abort();
      throw Error("rank 2 failed");
    }
    Tensor x(DType::F32, {8}, buf.data() + r * 8);
    c.all_reduce_sum(x);
  });
  EXPECT_NE(errors[0].find("aborted"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("aborted"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[2], "rank 2 failed");
  // The group stays unusable: a later collective fails at once instead of hanging.
  EXPECT_THROW(comms[0]->barrier(), Error);
}

TEST(CpuCommunicator, MismatchedShapesAreAnErrorOnEveryRank) {
  auto comms = make_cpu_communicators(2);
  std::vector<float> a(4, 1.0f), b(5, 1.0f);
  auto errors = run_ranks(comms, [&](int r, Communicator& c) {
    Tensor x = r == 0 ? Tensor(DType::F32, {4}, a.data()) : Tensor(DType::F32, {5}, b.data());
    c.all_reduce_sum(x);
  });
  for (const std::string& e : errors) EXPECT_NE(e.find("same shape"), std::string::npos) << e;
}

TEST(CpuCommunicator, RejectsWrongInputs) {
  EXPECT_THROW(make_cpu_communicators(0), Error);
  auto comms = make_cpu_communicators(1);
  std::vector<uint16_t> h(4);
  Tensor x(DType::F16, {4}, h.data());
  EXPECT_THROW(comms[0]->all_reduce_sum(x), Error);  // sums are F32 only
  std::vector<float> four(4), small(3);
  Tensor in(DType::F32, {4}, four.data()), out(DType::F32, {3}, small.data());
  EXPECT_THROW(comms[0]->all_gather(in, out), Error);  // out must hold size() x in
}

}  // namespace
}  // namespace inferx
