#pragma once
// --device cpu|cuda[:N] -> a Backend. CUDA is available when the binary was built with the cuda preset.
#include <memory>
#include <string>

#include "backend/backend.h"

namespace inferx::cli {

std::unique_ptr<Backend> make_backend(const std::string& device, int cpu_threads);

}  // namespace inferx::cli
