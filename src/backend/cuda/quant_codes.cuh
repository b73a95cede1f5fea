#pragma once
// Device pieces the FP8 activation passes share (kernels_quant.cu: the separate quantization and W8A8
// epilogue; kernels_quant_fused.cu: the same work folded into the norm and the SiLU pass), so that the fused
// passes compute exactly the codes, scales and values of the separate ones.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels_quant.h"
#include "backend/cuda/kernels_quant_math.h"

namespace inferx::cuda {

constexpr float kFp8Max = 448.0f;  // quant/fp8.h: the largest finite E4M3 value

// Per-token E4M3 quantization (quant/fp8.h convention): the row's scale from its largest |x| (1 for an
// all-zero row), its IEEE reciprocal, and a value's code from the reciprocal (one rounded product, round to
// nearest even, saturating). A multiplication, not a division per value: the FP8 SiLU pass is bound by its
// per-value instructions (H200 ncu 2026-12-04: 61% SM throughput at 45% of DRAM at 8192 rows), and an IEEE
// division is a ~10-instruction sequence with a slow path. The CPU reference multiplies the same way.
__device__ __forceinline__ float fp8_row_scale(float amax) {
  return amax > 0.0f ? __fdiv_rn(amax, kFp8Max) : 1.0f;
}
__device__ __forceinline__ float fp8_inverse(float s) { return __frcp_rn(s); }
__device__ __forceinline__ uint8_t fp8_code(float v, float inv) { return float_to_fp8(__fmul_rn(v, inv)); }
// Four codes as one 32-bit store, the first at the lowest address.
__device__ __forceinline__ uint32_t pack_codes(uint8_t c0, uint8_t c1, uint8_t c2, uint8_t c3) {
  return static_cast<uint32_t>(c0) | static_cast<uint32_t>(c1) << 8 | static_cast<uint32_t>(c2) << 16 |
         static_cast<uint32_t>(c3) << 24;
}
// Four values' codes (fp8_code with the row's reciprocal inv) packed the same way, converted two at a time
// (cvt.rn.satfinite.e4m3x2.f32: the same rounding and saturation as one at a time, half the instructions;
// the FP8 passes are bound by their per-value instructions).
__device__ __forceinline__ uint32_t fp8_codes4(float v0, float v1, float v2, float v3, float inv) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(v0, inv), __fmul_rn(v1, inv)),
                                               __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(v2, inv), __fmul_rn(v3, inv)),
                                               __NV_SATFINITE, __NV_E4M3);
  return lo | hi << 16;
}
__device__ __forceinline__ float abs_max4(const float4& v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// The W8A8 value of one output from its unscaled FP8 product a: row scale xs, the column's weight scale ws
// and bias bs (0 when absent). The rounding steps are pinned (no contraction left to the compiler), so the
// epilogue and the norm that adds a deferred product's values (kernels_quant_fused.cu) agree to the bit.
__device__ __forceinline__ float w8a8_value(float a, float xs, float ws, float bs) {
  return __fmaf_rn(__fmul_rn(a, xs), ws, bs);
}
// The same for column c of a product the epilogue e describes (its row's scale xs), for the kernels that
// read a deferred product's sums instead of its output.
__device__ __forceinline__ float w8a8_value(const Fp8Epilogue& e, float a, float xs, int64_t c) {
  return w8a8_value(a, xs, e.w_scale[e.per_channel ? c : 0], e.bias ? e.bias[c] : 0.0f);
}
// SiLU with the fast exponential and division (ex2.approx and a reciprocal, a few ulp): the FP8 passes round
// the product to E4M3 (2^-4) right after, and the SiLU pass was bound by its per-value arithmetic, not its
// loads (H200 2026-12-04: all of a row's loads in flight made it slower); measured together with the pass's
// other changes (kernels_quant_fused.cu), not alone. Every FP8 path (epilogue and fused pass) uses this one.
// The .ftz forms: __expf and __fdividef without flush-to-zero keep range checks and rescaling for denormal
// results and huge divisors (~6 instructions per value, SASS 2026-12-06); here they change nothing that
// survives: a denormal e^-g is negligible beside 1, and g / (1 + e^-g) for g < -87 is below E4M3's
// smallest code after any row scale (it rounds to zero either way; the zero may now carry g's sign).
__device__ __forceinline__ float silu_fast(float g) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(g * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return g * r;
}
// The W8A8 SiLU * up value of one gate / up column pair from the unscaled FP8 products a, b.
__device__ __forceinline__ float w8a8_silu_up(float a, float b, float xs, float ws, float bs, float ws2,
                                              float bs2) {
  return silu_fast(w8a8_value(a, xs, ws, bs)) * w8a8_value(b, xs, ws2, bs2);
}

// ---- the W8A8 decode products (GEMV v5, kernels_gemv_tc_stream.cu; the persistent decode kernel's FP8
// phases, kernels_decode_stack.cu): 8 BF16 activations (one 16-byte load) at a time, and the E4M3 product.
__device__ __forceinline__ float abs_max_bf16x8(const uint4& v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    m = fmaxf(m, fmaxf(fabsf(__uint_as_float(w[i] << 16)), fabsf(__uint_as_float(w[i] & 0xffff0000u))));
  return m;
}
// Their E4M3 codes (fp8_code with the row's reciprocal scale), the first at the lowest address.
__device__ __forceinline__ uint2 codes_bf16x8(const uint4& v, float inv) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float f[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
  return make_uint2(fp8_codes4(f[0], f[1], f[2], f[3], inv), fp8_codes4(f[4], f[5], f[6], f[7], inv));
}
// D += A B on tensor cores, E4M3 operands, F32 sums (PTX ISA mma.m16n8k32 fragment layout).
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// V consecutive accumulator values (F32, or BF16 when the FP8 GEMM wrote BF16) as floats; V = 4 is one
// vector load (16 / 8 bytes, aligned: the launchers check).
template <int V, class T>
__device__ __forceinline__ void load_v(const T* p, float (&v)[V]) {
  struct alignas(V * sizeof(T)) Vec {
    T e[V];
  };
  const Vec q = *reinterpret_cast<const Vec*>(p);
#pragma unroll
  for (int u = 0; u < V; ++u) v[u] = to_float(q.e[u]);
}

}  // namespace inferx::cuda
