// GEMV v5: FP8 (E4M3) decode products as W8A8 on tensor cores, on v4's streaming plan (the operand layout
// and why: gemv_tc_stream_layout.h; the choice between the kernels: kernels_gemv.cu). The CTA quantizes x
// per token into shared memory (quant_codes.cuh: the codes and scales of the FP8 GEMM's activation pass and
// of the CPU backend) and each 64-byte chunk of a row is two mma.m16n8k32.e4m3 - no per-weight
// instruction. The epilogue is the W8A8 epilogue's arithmetic (w8a8_value / w8a8_silu_up,
// kernels_quant_math.h).
// The plan:
//   - One wave of persistent warps. A warp takes tiles of 16 weight rows (SiLU: 8 gate rows over their 8
//     up rows), interleaved over the CTAs (tile n to group n / ctas of CTA n % ctas, so that products with
//     fewer tiles than warps spread over every SM), and streams each tile in batches of 4 64-byte chunks per
//     row with the next batch's loads in flight while the current one is multiplied, across tile ends too.
//   - K split (tcs::ksplit_for): ks warps of a CTA share a tile, each a 1/ks of its batches, and meet in
//     shared memory (a named barrier per group) where the group's first warp adds the sums in order
//     (deterministic) and stores.
//   - Before the PDL wait each warp has the copy engine stage the first batches of its first tile in shared
//     memory (cp.async.bulk, one copy per row), so the weight stream runs across the kernel boundary (v4's
//     measured gain).
//   - Each chunk's products go into a fresh F32 fragment that is then added to the running sums, so that a
//     tensor-core sum covers at most one chunk (the FP8 tensor-core accumulation is narrower than F32).
// Measured (H200, 2026-12-05 22:45): 8B fp8:lm_head batch 1 2.919 ms against v4's 2.988 (-2.4%). The same
// plan reading BF16 (two mma.m16n8k16 per chunk) and INT4 (v3's decode), 2-chunk batches and a cp.async ring
// of 3-4 batches were slower in every case (bf16 5.282 vs 4.592 ms, int4 2.636 vs v3's 2.313) and were
// removed.
// Not taken (cudaErrorNotSupported, nothing launched): other formats, the norm fusion, rows not whole
// 64-byte chunks, more activation rows than 16, unaligned pointers, x codes larger than tcs::kMaxXBytes, or
// a plan whose shared memory does not fit (tcs::plan_launch).
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/gemv_tc_stream_layout.h"
#include "backend/cuda/kernels_gemv_impl.cuh"
#include "backend/cuda/quant_codes.cuh"

