// Tensor parallelism on GPUs: the NCCL communicator (all-reduce / all-gather of odd sizes, barrier) on every
// visible GPU, and a tensor-parallel model on 2 (and 4, 8 where present) GPUs against one GPU. Needs at
// least two CUDA devices: every test skips otherwise (NCCL cannot put two ranks on one device).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/nccl/nccl_communicator.h"

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

CudaBackendOptions exact_options() {
  CudaBackendOptions o;
  o.kv_cache_dtype = DType::F32;
  o.bf16_activations = false;
  return o;
}

TEST(NcclCommunicator, AllReduceAndAllGatherOddSizes) {
  REQUIRE_GPUS(2);
  std::vector<int> devices;
  for (int d = 0; d < visible_gpus; ++d) devices.push_back(d);
  const int n = visible_gpus;
  std::printf("NCCL %d on %d GPUs\n", nccl_version(), n);
  auto comms = make_nccl_communicators(devices);
  std::vector<std::unique_ptr<Backend>> backends;
  for (int d : devices) backends.push_back(make_cuda_backend(d, exact_options()));
  for (int64_t count : {1, 7, 33, 1000, 4099}) {
    // Small integers: every summation order gives the exact sum.
    std::vector<std::vector<float>> out(static_cast<size_t>(n)), gathered(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          Backend& be = *backends[static_cast<size_t>(r)];
          std::vector<float> host(static_cast<size_t>(count));
          for (int64_t i = 0; i < count; ++i)
            host[static_cast<size_t>(i)] = static_cast<float>((r + 1) * (i % 5));
          auto x = be.allocate(host.size() * 4), all = be.allocate(host.size() * 4 * static_cast<size_t>(n));
          be.copy_to_device(x->data(), host.data(), host.size() * 4);
          Tensor in(DType::F32, {count}, x->data(), Device::CUDA);
          Tensor g(DType::F32, {n * count}, all->data(), Device::CUDA);
          be.synchronize();
          comms[static_cast<size_t>(r)]->all_gather(in, g);
          comms[static_cast<size_t>(r)]->all_reduce_sum(in);
          comms[static_cast<size_t>(r)]->barrier();
          out[static_cast<size_t>(r)].resize(host.size());
          gathered[static_cast<size_t>(r)].resize(host.size() * static_cast<size_t>(n));
          be.copy_to_host(out[static_cast<size_t>(r)].data(), x->data(), host.size() * 4);
          be.copy_to_host(gathered[static_cast<size_t>(r)].data(), all->data(), host.size() * 4 * n);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(i)], ranks_sum * static_cast<float>(i % 5));
        for (int src = 0; src < n; ++src)
          ASSERT_EQ(gathered[static_cast<size_t>(r)][static_cast<size_t>(src * count + i)],
                    static_cast<float>((src + 1) * (i % 5)));
      }
    }
  }
}

std::vector<float> logits_of(const std::string& spec, int tp, const std::vector<int32_t>& ids) {
  auto backend = make_cuda_backend(0, exact_options());
  LoadOptions o;
  o.tensor_parallel_size = tp;
  o.make_rank_backend = [](int r) { return make_cuda_backend(r, exact_options()); };
  o.make_communicators = [](int n) {
    std::vector<int> devices;
    for (int r = 0; r < n; ++r) devices.push_back(r);
    return make_nccl_communicators(devices);
  };
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
  for (const std::string spec : {"dummy:tiny:f32", "dummy:tiny:bf16"}) {
    const std::vector<float> ref = logits_of(spec, 1, ids);
    for (int tp : {2, 4, 8}) {
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

}  // namespace
}  // namespace inferx
