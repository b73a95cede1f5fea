// libFuzzer target for the GEMM tuning cache file (formats/gemm_tuning_file.h): any bytes must either give
// records that serialize back to exactly those bytes, or nothing with a reason - never a crash or a huge
// allocation. Seeds: fuzz/seeds/gemm_tuning_file/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "formats/gemm_tuning_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kContext = "fuzz";
  std::string why;
  const auto records = inferx::parse_gemm_tuning(bytes, kContext, why);
  if (why.empty() && inferx::serialize_gemm_tuning(kContext, records) != bytes) std::abort();
  if (!why.empty() && !records.empty()) std::abort();
  return 0;
}
