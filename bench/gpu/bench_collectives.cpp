// bench_collectives: the tensor-parallel collectives (parallel/nccl) over the visible GPUs, as InferX calls
// them: one thread per GPU, each enqueueing on its CUDA backend's stream. Prints, per size, the time per
// all-reduce (F32, in place) and per all-gather, with nccl-tests' bandwidth conventions: algbw = bytes /
// time; all-reduce busbw = algbw * 2 (n - 1) / n, all-gather busbw = algbw * (n - 1) / n (the bytes each
// link carries, comparable with the NVLink figure). The sizes cover a decode step's all-reduce at batch 1
// (hidden 8192 F32 = 32 KB) and 256 (8 MB) and a prefill chunk's (8192 tokens: 256 MB).
//   bench_collectives [max_gpus] [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "parallel/nccl/nccl_communicator.h"

using namespace inferx;

namespace {

// Runs fn(rank) on one thread per rank and joins; rethrows the first rank's error.
void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[static_cast<size_t>(r)].empty()) fail("rank {}: {}", r, errors[static_cast<size_t>(r)]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int visible = cuda_device_count();
    const int n = std::min(argc > 1 ? std::atoi(argv[1]) : visible, visible);
    const int iterations = argc > 2 ? std::atoi(argv[2]) : 50;
    INFERX_CHECK(n >= 1, "no CUDA device");
    std::printf("bench_collectives: %d GPU%s, NCCL %d, %d iterations per size (after 5 warm-up)\n", n,
                n > 1 ? "s" : "", nccl_version(), iterations);
    std::vector<std::unique_ptr<Backend>> backends;
    std::vector<int> devices;
    std::vector<void*> streams;
    for (int d = 0; d < n; ++d) {
      backends.push_back(make_cuda_backend(d));
      devices.push_back(d);
      streams.push_back(cuda_stream_of(*backends.back()));
    }
    auto comms = make_nccl_communicators(devices, streams);
    std::printf("%12s %14s %12s %12s %14s %12s %12s\n", "bytes", "allreduce us", "algbw GB/s", "busbw GB/s",
                "allgather us", "algbw GB/s", "busbw GB/s");
    for (int64_t bytes : {int64_t{32} << 10, int64_t{256} << 10, int64_t{2} << 20, int64_t{8} << 20,
                          int64_t{64} << 20, int64_t{256} << 20}) {
      const int64_t count = bytes / 4;
      double seconds[2] = {0, 0};
      for (int op = 0; op < 2; ++op) {
        std::vector<std::unique_ptr<DeviceBuffer>> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          in[static_cast<size_t>(r)] = backends[static_cast<size_t>(r)]->allocate(static_cast<size_t>(bytes));
          if (op == 1)
            out[static_cast<size_t>(r)] = backends[static_cast<size_t>(r)]->allocate(
                static_cast<size_t>(bytes) * static_cast<size_t>(n));
        }
        auto run = [&](int r, int times) {
          Tensor x(DType::F32, {count}, in[static_cast<size_t>(r)]->data(), Device::CUDA);
          for (int i = 0; i < times; ++i) {
            if (op == 0) {
              comms[static_cast<size_t>(r)]->all_reduce_sum(x);
            } else {
              Tensor all(DType::F32, {count * n}, out[static_cast<size_t>(r)]->data(), Device::CUDA);
              comms[static_cast<size_t>(r)]->all_gather(x, all);
            }
          }
          backends[static_cast<size_t>(r)]->synchronize();
        };
        on_ranks(n, [&](int r) { run(r, 5); });
        const auto t0 = std::chrono::steady_clock::now();
        on_ranks(n, [&](int r) { run(r, iterations); });
        seconds[op] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
      }
      const double ar_alg = static_cast<double>(bytes) / seconds[0] / 1e9;
      const double ag_alg = static_cast<double>(bytes) * n / seconds[1] / 1e9;  // the gathered bytes
      std::printf("%12lld %14.1f %12.1f %12.1f %14.1f %12.1f %12.1f\n", static_cast<long long>(bytes),
                  seconds[0] * 1e6, ar_alg, ar_alg * 2.0 * (n - 1) / n, seconds[1] * 1e6, ag_alg,
                  ag_alg * (n - 1) / n);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    return 1;
  }
}
