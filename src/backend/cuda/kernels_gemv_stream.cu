// GEMV v4: persistent warps streaming weight rows with the next batch of loads in flight, one activation
// row, BF16 / FP8 (v1's decoders) and INT4 (StreamInt4); its measured per-shape policies (loads per lane,
// K split, shared-memory staging). The overview and the choice between the kernels: kernels_gemv.cu.
#include <string_view>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/kernels_gemv_impl.cuh"

namespace inferx::cuda::gemv_impl {
namespace {

// ---- v4: v1's decoders (BF16, FP8) and StreamInt4 (INT4), one activation row, on persistent warps that
// keep the next batch of weight loads in flight while they convert and multiply the current one. v1 gives
// each warp one row and each CTA one launch slot: an FP8 row of 4096 columns is a single batch of loads, so
// a warp loads, waits a whole DRAM latency, computes and exits, and a 6144-row product runs in 1.5 waves of
// CTAs (ncu, H200, 2026-12-03: the qkv GEMV at 38% of DRAM throughput, warps stalled on long scoreboard, 8
// CTAs per SM by registers). Here the grid is one wave (CTAs per SM from the occupancy calculator), warp w
// takes rows w, w + W, ... (W warps in all) as one stream of batches of U granules per lane, and issues
// batch i + 1's loads before it uses batch i, across row ends too.
// kSilu (R = 2): the SiLU product; R = 2 without it: a plain product two rows per warp (x converted once
// for both; INFERX_GEMV_V4_PAIRS).
//
// Shared-memory prefetch (p.pf_batches > 0, dynamic shared memory = gemv_v4_smem_bytes): before it waits for
// the previous kernel a warp asks the copy engine (cp.async.bulk) for the first pf_batches batches of its
// first row(s) into shared memory, so the stream does not stop across the kernel boundary: the registers hold
// one batch, shared memory as many as the budget gives (gemv_v4_staged_batches; at 96 KB, the H200's
// default, half of an FP8 4096-column row pair for the o projection's 4 CTAs per SM), and the copy needs no
// registers while the previous kernel (RMSNorm, attention) runs. Those batches are then read from shared
// memory.
//
// Bytes of one row per batch of U 16-byte granules per lane (v4's formats: BF16, FP8, INT4).
__host__ __device__ constexpr int64_t v4_batch_row_bytes(int u) { return int64_t{kWarp} * u * 16; }
constexpr int kV4BarBytes = 128;  // the CTA's mbarriers (one per warp), then the warps' stages

// INT4 on v4 (kernels_gemv_decode.h int4_run_dot): a granule is a 32-column run, multiplied without
// per-weight conversions, given the run's sum X of x. x comes from shared memory, where each CTA puts it
// once (after the PDL wait) with every run's X: v1's way of reading x (each lane 64 bytes of x per run, at
// the run's stride: each of its four 16-byte loads touches 16 L1 lines) would take some 64 L1 wavefronts per
// 32 runs against the 4 of a row's weights (an estimate, not profiled), and converting x from BF16 costs
// half an instruction per weight at two rows per warp.
// kF32: x as F32 (8 16-byte loads per run, no conversion; 4.6 bytes of shared memory per column), else
// as its BF16 (4 loads and 32 conversions per run; 2.6 bytes per column) - the launcher takes F32 where it
// costs no CTAs per SM (v4_x_f32). Each run's x is padded by 16 bytes (144 / 80 bytes): the 8 lanes of a
// quarter-warp, whose runs are consecutive, then read 8 distinct bank groups. The group scale and zero
// point are loaded with the weights (a batch ahead; for staged batches from global memory), one word per
// run (int4_scale_zero); the run's term is scale * (S - f(z) X) and the row's sum is multiplied by 256 at
// the row's end (the scale stays outside row_scale, which is 1).
template <bool kF32>
struct StreamInt4 {
  static constexpr int kElems = 32;
  static constexpr int kXStride = kF32 ? 144 : 80;  // bytes per run of x in shared memory
  struct Raw {
    uint4 v;
    uint32_t sz;  // the run's group scale (F16 bits) | zero point << 16
  };
  __device__ static float row_scale(const GemvParams&, int64_t) { return 1.0f; }

  // Shared memory after the staging: X of every run (F32, 16-byte aligned), then x.
  __host__ __device__ static int64_t sums_bytes(int64_t k) { return (k / 32 * 4 + 15) / 16 * 16; }
  __host__ __device__ static int64_t bytes(int64_t k) { return sums_bytes(k) + k / 32 * kXStride; }

