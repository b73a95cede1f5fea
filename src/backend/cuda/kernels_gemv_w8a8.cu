// GEMV v5: E4M3 weights times E4M3 activations (W8A8) on tensor cores, on v4's streaming plan (the operand
// layout and why: gemv_w8a8_layout.h; the choice between the kernels: kernels_gemv.cu).
//   - One wave of persistent warps. A warp takes tiles of 16 weight rows (SiLU: 8 gate rows over their 8
//     up rows), interleaved over the CTAs (tile n to group n / ctas of CTA n % ctas, so that products with
//     fewer tiles than warps spread over every SM), and streams each tile in batches of U 64-byte chunks per
//     row with the next batch's loads in flight while the current one is multiplied, across tile ends too.
//   - K split (w8a8::ksplit_for): ks warps of a CTA share a tile, each a 1/ks of its batches, and meet in
//     shared memory (a named barrier per group) where the group's first warp adds the sums in order
//     (deterministic) and stores.
//   - Before the PDL wait each warp has the copy engine stage the first batches of its first tile in shared
//     memory (cp.async.bulk, one copy per row), so the weight stream runs across the kernel boundary (v4's
//     measured gain); then the CTA quantizes x per token into shared memory (quant_codes.cuh: the codes and
//     scales of the FP8 GEMM's activation pass and of the CPU backend) and every warp reads its activation
//     granules from there.
//   - Each chunk's two k32 products go into a fresh F32 fragment that is then added to the running sums, so
//     that a tensor-core sum covers at most 64 products (the FP8 tensor-core accumulation is narrower than
//     F32 on Hopper).
//   - The epilogue is the W8A8 epilogue's arithmetic (w8a8_value / w8a8_silu_up, kernels_quant_math.h):
//     sums x activation scale x weight scale + bias, and SiLU(gate) x up.
// Not taken (cudaErrorNotSupported, nothing launched): other formats, the norm fusion, K not a multiple of
// 64, more than 16 activation rows, unaligned pointers, or x's codes larger than kMaxXBytes.
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/gemv_w8a8_layout.h"
#include "backend/cuda/kernels_gemv_impl.cuh"
#include "backend/cuda/quant_codes.cuh"

namespace inferx::cuda::gemv_impl {
namespace {

constexpr int kV5Warps = 8;
constexpr int kV5Threads = kV5Warps * kWarp;
constexpr int kV5BarBytes = 128;          // one mbarrier per warp (the staging)
constexpr int64_t kMaxXBytes = 96 << 10;  // x's codes in shared memory: m * (k + 16) bytes at most

// Where a launch's pieces sit in dynamic shared memory, and its plan.
struct V5Layout {
  int64_t tiles = 0;
  int ks = 1;         // warps sharing a tile (K split)
  int pf = 0;         // staged batches of each warp's first tile (0: none)
  int stage_row = 0;  // bytes per staged row (w8a8::stage_row_bytes)
  int x_stride = 0;   // bytes per activation row of codes: k + 16 (conflict-free reads of 8 rows)
  int sums_off = 0;   // K split: [2 parities][kV5Warps][4 NT][kWarp] floats
  int x_off = 0;      // codes [m][x_stride]
  int xs_off = 0;     // activation scales [16] floats
  int stage_off = 0;  // [kV5Warps][16 rows][stage_row]
};

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const w8a8::Operands& o) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(o.a[0]), "r"(o.a[1]), "r"(o.a[2]), "r"(o.a[3]), "r"(o.b[0]), "r"(o.b[1]));
}

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
    for (int64_t j = threadIdx.x; j < granules; j += kV5Threads) {
      float v[8];
      bf16x8_to_float(__ldg(row + j), v);
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
    }
    const float s = fp8_row_scale(block_max(amax, scratch));
    const float inv = fp8_inverse(s);
    if (threadIdx.x == 0) xs[i] = s;
    for (int64_t j = threadIdx.x; j < granules; j += kV5Threads) {
      float v[8];
      bf16x8_to_float(__ldg(row + j), v);
      const uint2 codes = {
          pack_codes(fp8_code(v[0], inv), fp8_code(v[1], inv), fp8_code(v[2], inv), fp8_code(v[3], inv)),
          pack_codes(fp8_code(v[4], inv), fp8_code(v[5], inv), fp8_code(v[6], inv), fp8_code(v[7], inv))};
      *reinterpret_cast<uint2*>(xq + static_cast<int64_t>(i) * stride + 8 * j) = codes;
    }
  }
}

