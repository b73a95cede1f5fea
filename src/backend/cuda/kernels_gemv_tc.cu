// GEMV v3: the dot products on tensor cores (the overview and the choice between the kernels:
// kernels_gemv.cu).
#include "backend/cuda/kernels_gemv_impl.cuh"

namespace inferx::cuda::gemv_impl {
namespace {

// ---- v3: the dot products on tensor cores (kernels_gemv_decode.h, "v3"). A CTA takes 16 weight rows, the
// A operand of mma.m16n8k16 (lane (g, t) streams rows g and g + 8), and splits K among its warps, which
// meet in shared memory at the end. x is the B operand: column n holds activation row n / S on the
// columns of subset n % S (S = 1, or the INT4 groups of a 128-column set; other columns and subsets are
// zeros), so at M = 1 the product wastes 7 of 8 columns and costs one instruction per 256 weights: what
// remains per weight is its decode to BF16 (none for BF16, ~2.5 instructions per E4M3 code, 1.5 per INT4
// code) instead of v1's conversions and FMAs, and rows of x up to 16 / S ride along (16: two products).
// A chunk's products accumulate in a fresh F32 fragment that is then added (INT4: times its group scale)
// to the running sum, so that each tensor-core sum is short.

namespace tc {
constexpr int kRows = 16;     // weight rows per CTA (the m of m16n8k16)
constexpr int kMaxWarps = 8;  // warps splitting K
constexpr int kUnroll = 4;    // sets per lane and batch: 8 chunk loads (two rows) in flight, 4 KB per warp
}  // namespace tc

// Per format: the chunk decoder (kernels_gemv_decode.h) and the per-row scale; INT4 also reads a zero
// point per chunk and group scales per set (kGroups).
struct TcStepBf16 : gemv::TcBf16 {
  static constexpr bool kGroups = false;
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};
struct TcStepFp8 : gemv::TcFp8 {
  static constexpr bool kGroups = false;
  __device__ static float row_scale(const GemvParams& p, int64_t n) { return DecodeFp8::row_scale(p, n); }
};
struct TcStepInt4 : gemv::TcInt4 {
  static constexpr bool kGroups = true;
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }
};

// Weight row of the CTA's A row r: rows 16b.. (clamped: a missing row reads the last one, unstored), or
// with kSilu gate rows 8b.. (r < 8) over their up rows f + 8b.. (r >= 8).
template <bool kSilu>
__device__ __forceinline__ int64_t tc_row(const GemvParams& p, int r) {
  if constexpr (kSilu) {
    const int64_t j = static_cast<int64_t>(blockIdx.x) * 8 + (r & 7);
    return (r < 8 ? 0 : p.f) + (j < p.f ? j : p.f - 1);
  } else {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * tc::kRows + r;
    return row < p.rows ? row : p.rows - 1;
  }
}

// The CTA's sums (shared memory: per warp, A row, column) to the outputs: scale, bias, split outputs or
// the SiLU product. Warps and subsets are added in a fixed order (deterministic).
template <class Dec, int MR, int S, bool kSilu>
__device__ __forceinline__ void tc_finish(const GemvParams& p,
                                          const float (&red)[tc::kMaxWarps][tc::kRows][16], int nwarps) {
  auto value = [&](int i, int r, int64_t row) {
    float v = 0.0f;
    for (int w = 0; w < nwarps; ++w)
#pragma unroll
      for (int s = 0; s < S; ++s) v += red[w][r][i * S + s];
    return v * Dec::row_scale(p, row) + (p.bias ? p.bias[row] : 0.0f);
  };
  if constexpr (!kSilu) {
    for (int e = threadIdx.x; e < MR * tc::kRows; e += blockDim.x) {
      const int i = e / tc::kRows, r = e % tc::kRows;
      const int64_t row = static_cast<int64_t>(blockIdx.x) * tc::kRows + r;
      if (i >= p.m || row >= p.rows) continue;
      int o = 0;
      int64_t col = row;
      while (o + 1 < p.num_outs && col >= p.outs[o].count) col -= p.outs[o++].count;
      p.outs[o].data[i * p.outs[o].ld + col] = value(i, r, row);
    }
  } else {
    for (int e = threadIdx.x; e < MR * 8; e += blockDim.x) {
      const int i = e / 8, j = e % 8;
      const int64_t col = static_cast<int64_t>(blockIdx.x) * 8 + j;
      if (i >= p.m || col >= p.f) continue;
      const float v = silu_fast(value(i, j, col)) * value(i, 8 + j, p.f + col);
      p.outs[0].data[i * p.outs[0].ld + col] = v;
      if (p.out_bf16) p.out_bf16[i * p.f + col] = __float2bfloat16_rn(v);
    }
  }
}

// MR: activation rows (p.m <= MR, MR * S <= 16: NT = 1 or 2 products of 8 columns; tc_finish reads
// columns below MR * S only). A row is whole sets (row_bytes a multiple of 64: launch_format). Warp w
// takes a contiguous range of sets (4 chunks: chunk 4c + t for lane t); each batch issues kUnroll sets of
// loads per lane (two rows, plus INT4 zero points and group scales) before decoding any. Offsets within
// a batch are immediates: the lane's pointers advance once per batch.
template <class Dec, int MR, int S, bool kSilu>
__global__ void __launch_bounds__(tc::kMaxWarps* kWarp) gemv_tc_kernel(const GemvParams p) {
  static_assert(MR * S <= 16, "B columns: activation rows x subsets, two products at most");
  constexpr int U = tc::kUnroll, NT = MR * S > 8 ? 2 : 1, kX = Dec::kCols / 8;  // kX: x loads per chunk
  constexpr int kCS = S == 1 ? 1 : 2;  // distinct subsets among the C fragment's columns 2t, 2t + 1
  __shared__ float red[tc::kMaxWarps][tc::kRows][16];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = tc_row<kSilu>(p, g), row1 = tc_row<kSilu>(p, g + 8);
  const int chunks = static_cast<int>(p.row_bytes / 16), sets = (chunks + 3) / 4;
  const int per_warp = (sets + nwarps - 1) / nwarps;
  const int first = warp * per_warp, last = min(sets, first + per_warp);
  // Lane pointers at set `first`: weights (rows g, g + 8), x (B columns g and 8 + g), zero points of
  // the lane's chunks, group scales of the C fragment's columns.
  const uint4* w0 = reinterpret_cast<const uint4*>(p.w + row0 * p.row_bytes) + 4 * first + t;
  const uint4* w1 = reinterpret_cast<const uint4*>(p.w + row1 * p.row_bytes) + 4 * first + t;
  const int sub = gemv::tc_subset(t, S);
  bool xon[NT];
  const uint4* xp[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    // B column: activation row col / S, subset col % S. Zeros where lane t's subset is another; a
    // column past the activation rows is never read, so it takes the last row (no zeros to make).
    const int col = 8 * nt + g;
    xon[nt] = S == 1 || (col % S == sub && col / S < p.m);
    const int64_t xrow = min(col / S, p.m - 1);
    xp[nt] = reinterpret_cast<const uint4*>(p.x + xrow * p.k) + (4 * first + t) * kX;
  }
  const uint8_t *z0 = nullptr, *z1 = nullptr;
  const unsigned short* sc[2][kCS] = {};
  if constexpr (Dec::kGroups) {
    const int64_t grp = static_cast<int64_t>(first) * S;
    if (p.zero) {
      z0 = p.zero + row0 * p.groups_per_row + grp + sub;
      z1 = p.zero + row1 * p.groups_per_row + grp + sub;
    }
    const auto* scale = static_cast<const unsigned short*>(p.scale);
#pragma unroll
    for (int h = 0; h < kCS; ++h) {
      sc[0][h] = scale + row0 * p.groups_per_row + grp + (2 * t + h) % S;
      sc[1][h] = scale + row1 * p.groups_per_row + grp + (2 * t + h) % S;
    }
  }
  float acc[NT][4] = {};
  bool waited = false;  // the first batch of weight loads goes out before waiting for x (cuda_common.cuh)
  for (int base = first; base < last; base += U) {
    const int nsets = last - base;  // sets left from `base`
    uint4 raw[U][2];
    uint32_t zz[U][2], gs[U][2][kCS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= nsets) break;  // warp-uniform; the compute loop stops at the same set
      raw[u][0] = load_stream_evict_first(w0 + 4 * u);
      raw[u][1] = load_stream_evict_first(w1 + 4 * u);
      zz[u][0] = zz[u][1] = 0;
      if constexpr (Dec::kGroups) {
        zz[u][0] = gemv::int4_zero_pair(z0 ? __ldg(z0 + u * S) : 8u);
        zz[u][1] = gemv::int4_zero_pair(z1 ? __ldg(z1 + u * S) : 8u);
#pragma unroll
        for (int h = 0; h < kCS; ++h) {
          gs[u][0][h] = __ldg(sc[0][h] + u * S);
          gs[u][1][h] = __ldg(sc[1][h] + u * S);
        }
      }
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= nsets) break;
      uint32_t f0[Dec::kMmas][2], f1[Dec::kMmas][2];
      Dec::decode({raw[u][0].x, raw[u][0].y, raw[u][0].z, raw[u][0].w}, zz[u][0], f0);
      Dec::decode({raw[u][1].x, raw[u][1].y, raw[u][1].z, raw[u][1].w}, zz[u][1], f1);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint4 xv[kX];
#pragma unroll
        for (int i = 0; i < kX; ++i)
          xv[i] = xon[nt] ? __ldg(xp[nt] + 4 * u * kX + i) : make_uint4(0, 0, 0, 0);
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < Dec::kMmas; ++j) {
          const int q = Dec::piece(j);  // columns 4q..4q+3 of the chunk: half q % 2 of x's load q / 2
          const uint32_t a[4] = {f0[j][0], f1[j][0], f0[j][1], f1[j][1]};
          mma_16816(c, a, q % 2 ? xv[q / 2].z : xv[q / 2].x, q % 2 ? xv[q / 2].w : xv[q / 2].y);
        }
        if constexpr (Dec::kGroups) {
          // c: rows g, g + 8 x columns 2t, 2t + 1 (subsets (2t) % S, (2t + 1) % S)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t bits = gs[u][i / 2][kCS == 1 ? 0 : i % 2];
            acc[nt][i] = fmaf(c[i], gemv::half_float(static_cast<uint16_t>(bits)), acc[nt][i]);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[nt][i] += c[i];
        }
      }
    }
    w0 += 4 * U;
    w1 += 4 * U;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) xp[nt] += 4 * U * kX;
    if constexpr (Dec::kGroups) {
      if (z0) {
        z0 += U * S;
        z1 += U * S;
      }
#pragma unroll
      for (int h = 0; h < kCS; ++h) {
        sc[0][h] += U * S;
        sc[1][h] += U * S;
      }
    }
  }
  if (!waited) pdl_wait();  // a warp without sets still stores (after the CTA's barrier)
  pdl_launch_dependents();  // after the weight stream (see the file comment)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    red[warp][g][8 * nt + 2 * t] = acc[nt][0];
    red[warp][g][8 * nt + 2 * t + 1] = acc[nt][1];
    red[warp][g + 8][8 * nt + 2 * t] = acc[nt][2];
    red[warp][g + 8][8 * nt + 2 * t + 1] = acc[nt][3];
  }
  __syncthreads();
  tc_finish<Dec, MR, S, kSilu>(p, red, nwarps);
}