  // Run g of x (its 64 bytes of BF16) into shared memory with its X.
  __device__ static void put_x(const GemvParams& p, uint8_t* sm, int g) {
    const uint4* xp = reinterpret_cast<const uint4*>(p.x) + 4 * g;
    uint4 raw[4];
    float xv[32];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      raw[c] = __ldg(xp + c);
      bf16x8_to_float(raw[c], xv + 8 * c);
    }
    reinterpret_cast<float*>(sm)[g] = gemv::int4_run_sum(xv);
    uint8_t* at = sm + sums_bytes(p.k) + int64_t{g} * kXStride;
#pragma unroll
    for (int c = 0; c < (kF32 ? 8 : 4); ++c) {
      if constexpr (kF32)
        reinterpret_cast<float4*>(at)[c] =
            make_float4(xv[4 * c], xv[4 * c + 1], xv[4 * c + 2], xv[4 * c + 3]);
      else
        reinterpret_cast<uint4*>(at)[c] = raw[c];
    }
  }
  // Run g's x and X from shared memory (sums: the X table, x: the runs).
  __device__ static void get_x(const float* sums, const uint8_t* x, int g, float (&xv)[32], float& xsum) {
    xsum = sums[g];
    const uint8_t* at = x + g * kXStride;
#pragma unroll
    for (int c = 0; c < (kF32 ? 8 : 4); ++c) {
      if constexpr (kF32) {
        const float4 t = reinterpret_cast<const float4*>(at)[c];
        xv[4 * c] = t.x;
        xv[4 * c + 1] = t.y;
        xv[4 * c + 2] = t.z;
        xv[4 * c + 3] = t.w;
      } else {
        bf16x8_to_float(reinterpret_cast<const uint4*>(at)[c], xv + 8 * c);
      }
    }
  }
  __device__ static void dot(const Raw& r, const float (&xv)[32], float xsum, float& acc) {
    acc = gemv::int4_run_term({r.v.x, r.v.y, r.v.z, r.v.w}, r.sz, xv, xsum, acc);
  }

  // A batch's loads (granules g0, g0 + 32, ... below `granules` of the R rows): the weights (kWeights;
  // else they come from shared memory) and each run's scale and zero point (kZero; else 8). SH =
  // group_shift: 2^SH runs per group, so that the lane's successive runs (32 apart) are 32 >> SH groups
  // apart: immediate offsets. Offsets within the weight in 32 bits (the launcher checks that they fit).
  template <int SH, bool kZero, bool kWeights, int R, int U>
  __device__ static void load_batch_of(const GemvParams& p, const int64_t (&rows)[R], int64_t g0,
                                       int64_t granules, Raw (&raw)[R][U]) {
    constexpr int kGroupStride = kWarp >> SH;
    const uint32_t g = static_cast<uint32_t>(g0), runs = static_cast<uint32_t>(granules);
    const uint8_t* const wg = p.w + 16 * g0;
    const uint8_t* w[R];
    const unsigned short* s[R];
    const uint8_t* z[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t row = static_cast<uint32_t>(rows[r]);
      const uint32_t at = row * static_cast<uint32_t>(p.groups_per_row) + (g >> SH);
      w[r] = wg + static_cast<uint64_t>(row) * static_cast<uint32_t>(p.row_bytes);
      s[r] = static_cast<const unsigned short*>(p.scale) + at;
      if constexpr (kZero) z[r] = p.zero + at;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (g + kWarp * u < runs) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if constexpr (kWeights) raw[r][u].v = load_stream(w[r] + v4_batch_row_bytes(u));
          const uint32_t scale = __ldg(s[r] + u * kGroupStride);
          if constexpr (kZero)
            raw[r][u].sz = gemv::int4_scale_zero(scale, __ldg(z[r] + u * kGroupStride));
          else
            raw[r][u].sz = scale | 8u << 16;  // int4_scale_zero(scale, 8)
        }
      }
    }
  }
  template <bool kWeights, int R, int U>
  __device__ static void load_batch(const GemvParams& p, const int64_t (&rows)[R], int64_t g0,
                                    int64_t granules, Raw (&raw)[R][U]) {
    auto by_shift = [&](auto zero) {
      constexpr bool kZero = decltype(zero)::value;
      if (p.group_shift == 0)
        load_batch_of<0, kZero, kWeights>(p, rows, g0, granules, raw);
      else if (p.group_shift == 1)
        load_batch_of<1, kZero, kWeights>(p, rows, g0, granules, raw);
      else
        load_batch_of<2, kZero, kWeights>(p, rows, g0, granules, raw);
    };
    if (p.zero != nullptr)
      by_shift(std::true_type{});
    else
      by_shift(std::false_type{});
  }
  // Whether the 32-bit offsets of load_batch_of hold for a weight of `rows` rows.
  static bool offsets_fit(const GemvParams& p, int64_t rows) {
    return rows * p.row_bytes < (int64_t{1} << 31) && rows * p.groups_per_row < (int64_t{1} << 31);
  }
};
template <class Dec>
constexpr bool kStreamInt4 = false;
template <bool kF32>
constexpr bool kStreamInt4<StreamInt4<kF32>> = true;

// CTAs per SM a v4 instance's registers are held to: FP8 with 4 loads per lane (R * U = 4, the 8B products)
// to 6 (80 registers), so that more warps can keep loads in flight (ncu, H100 2026-12-07: the 8B FP8 gate/up
// at 73% of DRAM bandwidth, 0.6 eligible warps per scheduler, stalled on its loads; with 6 CTAs the 8B
// fp8:lm_head step is 1.4% shorter, v4_ctas_per_sm); the rest as ptxas likes (5 for the 8-load kernels lost).
template <class Dec, int R, int U>
constexpr int v4_min_ctas() {
  return std::is_same_v<Dec, DecodeFp8> && R * U <= 4 ? 6 : 1;
}

