#pragma once
// The weight decoders of the v2 decode GEMV (kernels_gemv.cu) as host+device functions: the kernel runs
// them on the device, and tests/cuda/cuda_gemv_test.cpp runs the very same code on the host against
// quant/'s reference dequantizers. A lane of the v2 kernel takes 8 consecutive columns per step s
// (columns 8s..8s+7), so that the 32 lanes of a warp read 512 contiguous bytes of x per load (the v1
// kernel's lanes read x at the stride of a whole granule: 4 to 8 times the L1 wavefronts). Each function
// below gives the byte offset of step s's weight bytes in a row and turns them into 8 exact floats
// without integer-to-float conversions: a byte v < 2^23 or'ed into the bits of 2^23 (0x4B000000) is the
// float 2^23 + v, and subtracting 2^23 + z leaves v - z exactly.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define INFERX_GEMV_HD __host__ __device__ __forceinline__
#else
#define INFERX_GEMV_HD inline
#endif
// Full unrolling where the selectors of byte_perm must become immediates (host compilers: no pragma).
#if defined(__CUDA_ARCH__)
#define INFERX_GEMV_UNROLL _Pragma("unroll")
#else
#define INFERX_GEMV_UNROLL
#endif

namespace inferx::cuda::gemv {

constexpr uint32_t kMagicBits = 0x4B000000u;  // 2^23
constexpr float kMagic = 8388608.0f;

INFERX_GEMV_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// 2^23 + v for v < 2^23 (an integer, exact).
INFERX_GEMV_HD float magic(uint32_t v) { return bits_float(kMagicBits | v); }

// PRMT (__byte_perm): byte i of the result is byte (selector nibble i) & 7 of the 8 bytes {hi, lo}
// (lo the low 4). The host emulation runs the same selectors in the tests (sign mode, bit 3, is unused).
INFERX_GEMV_HD uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(lo, hi, selector);
#else
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<uint32_t>((v >> (8 * ((selector >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
#endif
}

// The four bytes of w (little-endian order) as 2^23 + byte: one PRMT each (byte b of w, then bytes 0, 1
// and 3 of 0x4B000000).
INFERX_GEMV_HD void bytes_magic(uint32_t w, float* out) {
  out[0] = bits_float(byte_perm(w, kMagicBits, 0x7540u));
  out[1] = bits_float(byte_perm(w, kMagicBits, 0x7541u));
  out[2] = bits_float(byte_perm(w, kMagicBits, 0x7542u));
  out[3] = bits_float(byte_perm(w, kMagicBits, 0x7543u));
}

INFERX_GEMV_HD float half_float(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}

// The offsets below are linear in steps of 32 (a warp's lanes take steps s0 + 32u): the weight bytes of
// step s + 32u lie u * k*Stride bytes after those of step s, and the shifts / sub-blocks depend on s & 31.
constexpr int kFp8Stride = 256, kInt4Stride = 128, kQ8_0Stride = 8 * 34, kQ4KStride = 144;

// ---- F8_E4M3: row bytes 8s..8s+7 (code e in byte e of lo, hi); E4M3 -> F16 is exact, two per cvt.
INFERX_GEMV_HD int64_t fp8_offset(int64_t s) { return 8 * s; }
INFERX_GEMV_HD void fp8x8(uint32_t lo, uint32_t hi, float* out) {
  const uint32_t words[2] = {lo, hi};
  for (int i = 0; i < 2; ++i) {
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>((words[i] >> (16 * h)) & 0xffffu);
      const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      out[4 * i + 2 * h] = half_float(r.x);
      out[4 * i + 2 * h + 1] = half_float(r.y);
    }
  }
}

// ---- INT4 (quant/int4.h): a 32-column run is 16 bytes, byte b holding column b (low nibble) and
// 16 + b (high). Step s is quarter j = s & 3 of run s >> 2: columns 8j..8j+7 of the run are the low
// (j < 2) or high (j >= 2) nibbles of the run's bytes 8 (j & 1)..+7. The group of step s is
// s >> (log2(group) - 3).
INFERX_GEMV_HD int64_t int4_offset(int64_t s) { return 16 * (s >> 2) + 8 * (s & 1); }
INFERX_GEMV_HD uint32_t int4_shift(int64_t s) { return static_cast<uint32_t>((s & 2) << 1); }  // 0 or 4
// out[e] = code_e - zero, exact; bias = magic(zero) = 2^23 + zero.
INFERX_GEMV_HD void int4x8(uint32_t lo, uint32_t hi, uint32_t shift, float bias, float* out) {
  bytes_magic((lo >> shift) & 0x0f0f0f0fu, out);
  bytes_magic((hi >> shift) & 0x0f0f0f0fu, out + 4);
  for (int e = 0; e < 8; ++e) out[e] -= bias;
}

// ---- v4 INT4 (kernels_gemv.cu StreamInt4): a lane multiplies a whole 32-column run (16 bytes) per step,
// with no conversion and no subtraction per weight. A byte b < 16 placed by one PRMT as the third byte of
// a float whose top byte is 0x3F (bits 0x3F'b'0000) is 0.5 + b / 256 = (128 + b) / 256 exactly, so with
// f_j that value of column j's code, the run's S = sum_j f_j x_j and X = sum_j x_j,
//   sum_j (code_j - z) x_j = 256 (S - f(z) X),   f(z) = (128 + z) / 256 (the same placement of z).
// int4_run_dot computes S - f(z) X by starting its chain of 32 FMAs at -f(z) X; the kernel multiplies it
// by the group scale and the row's sum by 256 (exact). Per weight: one PRMT, one FFMA and 3/8 of a LOP3 /
// shift (the nibble masks, one or two per 4-byte word).
constexpr uint32_t kHalfBits = 0x3F000000u;  // 0.5

// (128 + byte i of n) / 256 for a byte below 16: bytes 0, 1 of the result from kHalfBits' byte 0 (zero),
// byte 2 from n, byte 3 from kHalfBits' byte 3 (0x3F).
INFERX_GEMV_HD float int4_half(uint32_t n, uint32_t i) {
  return bits_float(byte_perm(n, kHalfBits, 0x7044u | i << 8));
}

// S - f(z) X of a run (words v[0..3]: byte b holds column b in its low nibble and 16 + b in its high one;
// x: its 32 columns) given start = -f(z) X; columns in order 0..31.
INFERX_GEMV_HD float int4_run_dot(const uint32_t (&v)[4], const float* x, float start) {
  float s = start;
  INFERX_GEMV_UNROLL
  for (int w = 0; w < 4; ++w) {
    const uint32_t lo = v[w] & 0x0f0f0f0fu;
    INFERX_GEMV_UNROLL
    for (uint32_t b = 0; b < 4; ++b) s = fmaf(int4_half(lo, b), x[4 * w + b], s);
  }
  INFERX_GEMV_UNROLL
  for (int w = 0; w < 4; ++w) {
    const uint32_t hi = (v[w] >> 4) & 0x0f0f0f0fu;
    INFERX_GEMV_UNROLL
    for (uint32_t b = 0; b < 4; ++b) s = fmaf(int4_half(hi, b), x[16 + 4 * w + b], s);
  }
  return s;
}

// X of a run of 32 columns, pairwise (the order the kernel and the tests share).
INFERX_GEMV_HD float int4_run_sum(const float* x) {
  float t[16];
  INFERX_GEMV_UNROLL
  for (int i = 0; i < 16; ++i) t[i] = x[i] + x[16 + i];
  INFERX_GEMV_UNROLL
  for (int i = 0; i < 8; ++i) t[i] += t[8 + i];
  INFERX_GEMV_UNROLL
  for (int i = 0; i < 4; ++i) t[i] += t[4 + i];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// A run's group scale (F16 bits) and zero point in one word, as the kernel carries them: scale | z << 16.
INFERX_GEMV_HD uint32_t int4_scale_zero(uint32_t scale_bits, uint32_t zero) {
  return byte_perm(scale_bits, zero, 0x5410u);
}
// The run's contribution to its row's sum before the final factor 256: scale * (S - f(z) X).
INFERX_GEMV_HD float int4_run_term(const uint32_t (&v)[4], uint32_t sz, const float* x, float xsum,
                                   float acc) {
  const float fz = bits_float(byte_perm(sz, kHalfBits, 0x7244u));  // (128 + z) / 256: byte 2 of sz is z
  return fmaf(half_float(static_cast<uint16_t>(sz & 0xffffu)), int4_run_dot(v, x, -fz * xsum), acc);
}
constexpr float kInt4RunFactor = 256.0f;

// ---- GGUF Q8_0: 34-byte blocks (f16 d, 32 int8); step s is quants 8 (s & 3)..+7 of block s >> 2.
INFERX_GEMV_HD int64_t q8_0_block_offset(int64_t s) { return 34 * (s >> 2); }
INFERX_GEMV_HD int64_t q8_0_offset(int64_t s) { return 34 * (s >> 2) + 2 + 8 * (s & 3); }
// out[e] = int8 quant e, exact: q ^ 0x80 is q + 128 as an unsigned byte.
INFERX_GEMV_HD void q8x8(uint32_t lo, uint32_t hi, float* out) {
  bytes_magic(lo ^ 0x80808080u, out);
  bytes_magic(hi ^ 0x80808080u, out + 4);
  for (int e = 0; e < 8; ++e) out[e] -= kMagic + 128.0f;
}

// ---- GGUF Q4_K: 144-byte super-blocks of 256 (f16 d, f16 dmin, 12 bytes of 6-bit scales / mins, 128
// bytes of quants). Step s is columns 8t..8t+7 (t = s & 31) of block s >> 5: sub-block j = t >> 2, the
// low (j even) or high (j odd) nibbles of quant bytes 32 (t >> 3) + 8 (t & 3)..+7.
INFERX_GEMV_HD int64_t q4_k_block_offset(int64_t s) { return 144 * (s >> 5); }
INFERX_GEMV_HD int64_t q4_k_offset(int64_t s) {
  return 144 * (s >> 5) + 16 + 32 * ((s & 31) >> 3) + 8 * (s & 3);
}
INFERX_GEMV_HD uint32_t q4_k_shift(int64_t s) { return static_cast<uint32_t>(((s >> 2) & 1) << 2); }
INFERX_GEMV_HD int q4_k_sub_block(int64_t s) { return static_cast<int>((s & 31) >> 2); }
// Sub-block j's scale and min (unpack_q4_k_scales) from the block's first 16 bytes as words h0..h3, as
// floats: *scale = d * sc, *min = dmin * m (the values quant/'s dequantizer uses).
INFERX_GEMV_HD void q4_k_scale_min(uint32_t h0, uint32_t h1, uint32_t h2, uint32_t h3, int j, float* scale,
                                   float* min) {
  const float d = half_float(static_cast<uint16_t>(h0 & 0xffffu));
  const float dmin = half_float(static_cast<uint16_t>(h0 >> 16));
  // Scale bytes s[0..11] are h1, h2, h3 (little-endian). j < 4: sc = s[j] & 63, m = s[j + 4] & 63;
  // j >= 4: sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4, m = (s[j + 4] >> 4) | (s[j] >> 6) << 4.
  const uint32_t sh = 8u * static_cast<uint32_t>(j & 3);
  const uint32_t b1 = (h1 >> sh) & 0xffu, b2 = (h2 >> sh) & 0xffu, b3 = (h3 >> sh) & 0xffu;
  const uint32_t a = j < 4 ? b1 & 63u : (b3 & 15u) | ((b1 >> 6) << 4);
  const uint32_t b = j < 4 ? b2 & 63u : (b3 >> 4) | ((b2 >> 6) << 4);
  *scale = d * (magic(a) - kMagic);
  *min = dmin * (magic(b) - kMagic);
}
// out[e] = quant e (0..15), exact.
INFERX_GEMV_HD void q4_k_x8(uint32_t lo, uint32_t hi, uint32_t shift, float* out) {
  int4x8(lo, hi, shift, kMagic, out);
}

// ---- v3 (tensor cores, kernels_gemv.cu): a lane's 16-byte chunk of a weight row becomes its part of the
// A operand of mma.m16n8k16 (BF16 in, F32 accumulate) as exact BF16 values: BF16 itself, E4M3 codes,
// INT4 codes minus their zero point (the INT4 group scale multiplies the F32 product instead). Product j
// of a chunk covers its 4-column piece piece(j): frag[j][0] holds columns 4p, 4p + 1 (k-slots 2t, 2t + 1
// of lane t) and frag[j][1] columns 4p + 2, 4p + 3 (k-slots 2t + 8, 2t + 9); x's B fragment takes the
// same columns in their natural order (two 32-bit words of x), so K is permuted alike on both sides.

// BF16 pair arithmetic (round to nearest; every use below is exact). The host versions run the tests.
INFERX_GEMV_HD float bf16_bits_float(uint32_t b) { return bits_float(b << 16); }
INFERX_GEMV_HD uint32_t float_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even (no NaN here)
}
// a * b (kSub false) or a - b (true) on both BF16 halves.
template <bool kSub>
INFERX_GEMV_HD uint32_t bf16x2_arith(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  __nv_bfloat162 x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  const __nv_bfloat162 r = kSub ? __hsub2(x, y) : __hmul2(x, y);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return u;
#else
  const auto op = [](float u, float v) { return kSub ? u - v : u * v; };
  return float_bf16_bits(op(bf16_bits_float(a & 0xffffu), bf16_bits_float(b & 0xffffu))) |
         float_bf16_bits(op(bf16_bits_float(a >> 16), bf16_bits_float(b >> 16))) << 16;
#endif
}
INFERX_GEMV_HD uint32_t bf16x2_mul(uint32_t a, uint32_t b) { return bf16x2_arith<false>(a, b); }
INFERX_GEMV_HD uint32_t bf16x2_sub(uint32_t a, uint32_t b) { return bf16x2_arith<true>(a, b); }

// E4M3 -> BF16, exact. E4M3 -> F16 is one cvt for two codes; an F16 whose low 7 mantissa bits are zero
// (every E4M3 value) shifted right by 3, its sign left in place, is the BF16 of value * 2^-112, a normal
// number (E4M3's smallest, 2^-9, is an F16 normal), so one BF16 multiply by 2^112 (0x7780) restores it
// exactly; zeros stay zeros.
INFERX_GEMV_HD uint32_t f16x2_e4m3_bf16x2(uint32_t h) {
  return bf16x2_mul(((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u), 0x77807780u);
}
// Codes 0, 1 of v (bytes 0 and 1) to lo, codes 2, 3 to hi, as BF16 pairs (low half first).
INFERX_GEMV_HD void e4m3x4_bf16x4(uint32_t v, uint32_t& lo, uint32_t& hi) {
  uint32_t h0, h1;
#if defined(__CUDA_ARCH__)
  asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;}"
      : "=r"(h0), "=r"(h1)
      : "r"(v));
#else
  const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v >> 16), __NV_E4M3);
  h0 = static_cast<uint32_t>(a.x) | static_cast<uint32_t>(a.y) << 16;
  h1 = static_cast<uint32_t>(b.x) | static_cast<uint32_t>(b.y) << 16;
#endif
  lo = f16x2_e4m3_bf16x2(h0);
  hi = f16x2_e4m3_bf16x2(h1);
}

// (a & m) | c in one LOP3 (the compiler, given two immediates, emits two).
INFERX_GEMV_HD uint32_t and_or(uint32_t a, uint32_t m, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "r"(m), "r"(c));  // 0xea: (a & b) | c
  return r;
#else
  return (a & m) | c;
#endif
}

