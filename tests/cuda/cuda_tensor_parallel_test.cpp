// Tensor parallelism on GPUs: the NCCL communicator (all-reduce / all-gather / broadcast of odd sizes,
// barrier, ordered on the backends' streams) on every visible GPU, a tensor-parallel model on 2 (and 4, 8
// where present) GPUs against one GPU, and on one GPU the tensor-parallel path itself with one rank
// (LoadOptions::tensor_parallel_path; NCCL cannot put two ranks on one device): decode steps recorded
// in CUDA graphs with their collectives and metadata broadcast, and overlapped steps, against the same
// path run eagerly.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../unit/engine/engine_test_requests.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "inferx/engine.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/nccl/nccl_communicator.h"
#include "parallel/nccl/p2p_all_reduce.h"

namespace inferx {
namespace {

int gpus_or_skip(int needed) {
  const int n = cuda_device_count();
  return n >= needed ? n : 0;
}

#define REQUIRE_GPUS(k)                     \
  const int visible_gpus = gpus_or_skip(k); \
  if (visible_gpus == 0)                    \
  GTEST_SKIP() << "needs " << (k) << " CUDA devices, " << cuda_device_count() << " visible"

// Runs fn(rank) on one thread per rank (as the tensor-parallel ranks run); returns each rank's error
// message ("" when none).
std::vector<std::string> run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

CudaBackendOptions exact_options() {
  CudaBackendOptions o;
  o.kv_cache_dtype = DType::F32;
  o.bf16_activations = false;
  return o;
}

// Every visible GPU, one included (a group of one: the gather and broadcast are copies). The inputs are
// written by an op queued on each backend's stream just before the collectives, with no wait in between:
// a collective that did not run behind the backend's work would read the zeros before them.
TEST(NcclCommunicator, CollectivesOfOddSizesRunBehindTheBackendsWork) {
  REQUIRE_GPUS(1);
  std::vector<int> devices;
  for (int d = 0; d < visible_gpus; ++d) devices.push_back(d);
  const int n = visible_gpus;
  std::printf("NCCL %d on %d GPUs\n", nccl_version(), n);
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<void*> streams;
  for (int d : devices) {
    backends.push_back(make_cuda_backend(d, exact_options()));
    streams.push_back(cuda_stream_of(*backends.back()));
  }
  auto comms = make_nccl_communicators(devices, streams);
  for (int64_t count : {1, 7, 33, 1000, 4099}) {
    // Small integers: every summation order gives the exact sum.
    std::vector<std::vector<float>> out(static_cast<size_t>(n)), gathered(static_cast<size_t>(n)),
        broadcast(static_cast<size_t>(n));
    const std::vector<std::string> errors = run_ranks(n, [&](int r) {
      Backend& be = *backends[static_cast<size_t>(r)];
      const size_t bytes = static_cast<size_t>(count) * 4;
      std::vector<float> host(2 * static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        host[static_cast<size_t>(i)] = static_cast<float>((r + 1) * (i % 5));
        host[static_cast<size_t>(count + i)] = static_cast<float>(1000 * r + i);
      }
      auto staged = be.allocate(2 * bytes), x = be.allocate(bytes), b = be.allocate(bytes),
           all = be.allocate(bytes * static_cast<size_t>(n));
      be.copy_to_device(staged->data(), host.data(), 2 * bytes);
      be.synchronize();
      // Queued, not waited for: the collectives below must still see these values.
      be.copy_on_device(x->data(), staged->data(), bytes);
      be.copy_on_device(b->data(), static_cast<char*>(staged->data()) + bytes, bytes);
      Tensor in(DType::F32, {count}, x->data(), Device::CUDA);
      Tensor bt(DType::F32, {count}, b->data(), Device::CUDA);
      Tensor g(DType::F32, {n * count}, all->data(), Device::CUDA);
      Communicator& c = *comms[static_cast<size_t>(r)];
      c.all_gather(in, g);
      c.all_reduce_sum(in);
      c.broadcast(bt, n - 1);
      out[static_cast<size_t>(r)].resize(static_cast<size_t>(count));
      broadcast[static_cast<size_t>(r)].resize(static_cast<size_t>(count));
      gathered[static_cast<size_t>(r)].resize(static_cast<size_t>(count * n));
      be.copy_to_host(out[static_cast<size_t>(r)].data(), x->data(), bytes);
      be.copy_to_host(broadcast[static_cast<size_t>(r)].data(), b->data(), bytes);
      be.copy_to_host(gathered[static_cast<size_t>(r)].data(), all->data(), bytes * n);
      c.barrier();
    });
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(i)], ranks_sum * static_cast<float>(i % 5));
        ASSERT_EQ(broadcast[static_cast<size_t>(r)][static_cast<size_t>(i)],
                  static_cast<float>(1000 * (n - 1) + i));
        for (int src = 0; src < n; ++src)
          ASSERT_EQ(gathered[static_cast<size_t>(r)][static_cast<size_t>(src * count + i)],
                    static_cast<float>((src + 1) * (i % 5)));
      }
    }
  }
}

