#include "core/dtype.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace inferx {

namespace {
constexpr std::array<DTypeInfo, static_cast<size_t>(DType::kCount)> kInfo = {{
    {"F32", 1, 4, false},
    {"F16", 1, 2, false},
    {"BF16", 1, 2, false},
    {"Q8_0", 32, 34, true},
    {"Q4_0", 32, 18, true},
    {"Q4_K", 256, 144, true},
    {"Q6_K", 256, 210, true},
    {"I32", 1, 4, false},
    {"I8", 1, 1, false},
    {"F8_E4M3", 1, 1, false},
    {"U8", 1, 1, false},
    {"INT4", 32, 16, true},
}};
}  // namespace

const DTypeInfo& dtype_info(DType t) {
  auto i = static_cast<size_t>(t);
  INFERX_CHECK(i < kInfo.size(), "invalid dtype id {}", i);
  return kInfo[i];
}

int64_t row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  INFERX_CHECK(n >= 0 && n % info.block_elems == 0,
               "a row of {} elements is not a whole number of {} blocks ({} elements each)", n, info.name,
               info.block_elems);
  return n / info.block_elems * info.block_bytes;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (size_t i = 0; i < kInfo.size(); ++i) {
    std::string_view k = kInfo[i].name;
    if (k.size() != name.size()) continue;
    bool same = true;
    for (size_t j = 0; j < k.size() && same; ++j)
      same = std::toupper(static_cast<unsigned char>(name[j])) == k[j];
    if (same) return static_cast<DType>(i);
  }
  return std::nullopt;
}

}  // namespace inferx
