#pragma once
// INT4 weight-only group quantization (InferX's own layout; documented in docs/quantized-checkpoint.md).
//
// A [n, k] weight matrix becomes:
//   codes  INT4 [n, k]: 4-bit codes q in 0..15, k/2 bytes per row. Within each run of 32 columns
//          c0..c0+31 (16 bytes), byte j holds column c0+j in its low nibble and column c0+16+j in its
//          high nibble: one 16-byte load, a mask and a shift give the 32 codes in column order (the same
//          nibble order as GGUF Q4_0, so the CPU kernels share their unpacking).
//   scale  F16 [n, k/group]: one scale per group of `group` consecutive columns of a row.
//   zero   U8 [n, k/group] zero points 0..15 (asymmetric), or none (symmetric: zero point 8).
// Dequantized weight: w = scale * (q - zero).
//
// Quantizers (round to nearest, no search; the GPTQ/AWQ conventions for the grid):
//   symmetric:  s = max|w| / 7.5, q = clamp(round(w / s) + 8, 0, 15)  (GPTQ sym: zero (maxq + 1) / 2)
//   asymmetric: s = (max - min) / 15 with min <= 0 <= max, z = round(-min / s), q = clamp(round(w / s) + z,
//   0, 15)
// s is rounded to f16 before the codes are computed, so the stored scale is the one the codes used.
#include <cstdint>
#include <vector>

namespace inferx {

struct Int4Weight {
  int64_t n = 0, k = 0, group = 0;
  std::vector<uint8_t> codes;   // [n, k/2] packed as above
  std::vector<uint16_t> scale;  // f16 [n, k/group]
  std::vector<uint8_t> zero;    // [n, k/group], empty when symmetric
  bool symmetric() const { return zero.empty(); }
};

// Whether a layer with k input columns can use this group size (k a multiple of group, group one of
// 32/64/128).
bool int4_group_fits(int64_t k, int64_t group);

Int4Weight quantize_int4_weight(const float* w, int64_t n, int64_t k, int64_t group, bool symmetric);

// Packs/unpacks one row of k codes (0..15) to/from the nibble layout above (k a multiple of 32).
void pack_int4_row(const uint8_t* codes, uint8_t* packed, int64_t k);
void unpack_int4_row(const uint8_t* packed, uint8_t* codes, int64_t k);

// One dequantized row: scale/zero point to the row's k/group entries (zero nullptr: symmetric).
void dequantize_int4_row(const uint8_t* packed, const uint16_t* scale, const uint8_t* zero, int64_t group,
                         float* out, int64_t k);

// Builds an Int4Weight from unpacked codes [n, k] and per-group f16 scales / zero points.
Int4Weight int4_from_codes(const std::vector<uint8_t>& codes, std::vector<uint16_t> scale,
                           std::vector<uint8_t> zero, int64_t n, int64_t k, int64_t group);

}  // namespace inferx