std::vector<std::unique_ptr<Communicator>> nccl_for(const std::vector<Backend*>& backends) {
  std::vector<int> devices;
  std::vector<void*> streams;
  for (size_t r = 0; r < backends.size(); ++r) {
    devices.push_back(static_cast<int>(r));
    streams.push_back(cuda_stream_of(*backends[r]));
  }
  return make_nccl_communicators(devices, streams);
}

std::vector<float> logits_of(const std::string& spec, int tp, const std::vector<int32_t>& ids,
                             bool path = false) {
  auto backend = make_cuda_backend(0, exact_options());
  LoadOptions o;
  o.tensor_parallel_size = tp;
  o.tensor_parallel_path = path;
  o.make_rank_backend = [](int r) { return make_cuda_backend(r, exact_options()); };
  o.make_communicators = nccl_for;
  auto model = Model::load(spec, *backend, o);
  SequenceRunner runner(*model, static_cast<int64_t>(ids.size()) + 4);
  std::vector<float> all = runner.step_all_logits(ids);
  for (int32_t t : {3, 5, 7}) {  // decode steps
    const std::vector<float>& row = runner.step({t});
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

TEST(CudaTensorParallel, LogitsMatchOneGpu) {
  REQUIRE_GPUS(2);
  const std::vector<int32_t> ids = {1, 17, 300, 42, 511, 7, 99, 256, 3, 128};
  // dummy:tiny's 4 heads split 2 and 4 ways; 8 ranks take Llama-3.2-1B's shape (32 heads, 8 KV heads).
  const std::vector<std::pair<std::string, std::vector<int>>> cases = {
      {"dummy:tiny:f32", {2, 4}}, {"dummy:tiny:bf16", {2, 4}}, {"dummy:llama-3.2-1b:f32", {8}}};
  for (const auto& [spec, tps] : cases) {
    if (tps.front() > visible_gpus) continue;
    const std::vector<float> ref = logits_of(spec, 1, ids);
    for (int tp : tps) {
      if (tp > visible_gpus) break;
      const std::vector<float> got = logits_of(spec, tp, ids);
      ASSERT_EQ(got.size(), ref.size());
      double max_ref = 1, max_diff = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
      }
      std::printf("%s tp=%d: max |diff| %.3g (max |logit| %.3g)\n", spec.c_str(), tp, max_diff, max_ref);
      // Partial sums added by NCCL instead of inside one GEMM can move a BF16 rounding of the next
      // layer's input by one unit (2^-8 relative); a wrong slice or a missing reduction gives O(1).
      EXPECT_LE(max_diff / max_ref, 5e-3) << spec << " tp=" << tp;
    }
  }
}

// One rank through the tensor-parallel path on one GPU: CUDA graphs recorded with the step's NCCL
// broadcast, all-reduces and all-gather inside, replayed (and overlapped: the next step's ids gathered on
// the device before the broadcast) must give exactly the text of the same padded steps run eagerly.
std::vector<std::vector<int32_t>> one_rank_text(Model& model, const std::vector<GenerationParams>& ps,
                                                const char* graphs_env, EngineStats& stats) {
  if (graphs_env) setenv("INFERX_GRAPHS", graphs_env, 1);
  auto tokens = testing::run_to_end(model, ps, &stats);
  unsetenv("INFERX_GRAPHS");
  return tokens;
}

TEST(CudaTensorParallel, OneRankPathReplaysItsCollectivesFromGraphs) {
  REQUIRE_GPUS(1);
  auto backend = make_cuda_backend(0);
  LoadOptions o;
  o.tensor_parallel_path = true;
  o.make_communicators = nccl_for;
  auto model = Model::load("dummy:tiny", *backend, o);
  ASSERT_NE(model->tensor_parallel(), nullptr);
  std::vector<GenerationParams> ps;
  for (int i = 0; i < 20; ++i) ps.push_back(testing::greedy_tokens(6 + 5 * (i % 7)));
  ps[3].temperature = 0.9f;
  ps[3].seed = 5;
  EngineStats graphs, padded;
  const auto replayed = one_rank_text(*model, ps, nullptr, graphs);
  const auto eager = one_rank_text(*model, ps, "pad", padded);
  EXPECT_EQ(replayed, eager);
  EXPECT_GT(graphs.decode_graph_steps, 10);
  EXPECT_EQ(graphs.decode_graph_steps, padded.decode_graph_steps);
  EXPECT_GT(graphs.overlapped_steps, 10) << "overlapped steps run on the tensor-parallel path";
  EXPECT_GT(graphs.decode_graph_replays, 10)
      << "the steps must replay recorded graphs, not fall back to eager";
  EXPECT_EQ(padded.decode_graph_replays, 0);
  std::printf("one rank: %lld graph steps, %lld overlapped\n",
              static_cast<long long>(graphs.decode_graph_steps),
              static_cast<long long>(graphs.overlapped_steps));
}

// The same one-rank model against the plain model: the tensor-parallel transformer takes the unfused
// o / down products (the all-reduce sits between them and the residual add), so roundings may differ;
// the logits must stay close.
TEST(CudaTensorParallel, OneRankPathLogitsMatchThePlainModel) {
  REQUIRE_GPUS(1);
  const std::vector<int32_t> ids = {1, 17, 300, 42, 511, 7, 99, 256, 3, 128};
  for (const std::string spec : {"dummy:tiny:f32", "dummy:tiny:bf16"}) {
    const std::vector<float> ref = logits_of(spec, 1, ids);
    const std::vector<float> got = logits_of(spec, 1, ids, /*path=*/true);
    ASSERT_EQ(got.size(), ref.size());
    double max_ref = 1, max_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    }
    std::printf("%s one-rank path: max |diff| %.3g (max |logit| %.3g)\n", spec.c_str(), max_diff, max_ref);
    EXPECT_LE(max_diff / max_ref, 5e-3) << spec;
  }
}