template <class Dec, int R, int U, bool kSilu>
__global__ void __launch_bounds__(kGemvThreads, v4_min_ctas<Dec, R, U>())
    gemv_stream_kernel(const GemvParams p) {
  using Raw = typename Dec::Raw;
  constexpr bool kInt4 = kStreamInt4<Dec>;  // x from shared memory, filled by the whole CTA
  extern __shared__ __align__(128) uint8_t v4_smem[];
  const int lane = threadIdx.x % kWarp, wib = threadIdx.x / kWarp;
  // K split (p.ksplit = ks): warps wib = j * ks .. j * ks + ks - 1 of a CTA take the same row groups, warp
  // seg = wib % ks batches [seg, seg + 1) * batches / ks of each; the group's first warp adds the others'
  // sums (shared memory, a named barrier per group) and stores. ks = 1: every warp its own rows.
  const int ks = p.ksplit, seg = wib % ks;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kGemvWarps / ks);  // row-group slots
  const int64_t nrows = warp_row_count<R, kSilu>(p);
  int64_t n = static_cast<int64_t>(blockIdx.x) * (kGemvWarps / ks) + wib / ks;
  // The norm fusion's CTA-wide sums and INT4's x in shared memory need every warp, rows or not.
  const bool active = n < nrows, cta_wide = p.residual != nullptr || p.in_partials != nullptr || kInt4;
  if (!active && !cta_wide) return;
  __shared__ float sums[kWarp];
  __shared__ float split_sums[2][kGemvWarps][R];  // K split: each warp's sums, by the group's round parity
  float in_scale = 1.0f;
  ResidualRows rr;
  // Lane 0 loads row group g's residual and norm weight for the epilogue (p.residual; after the PDL wait:
  // the previous kernels write the residual).
  auto load_residual_rows = [&](int64_t g) {
    if (p.residual == nullptr || lane != 0) return;
    int64_t rows[R];
    const int valid = warp_rows<R, kSilu>(p, g, rows);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < valid) {
        rr.res[r] = p.residual[rows[r]];
        rr.gam[r] = __ldg(p.norm_weight + rows[r]);
      }
    }
  };
  const int64_t n0 = n;  // the warp's first row (group): its first p.pf_batches batches are staged
  const int64_t pf_bytes = p.pf_batches * v4_batch_row_bytes(U);
  uint64_t* bar = reinterpret_cast<uint64_t*>(v4_smem) + wib;
  uint8_t* stage = v4_smem + kV4BarBytes + wib * R * pf_bytes;
  // INT4: the runs' sums X and x, after the staging (StreamInt4::bytes).
  uint8_t* const xsm = v4_smem + (p.pf_batches > 0 ? kV4BarBytes + kGemvWarps * R * pf_bytes : 0);
  // Batch b_lo + batch (batch < p.pf_batches) of row group n0 from shared memory: the same lanes' granules
  // as from global.
  auto load_staged = [&](int batch, Raw(&raw)[R][U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t g = static_cast<int64_t>(batch) * kWarp * U + kWarp * u + lane;
#pragma unroll
      for (int r = 0; r < R; ++r)
        raw[r][u].v = *reinterpret_cast<const uint4*>(stage + r * pf_bytes + g * 16);
    }
  };
  const int64_t granules = p.k / Dec::kElems;
  const int batches = static_cast<int>((granules + kWarp * U - 1) / (kWarp * U));
  // This warp's batches of each row: [b_lo, b_hi) (the launcher makes ks divide batches).
  const int b_lo = seg * (batches / ks), b_hi = b_lo + batches / ks;
  auto first = [&](int batch) { return static_cast<int64_t>(batch) * kWarp * U + lane; };
  int b = b_lo;  // the batch of row n that `cur` holds
  int parity = 0;
  float acc[R][1];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;

  // Uses `cur` (batch b of row n) and fills `nxt` with the warp's next batch; false after the last.
  auto step = [&](Raw(&cur)[R][U], Raw(&nxt)[R][U]) {
    int64_t next_n = n;
    int next_b = b + 1;
    if (next_b == b_hi) {
      next_b = b_lo;
      next_n = n + warps;
    }
    const bool more = next_n < nrows;
    if (more && next_n == n0 && next_b - b_lo < p.pf_batches) {
      load_staged(next_b - b_lo, nxt);
      if constexpr (kInt4) {  // the staged runs' scales and zero points
        int64_t next_rows[R];
        warp_rows<R, kSilu>(p, next_n, next_rows);
        Dec::template load_batch<false>(p, next_rows, first(next_b), granules, nxt);
      }
    } else if (more) {
      int64_t next_rows[R];
      warp_rows<R, kSilu>(p, next_n, next_rows);
      if constexpr (kInt4)
        Dec::template load_batch<true>(p, next_rows, first(next_b), granules, nxt);
      else
        load_granules<Dec, R, U>(p, next_rows, first(next_b), granules, nxt);
    } else {
      if (!p.late_trigger) pdl_launch_dependents();  // after the weight stream (see the file comment)
    }
    // Not dot_granules (v1's order: each weight granule expanded, then x loaded per 8 columns and row): x's
    // granule loaded and converted once for the R rows, then their weights. With dot_granules v4 measured
    // 4.5% slower end to end at batch 1 (fp8:lm_head 338.3-339.7 vs 354.2-356.4 tok/s, H200 2026-12-03
    // 13:52, the same call); the cause (instruction order or the extra x conversion of R = 2) was not
    // profiled.
    if constexpr (kInt4) {  // x and the run's X from shared memory, then each row's run term (32-bit indices)
      const int g0 = static_cast<int>(first(b)), runs = static_cast<int>(granules);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int g = g0 + kWarp * u;
        if (g >= runs) break;
        float xv[32], xsum;
        Dec::get_x(reinterpret_cast<const float*>(xsm), xsm + Dec::sums_bytes(p.k), g, xv, xsum);
#pragma unroll
        for (int r = 0; r < R; ++r) Dec::dot(cur[r][u], xv, xsum, acc[r][0]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t g = first(b) + static_cast<int64_t>(kWarp) * u;
        if (g >= granules) break;
        constexpr int E = Dec::kElems;
        const uint4* xp = reinterpret_cast<const uint4*>(p.x + g * E);
        float xv[E];
#pragma unroll
        for (int c = 0; c < E / 8; ++c) bf16x8_to_float(__ldg(xp + c), xv + 8 * c);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float w[E];
          Dec::expand(p, cur[r][u], w);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[r][0] = fmaf(w[e], xv[e], acc[r][0]);
        }
      }
    }
    if (next_n != n) {  // row n is complete (this warp's part of it)
      if constexpr (kInt4) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] *= gemv::kInt4RunFactor;  // exact: the runs' terms were S / 256
      }
      if (ks > 1) {
        // The group's sums: each warp's into shared memory, the group's first warp adds them in order
        // (deterministic) and stores through gemv_finish (lane 0 holds the total, the others 0).
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] = warp_sum(acc[r][0]);
        if (lane == 0) {
#pragma unroll
          for (int r = 0; r < R; ++r) split_sums[parity][wib][r] = acc[r][0];
        }
        named_barrier_sync<kGemvWarps>(1 + wib / ks, ks * kWarp);
        if (seg == 0) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float total = 0.0f;
            for (int j = 0; j < ks; ++j) total += split_sums[parity][wib + j][r];
            acc[r][0] = lane == 0 ? total : 0.0f;
          }
        }
        parity ^= 1;  // a group's warps meet at every round's barrier: two slots never race
      }
      if (seg == 0) {
        int64_t wrow[R];
        const int valid = warp_rows<R, kSilu>(p, n, wrow);
        gemv_finish<Dec, 1, R, kSilu>(p, n, wrow, acc, valid, in_scale, p.residual ? &rr : nullptr);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
      if (more) load_residual_rows(next_n);
    }
    n = next_n;
    b = next_b;
    return more;
  };

  Raw a[R][U], c[R][U];
  int64_t wrow[R];
  if (active) warp_rows<R, kSilu>(p, n, wrow);
  const bool staged = active && p.pf_batches > 0;
  if (staged) {
    if (lane == 0) {
      mbar_init(bar, 1);
      mbar_init_fence();
      mbar_expect_tx(bar, static_cast<uint32_t>(R * pf_bytes));
#pragma unroll
      for (int r = 0; r < R; ++r)
        bulk_copy(stage + r * pf_bytes, p.w + wrow[r] * p.row_bytes + b_lo * v4_batch_row_bytes(U),
                  static_cast<uint32_t>(pf_bytes), bar);
    }
    __syncwarp();
    if constexpr (kInt4) Dec::template load_batch<false>(p, wrow, first(b_lo), granules, a);  // scales, zeros
  } else if (active) {
    if constexpr (kInt4)
      Dec::template load_batch<true>(p, wrow, first(b_lo), granules, a);
    else
      load_granules<Dec, R, U>(p, wrow, first(b_lo), granules, a);
  }
  pdl_wait();  // the staged batches or the first batch are in flight (cuda_common.cuh)
  if (!active && !p.late_trigger) pdl_launch_dependents();  // no weights to stream (others: after theirs)
  if constexpr (kInt4) {  // x (written by the previous kernel) and its run sums, once per CTA
    for (int g = threadIdx.x; g < granules; g += kGemvThreads) Dec::put_x(p, xsm, g);
    __syncthreads();
  }
  if (p.in_partials != nullptr) {
    // The residual epilogue's partial sums of squares, summed in a fixed order (deterministic), while
    // the first weights arrive.
    float ss = 0.0f;
    if (p.warp_prenorm) {  // each warp on its own: no CTA barrier
#pragma unroll 4
      for (int i = lane; i < p.in_ctas; i += kWarp) ss += p.in_partials[i];
      ss = warp_sum(ss);
    } else {
#pragma unroll 4
      for (int i = threadIdx.x; i < p.in_ctas; i += kGemvThreads) ss += p.in_partials[i];
      ss = block_sum(ss, sums);
    }
    in_scale = rsqrtf(ss / static_cast<float>(p.k) + p.eps);
  }
  if (active) {
    load_residual_rows(n);
    if (staged) {
      mbar_wait(bar, 0);
      load_staged(0, a);
    }
    while (step(a, c) && step(c, a)) {
    }
  }
  if (p.residual != nullptr) {
    const float ss = block_sum(rr.ss, sums);  // lane 0 of each warp holds its rows' sum
    if (threadIdx.x == 0) p.partials[blockIdx.x] = ss;
  }
}