// The BF16 pair 128 + z (z < 128): subtracted from 128 + code it leaves code - z exactly.
INFERX_GEMV_HD uint32_t int4_zero_pair(uint32_t z) { return (0x4300u + z) * 0x10001u; }

// Word q of an INT4 run (bytes 4w..4w+3: columns 4w..4w+3 in the low nibbles, 16 + 4w.. in the high ones)
// as BF16 pairs code - z: lo = columns (4w, 4w+1), (4w+2, 4w+3); hi = the same 16 columns on. A byte
// permute puts two code bytes under 0x43 (the BF16 exponent of 128, whose last bit is 1 code), a mask
// keeps the low nibbles (128 + code), a shift by 4 brings the high ones down.
INFERX_GEMV_HD void int4_word_bf16(uint32_t q, uint32_t zz, uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  const uint32_t t01 = byte_perm(q, 0x43u, 0x4140u), t23 = byte_perm(q, 0x43u, 0x4342u);
  lo[0] = bf16x2_sub(t01 & 0xff0fff0fu, zz);
  lo[1] = bf16x2_sub(t23 & 0xff0fff0fu, zz);
  hi[0] = bf16x2_sub(and_or(t01 >> 4, 0x000f000fu, 0x43004300u), zz);
  hi[1] = bf16x2_sub(and_or(t23 >> 4, 0x000f000fu, 0x43004300u), zz);
}