namespace inferx::cuda::gemv_impl {
namespace {

constexpr int kV5Warps = tcs::kWarps;
constexpr int kV5Threads = kV5Warps * kWarp;
using V5Layout = tcs::Layout;
static_assert(tcs::kStaticBytes == kWarp * sizeof(float), "the plan counts the kernel's static scratch");

__device__ __forceinline__ void to_words(const uint4& v, uint32_t (&w)[4]) {
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}

// The CTA's activation rows as E4M3 codes (row i at xq + i * stride) and their scales xs[i], every thread.
__device__ void quantize_x(const GemvParams& p, uint8_t* xq, int stride, float* xs, float* scratch) {
  const int64_t granules = p.k / 8;
  for (int i = 0; i < p.m; ++i) {
    const uint4* row = reinterpret_cast<const uint4*>(p.x + i * p.k);
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < granules; j += kV5Threads)
      amax = fmaxf(amax, abs_max_bf16x8(__ldg(row + j)));
    const float s = fp8_row_scale(block_max(amax, scratch));
    const float inv = fp8_inverse(s);
    if (threadIdx.x == 0) xs[i] = s;
    for (int64_t j = threadIdx.x; j < granules; j += kV5Threads) {
      const uint2 codes = codes_bf16x8(__ldg(row + j), inv);
      *reinterpret_cast<uint2*>(xq + static_cast<int64_t>(i) * stride + 8 * j) = codes;
    }
  }
}

// One batch of a warp: the lane's kChunks 16-byte pieces of its two rows.
struct V5Batch {
  uint4 w[2][tcs::kChunks];
};

// NT: n-tiles of 8 activation rows.
template <int NT, bool kSilu>
__global__ void __launch_bounds__(kV5Threads, 2) gemv_tc_stream_kernel(const GemvParams p, const V5Layout L) {
  constexpr int U = tcs::kChunks;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float scratch[kWarp];
  const int lane = threadIdx.x % kWarp, wib = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int ks = L.ks, seg = wib % ks, group = wib / ks;
  const int64_t slots = static_cast<int64_t>(gridDim.x) * (kV5Warps / ks);
  int64_t n = static_cast<int64_t>(group) * gridDim.x + blockIdx.x;
  const int64_t n0 = n;             // the tile whose first batches are staged
  const bool active = n < L.tiles;  // alike for the warps of a group
  const int64_t chunks = p.row_bytes / tcs::kChunkBytes;
  const int batches = static_cast<int>((chunks + U - 1) / U);
  const int b_lo = tcs::segment_begin(seg, ks, batches), b_hi = tcs::segment_begin(seg + 1, ks, batches);
  uint64_t* const bar = reinterpret_cast<uint64_t*>(smem) + wib;
  const uint8_t* const stage = smem + L.stage_off + static_cast<int64_t>(wib) * tcs::kTileRows * L.stage_row;
  const uint8_t* const xq = smem + L.x_off;
  float* const xs = reinterpret_cast<float*>(smem + L.xs_off);
  float* const sums = reinterpret_cast<float*>(smem + L.sums_off);
  // B column 8 nt + g is activation row 8 nt + g (zero past the m rows).
  bool xon[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xon[nt] = 8 * nt + g < p.m;

  // The lane's two weight rows of a tile (g, g + 8), at its 16 bytes of chunk 0.
  const uint8_t *wlo = p.w, *whi = p.w;
  auto set_rows = [&](int64_t tile) {
    wlo = p.w + tcs::tile_row(tile, g, p.rows, p.f, kSilu) * p.row_bytes + tcs::granule_offset(0, t);
    whi = p.w + tcs::tile_row(tile, g + 8, p.rows, p.f, kSilu) * p.row_bytes + tcs::granule_offset(0, t);
  };
  auto load_global = [&](int b, V5Batch& bt) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b) * U + u;
      if (c < chunks) {
        bt.w[0][u] = load_stream(wlo + c * tcs::kChunkBytes);
        bt.w[1][u] = load_stream(whi + c * tcs::kChunkBytes);
      }
    }
  };
  // Batch b_lo + b of tile n0 from the staging (row r at stage + r * stage_row, its chunks from b_lo * U on).
  auto load_staged = [&](int b, V5Batch& bt) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b_lo + b) * U + u;
      if (c < chunks) {
        const int64_t at = tcs::granule_offset(static_cast<int64_t>(b) * U + u, t);
        bt.w[0][u] = *reinterpret_cast<const uint4*>(stage + g * L.stage_row + at);
        bt.w[1][u] = *reinterpret_cast<const uint4*>(stage + (g + 8) * L.stage_row + at);
      }
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
  auto multiply = [&](const V5Batch& bt, int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b) * U + u;
      if (c >= chunks) break;  // warp-uniform
      uint32_t lo[4], hi[4];
      to_words(bt.w[0][u], lo);
      to_words(bt.w[1][u], hi);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t x[4];
        to_words(xon[nt] ? *reinterpret_cast<const uint4*>(xq + (8 * nt + g) * L.x_stride +
                                                           tcs::granule_offset(c, t))
                         : make_uint4(0, 0, 0, 0),
                 x);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          const tcs::Operands o = tcs::step_operands(lo, hi, x, step);
          mma_e4m3_16832(d, o.a, o.b[0], o.b[1]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] += d[i];
      }
    }
  };

  const float* wscale = static_cast<const float*>(p.scale);  // F32 [1] or [rows]
  // The outputs of tile `tile` from acc: v[h][e] = rows g + 8h, B columns 2t + e of n-tile nt.
  auto epilogue = [&](int64_t tile) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float v[2][2] = {{acc[nt][0], acc[nt][1]}, {acc[nt][2], acc[nt][3]}};
      // acc[nt][2h + e]: tile row tcs::acc_tile_row(lane, 2h) = g + 8h, B column 8 nt + acc_token(lane, e).
      const int token0 = 8 * nt + tcs::acc_token(lane, 0);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int token = token0 + e;
        if (token >= p.m) continue;
        if constexpr (kSilu) {
          const int r = tcs::acc_tile_row(lane, 0);  // gate row r, its up row in tile row r + 8
          if (!tcs::tile_row_stored(tile, r, p.rows, p.f, true)) continue;
          const int64_t j = tile * 8 + r;
          const float b0 = p.bias ? p.bias[j] : 0.0f, b1 = p.bias ? p.bias[p.f + j] : 0.0f;
          const float out = w8a8_silu_up(v[0][e], v[1][e], xs[token], wscale[p.per_channel ? j : 0], b0,
                                         wscale[p.per_channel ? p.f + j : 0], b1);
          p.outs[0].data[token * p.outs[0].ld + j] = out;
          if (p.out_bf16) p.out_bf16[token * p.f + j] = __float2bfloat16_rn(out);
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = tcs::acc_tile_row(lane, 2 * h);
            if (!tcs::tile_row_stored(tile, r, p.rows, p.f, false)) continue;
            const int64_t row = tile * tcs::kTileRows + r;
            const float b = p.bias ? p.bias[row] : 0.0f;
            const float out = w8a8_value(v[h][e], xs[token], wscale[p.per_channel ? row : 0], b);
            int o = 0;
            int64_t col = row;
            while (o + 1 < p.num_outs && col >= p.outs[o].count) col -= p.outs[o++].count;
            p.outs[o].data[token * p.outs[o].ld + col] = out;
          }
        }
      }
    }
  };
  int parity = 0;
  auto finish = [&](int64_t tile) {
    if (ks > 1) {
      float* own = sums + (static_cast<int64_t>(parity) * kV5Warps + wib) * 4 * NT * kWarp;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) own[(nt * 4 + i) * kWarp + lane] = acc[nt][i];
      named_barrier_sync<kV5Warps>(1 + group, ks * kWarp);
      if (seg == 0) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float total = 0.0f;
            for (int j = 0; j < ks; ++j) total += own[(j * 4 * NT + nt * 4 + i) * kWarp + lane];
            acc[nt][i] = total;
          }
      }
      parity ^= 1;  // the group meets at every tile: the other parity's slots are free
    }
    if (seg == 0) epilogue(tile);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
  };

  // Batch b of tile n is in `cur`: fill `nxt` with the warp's next batch (the next of the tile's segment,
  // else the first of its next tile), multiply `cur`, finish the tile at its end. False after the warp's
  // last batch.
  int b = b_lo;
  auto step = [&](const V5Batch& cur, V5Batch& nxt) {
    int next_b = b + 1;
    int64_t next_n = n;
    if (next_b == b_hi) {
      next_b = b_lo;
      next_n += slots;
    }
    const bool more = next_n < L.tiles;
    if (more && next_n != n) set_rows(next_n);  // finish(n) below reads no row pointer
    if (more && next_n == n0 && next_b - b_lo < L.pf)
      load_staged(next_b - b_lo, nxt);
    else if (more)
      load_global(next_b, nxt);
    else
      pdl_launch_dependents();  // after the weight stream (kernels_gemv.cu)
    multiply(cur, b);
    if (next_n != n) finish(n);
    n = next_n;
    b = next_b;
    return more;
  };

  V5Batch a = {}, c = {};
  if (active) set_rows(n);
  const bool staged = active && L.pf > 0;
  if (staged) {
    const int64_t c0 = static_cast<int64_t>(b_lo) * U;
    const int64_t c1 = std::min<int64_t>(static_cast<int64_t>(b_lo + L.pf) * U, chunks);
    const auto bytes = static_cast<uint32_t>((c1 - c0) * tcs::kChunkBytes);
    if (lane == 0) {
      mbar_init(bar, 1);
      mbar_init_fence();
      mbar_expect_tx(bar, bytes * tcs::kTileRows);
    }
    __syncwarp();
    if (lane < tcs::kTileRows)
      bulk_copy(smem + L.stage_off + (static_cast<int64_t>(wib) * tcs::kTileRows + lane) * L.stage_row,
                p.w + tcs::tile_row(n, lane, p.rows, p.f, kSilu) * p.row_bytes + c0 * tcs::kChunkBytes, bytes,
                bar);
  } else if (active) {
    load_global(b_lo, a);
  }
  pdl_wait();  // the staged batches or the first batch are in flight (cuda_common.cuh)
  if (!active) pdl_launch_dependents();
  quantize_x(p, smem + L.x_off, L.x_stride, xs, scratch);
  __syncthreads();
  if (!active) return;
  if (staged) {
    mbar_wait(bar, 0);
    load_staged(0, a);
  }
  while (step(a, c) && step(c, a)) {
  }
}

