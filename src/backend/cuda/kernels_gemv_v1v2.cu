// GEMV v1 (one warp per output row, v1's decoders element by element) and v2 (8 columns per lane and step,
// block scales once per step); the overview and the choice between the kernels: kernels_gemv.cu.
#include "backend/cuda/kernels_gemv_impl.cuh"

namespace inferx::cuda::gemv_impl {
namespace {

template <class Dec, int MR, int R, int U>
__device__ __forceinline__ void dot_granules(const GemvParams& p, const typename Dec::Raw (&raw)[R][U],
                                             int64_t g0, int64_t granules, float (&acc)[R][MR]) {
  constexpr int E = Dec::kElems;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t g = g0 + static_cast<int64_t>(kWarp) * u;
    if (g >= granules) break;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float w[E];
      Dec::expand(p, raw[r][u], w);
#pragma unroll
      for (int i = 0; i < MR; ++i) {
        if (i < p.m) {
          const uint4* xp = reinterpret_cast<const uint4*>(p.x + i * p.k + g * E);
#pragma unroll
          for (int c = 0; c < E / 8; ++c) {
            float xv[8];
            bf16x8_to_float(__ldg(xp + c), xv);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][i] = fmaf(w[8 * c + e], xv[e], acc[r][i]);
          }
        }
      }
    }
  }
}

// R = 1: warp row n of the weight; R = 2: rows n (gate) and f + n (up), written as silu(g) * u.
template <class Dec, int MR, int R>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const GemvParams p) {
  constexpr int E = Dec::kElems, U = Dec::kUnroll;
  const int lane = threadIdx.x % kWarp;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  if (n >= p.rows) return;
  int64_t wrow[R];
  warp_rows<R, R == 2>(p, n, wrow);
  bool waited = false;  // the first batch of weight loads is issued before waiting for x (cuda_common.cuh)
  float acc[R][MR];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MR; ++i) acc[r][i] = 0.0f;

  const int64_t granules = p.k / E;
  for (int64_t g0 = lane; g0 < granules; g0 += kWarp * U) {
    typename Dec::Raw raw[R][U];
    load_granules<Dec, R, U>(p, wrow, g0, granules, raw);
    if (!waited) {
      pdl_wait();
      waited = true;
    }
    dot_granules<Dec, MR, R, U>(p, raw, g0, granules, acc);
  }
  if (!waited) pdl_wait();  // no granule for this lane: it still stores (lane 0) after the wait
  pdl_launch_dependents();  // after the weight stream (see the file comment)
  gemv_finish<Dec, MR, R, R == 2>(p, n, wrow, acc, 1);
}

// ---- v2: 8 columns per lane and step (kernels_gemv_decode.h). The lanes of a warp read 512 contiguous
// bytes of x per load (v1: a granule's 32 to 128 bytes per lane, at the granule's stride: 4 to 16 L1
// wavefronts per load where 4 suffice), weights decode without integer-to-float conversions, and the
// INT4 / Q8_0 / Q4_K block scales multiply the step's 8-term partial sum once (v1: every element).
// decode() turns a step's raw bytes into W; dot() adds W . x (8 columns of one row of x) to acc.

struct StepW {
  float w[8];
  float scale, min;
};

// A decoder's Row is a lane's cursor at its first step s0 of a batch in one weight row: the weight bytes
// of step s0 + 32u lie u * kStride bytes further (kernels_gemv_decode.h's offsets are linear in steps of
// 32), and everything decode() derives from the step depends only on s & 31, the lane's, so s0 serves.
struct StepFp8 {
  static constexpr int kUnroll = 16, kStride = gemv::kFp8Stride;
  struct Raw {
    uint2 v;
  };
  struct Row {
    const uint8_t* w;
  };
  __device__ static Row row(const GemvParams& p, int64_t n, int s0) {
    return {p.w + n * p.row_bytes + gemv::fp8_offset(s0)};
  }
  __device__ static Raw load(const Row& c, int u) { return {load_stream8(c.w + u * kStride)}; }
  __device__ static void decode(const Raw& r, int, StepW& w) { gemv::fp8x8(r.v.x, r.v.y, w.w); }
  __device__ static void dot(const StepW& w, const float* x, float& acc) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(w.w[e], x[e], acc);
  }
  __device__ static float row_scale(const GemvParams& p, int64_t n) { return DecodeFp8::row_scale(p, n); }
};

// The step's partial sum times the step's block scale.
__device__ __forceinline__ void dot_scaled(const StepW& w, const float* x, float& acc) {
  float part = w.w[0] * x[0];
#pragma unroll
  for (int e = 1; e < 8; ++e) part = fmaf(w.w[e], x[e], part);
  acc = fmaf(part, w.scale, acc);
}

