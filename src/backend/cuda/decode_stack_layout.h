#pragma once
// The persistent decode kernel's weight matrices and how their rows sit in a ring stage
// (kernels_decode_stack.cu), as plain C++ shared by the kernel and the host test
// (tests/unit/backend/decode_stack_layout_test.cpp builds stages as the producer copies them and decodes them
// as the consumers do, without a GPU): StackMatrix, the stage geometry, a row's place in a stage, and the
// INT4 decode of one 16-byte vector.
#include <cstdint>

#include "core/half.h"  // the host side of the bit casts below

#if defined(__CUDACC__)
#define INFERX_STACK_HD __host__ __device__ __forceinline__
#else
#define INFERX_STACK_HD inline
#endif
#if defined(__CUDA_ARCH__)  // the device pass only: the host compiler warns on an unknown pragma
#define INFERX_STACK_UNROLL _Pragma("unroll")
#else
#define INFERX_STACK_UNROLL
#endif

namespace inferx::cuda {

// One weight matrix [rows (x2 for gate_up: gate rows, then up rows), k], rows of k * 2 (BF16), k (F8_E4M3)
// or k / 2 bytes (INT4, src/quant/int4.h's nibble order, with its scales and zero points beside it).
struct StackMatrix {
  const void* data = nullptr;
  const void* scale = nullptr;    // F8_E4M3: F32 [1] or per stored row; INT4: F16 [stored rows, k / group]
  const uint8_t* zero = nullptr;  // INT4: U8 zero points shaped as the scales, or null (symmetric: 8)
  const float* bias = nullptr;    // F32 per row of the stored matrix, or null
  int32_t rows = 0;               // output rows (gate_up: F, the matrix holds 2F)
  int32_t k = 0;
  uint8_t fp8 = 0;          // 1: F8_E4M3
  uint8_t int4 = 0;         // 1: INT4 (neither: BF16)
  uint8_t per_channel = 0;  // F8_E4M3: scale has one value per stored row
  uint8_t group_shift = 0;  // INT4: log2(group / 32), group 32, 64 or 128 columns per scale
};

namespace stack {

constexpr int kMaxUnits = 8;  // rows of a stage (gate and up rows both count)

// ---- stage geometry -------------------------------------------------------------------------------------
// A stage holds up to kMaxUnits whole rows (gate and up rows of the same outputs for the SiLU product),
// back to back; a row (or gate + up pair) longer than a stage is not taken (the host sizes stages for the
// longest row). A source's block of rs rows is its rs weight rows, then (INT4) their rs scale rows and rs
// zero-point rows, each part one bulk copy of contiguous rows (the scales are [rows, groups] row-major).
struct Geom {
  int32_t srcs;            // 1, or 2 for gate/up
  int32_t w_bytes;         // weight bytes of one source row
  int32_t s_bytes;         // INT4: scale bytes of one row (F16 per group); else 0
  int32_t z_bytes;         // INT4 with zero points: their bytes per row (U8 per group); else 0
  int32_t row_bytes;       // all three
  int32_t rows_per_stage;  // power of two, rows_per_stage * srcs <= kMaxUnits; 0: a row does not fit
};

INFERX_STACK_HD Geom stage_geometry(const StackMatrix& m, bool paired, int32_t stage_bytes) {
  Geom g;
  g.srcs = paired ? 2 : 1;
  g.w_bytes = m.int4 ? m.k / 2 : m.k * (m.fp8 ? 1 : 2);
  const int32_t groups = m.int4 ? m.k >> (5 + m.group_shift) : 0;
  g.s_bytes = groups * 2;
  g.z_bytes = m.int4 && m.zero != nullptr ? groups : 0;
  g.row_bytes = g.w_bytes + g.s_bytes + g.z_bytes;
  const int64_t fit = stage_bytes / (static_cast<int64_t>(g.row_bytes) * g.srcs);
  int rs = 1;
  while (rs * 2 <= fit && rs * 2 * g.srcs <= kMaxUnits) rs *= 2;
  g.rows_per_stage = fit >= 1 ? rs : 0;
  return g;
}

// Byte offsets in a stage of row i of source src: its weights, and (INT4) its scales and zero points.
struct StageRow {
  int64_t w, s, z;
};
INFERX_STACK_HD StageRow stage_row(const Geom& g, int src, int i) {
  const int64_t rs = g.rows_per_stage;
  const int64_t block = src * rs * g.row_bytes;
  return StageRow{block + i * static_cast<int64_t>(g.w_bytes), block + rs * g.w_bytes + i * g.s_bytes,
                  block + rs * (g.w_bytes + g.s_bytes) + i * g.z_bytes};
}

// ---- INT4 ------------------------------------------------------------------------------------------------
// A 16-byte vector is 32 columns of one group: byte j holds column j in its low nibble and column 16 + j in
// its high one (src/quant/int4.h). A code becomes a float by the exponent trick: byte b of a word of nibbles,
// put under 0x4B000000 (PRMT on the GPU), reads as 2^23 + code, so one subtraction of off = 2^23 + zero
// leaves code - zero exactly (full-rate instructions, where I2F runs at a quarter of the rate).
INFERX_STACK_HD float int4_code_plus_2p23(uint32_t nibbles, int b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(__byte_perm(nibbles, 0x4B000000u, 0x7440u | static_cast<uint32_t>(b)));
#else
  return bits_to_f32(0x4B000000u | ((nibbles >> (8 * b)) & 0xffu));
#endif
}
INFERX_STACK_HD float bf16_bits_to_float(uint32_t bits16) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits16 << 16);
#else
  return bf16_to_f32(static_cast<uint16_t>(bits16));
#endif
}

