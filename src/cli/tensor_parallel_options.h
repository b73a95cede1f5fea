#pragma once
// --tensor-parallel-size N, shared by generate, serve and bench offline: the model's weights split over
// N ranks (model/tensor_parallel.h). CPU: N CPU backends in this process (ranks 1..N-1 get threads/N
// kernel threads each) and the in-process communicator. CUDA (--device cuda:K): ranks on devices
// K..K+N-1 with NCCL, one thread per GPU. INFERX_TENSOR_PARALLEL_PATH=1 runs a size of 1 through the
// tensor-parallel model too (LoadOptions::tensor_parallel_path: its cost on one device).
#include <CLI/CLI.hpp>
#include <string>

#include "model/model.h"

namespace inferx::cli {

void add_tensor_parallel_option(CLI::App& sub, int& size);

// Fills lo.tensor_parallel_size and the rank backend / communicator factories for `device`; GPU ranks get
// rank 0's --kv-cache-dtype.
void apply_tensor_parallel(const std::string& device, int threads, int size, LoadOptions& lo,
                           const std::string& kv_cache_dtype = "auto");

}  // namespace inferx::cli
