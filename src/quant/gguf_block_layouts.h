#pragma once
// Byte layouts of the GGUF block-quantized weight types, as stored in .gguf files (see the GGUF
// specification and gguf-py's gguf/quants.py). All fields are little-endian; f16 fields are IEEE
// half precision stored as raw uint16_t bits. Blocks are packed back to back in a row, so a block's
// address is only 2-byte aligned: read them through these structs (alignment 1-2), never wider.
#include <cstdint>

namespace inferx {

// Q8_0: 32 elements. x[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: 32 elements. Element j (0..15) is the low nibble of qs[j], element j + 16 the high nibble;
// x = d * (q - 8).
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_K: a super-block of 256 elements = 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min
// packed into `scales` (unpack_q4_k_scales). qs holds 4 chunks of 32 bytes; chunk c gives elements
// 64c + l (low nibble of qs[32c + l]) and 64c + 32 + l (high nibble), i.e. sub-blocks 2c and 2c + 1.
// x = d * sc[j] * q - dmin * m[j] for element in sub-block j.
struct BlockQ4_K {
  uint16_t d;     // f16 super-block scale of the 6-bit sub-block scales
  uint16_t dmin;  // f16 super-block scale of the 6-bit sub-block mins
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q6_K: a super-block of 256 elements in two halves of 128. For half h and l in 0..31, the 6-bit
// value of element 128h + 32s + l (s = 0..3) is
//   low 4 bits: s=0: ql[64h + l] & 15, s=1: ql[64h + 32 + l] & 15, s=2: ql[64h + l] >> 4,
//               s=3: ql[64h + 32 + l] >> 4
//   high 2 bits: (qh[32h + l] >> 2s) & 3
// x = d * scales[i / 16] * (q - 32) for element i.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;  // f16
};
static_assert(sizeof(BlockQ6_K) == 210);

// Unpacks Q4_K's 12 bytes into 8 six-bit scales and 8 six-bit mins. Bytes 0-3 hold the low 6 bits of
// scales 0-3 (top 2 bits: high bits of scales 4-7), bytes 4-7 the same for mins, bytes 8-11 the low
// 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble).
inline void unpack_q4_k_scales(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    m[j] = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Inverse of unpack_q4_k_scales (values must be < 64).
inline void pack_q4_k_scales(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

}  // namespace inferx