// ---- launch ---------------------------------------------------------------------------------------------
// The staging budget per SM in KB: set_gemv_v5_smem_kb, else INFERX_GEMV_V5_SMEM_KB (default 96, v4's; 0
// measured level with it at batch 1, H200 2026-12-05: 2.911 vs 2.919 ms), read once.
std::atomic<int> g_v5_smem_kb{-1};
int v5_smem_kb() {
  static const int env = env_int("INFERX_GEMV_V5_SMEM_KB", 0, 200, 96);
  const int o = g_v5_smem_kb.load(std::memory_order_relaxed);
  return o >= 0 ? o : env;
}

template <int NT, bool kSilu>
cudaError_t launch_tc_stream(const GemvParams& p, cudaStream_t stream) {
  const auto kernel = gemv_tc_stream_kernel<NT, kSilu>;
  static std::atomic<int> fit{0};  // CTAs per SM by registers (the same on every Hopper part)
  int by_regs = fit.load(std::memory_order_relaxed);
  if (by_regs == 0) {
    const cudaError_t st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, kernel, kV5Threads, 0);
    if (st != cudaSuccess) return st;
    by_regs = std::max(by_regs, 1);
    fit.store(by_regs, std::memory_order_relaxed);
  }
  int sms = 0, sm_bytes = 0, reserved = 0;
  if (const cudaError_t st = device_sms(sms); st != cudaSuccess) return st;
  if (const cudaError_t st = device_smem(sm_bytes, reserved); st != cudaSuccess) return st;
  tcs::PlanInput in;
  in.rows = p.rows;
  in.f = p.f;
  in.silu = kSilu;
  in.row_bytes = p.row_bytes;
  in.k = p.k;
  in.m = p.m;
  in.nt = NT;
  in.staging_kb = v5_smem_kb();
  in.by_regs = by_regs;
  in.sms = sms;
  in.sm_bytes = sm_bytes;
  in.reserved = reserved;
  const tcs::Plan plan = tcs::plan_launch(in);
  if (plan.per_sm < 1) return cudaErrorNotSupported;
  const int64_t smem = plan.smem;
  if (smem > 48 * 1024) {  // the opt-in above 48 KB, once per device and instance
    static unsigned smem_set = 0;
    const int most = static_cast<int>(tcs::kMaxCtaSmem - tcs::kStaticBytes);
    if (const cudaError_t st = allow_dynamic_smem(kernel, most, smem_set); st != cudaSuccess) return st;
  }
  return launch_pdl(kernel, dim3(static_cast<unsigned>(plan.ctas)), dim3(kV5Threads),
                    static_cast<size_t>(smem), stream, p, plan.layout);
}

}  // namespace

template <int R>
cudaError_t launch_v5(DType dtype, const GemvParams& p, cudaStream_t stream) {
  constexpr bool kSilu = R == 2;
  if (dtype != DType::F8_E4M3 || p.residual != nullptr || p.in_partials != nullptr || p.scale == nullptr ||
      p.row_bytes % tcs::kChunkBytes != 0 || p.m < 1 || p.m > tcs::kMaxTokens ||
      p.m * (p.k + 16) > tcs::kMaxXBytes || !is_aligned(p.w, 16) || !is_aligned(p.x, 16))
    return cudaErrorNotSupported;
  return p.m > tcs::kTokens ? launch_tc_stream<2, kSilu>(p, stream) : launch_tc_stream<1, kSilu>(p, stream);
}
template cudaError_t launch_v5<1>(DType, const GemvParams&, cudaStream_t);
template cudaError_t launch_v5<2>(DType, const GemvParams&, cudaStream_t);

}  // namespace inferx::cuda::gemv_impl

namespace inferx::cuda {

void set_gemv_v5_smem_kb(int smem_kb) { gemv_impl::g_v5_smem_kb.store(smem_kb, std::memory_order_relaxed); }

}  // namespace inferx::cuda
