#include "cli/backend_choice.h"

#include "core/error.h"
#if defined(INFERX_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif

namespace inferx::cli {

std::unique_ptr<Backend> make_backend(const std::string& device, int cpu_threads) {
  if (device == "cpu") return make_cpu_backend({cpu_threads});
  if (device.rfind("cuda", 0) == 0) {
    int index = 0;
    if (device.size() > 4) {
      INFERX_CHECK(device[4] == ':' && device.size() > 5 &&
                       device.find_first_not_of("0123456789", 5) == std::string::npos,
                   "--device: '{}' is not cuda or cuda:N", device);
      index = std::stoi(device.substr(5));
    }
#if defined(INFERX_HAVE_CUDA)
    return make_cuda_backend(index);
#else
    (void)index;
    fail("--device {}: this inferx was built without the CUDA backend (build with the cuda preset)", device);
#endif
  }
  fail("--device: unknown device '{}' (cpu, cuda, cuda:N)", device);
}

}  // namespace inferx::cli