// The fragments of a chunk (words v[0..3]) and the piece each covers.
struct TcBf16 {
  static constexpr int kCols = 8, kMmas = 2;
  static constexpr int piece(int j) { return j; }
  INFERX_GEMV_HD static void decode(const uint32_t (&v)[4], uint32_t, uint32_t (&b)[kMmas][2]) {
    for (int j = 0; j < kMmas; ++j) {
      b[j][0] = v[2 * j];
      b[j][1] = v[2 * j + 1];
    }
  }
};
struct TcFp8 {
  static constexpr int kCols = 16, kMmas = 4;
  static constexpr int piece(int j) { return j; }
  INFERX_GEMV_HD static void decode(const uint32_t (&v)[4], uint32_t, uint32_t (&b)[kMmas][2]) {
    for (int j = 0; j < kMmas; ++j) e4m3x4_bf16x4(v[j], b[j][0], b[j][1]);
  }
};
// zz: int4_zero_pair of the chunk's zero point. Products 2w, 2w + 1: word w's low and high nibbles.
struct TcInt4 {
  static constexpr int kCols = 32, kMmas = 8;
  static constexpr int piece(int j) { return (j & 1) * 4 + (j >> 1); }
  INFERX_GEMV_HD static void decode(const uint32_t (&v)[4], uint32_t zz, uint32_t (&b)[kMmas][2]) {
    for (int w = 0; w < 4; ++w) int4_word_bf16(v[w], zz, b[2 * w], b[2 * w + 1]);
  }
};

// A CTA of the v3 kernel computes 16 weight rows (the m of m16n8k16: lane (g, t) = (lane / 4, lane % 4)
// reads rows g and g + 8) over sets of 4 chunks, chunk 4c + t for lane t. x is the B operand: column n
// (0..7, and 8..15 in a second product) holds activation row n / S restricted to the columns of subset
// n % S, where the S subsets split a set's chunks by INT4 group (S = 128 / group; 1 for BF16 and FP8),
// so that a product's sum never mixes two groups and the group scale can multiply it. Lane t's chunk
// belongs to subset tc_subset(t, S).
INFERX_GEMV_HD int tc_subset(int t, int subsets) { return t * subsets / 4; }

}  // namespace inferx::cuda::gemv
