#pragma once
// --device cpu|cuda[:N] -> a Backend. CUDA is available when the binary was built with the cuda preset.
// --kv-cache-dtype auto|bf16|fp8|f32: the CUDA backend's KV cache element type (auto: its default, or
// INFERX_CUDA_KV_DTYPE); the CPU backend keeps an F32 cache and accepts only auto and f32. The CUDA backend
// keeps its GEMM tuning cache in default_gemm_tuning_cache() (CudaBackendOptions::gemm_tuning_cache).
#include <memory>
#include <string>

#include "backend/backend.h"

namespace inferx::cli {

std::unique_ptr<Backend> make_backend(const std::string& device, int cpu_threads,
                                      const std::string& kv_cache_dtype = "auto");

// The CUDA backend's GEMM tuning cache folder for the CLI's commands: $XDG_CACHE_HOME/inferx, else
// $HOME/.cache/inferx, else none (""). INFERX_GEMM_CACHE (a folder, or off) overrides it.
std::string default_gemm_tuning_cache();

}  // namespace inferx::cli