// The one-shot peer-to-peer all-reduce with several ranks on one GPU (their kernels run side by side on
// separate streams; peers' buffers are then local memory, the protocol the same): rank-order sums, exact
// and identical on every rank, for odd and vector sizes, a misaligned tensor on one rank, many calls in a
// row (the staging slots alternate), and calls recorded in CUDA graphs and replayed (the call counter
// lives on the device).
TEST(P2pAllReduce, RanksOnOneGpuSumInRankOrderEagerlyAndFromGraphs) {
  REQUIRE_GPUS(1);
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    P2pAllReduce ar(std::vector<int>(static_cast<size_t>(n), 0), 256 << 10);
    std::vector<cudaStream_t> streams(static_cast<size_t>(n));
    for (auto& st : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    const int64_t cap = 65536 + 8;
    std::vector<float*> bufs(static_cast<size_t>(n)), srcs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&bufs[static_cast<size_t>(r)]), cap * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&srcs[static_cast<size_t>(r)]), cap * 4), cudaSuccess);
    }
    auto value = [](int r, int64_t i, int round) {
      return static_cast<float>((r + 1) * 0.37 + (i % 101) * 1e-3 + round * 11.0 +
                                ((i % 7 == 0) ? 1e6 : 0.0));
    };
    // Runs one call per rank on its own thread (x of rank 1 one float past the buffer's start when `skew`),
    // then checks every rank's result against the rank-order sum.
    auto check_round = [&](int64_t count, bool skew, int round, bool graph, int replays, int chain = 1) {
      const std::vector<std::string> errors = run_ranks(n, [&](int r) {
        const size_t ri = static_cast<size_t>(r);
        float* x = bufs[ri] + (skew && r == 1 ? 1 : 0);
        cudaGraphExec_t exec = nullptr;
        for (int rep = 0; rep < std::max(replays, 1); ++rep) {
          std::vector<float> host(static_cast<size_t>(count));
          for (int64_t i = 0; i < count; ++i) host[static_cast<size_t>(i)] = value(r, i, round + rep);
          if (cudaMemcpy(srcs[ri], host.data(), count * 4, cudaMemcpyHostToDevice) != cudaSuccess)
            fail("upload");
          if (!graph) {
            cudaMemcpyAsync(x, srcs[ri], count * 4, cudaMemcpyDeviceToDevice, streams[ri]);
            for (int c = 0; c < chain; ++c) ar.all_reduce(r, x, count, streams[ri]);  // back to back
          } else {
            if (exec == nullptr) {  // recorded once: the copy from the source, then the sum
              cudaGraph_t g = nullptr;
              if (cudaStreamBeginCapture(streams[ri], cudaStreamCaptureModeThreadLocal) != cudaSuccess)
                fail("capture");
              cudaMemcpyAsync(x, srcs[ri], count * 4, cudaMemcpyDeviceToDevice, streams[ri]);
              ar.all_reduce(r, x, count, streams[ri]);
              if (cudaStreamEndCapture(streams[ri], &g) != cudaSuccess ||
                  cudaGraphInstantiate(&exec, g, 0) != cudaSuccess)
                fail("instantiate");
              cudaGraphDestroy(g);
            }
            if (cudaGraphLaunch(exec, streams[ri]) != cudaSuccess) fail("replay");
          }
          if (cudaStreamSynchronize(streams[ri]) != cudaSuccess)
            fail("sync: {}", cudaGetErrorString(cudaGetLastError()));
          std::vector<float> got(static_cast<size_t>(count));
          cudaMemcpy(got.data(), x, count * 4, cudaMemcpyDeviceToHost);
          for (int64_t i = 0; i < count; ++i) {
            float want = value(0, i, round + rep);
            for (int q = 1; q < n; ++q) want += value(q, i, round + rep);
            for (int c = 1; c < chain; ++c) {  // every rank holds `want`: the next sum adds it n times
              const float each = want;
              for (int q = 1; q < n; ++q) want += each;
            }
            if (got[static_cast<size_t>(i)] != want)
              fail("rank {} count {} element {} replay {}: {} != {}", r, count, i, rep,
                   got[static_cast<size_t>(i)], want);
          }
        }
        if (exec) cudaGraphExecDestroy(exec);
      });
      for (int r = 0; r < n; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    };
    int round = 0;
    for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{4099}, int64_t{65536}})
      check_round(count, false, round++, false, 1);
    // Rank 1's x not 16-byte aligned: every rank's blocks must still take the same elements.
    check_round(4096, true, round++, false, 1);
    for (int i = 0; i < 5; ++i) check_round(1000 + 4 * i, false, round++, false, 1);  // calls in a row
    check_round(2048, false, round++, false, 1, 7);  // seven calls queued back to back: the slots alternate
    check_round(8192, false, round, true, 5);        // recorded once per rank, replayed five times
    EXPECT_FALSE(ar.takes(65537)) << "256 KB is 65536 floats";
    for (int r = 0; r < n; ++r) {
      cudaFree(bufs[static_cast<size_t>(r)]);
      cudaFree(srcs[static_cast<size_t>(r)]);
      cudaStreamDestroy(streams[static_cast<size_t>(r)]);
    }
  }
}