// SH = log2(group / 8): a group is 2^SH steps, 32 steps span 32 >> SH groups (a template parameter so
// that the scale / zero point loads of a batch are immediate offsets).
template <int SH>
struct StepInt4 {
  static constexpr int kUnroll = 16, kStride = gemv::kInt4Stride, kGroupStride = kWarp >> SH;
  struct Raw {
    uint2 v;
    uint32_t sz;  // the group's F16 scale bits | its zero point << 16 (one register of the batch's 16)
  };
  struct Row {
    const uint8_t* w;
    const unsigned short* scale;  // the group of step s0; step s0 + 32u: u * kGroupStride further
    const uint8_t* zero;          // the same, or null
  };
  __device__ static Row row(const GemvParams& p, int64_t n, int s0) {
    const int64_t at = n * p.groups_per_row + (s0 >> SH);
    return {p.w + n * p.row_bytes + gemv::int4_offset(s0), static_cast<const unsigned short*>(p.scale) + at,
            p.zero ? p.zero + at : nullptr};
  }
  __device__ static Raw load(const Row& c, int u) {
    Raw r;
    r.v = load_stream8(c.w + u * kStride);
    const uint32_t zero = c.zero ? static_cast<uint32_t>(__ldg(c.zero + u * kGroupStride)) : 8u;
    r.sz = static_cast<uint32_t>(__ldg(c.scale + u * kGroupStride)) | (zero << 16);
    return r;
  }
  __device__ static void decode(const Raw& r, int s0, StepW& w) {
    gemv::int4x8(r.v.x, r.v.y, gemv::int4_shift(s0), gemv::magic(r.sz >> 16), w.w);
    w.scale = gemv::half_float(static_cast<uint16_t>(r.sz & 0xffffu));
  }
  __device__ static void dot(const StepW& w, const float* x, float& acc) { dot_scaled(w, x, acc); }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

struct StepQ8_0 {
  static constexpr int kUnroll = 8, kStride = gemv::kQ8_0Stride;
  struct Raw {
    uint32_t d, q[4];  // f16 bits of the block scale; the step's 8 quants as 4 halfwords
  };
  struct Row {
    const uint8_t* d;  // the block of step s0
    const uint8_t* q;  // its 8 quants
  };
  __device__ static Row row(const GemvParams& p, int64_t n, int s0) {
    const uint8_t* r = p.w + n * p.row_bytes;
    return {r + gemv::q8_0_block_offset(s0), r + gemv::q8_0_offset(s0)};
  }
  __device__ static Raw load(const Row& c, int u) {
    Raw r;
    r.d = __ldg(reinterpret_cast<const unsigned short*>(c.d + u * kStride));
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = load_stream2(c.q + u * kStride + 2 * i);
    return r;
  }
  __device__ static void decode(const Raw& r, int, StepW& w) {
    gemv::q8x8(r.q[0] | (r.q[1] << 16), r.q[2] | (r.q[3] << 16), w.w);
    w.scale = gemv::half_float(static_cast<uint16_t>(r.d));
  }
  __device__ static void dot(const StepW& w, const float* x, float& acc) { dot_scaled(w, x, acc); }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

struct StepQ4K {
  static constexpr int kUnroll = 8, kStride = gemv::kQ4KStride;
  struct Raw {
    uint4 head;  // d, dmin, the 12 scale bytes: one block for the whole warp's step (cached)
    uint2 v;
  };
  struct Row {
    const uint8_t* head;  // the block of step s0
    const uint8_t* q;     // its 8 quant bytes
  };
  __device__ static Row row(const GemvParams& p, int64_t n, int s0) {
    const uint8_t* r = p.w + n * p.row_bytes;
    return {r + gemv::q4_k_block_offset(s0), r + gemv::q4_k_offset(s0)};
  }
  __device__ static Raw load(const Row& c, int u) {
    Raw r;
    r.head = __ldg(reinterpret_cast<const uint4*>(c.head + u * kStride));
    r.v = load_stream8(c.q + u * kStride);
    return r;
  }
  __device__ static void decode(const Raw& r, int s0, StepW& w) {
    gemv::q4_k_x8(r.v.x, r.v.y, gemv::q4_k_shift(s0), w.w);
    gemv::q4_k_scale_min(r.head.x, r.head.y, r.head.z, r.head.w, gemv::q4_k_sub_block(s0), &w.scale, &w.min);
  }
  // sum (scale q - min) x = scale (sum q x) - min (sum x)
  __device__ static void dot(const StepW& w, const float* x, float& acc) {
    float part = w.w[0] * x[0], sx = x[0];
#pragma unroll
    for (int e = 1; e < 8; ++e) {
      part = fmaf(w.w[e], x[e], part);
      sx += x[e];
    }
    acc = fmaf(part, w.scale, fmaf(-w.min, sx, acc));
  }
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

// kSilu (R = 2): warp n takes rows n (gate) and f + n (up), written as silu(g) * u. Else warp n takes the
// R rows Rn.. of the weight (those below p.rows; a missing second row reads the first again, unstored).
// Lane l takes steps l, l + 32, ... (8 columns each); the weight loads of kUnroll (R = 2: half as many)
// steps are issued before any is decoded; x is read once per step and row of x for the R weight rows.
template <class Dec, int MR, int R, bool kSilu>
__global__ void __launch_bounds__(kGemvThreads) gemv8_kernel(const GemvParams p) {
  constexpr int U = R == 1 ? Dec::kUnroll : Dec::kUnroll / 2;
  const int lane = threadIdx.x % kWarp;
  bool waited = false;  // as gemv_kernel: the first weight loads go out before the wait
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  if (n >= warp_row_count<R, kSilu>(p)) return;
  int64_t wrow[R];
  const int valid = warp_rows<R, kSilu>(p, n, wrow);
  float acc[R][MR];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MR; ++i) acc[r][i] = 0.0f;

