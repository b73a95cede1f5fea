// AWQ GEMM and GPTQ checkpoints -> InferX INT4 (layouts in awq_gptq.h).
#include "quant/awq_gptq.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace inferx {

namespace {

constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

uint8_t nibble(int32_t word, int i) {
  return static_cast<uint8_t>((static_cast<uint32_t>(word) >> (4 * i)) & 0xF);
}

void check_shapes(const char* what, int64_t k, int64_t n, int64_t group) {
  INFERX_CHECK(k > 0 && n > 0 && n % 8 == 0, "{}: out_features {} is not a positive multiple of 8", what, n);
  INFERX_CHECK(int4_group_fits(k, group),
               "{}: in_features {} with group_size {}: InferX INT4 needs group 32, 64 or 128 dividing "
               "in_features",
               what, k, group);
}

}  // namespace

Int4Conversion convert_awq_gemm(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales,
                                int64_t k, int64_t n, int64_t group) {
  check_shapes("AWQ", k, n, group);
  int awq_slot[8];  // column offset c (0..7) -> nibble index
  for (int i = 0; i < 8; ++i) awq_slot[kAwqOrder[i]] = i;
  const int64_t groups = k / group, words = n / 8;
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  std::vector<uint16_t> sc(static_cast<size_t>(n * groups));
  std::vector<uint8_t> zero(static_cast<size_t>(n * groups));
  for (int64_t row = 0; row < k; ++row)
    for (int64_t col = 0; col < n; ++col)
      codes[static_cast<size_t>(col * k + row)] = nibble(qweight[row * words + col / 8], awq_slot[col % 8]);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t col = 0; col < n; ++col) {
      sc[static_cast<size_t>(col * groups + g)] = scales[g * n + col];
      zero[static_cast<size_t>(col * groups + g)] = nibble(qzeros[g * words + col / 8], awq_slot[col % 8]);
    }
  return {int4_from_codes(codes, std::move(sc), std::move(zero), n, k, group), {}};
}

Int4Conversion convert_gptq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales,
                            const int32_t* g_idx, int64_t k, int64_t n, int64_t group, bool zero_plus_one) {
  check_shapes("GPTQ", k, n, group);
  INFERX_CHECK(k % 8 == 0, "GPTQ: in_features {} is not a multiple of 8", k);
  const int64_t groups = k / group, zwords = n / 8;
  // Input order: sort rows by group (stable, so desc_act=false keeps the identity).
  std::vector<int32_t> perm(static_cast<size_t>(k));
  std::iota(perm.begin(), perm.end(), 0);
  if (g_idx != nullptr) {
    for (int64_t r = 0; r < k; ++r)
      INFERX_CHECK(g_idx[r] >= 0 && g_idx[r] < groups, "GPTQ: g_idx[{}] = {} is outside 0..{}", r, g_idx[r],
                   groups - 1);
    std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return g_idx[a] < g_idx[b]; });
    for (int64_t i = 0; i < k; ++i)
      INFERX_CHECK(g_idx[perm[static_cast<size_t>(i)]] == i / group,
                   "GPTQ: g_idx does not give every group exactly {} rows", group);
  }
  const bool identity = std::is_sorted(perm.begin(), perm.end());
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < k; ++i) {
    const int64_t row = perm[static_cast<size_t>(i)];
    for (int64_t col = 0; col < n; ++col)
      codes[static_cast<size_t>(col * k + i)] =
          nibble(qweight[(row / 8) * n + col], static_cast<int>(row % 8));
  }
  std::vector<uint16_t> sc(static_cast<size_t>(n * groups));
  std::vector<uint8_t> zero(static_cast<size_t>(n * groups));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t col = 0; col < n; ++col) {
      sc[static_cast<size_t>(col * groups + g)] = scales[g * n + col];
      // "gptq" stores z - 1 in 4 bits, so a zero point of 0 is stored as 15 (-1 masked): adding 1
      // modulo 16 recovers every z in 0..15.
      const int stored = nibble(qzeros[g * zwords + col / 8], static_cast<int>(col % 8));
      const int z = zero_plus_one ? (stored + 1) & 0xF : stored;
      zero[static_cast<size_t>(col * groups + g)] = static_cast<uint8_t>(z);
    }
  Int4Conversion out{int4_from_codes(codes, std::move(sc), std::move(zero), n, k, group), {}};
  if (!identity) out.input_perm = std::move(perm);
  return out;
}

}  // namespace inferx