// v4's weight loads per lane and batch, split over the R rows (4 or 8; 0: by the row's length, v4_loads_for),
// and its CTAs per SM (0: as many as fit): set_gemv_v4_shape, else INFERX_GEMV_V4_LOADS (4, 8, default 0) /
// INFERX_GEMV_V4_CTAS_PER_SM (default 0: as many as fit). Read once. Until 2026-12-07 every v4 kernel ran at
// most 4 CTAs per SM (all 16 hardware barriers reserved, see named_barrier_sync). Measured once the barrier
// ids became immediates (H100, 2026-12-07 07:18, 8B batch 1, 1k context, TPOT p50, one call,
// bench/gpu/pending.sh step 26): fp8:lm_head 3.508 / 3.498 ms before the change, 3.613 with it at 4 CTAs,
// 3.451 / 3.454 with as many as fit (6 for the FP8 4-load kernels: -1.4%); bf16 and int4:lm_head level
// (their kernels still fit 4). Holding the 8-load kernels to 96 registers for 5 CTAs lost (bf16 +3.5%, 70B
// fp8:lm_head +7.4%).
std::atomic<int> g_v4_loads{0}, g_v4_ctas{-1}, g_v4_smem_kb{-1};
int v4_loads() {
  static const int env = env_int("INFERX_GEMV_V4_LOADS", 0, 8, 0);
  const int o = g_v4_loads.load(std::memory_order_relaxed);
  return o == 4 || o == 8 ? o : env == 4 || env == 8 ? env : 0;
}
// The loads of a product of `rows` rows of row_bytes: 8 from 8 KB rows (FP8: of products of at least 8192
// rows), else 4 - an empirical rule. Measured at batch 1, 1k context, TPOT p50, each pair in one call: one
// H200 node (2026-12-05 16:55): 70B fp8:lm_head (8-28 KB rows, 8192-57344 rows) 21.632 ms with 4, 20.614
// with 8 (+4.9%; its products alone in chains: q/k/v 31.2 -> 28.7 us, gate/up + SiLU 123.9 -> 113.9, down
// 69.8 -> 66.2); 8B bf16 (8 KB rows; down on cuBLASLt) 4.688 -> 4.550 ms (+3.0%); 8B fp8:lm_head 2.992 ->
// 3.136 ms with 8 everywhere (-4.6%). An H100 (17:00), 8 from 8 KB rows: 70B 26.868 -> 26.44 ms (+1.6%), 8B
// bf16 6.026 -> 5.933 (+1.5%), 8B fp8:lm_head 3.544 -> 3.561 (-0.5%: its 4096-row down product, 14 KB rows,
// the one FP8 product that changed) - hence the row count for FP8. (On 12-03 10:41, before pairs and the
// shared-memory staging, 8 everywhere had lost in both formats.) INT4 follows FP8's rule in bytes (8 loads
// from rows of 16384 columns in products of 8192 rows; with 8 loads the 8B chains (H100, 12-05 18:55) gain 6%
// on 6144x4096 and lose 2-15% on the other three shapes).
template <class Dec>
int v4_loads_for(int64_t rows, int64_t row_bytes) {
  const int forced = v4_loads();
  if (forced != 0) return forced;
  return row_bytes >= 8192 && (std::is_same_v<Dec, DecodeBf16> || rows >= 8192) ? 8 : 4;
}
int v4_ctas_per_sm() {
  static const int env = env_int("INFERX_GEMV_V4_CTAS_PER_SM", 0, 64, 0);
  const int o = g_v4_ctas.load(std::memory_order_relaxed);
  return o >= 0 ? o : env;
}