  const int steps = static_cast<int>(p.k / 8);
  for (int s0 = lane; s0 < steps; s0 += kWarp * U) {
    typename Dec::Raw raw[R][U];
    typename Dec::Row rc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rc[r] = Dec::row(p, wrow[r], s0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s0 + kWarp * u < steps) {
#pragma unroll
        for (int r = 0; r < R; ++r) raw[r][u] = Dec::load(rc[r], u);
      }
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s0 + kWarp * u >= steps) break;
      StepW w[R];
#pragma unroll
      for (int r = 0; r < R; ++r) Dec::decode(raw[r][u], s0, w[r]);
#pragma unroll
      for (int i = 0; i < MR; ++i) {
        if (i < p.m) {
          // step s0 + 32u of row i of x: 8 BF16 = one uint4
          const uint4* xr = reinterpret_cast<const uint4*>(p.x + i * p.k) + s0;
          float xv[8];
          bf16x8_to_float(__ldg(xr + kWarp * u), xv);
#pragma unroll
          for (int r = 0; r < R; ++r) Dec::dot(w[r], xv, acc[r][i]);
        }
      }
    }
  }
  if (!waited) pdl_wait();
  pdl_launch_dependents();  // after the weight stream (see the file comment)
  gemv_finish<Dec, MR, R, kSilu>(p, n, wrow, acc, valid);
}

// v2 products (not the SiLU one) of at least INFERX_GEMV_V2_PAIRS rows (default 8192; 0: never) give each
// warp two rows: x is then loaded and converted once per two rows. Fewer rows keep one per warp, so that
// there are warps enough to fill the GPU (8192 rows in pairs: 1024 CTAs). Read once.
bool v2_pairs(int64_t rows) {
  static const int64_t min_rows = [] {
    const char* e = std::getenv("INFERX_GEMV_V2_PAIRS");
    if (e == nullptr || *e == 0) return int64_t{8192};
    const long long v = std::atoll(e);
    return v <= 0 ? INT64_MAX : static_cast<int64_t>(v);
  }();
  return rows >= min_rows;
}

// R = 2: the SiLU product (gate and up rows per warp).
template <class Dec, int R, bool V2>
cudaError_t launch_dec(const GemvParams& p, cudaStream_t stream) {
  const bool pairs = V2 && R == 1 && v2_pairs(p.rows);
  const int64_t rows_per_cta = kGemvWarps * (pairs ? 2 : 1);
  const dim3 grid(static_cast<unsigned>((p.rows + rows_per_cta - 1) / rows_per_cta));
  auto go = [&](auto mr) {
    constexpr int MR = decltype(mr)::value;
    if constexpr (!V2)
      return launch_pdl(gemv_kernel<Dec, MR, R>, grid, dim3(kGemvThreads), 0, stream, p);
    else if constexpr (R == 2)
      return launch_pdl(gemv8_kernel<Dec, MR, 2, true>, grid, dim3(kGemvThreads), 0, stream, p);
    else if (pairs)
      return launch_pdl(gemv8_kernel<Dec, MR, 2, false>, grid, dim3(kGemvThreads), 0, stream, p);
    else
      return launch_pdl(gemv8_kernel<Dec, MR, 1, false>, grid, dim3(kGemvThreads), 0, stream, p);
  };
  return with_rows_bucket(p.m, go);
}

}  // namespace

template <int R>
cudaError_t launch_v1v2(DType dtype, bool v2, const GemvParams& p, cudaStream_t stream) {
  const bool v1 = !v2;
  switch (dtype) {
    case DType::BF16:
      return launch_dec<DecodeBf16, R, false>(p, stream);
    case DType::F8_E4M3:
      return v1 ? launch_dec<DecodeFp8, R, false>(p, stream) : launch_dec<StepFp8, R, true>(p, stream);
    case DType::INT4:
      if (v1) return launch_dec<DecodeInt4, R, false>(p, stream);
      if (p.step_group_shift == 2) return launch_dec<StepInt4<2>, R, true>(p, stream);
      if (p.step_group_shift == 3) return launch_dec<StepInt4<3>, R, true>(p, stream);
      return launch_dec<StepInt4<4>, R, true>(p, stream);
    case DType::Q8_0:
      return v1 ? launch_dec<DecodeQ8_0, R, false>(p, stream) : launch_dec<StepQ8_0, R, true>(p, stream);
    case DType::Q4_K:
      return v1 ? launch_dec<DecodeQ4K, R, false>(p, stream) : launch_dec<StepQ4K, R, true>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
template cudaError_t launch_v1v2<1>(DType, bool, const GemvParams&, cudaStream_t);
template cudaError_t launch_v1v2<2>(DType, bool, const GemvParams&, cudaStream_t);

}  // namespace inferx::cuda::gemv_impl