// x in shared memory as a phase's product loop reads it. A lane takes 16-byte weight vectors of
// x_chunks(m) x 8 columns (BF16: 8 columns, 1 chunk; FP8: 16, 2; INT4: 32, 4), and x is laid out chunk-major
// over nv = k / (8 chunks) vectors: the q-th 8 columns (16 bytes of BF16) of every vector together - element
// i of vector v = i / (8 chunks), chunk q = i / 8 % chunks, at (q * nv + v) * 8 + i % 8 (with 1 chunk,
// column order). A quarter-warp's lanes read the same chunk of consecutive vectors, 16 consecutive bytes
// apart: conflict-free. In column order a lane's x is 16 x chunks bytes, so FP8's and INT4's 16-byte loads
// were 2-way and 4-way bank conflicts.
INFERX_STACK_HD int32_t x_chunks(const StackMatrix& m) { return m.int4 ? 4 : m.fp8 ? 2 : 1; }
INFERX_STACK_HD int32_t x_chunked_index(int32_t i, int32_t nv, int32_t chunks) {
  return ((i / 8 % chunks) * nv + i / (8 * chunks)) * 8 + i % 8;
}

// sum over the vector's 32 columns of (code - zero) * x, with w its four words, x its 32 BF16 values as 16
// words of two (columns 0..31 in order), off = 2^23 + zero. Two partial sums (low and high nibbles).
INFERX_STACK_HD float int4_vector_dot(const uint32_t (&w)[4], const uint32_t (&x)[16], float off) {
  float a0 = 0.0f, a1 = 0.0f;
  INFERX_STACK_UNROLL
  for (int j = 0; j < 4; ++j) {  // word j: columns 4j .. 4j + 3 (low nibbles) and 16 + 4j .. (high)
    const uint32_t lo = w[j] & 0x0F0F0F0Fu, hi = (w[j] >> 4) & 0x0F0F0F0Fu;
    INFERX_STACK_UNROLL
    for (int b = 0; b < 4; ++b) {
      const int c = 4 * j + b;
      const uint32_t xl = x[c / 2], xh = x[8 + c / 2];
      const float xlo = bf16_bits_to_float(c % 2 ? xl >> 16 : xl & 0xffffu);
      const float xhi = bf16_bits_to_float(c % 2 ? xh >> 16 : xh & 0xffffu);
      a0 += (int4_code_plus_2p23(lo, b) - off) * xlo;
      a1 += (int4_code_plus_2p23(hi, b) - off) * xhi;
    }
  }
  return a0 + a1;
}

}  // namespace stack
}  // namespace inferx::cuda
