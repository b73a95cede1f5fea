#include "cli/tensor_parallel_options.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cli/backend_choice.h"
#include "core/error.h"
#if defined(INFERX_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif
#if defined(INFERX_HAVE_NCCL)
#include "parallel/nccl/nccl_communicator.h"
#endif

namespace inferx::cli {

void add_tensor_parallel_option(CLI::App& sub, int& size) {
  sub.add_option("--tensor-parallel-size", size,
                 "Split the model over N ranks (CPU: N backends in this process; cuda:K: GPUs K..K+N-1 "
                 "with NCCL)")
      ->check(CLI::Range(1, 64));
}

void apply_tensor_parallel(const std::string& device, int threads, int size, LoadOptions& lo,
                           const std::string& kv_cache_dtype) {
  lo.tensor_parallel_size = size;
  // INFERX_TENSOR_PARALLEL_PATH=1 with a size of 1: one rank through the tensor-parallel model (what the
  // multi-GPU machinery costs on one GPU: the unfused o / down products, the collectives, the broadcast).
  const char* path = std::getenv("INFERX_TENSOR_PARALLEL_PATH");
  lo.tensor_parallel_path = size == 1 && path != nullptr && std::strcmp(path, "0") != 0;
  if (size <= 1 && !lo.tensor_parallel_path) return;
  if (device == "cpu") {
    const int all =
        threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int per_rank = std::max(1, all / size);
    lo.make_rank_backend = [per_rank](int) { return make_cpu_backend({per_rank}); };
    return;  // the in-process CPU communicator is the default
  }
  INFERX_CHECK(device.rfind("cuda", 0) == 0, "--tensor-parallel-size: unknown device '{}'", device);
  int first = 0;
  if (device.size() > 5 && device[4] == ':') first = std::stoi(device.substr(5));
#if defined(INFERX_HAVE_CUDA) && defined(INFERX_HAVE_NCCL)
  const int count = cuda_device_count();
  INFERX_CHECK(first + size <= count,
               "--tensor-parallel-size {} on {}: needs CUDA devices {}..{}, {} visible", size, device, first,
               first + size - 1, count);
  // Every rank's backend made as rank 0's (backend_choice.cpp): the same KV cache type and options.
  lo.make_rank_backend = [first, kv_cache_dtype](int rank) {
    return make_backend(fmt::format("cuda:{}", first + rank), 0, kv_cache_dtype);
  };
  lo.make_communicators = [first](const std::vector<Backend*>& backends) {
    std::vector<int> devices;
    std::vector<void*> streams;  // each rank's collectives run behind its backend's ops
    for (size_t r = 0; r < backends.size(); ++r) {
      devices.push_back(first + static_cast<int>(r));
      streams.push_back(cuda_stream_of(*backends[r]));
    }
    return make_nccl_communicators(devices, streams);
  };
#else
  (void)first;
  fail(
      "--tensor-parallel-size {} on {}: this inferx was built without CUDA and NCCL (build with the cuda "
      "preset)",
      size, device);
#endif
}

}  // namespace inferx::cli