// U: chunks per row and batch (2U 16-byte loads per lane); NT: n-tiles of 8 activation rows (1 or 2).
template <int U, int NT, bool kSilu>
__global__ void __launch_bounds__(kV5Threads, 2) gemv_w8a8_kernel(const GemvParams p, const V5Layout L) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float scratch[kWarp];
  const int lane = threadIdx.x % kWarp, wib = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int ks = L.ks, seg = wib % ks, group = wib / ks;
  const int64_t slots = static_cast<int64_t>(gridDim.x) * (kV5Warps / ks);
  int64_t n = static_cast<int64_t>(group) * gridDim.x + blockIdx.x;
  const int64_t n0 = n;             // the tile whose first batches are staged
  const bool active = n < L.tiles;  // alike for the warps of a group
  const int64_t chunks = p.k / w8a8::kChunkBytes;
  const int batches = static_cast<int>((chunks + U - 1) / U);
  const int b_lo = w8a8::segment_begin(seg, ks, batches), b_hi = w8a8::segment_begin(seg + 1, ks, batches);
  uint64_t* const bar = reinterpret_cast<uint64_t*>(smem) + wib;
  const uint8_t* const stage = smem + L.stage_off + static_cast<int64_t>(wib) * w8a8::kTileRows * L.stage_row;
  const uint8_t* const xq = smem + L.x_off;
  float* const xs = reinterpret_cast<float*>(smem + L.xs_off);
  float* const sums = reinterpret_cast<float*>(smem + L.sums_off);

  // The lane's two weight rows of a tile (g, g + 8), at its 16 bytes of chunk 0.
  const uint8_t *wlo = p.w, *whi = p.w;
  auto set_rows = [&](int64_t tile) {
    wlo = p.w + w8a8::tile_row(tile, g, p.rows, p.f, kSilu) * p.row_bytes + w8a8::granule_offset(0, t);
    whi = p.w + w8a8::tile_row(tile, g + 8, p.rows, p.f, kSilu) * p.row_bytes + w8a8::granule_offset(0, t);
  };
  auto load_global = [&](int b, uint4(&raw)[2][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b) * U + u;
      if (c < chunks) {
        raw[0][u] = load_stream(wlo + c * w8a8::kChunkBytes);
        raw[1][u] = load_stream(whi + c * w8a8::kChunkBytes);
      }
    }
  };
  // Batch b_lo + b of tile n0 from the staging (row r at stage + r * stage_row, its chunks from b_lo * U on).
  auto load_staged = [&](int b, uint4(&raw)[2][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b_lo + b) * U + u;
      if (c < chunks) {
        const int64_t at = w8a8::granule_offset(static_cast<int64_t>(b) * U + u, t);
        raw[0][u] = *reinterpret_cast<const uint4*>(stage + g * L.stage_row + at);
        raw[1][u] = *reinterpret_cast<const uint4*>(stage + (g + 8) * L.stage_row + at);
      }
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
  auto multiply = [&](const uint4(&raw)[2][U], int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b) * U + u;
      if (c >= chunks) break;  // warp-uniform
      uint32_t lo[4], hi[4], x[NT][4];
      to_words(raw[0][u], lo);
      to_words(raw[1][u], hi);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int token = nt * w8a8::kTokens + g;
        const uint4 v = token < p.m
                            ? *reinterpret_cast<const uint4*>(xq + static_cast<int64_t>(token) * L.x_stride +
                                                              w8a8::granule_offset(c, t))
                            : make_uint4(0, 0, 0, 0);
        to_words(v, x[nt]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_e4m3(d, w8a8::step_operands(lo, hi, x[nt], 0));
        mma_e4m3(d, w8a8::step_operands(lo, hi, x[nt], 1));
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] += d[i];
      }
    }
  };

  const float* wscale = static_cast<const float*>(p.scale);
  auto epilogue = [&](int64_t tile) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < (kSilu ? 2 : 4); ++i) {  // SiLU: d[2], d[3] are the up rows of d[0], d[1]
        const int r = w8a8::acc_tile_row(lane, i), token = nt * w8a8::kTokens + w8a8::acc_token(lane, i);
        if (token >= p.m || !w8a8::tile_row_stored(tile, r, p.rows, p.f, kSilu)) continue;
        if constexpr (kSilu) {
          // The gate row's sums in d[i], its up row's (tile row r + 8) in d[i + 2].
          const int64_t j = tile * 8 + r;
          const float v = w8a8_silu_up(acc[nt][i], acc[nt][i + 2], xs[token], wscale[p.per_channel ? j : 0],
                                       p.bias ? p.bias[j] : 0.0f, wscale[p.per_channel ? p.f + j : 0],
                                       p.bias ? p.bias[p.f + j] : 0.0f);
          p.outs[0].data[token * p.outs[0].ld + j] = v;
          if (p.out_bf16) p.out_bf16[token * p.f + j] = __float2bfloat16_rn(v);
        } else {
          const int64_t row = tile * w8a8::kTileRows + r;
          int o = 0;
          int64_t col = row;
          while (o + 1 < p.num_outs && col >= p.outs[o].count) col -= p.outs[o++].count;
          p.outs[o].data[token * p.outs[o].ld + col] =
              w8a8_value(acc[nt][i], xs[token], wscale[p.per_channel ? row : 0], p.bias ? p.bias[row] : 0.0f);
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
      named_barrier_sync(1 + group, ks * kWarp);
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

  // Batch b of tile n is in `cur`: fill `nxt` with the warp's next batch, multiply `cur`, finish the tile
  // at its end. False after the warp's last batch.
  int b = b_lo;
  auto step = [&](const uint4(&cur)[2][U], uint4(&nxt)[2][U]) {
    int next_b = b + 1;
    int64_t next_n = n;
    if (next_b == b_hi) {
      next_b = b_lo;
      next_n = n + slots;
    }
    const bool more = next_n < L.tiles;
    if (more && next_n == n0 && next_b - b_lo < L.pf) {
      load_staged(next_b - b_lo, nxt);
    } else if (more) {
      if (next_n != n) set_rows(next_n);
      load_global(next_b, nxt);
    } else {
      pdl_launch_dependents();  // after the weight stream (kernels_gemv.cu)
    }
    multiply(cur, b);
    if (next_n != n) finish(n);
    n = next_n;
    b = next_b;
    return more;
  };

  uint4 a[2][U] = {}, c[2][U] = {};
  if (active) set_rows(n);
  const bool staged = active && L.pf > 0;
  if (staged) {
    const int64_t c0 = static_cast<int64_t>(b_lo) * U;
    const int64_t c1 = std::min<int64_t>(static_cast<int64_t>(b_lo + L.pf) * U, chunks);
    const auto bytes = static_cast<uint32_t>((c1 - c0) * w8a8::kChunkBytes);
    if (lane == 0) {
      mbar_init(bar, 1);
      mbar_init_fence();
      mbar_expect_tx(bar, bytes * w8a8::kTileRows);
    }
    __syncwarp();
    if (lane < w8a8::kTileRows)
      bulk_copy(smem + L.stage_off + (static_cast<int64_t>(wib) * w8a8::kTileRows + lane) * L.stage_row,
                p.w + w8a8::tile_row(n, lane, p.rows, p.f, kSilu) * p.row_bytes + c0 * w8a8::kChunkBytes,
                bytes, bar);
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
// Chunks per row and batch (2 or 4: 4 or 8 loads per lane) and the staging budget per SM in KB:
// set_gemv_v5_shape, else INFERX_GEMV_V5_CHUNKS (default 4) / INFERX_GEMV_V5_SMEM_KB (default 96, v4's), read
// once. Both unmeasured defaults (v4's 8 loads per lane from 8 KB rows, its 96 KB).
std::atomic<int> g_v5_chunks{0}, g_v5_smem_kb{-1};
int v5_chunks() {
  static const int env = env_int("INFERX_GEMV_V5_CHUNKS", 2, 4, 4);
  const int o = g_v5_chunks.load(std::memory_order_relaxed);
  return o == 2 || o == 4 ? o : env == 2 ? 2 : 4;
}
int v5_smem_kb() {
  static const int env = env_int("INFERX_GEMV_V5_SMEM_KB", 0, 200, 96);
  const int o = g_v5_smem_kb.load(std::memory_order_relaxed);
  return o >= 0 ? o : env;
}

template <int U, int NT, bool kSilu>
cudaError_t launch_w8a8(const GemvParams& p, cudaStream_t stream) {
  const auto kernel = gemv_w8a8_kernel<U, NT, kSilu>;
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
  V5Layout L;
  L.tiles = w8a8::tile_count(p.rows, p.f, kSilu);
  const int64_t chunks = p.k / w8a8::kChunkBytes, batches = (chunks + U - 1) / U;
  auto up = [](int64_t v, int64_t a) { return (v + a - 1) / a * a; };
  L.sums_off = kV5BarBytes;
  L.x_stride = static_cast<int>(p.k + 16);
  L.x_off = static_cast<int>(up(L.sums_off + int64_t{2} * kV5Warps * 4 * NT * kWarp * 4, 16));
  L.xs_off = static_cast<int>(up(L.x_off + int64_t{p.m} * L.x_stride, 16));
  L.stage_off = static_cast<int>(up(L.xs_off + w8a8::kMaxTokens * 4, 128));
  const int64_t static_bytes = kWarp * 4;  // scratch
  // CTAs per SM: by registers, and by shared memory without staging; the staging then shares the budget.
  int per_sm =
      static_cast<int>(std::min<int64_t>(by_regs, sm_bytes / (L.stage_off + static_bytes + reserved)));
  if (per_sm < 1) return cudaErrorNotSupported;
  L.ks = w8a8::ksplit_for(L.tiles, batches, int64_t{sms} * per_sm * kV5Warps, kV5Warps);
  const int64_t room = std::min<int64_t>(int64_t{v5_smem_kb()} * 1024 / per_sm,
                                         sm_bytes / per_sm - L.stage_off - static_bytes - reserved);
  L.pf = w8a8::staged_batches(room / kV5Warps, batches, L.ks, U);
  L.stage_row = L.pf > 0 ? static_cast<int>(w8a8::stage_row_bytes(L.pf, U)) : 0;
  const int64_t smem = L.stage_off + int64_t{kV5Warps} * w8a8::kTileRows * L.stage_row;
  if (smem > 48 * 1024) {
    // The opt-in above 48 KB: a function attribute of the current device, once per device and instance.
    static std::atomic<uint32_t> opted{0};
    int device = 0;
    if (const cudaError_t st = cudaGetDevice(&device); st != cudaSuccess) return st;
    const uint32_t bit = device < 32 ? 1u << device : 0u;
    if (bit == 0 || (opted.load(std::memory_order_relaxed) & bit) == 0) {
      const cudaError_t st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  227 * 1024 - static_cast<int>(static_bytes));
      if (st != cudaSuccess) return st;
      opted.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  const int64_t ctas = std::min<int64_t>(int64_t{sms} * per_sm, L.tiles);
  return launch_pdl(kernel, dim3(static_cast<unsigned>(ctas)), dim3(kV5Threads), static_cast<size_t>(smem),
                    stream, p, L);
}

template <int NT, bool kSilu>
cudaError_t launch_w8a8_chunks(const GemvParams& p, cudaStream_t stream) {
  return v5_chunks() == 2 ? launch_w8a8<2, NT, kSilu>(p, stream) : launch_w8a8<4, NT, kSilu>(p, stream);
}

}  // namespace

template <int R>
cudaError_t launch_v5(DType dtype, const GemvParams& p, cudaStream_t stream) {
  if (dtype != DType::F8_E4M3 || p.residual != nullptr || p.in_partials != nullptr || p.scale == nullptr ||
      p.k % w8a8::kChunkBytes != 0 || p.m < 1 || p.m > w8a8::kMaxTokens || p.m * (p.k + 16) > kMaxXBytes ||
      !is_aligned(p.w, 16) || !is_aligned(p.x, 16))
    return cudaErrorNotSupported;
  constexpr bool kSilu = R == 2;
  return p.m > w8a8::kTokens ? launch_w8a8_chunks<2, kSilu>(p, stream)
                             : launch_w8a8_chunks<1, kSilu>(p, stream);
}
template cudaError_t launch_v5<1>(DType, const GemvParams&, cudaStream_t);
template cudaError_t launch_v5<2>(DType, const GemvParams&, cudaStream_t);

}  // namespace inferx::cuda::gemv_impl

namespace inferx::cuda {

void set_gemv_v5_shape(int chunks, int smem_kb) {
  gemv_impl::g_v5_chunks.store(chunks, std::memory_order_relaxed);
  gemv_impl::g_v5_smem_kb.store(smem_kb, std::memory_order_relaxed);
}

}  // namespace inferx::cuda