// v4's shared-memory prefetch budget per SM in KB (0: off): set_gemv_v4_shape, else
// INFERX_GEMV_V4_SMEM_KB (0..200), else tuned per card: 96 on an H200, off elsewhere. Read once.
// - H200 (2026-12-03 21:10-21:20, an older build, 4 CTAs per SM; 8B, batch 1, 1k context, TPOT p50, two runs
//   each in one call): fp8:lm_head 2.817 / 2.803 ms off, 2.804 at 64, 2.748 / 2.759 at 96, 2.845 at 128,
//   2.899 at 160, 2.981 at 200; BF16 through v4 with 96: 4.407 / 4.417 against v1's 4.543 / 4.546; 70B
//   fp8:lm_head unchanged (19.15 vs 19.18 ms). Alone in a chain of the same product (bench_cuda_kernels) 96
//   KB gains 2-3% on 6144- and 28672-row FP8 products and 3% on BF16 14336x4096, nothing on 4096x4096.
// - H100 (2026-12-07 08:10, this build, as many CTAs per SM as fit; same workload, one node): fp8:lm_head
//   3.324-3.329 ms off, 3.324-3.332 at 32 (which stages nothing at 4-6 CTAs per SM), 3.364 at 64, 3.393-3.400
//   at 96 (+2.2%), 3.473 at 128; held to 4 CTAs 3.457 off against 3.550 at 96; bf16 5.755 / 5.759 off
//   against 5.786 / 5.787; 70B fp8:lm_head 25.288 ms off against 25.570 (91.2% / 90.0% of its roofline).
// Whether the H200 still gains with this build is queued (bench/gpu/pending.sh step 28); until then each
// card keeps what was measured on it. By name ("H200": a GH200 matches too, unmeasured), of the device
// current at the first launch: a process drives one kind of card.
int v4_smem_kb_for_card() {
  static const int kb = [] {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; the launch that follows reports a real failure
      return 0;
    }
    return std::string_view(prop.name).find("H200") != std::string_view::npos ? 96 : 0;
  }();
  return kb;
}
int v4_smem_kb() {
  static const int env = env_int("INFERX_GEMV_V4_SMEM_KB", -1, 200, -1);
  const int o = g_v4_smem_kb.load(std::memory_order_relaxed);
  return o >= 0 ? o : env >= 0 ? env : v4_smem_kb_for_card();
}

