#include "cli/backend_choice.h"

#include <cstdlib>

#include "core/error.h"
#if defined(INFERX_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif

namespace inferx::cli {

std::string default_gemm_tuning_cache() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/inferx";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return std::string(home) + "/.cache/inferx";
  return "";
}

std::unique_ptr<Backend> make_backend(const std::string& device, int cpu_threads,
                                      const std::string& kv_cache_dtype) {
  const std::string& kv = kv_cache_dtype;
  INFERX_CHECK(kv == "auto" || kv == "bf16" || kv == "fp8" || kv == "f32",
               "--kv-cache-dtype: '{}' is not auto, bf16, fp8 or f32", kv);
  if (device == "cpu") {
    INFERX_CHECK(kv == "auto" || kv == "f32",
                 "--kv-cache-dtype {}: the CPU backend keeps an F32 KV cache (use auto or f32)", kv);
    return make_cpu_backend({cpu_threads});
  }
  if (device.rfind("cuda", 0) == 0) {
    int index = 0;
    if (device.size() > 4) {
      INFERX_CHECK(device[4] == ':' && device.size() > 5 &&
                       device.find_first_not_of("0123456789", 5) == std::string::npos,
                   "--device: '{}' is not cuda or cuda:N", device);
      index = std::stoi(device.substr(5));
    }
#if defined(INFERX_HAVE_CUDA)
    // The GEMM tuning cache: on for the CLI's commands (a restart then skips the warm-up's algorithm timing),
    // in the user's cache folder unless INFERX_GEMM_CACHE names another folder or "off".
    CudaBackendOptions options = cuda_options_from_environment(default_gemm_tuning_cache());
    if (kv == "bf16") options.kv_cache_dtype = DType::BF16;
    if (kv == "fp8") options.kv_cache_dtype = DType::F8_E4M3;
    if (kv == "f32") options.kv_cache_dtype = DType::F32;
    return make_cuda_backend(index, options);
#else
    (void)index;
    fail("--device {}: this inferx was built without the CUDA backend (build with the cuda preset)", device);
#endif
  }
  fail("--device: unknown device '{}' (cpu, cuda, cuda:N)", device);
}

}  // namespace inferx::cli