// INFERX_TP_ALLREDUCE_BF16 on one GPU (a group of one: the sum is the tensor itself): a sum of 1 MB or more
// comes back as its BF16 rounding (round to nearest even), a smaller one exactly.
TEST(NcclCommunicator, Bf16AllReduceRoundsLargeSumsOnly) {
  REQUIRE_GPUS(1);
  setenv("INFERX_TP_ALLREDUCE_BF16", "16", 1);
  auto backend = make_cuda_backend(0, exact_options());
  auto comms = make_nccl_communicators({0}, {cuda_stream_of(*backend)});
  unsetenv("INFERX_TP_ALLREDUCE_BF16");
  for (int64_t n : {int64_t{1000}, int64_t{1} << 18, (int64_t{1} << 20) + 3}) {
    SCOPED_TRACE(n);
    std::vector<float> host(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (float& v : host) v = u(rng);
    auto buf = backend->allocate(host.size() * 4);
    backend->copy_to_device(buf->data(), host.data(), host.size() * 4);
    Tensor x(DType::F32, {n}, buf->data(), Device::CUDA);
    comms[0]->all_reduce_sum(x);
    std::vector<float> got(host.size());
    backend->copy_to_host(got.data(), buf->data(), got.size() * 4);
    const bool rounded = n >= (int64_t{1} << 18);
    for (size_t i = 0; i < host.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &host[i], 4);
      bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;  // round to nearest even (finite values)
      float want;
      std::memcpy(&want, &bits, 4);
      ASSERT_EQ(got[i], rounded ? want : host[i]) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace inferx