// v4's K split (kernels_gemv.h gemv_v4_ksplit): set_gemv_v4_shape's ksplit, else INFERX_GEMV_V4_KSPLIT
// (0, the default: chosen per shape for BF16 weights, FP8 unsplit; 1: off; 2, 4: forced), read once.
// Measured on an H100 (2026-12-05 16:20-16:30, 8B at batch 1, 1k context, TPOT p50, two runs each in one
// call): BF16 5.906 / 5.907 ms unsplit, 5.871 / 5.872 chosen (the 6144-row qkv product 8 -> 6 batches per
// warp: 22.3 -> 20.9 us alone in a chain); FP8 (fp8:lm_head) 3.479 / 3.478 unsplit, 3.487 / 3.484 split as
// for BF16; 70B fp8:lm_head 26.08 / 26.05 vs 26.09 / 26.06 ms. So FP8 stays unsplit.
std::atomic<int> g_v4_ksplit{-1};
int v4_ksplit() {
  static const int env = env_int("INFERX_GEMV_V4_KSPLIT", 0, 4, 0);
  const int o = g_v4_ksplit.load(std::memory_order_relaxed);
  return o >= 0 ? o : env;
}
// The K split of a launch of `groups` row groups with batches of batch_elems columns on `warps` warps: only
// where K is a whole number of batches and the norm fusion's one-warp-per-row epilogue is not asked for;
// gemv_v4_ksplit's choice for BF16, FP8 and INT4 unsplit unless forced (the measurements above; INT4 not
// measured).
template <class Dec>
int v4_ksplit_for(const GemvParams& p, int64_t groups, int64_t batch_elems, int64_t warps) {
  const int requested = v4_ksplit();
  if (p.k % batch_elems != 0 || p.residual != nullptr || p.in_partials != nullptr) return 1;
  if (requested == 0 && !std::is_same_v<Dec, DecodeBf16>) return 1;
  return gemv_v4_ksplit(groups, p.k / batch_elems, warps, requested);
}

}  // namespace

// Attributes of the current device the launchers read on every launch, cached per device
// (kernels_gemv_impl.cuh).
enum DeviceAttr { kDevSms, kDevSmemPerSm, kDevSmemReserved, kDevAttrs };
cudaError_t device_attr(DeviceAttr a, int& value) {
  static constexpr cudaDeviceAttr kQuery[kDevAttrs] = {cudaDevAttrMultiProcessorCount,
                                                       cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                                       cudaDevAttrReservedSharedMemoryPerBlock};
  static std::atomic<int> cache[32][kDevAttrs];  // value + 1 (0: not asked yet; a reservation may be 0)
  int device = 0;
  cudaError_t st = cudaGetDevice(&device);
  if (st != cudaSuccess) return st;
  const bool cached = device >= 0 && device < 32;
  if (cached) {
    const int v = cache[device][a].load(std::memory_order_relaxed);
    if (v > 0) {
      value = v - 1;
      return cudaSuccess;
    }
  }
  st = cudaDeviceGetAttribute(&value, kQuery[a], device);
  if (st == cudaSuccess && cached) cache[device][a].store(value + 1, std::memory_order_relaxed);
  return st;
}
cudaError_t device_sms(int& sms) { return device_attr(kDevSms, sms); }
cudaError_t device_smem(int& per_sm, int& reserved) {
  const cudaError_t st = device_attr(kDevSmemPerSm, per_sm);
  return st != cudaSuccess ? st : device_attr(kDevSmemReserved, reserved);
}

namespace {

// A v4 kernel's CTAs per SM: as many as its registers allow (the occupancy calculator, cached per instance:
// the same on every H200 / H100), at most v4_ctas_per_sm(); INT4 (StreamInt4) also as many as the shared
// memory of its x (beyond any staging) lets share an SM, and *fixed receives that memory per CTA with the
// kernel's static shared memory and the system's reserve (0: not one CTA fits). Others: *fixed = 0.
template <class Dec, int R, int L, bool kSilu>
cudaError_t v4_fit(const GemvParams& p, int& per_sm, int64_t* fixed = nullptr) {
  const auto kernel = gemv_stream_kernel<Dec, R, L / R, kSilu>;
  static std::atomic<int> fit{0};
  per_sm = fit.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    const cudaError_t st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvThreads, 0);
    if (st != cudaSuccess) return st;
    per_sm = std::max(per_sm, 1);
    fit.store(per_sm, std::memory_order_relaxed);
  }
  if (const int cap = v4_ctas_per_sm(); cap > 0) per_sm = std::min(per_sm, cap);
  if (fixed != nullptr) *fixed = 0;
  if constexpr (kStreamInt4<Dec>) {
    static std::atomic<int> static_smem{-1};
    int own = static_smem.load(std::memory_order_relaxed);
    if (own < 0) {
      cudaFuncAttributes attr{};
      if (const cudaError_t st = cudaFuncGetAttributes(&attr, kernel); st != cudaSuccess) return st;
      own = static_cast<int>(attr.sharedSizeBytes);
      static_smem.store(own, std::memory_order_relaxed);
    }
    int sm_bytes = 0, reserved = 0;
    if (const cudaError_t st = device_smem(sm_bytes, reserved); st != cudaSuccess) return st;
    const int64_t cta = Dec::bytes(p.k) + own + reserved;
    per_sm = static_cast<int>(std::min<int64_t>(per_sm, sm_bytes / cta));
    if (fixed != nullptr) *fixed = cta;
  }
  return cudaSuccess;
}

