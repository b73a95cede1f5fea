#pragma once
// Shared by the GPU test files: the skip-or-fail rule for machines without a GPU, and the error measures
// of a kernel's output against a float64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_backend.h"

// In a fixture's SetUp (or a test body): skip without a CUDA device, except on the GPU machine
// (INFERX_REQUIRE_GPU set, bench/gpu/run.sh), where a silent skip would hide a broken setup.
#define INFERX_SKIP_WITHOUT_GPU()                                            \
  do {                                                                       \
    if (::inferx::cuda_device_count() == 0) {                                \
      if (std::getenv("INFERX_REQUIRE_GPU"))                                 \
        FAIL() << "INFERX_REQUIRE_GPU is set but no CUDA device is visible"; \
      GTEST_SKIP() << "no CUDA device visible";                              \
    }                                                                        \
  } while (0)

namespace inferx::cuda_test {

struct Errors {
  double rel_norm = 0, max_abs = 0;  // ||got - want|| / ||want||, max |got - want|
  bool all_finite = true;
};

inline Errors compare(const std::vector<float>& got, const std::vector<double>& want) {
  Errors e;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) e.all_finite = false;
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  e.rel_norm = std::sqrt(num / std::max(den, 1e-30));
  return e;
}

}  // namespace inferx::cuda_test