// Warps per v3 CTA: enough that each has one batch (kUnroll sets), at most INFERX_GEMV_V3_WARPS (default
// 8; set_gemv_v3_max_warps overrides).
std::atomic<int> g_v3_max_warps{0};
int v3_max_warps() {
  static const int env = env_int("INFERX_GEMV_V3_WARPS", 1, tc::kMaxWarps, tc::kMaxWarps);
  const int o = g_v3_max_warps.load(std::memory_order_relaxed);
  return o >= 1 && o <= tc::kMaxWarps ? o : env;
}

// R = 2: the SiLU product. S: subsets (INT4: 128 / group). Returns cudaErrorNotSupported (nothing
// launched) when p.m * S needs more than the 16 A rows.
template <class Dec, int R, int S>
cudaError_t launch_tc(const GemvParams& p, cudaStream_t stream) {
  const int sets = static_cast<int>((p.row_bytes / 16 + 3) / 4);
  const int warps = std::max(1, std::min(v3_max_warps(), (sets + tc::kUnroll - 1) / tc::kUnroll));
  const int64_t per_cta = R == 2 ? tc::kRows / 2 : tc::kRows;
  const dim3 grid(static_cast<unsigned>((p.rows + per_cta - 1) / per_cta)), block(warps * kWarp);
  auto go = [&](auto mr) {
    constexpr int MR = decltype(mr)::value;
    if constexpr (MR * S > 16)
      return cudaErrorNotSupported;
    else
      return launch_pdl(gemv_tc_kernel<Dec, MR, S, R == 2>, grid, block, 0, stream, p);
  };
  return with_rows_bucket(p.m, go);
}

}  // namespace

template <int R>
cudaError_t launch_v3(DType dtype, const GemvParams& p, cudaStream_t stream) {
  switch (dtype) {
    case DType::BF16:
      return launch_tc<TcStepBf16, R, 1>(p, stream);
    case DType::F8_E4M3:
      return launch_tc<TcStepFp8, R, 1>(p, stream);
    default:  // INT4: S = 128 / group
      if (p.group_shift == 2) return launch_tc<TcStepInt4, R, 1>(p, stream);
      if (p.group_shift == 1) return launch_tc<TcStepInt4, R, 2>(p, stream);
      return launch_tc<TcStepInt4, R, 4>(p, stream);
  }
}
template cudaError_t launch_v3<1>(DType, const GemvParams&, cudaStream_t);
template cudaError_t launch_v3<2>(DType, const GemvParams&, cudaStream_t);

}  // namespace inferx::cuda::gemv_impl

namespace inferx::cuda {

void set_gemv_v3_max_warps(int warps) { gemv_impl::g_v3_max_warps.store(warps, std::memory_order_relaxed); }

}  // namespace inferx::cuda