// One wave of v4 CTAs (no more warps than rows). L: loads per lane and batch.
// kSilu: the SiLU product (R = 2), else a plain product with R rows per warp. INT4: cudaErrorNotSupported
// (nothing launched) where x does not fit in shared memory.
template <class Dec, int R, int L, bool kSilu>
cudaError_t launch_stream(const GemvParams& p, cudaStream_t stream) {
  const auto kernel = gemv_stream_kernel<Dec, R, L / R, kSilu>;
  int per_sm = 0;
  int64_t fixed = 0;  // INT4: shared memory per CTA besides the staging (v4_fit)
  if (const cudaError_t st = v4_fit<Dec, R, L, kSilu>(p, per_sm, &fixed); st != cudaSuccess) return st;
  if (per_sm < 1) return cudaErrorNotSupported;
  int sms = 0;
  if (const cudaError_t st = device_sms(sms); st != cudaSuccess) return st;
  const int64_t groups = warp_row_count<R, kSilu>(p);
  const int ks = v4_ksplit_for<Dec>(p, groups, int64_t{kWarp} * (L / R) * Dec::kElems,
                                    int64_t{sms} * per_sm * kGemvWarps);
  const int64_t ctas = std::min<int64_t>((groups * ks + kGemvWarps - 1) / kGemvWarps, int64_t{sms} * per_sm);
  GemvParams q = p;
  q.ksplit = ks;
  int staging_kb = v4_smem_kb();
  if constexpr (kStreamInt4<Dec>) {  // the staging gets what x leaves of the SM, at most its budget
    int sm_bytes = 0, reserved = 0;
    if (const cudaError_t st = device_smem(sm_bytes, reserved); st != cudaSuccess) return st;
    const int64_t left = sm_bytes - (ctas + sms - 1) / sms * fixed;
    staging_kb = static_cast<int>(std::clamp<int64_t>(left / 1024, 0, staging_kb));
  }
  q.pf_batches = gemv_v4_staged_batches(ctas, sms, R, L, p.row_bytes / ks, staging_kb);
  size_t smem = gemv_v4_smem_bytes(R, L, q.pf_batches);
  if constexpr (kStreamInt4<Dec>) smem += static_cast<size_t>(Dec::bytes(p.k));
  if (smem > 48 * 1024) {
    // The opt-in above 48 KB (allow_dynamic_smem: once per device and instance): the most a CTA may take
    // (227 KB on Hopper) less the kernel's static shared memory, asked once.
    static unsigned smem_set = 0;
    static std::atomic<int> own{-1};
    if (own.load(std::memory_order_relaxed) < 0) {
      cudaFuncAttributes attr{};
      if (const cudaError_t st = cudaFuncGetAttributes(&attr, kernel); st != cudaSuccess) return st;
      own.store(static_cast<int>(attr.sharedSizeBytes), std::memory_order_relaxed);
    }
    const int most = 227 * 1024 - own.load(std::memory_order_relaxed);
    if (const cudaError_t st = allow_dynamic_smem(kernel, most, smem_set); st != cudaSuccess) return st;
  }
  if (p.residual != nullptr && ctas > kGemvMaxPartials) return cudaErrorNotSupported;
  if (p.launched_ctas != nullptr) *p.launched_ctas = static_cast<int>(ctas);
  return launch_pdl(kernel, dim3(static_cast<unsigned>(ctas)), dim3(kGemvThreads), static_cast<size_t>(smem),
                    stream, q);
}

// Plain products give each v4 warp two rows, x converted once for both (set_gemv_v4_shape, else
// INFERX_GEMV_V4_PAIRS=1|0, default 1; read once): FP8 rows of 8-28 KB ran at 62-72% of copy with one
// (ncu 2026-12-03 14:14). Measured at batch 1, fp8:lm_head (H200 2026-12-03 14:19, one call): 70B 20.112 ms
// with one row per warp, 19.504 with pairs on the down projection only, 19.064 with pairs everywhere; 8B
// 2.804 / 2.796 / 2.776 ms.
std::atomic<int> g_v4_pairs{-1};
bool v4_pairs() {
  static const int env = env_int("INFERX_GEMV_V4_PAIRS", 0, 1, 1);
  const int o = g_v4_pairs.load(std::memory_order_relaxed);
  return (o == 0 || o == 1 ? o : env) == 1;
}

// INT4 puts x into shared memory as F32 (StreamInt4<true>) or BF16: set_gemv_v4_shape's x_f32, else
// INFERX_GEMV_V4_X_F32 (read once): 1, the default: F32 where it costs no CTAs per SM against BF16 (the
// 8B model's 4096-column products, not its 14336-column down product; chains on an H100: F32 ahead by 2.5-4%
// on 4096-column products, 28% behind on 4096x14336 - the default's choice); 2: F32
// wherever one CTA fits; 0: BF16.
std::atomic<int> g_v4_x_f32{-1};
int v4_x_f32() {
  static const int env = env_int("INFERX_GEMV_V4_X_F32", 0, 2, 1);
  const int o = g_v4_x_f32.load(std::memory_order_relaxed);
  return o >= 0 && o <= 2 ? o : env;
}
template <int R, int L, bool kSilu>
cudaError_t launch_stream_int4(const GemvParams& p, cudaStream_t stream) {
  if (const int mode = v4_x_f32(); mode != 0) {
    int f32 = 0, bf16 = 0;
    cudaError_t st = v4_fit<StreamInt4<true>, R, L, kSilu>(p, f32);
    if (st == cudaSuccess && mode == 1) st = v4_fit<StreamInt4<false>, R, L, kSilu>(p, bf16);
    if (st != cudaSuccess) return st;
    if (f32 >= 1 && f32 >= bf16) return launch_stream<StreamInt4<true>, R, L, kSilu>(p, stream);
  }
  return launch_stream<StreamInt4<false>, R, L, kSilu>(p, stream);
}
template <class Dec, int R, int L, bool kSilu>
cudaError_t launch_stream_of(const GemvParams& p, cudaStream_t stream) {
  if constexpr (kStreamInt4<Dec>)
    return launch_stream_int4<R, L, kSilu>(p, stream);
  else
    return launch_stream<Dec, R, L, kSilu>(p, stream);
}

// R = 2: the SiLU product; R = 1: a plain product (in pairs of rows unless v4_pairs() says not). INT4: Dec =
// StreamInt4<false> stands for both of its x layouts (launch_stream_int4 picks one).
template <class Dec, int R>
cudaError_t launch_stream(const GemvParams& p, cudaStream_t stream) {
  const bool four = v4_loads_for<Dec>(p.rows, p.row_bytes) == 4;
  if constexpr (R == 2)
    return four ? launch_stream_of<Dec, 2, 4, true>(p, stream) : launch_stream_of<Dec, 2, 8, true>(p, stream);
  if (v4_pairs())
    return four ? launch_stream_of<Dec, 2, 4, false>(p, stream)
                : launch_stream_of<Dec, 2, 8, false>(p, stream);
  return four ? launch_stream_of<Dec, 1, 4, false>(p, stream) : launch_stream_of<Dec, 1, 8, false>(p, stream);
}

}  // namespace

template <int R>
cudaError_t launch_v4(DType dtype, const GemvParams& p, cudaStream_t stream) {
  if (p.m != 1) return cudaErrorNotSupported;
  if (dtype == DType::BF16) return launch_stream<DecodeBf16, R>(p, stream);
  if (dtype == DType::F8_E4M3) return launch_stream<DecodeFp8, R>(p, stream);
  const bool norm_fusion = p.residual != nullptr || p.in_partials != nullptr;
  if (dtype == DType::INT4 && !norm_fusion && p.k % 32 == 0 &&
      StreamInt4<false>::offsets_fit(p, R == 2 ? 2 * p.f : p.rows))
    return launch_stream<StreamInt4<false>, R>(p, stream);  // NotSupported where x does not fit
  return cudaErrorNotSupported;
}
template cudaError_t launch_v4<1>(DType, const GemvParams&, cudaStream_t);
template cudaError_t launch_v4<2>(DType, const GemvParams&, cudaStream_t);

}  // namespace inferx::cuda::gemv_impl

namespace inferx::cuda {

using namespace gemv_impl;

int gemv_v4_staged_batches(int64_t ctas, int sms, int rows_per_warp, int loads, int64_t row_bytes,
                           int smem_kb) {
  if (smem_kb <= 0 || ctas <= 0 || sms <= 0 || rows_per_warp < 1 || loads < rows_per_warp) return 0;
  const int64_t on_sm = (ctas + sms - 1) / sms;  // the CTAs that share an SM's budget
  const int64_t per_warp = (int64_t{smem_kb} * 1024 / on_sm - kV4BarBytes) / kGemvWarps;
  const int64_t batch = v4_batch_row_bytes(loads / rows_per_warp);
  return static_cast<int>(std::clamp<int64_t>(per_warp / (rows_per_warp * batch), 0, row_bytes / batch));
}

size_t gemv_v4_smem_bytes(int rows_per_warp, int loads, int batches) {
  return batches > 0 ? static_cast<size_t>(kV4BarBytes + int64_t{kGemvWarps} * rows_per_warp * batches *
                                                             v4_batch_row_bytes(loads / rows_per_warp))
                     : 0;
}

int gemv_v4_ksplit(int64_t groups, int64_t batches, int64_t warps, int requested) {
  if (groups <= 0 || batches <= 0 || warps <= 0) return 1;
  if (requested > 0) {  // the largest of 4, 2, 1 not above the request that divides the batches
    int ks = requested >= 4 ? 4 : requested >= 2 ? 2 : 1;
    while (ks > 1 && batches % ks != 0) ks /= 2;
    return ks;
  }
  // Chosen: the fewest batches the busiest warp streams in a row, ceil(groups * ks / warps) rounds of
  // batches / ks each, where that is at most 3/4 of the unsplit count; ties go to the smaller split (fewer
  // partial sums to add). Why the margin: splitting the 128256-row lm_head (64 -> 61 batches) or the
  // 4096x14336 down product changed nothing or lost in a chain of the same product (H100, 2026-12-05
  // 16:20: BF16 lm_head 343 -> 349 us), while the qkv product (8 -> 6) gained 6%.
  const int64_t unsplit = (groups + warps - 1) / warps * batches;
  int best = 1;
  int64_t best_cost = unsplit;
  for (int ks : {2, 4}) {
    if (batches % ks != 0) continue;
    const int64_t cost = (groups * ks + warps - 1) / warps * (batches / ks);
    if (cost < best_cost && 4 * cost <= 3 * unsplit) {
      best = ks;
      best_cost = cost;
    }
  }
  return best;
}

void set_gemv_v4_shape(int loads, int ctas_per_sm, int pairs, int smem_kb, int ksplit, int x_f32) {
  g_v4_x_f32.store(x_f32, std::memory_order_relaxed);
  g_v4_ksplit.store(ksplit, std::memory_order_relaxed);
  g_v4_loads.store(loads, std::memory_order_relaxed);
  g_v4_ctas.store(ctas_per_sm, std::memory_order_relaxed);
  g_v4_pairs.store(pairs, std::memory_order_relaxed);
  g_v4_smem_kb.store(smem_kb, std::memory_order_relaxed);
}

}  // namespace inferx::cuda
