// GEMV v5: the dot products on tensor cores, on v4's streaming plan (the operand layout and why:
// gemv_tc_stream_layout.h; the choice between the kernels: kernels_gemv.cu). Three formats:
//   BF16 (S = -1): no decode at all; a lane's 16 bytes of a row feed two mma.m16n8k16.bf16 with x from L1
//     (the same register pairing as FP8's steps). The epilogue adds the bias (SiLU: v3's fast SiLU).
//   FP8 (S = 0), W8A8: the CTA quantizes x per token into shared memory (quant_codes.cuh: the codes and
//     scales of the FP8 GEMM's activation pass and of the CPU backend) and each chunk is two
//     mma.m16n8k32.e4m3 - no per-weight instruction. The epilogue is the W8A8 epilogue's arithmetic
//     (w8a8_value / w8a8_silu_up, kernels_quant_math.h).
//   INT4 (S = 128 / group subsets), W4A16 as v3: a lane's 16 bytes of a row are one 32-column run, decoded
//     to exact BF16 code - z (gemv::TcInt4, ~1.5 instructions per weight) for eight mma.m16n8k16.bf16 with
//     x in BF16 from L1; B column n holds activation row n / S on the columns of group subset n % S (v3's
//     scheme: a tensor-core sum never mixes two groups), and each is scaled by its group's scale. The
//     epilogue adds a row's S subsets, the bias, and for the SiLU product v3's fast SiLU.
// The plan, both formats:
//   - One wave of persistent warps. A warp takes tiles of 16 weight rows (SiLU: 8 gate rows over their 8
//     up rows), interleaved over the CTAs (tile n to group n / ctas of CTA n % ctas, so that products with
//     fewer tiles than warps spread over every SM), and streams each tile in batches of U 64-byte chunks per
//     row with the next batch's loads in flight while the current one is multiplied, across tile ends too.
//   - K split (tcs::ksplit_for): ks warps of a CTA share a tile, each a 1/ks of its batches, and meet in
//     shared memory (a named barrier per group) where the group's first warp adds the sums in order
//     (deterministic) and stores.
//   - Before the PDL wait each warp has the copy engine stage the first batches of its first tile in shared
//     memory (cp.async.bulk, one copy per row), so the weight stream runs across the kernel boundary (v4's
//     measured gain); INT4's group scales and zero points come from global memory with each batch.
//   - Each chunk's products go into a fresh F32 fragment that is then added (INT4: times its group scale) to
//     the running sums, so that a tensor-core sum covers at most one chunk (the FP8 tensor-core
//     accumulation is narrower than F32 on Hopper).
// Not taken (cudaErrorNotSupported, nothing launched): other formats, the norm fusion, rows not whole
// 64-byte chunks, more activation rows than 16 (INT4: 16 / S), unaligned pointers, FP8 x codes larger than
// tcs::kMaxXBytes, or a plan whose shared memory does not fit (tcs::plan_launch).
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

// One batch of a warp: the lane's U chunks of its two rows, and for INT4 each chunk's zero-point pairs
// (gemv::int4_zero_pair, rows g and g + 8) and the F16 group scales of its C columns 2t, 2t + 1 (kCS
// distinct subsets among them).
template <int S, int U>
struct V5Batch {
  static constexpr int kCS = S <= 1 ? 1 : 2;
  static constexpr int kN = S > 0 ? U : 1;  // FP8 and BF16 carry no extras
  uint4 w[2][U];
  struct Groups {
    uint32_t zz[kN][2];
    uint16_t gs[kN][2][kCS];
  } grp;
};

// S: -1 for BF16, 0 for FP8 (W8A8), else INT4 with S group subsets per 128-column chunk. U: chunks per row
// and batch (2U 16-byte weight loads per lane). NT: n-tiles of 8 B columns (FP8: activation rows; INT4: rows
// x S). kRing: the weights stream through a cp.async ring of L.ring batches per warp in shared memory instead
// of a second batch of registers, so the bytes in flight are not bounded by the registers (L.ring - 1 batches
// ahead; no staging, the ring's first batches are issued before the PDL wait).
template <int S, int U, int NT, bool kSilu, bool kRing>
__global__ void __launch_bounds__(kV5Threads, 2) gemv_tc_stream_kernel(const GemvParams p, const V5Layout L) {
  constexpr bool kInt4 = S > 0, kBf16 = S < 0, kFp8Format = S == 0;
  constexpr int kCS = V5Batch<S, U>::kCS;
  using Batch = V5Batch<S, U>;
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
  const auto* const scale16 = static_cast<const uint16_t*>(p.scale);  // INT4: F16 [rows][groups_per_row]
  // INT4: lane t's run of a chunk belongs to subset `sub`; B column 8 nt + g is activation row xrow[nt]'s
  // subset (8 nt + g) % S, which lane t supplies (xon) only when that is its own subset.
  int sub = 0;
  if constexpr (kInt4) sub = gemv::tc_subset(t, S);
  bool xon[NT];
  int64_t xrow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int col = 8 * nt + g;
    if constexpr (kInt4) {
      xon[nt] = col % S == sub && col / S < p.m;
      xrow[nt] = min(col / S, p.m - 1);
    } else {
      xon[nt] = col < p.m;
      xrow[nt] = col;
    }
  }

  // The lane's two weight rows of a tile (g, g + 8), at its 16 bytes of chunk 0; INT4: their rows of zero
  // points and group scales.
  int64_t row_lo = 0, row_hi = 0;
  const uint8_t *wlo = p.w, *whi = p.w;
  auto set_rows = [&](int64_t tile) {
    row_lo = tcs::tile_row(tile, g, p.rows, p.f, kSilu);
    row_hi = tcs::tile_row(tile, g + 8, p.rows, p.f, kSilu);
    wlo = p.w + row_lo * p.row_bytes + tcs::granule_offset(0, t);
    whi = p.w + row_hi * p.row_bytes + tcs::granule_offset(0, t);
  };
  // INT4: chunk c's zero points and group scales of the lane's rows.
  auto load_groups = [&](int64_t c, int u, Batch& bt) {
    if constexpr (kInt4) {
      const int64_t base_lo = row_lo * p.groups_per_row + c * S, base_hi = row_hi * p.groups_per_row + c * S;
      bt.grp.zz[u][0] = gemv::int4_zero_pair(p.zero ? __ldg(p.zero + base_lo + sub) : 8u);
      bt.grp.zz[u][1] = gemv::int4_zero_pair(p.zero ? __ldg(p.zero + base_hi + sub) : 8u);
#pragma unroll
      for (int h = 0; h < kCS; ++h) {
        bt.grp.gs[u][0][h] = __ldg(scale16 + base_lo + (2 * t + h) % S);
        bt.grp.gs[u][1][h] = __ldg(scale16 + base_hi + (2 * t + h) % S);
      }
    }
  };
  auto load_global = [&](int b, Batch& bt) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b) * U + u;
      if (c < chunks) {
        bt.w[0][u] = load_stream(wlo + c * tcs::kChunkBytes);
        bt.w[1][u] = load_stream(whi + c * tcs::kChunkBytes);
        load_groups(c, u, bt);
      }
    }
  };
  // Batch b_lo + b of tile n0 from the staging (row r at stage + r * stage_row, its chunks from b_lo * U on).
  auto load_staged = [&](int b, Batch& bt) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b_lo + b) * U + u;
      if (c < chunks) {
        const int64_t at = tcs::granule_offset(static_cast<int64_t>(b) * U + u, t);
        bt.w[0][u] = *reinterpret_cast<const uint4*>(stage + g * L.stage_row + at);
        bt.w[1][u] = *reinterpret_cast<const uint4*>(stage + (g + 8) * L.stage_row + at);
        load_groups(c, u, bt);
      }
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
  auto multiply = [&](const Batch& bt, int b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = static_cast<int64_t>(b) * U + u;
      if (c >= chunks) break;  // warp-uniform
      uint32_t lo[4], hi[4];
      to_words(bt.w[0][u], lo);
      to_words(bt.w[1][u], hi);
      if constexpr (kInt4) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          // x of the lane's run (32 BF16 columns, 64 bytes) of its B column's activation row, from L1.
          const uint4* xp = reinterpret_cast<const uint4*>(p.x + xrow[nt] * p.k) + (4 * c + t) * 4;
          uint4 xv[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) xv[i] = xon[nt] ? __ldg(xp + i) : make_uint4(0, 0, 0, 0);
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          // Word w of each row's run at a time (gemv::TcInt4::decode's pieces 2w, 2w + 1: columns 4w.. and
          // 16 + 4w..), so that only its decoded registers live beside the batch.
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            uint32_t l0[2], h0[2], l1[2], h1[2];
            gemv::int4_word_bf16(lo[w], bt.grp.zz[u][0], l0, h0);
            gemv::int4_word_bf16(hi[w], bt.grp.zz[u][1], l1, h1);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int q = gemv::TcInt4::piece(2 * w + half);  // columns 4q..4q+3: half q % 2 of load q / 2
              const uint32_t a[4] = {half ? h0[0] : l0[0], half ? h1[0] : l1[0], half ? h0[1] : l0[1],
                                     half ? h1[1] : l1[1]};
              mma_16816(d, a, q % 2 ? xv[q / 2].z : xv[q / 2].x, q % 2 ? xv[q / 2].w : xv[q / 2].y);
            }
          }
          // d: rows g, g + 8 x columns 2t, 2t + 1 (subsets (2t) % S, (2t + 1) % S)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            acc[nt][i] = fmaf(d[i], gemv::half_float(bt.grp.gs[u][i / 2][kCS == 1 ? 0 : i % 2]), acc[nt][i]);
        }
      } else if constexpr (kBf16) {
        // A chunk is 32 BF16 columns; lane t's 8 (its 16 bytes) are the two k16 steps' pairs 2t.. and 8 +
        // 2t.. (the same register pairing as FP8's k32 steps, tcs::step_operands), x's 8 from L1.
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t x[4];
          to_words(xon[nt] ? __ldg(reinterpret_cast<const uint4*>(p.x + xrow[nt] * p.k) + 4 * c + t)
                           : make_uint4(0, 0, 0, 0),
                   x);
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int step = 0; step < 2; ++step) {
            const tcs::Operands o = tcs::step_operands(lo, hi, x, step);
            mma_16816(d, o.a, o.b[0], o.b[1]);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[nt][i] += d[i];
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t x[4];
          to_words(xon[nt] ? *reinterpret_cast<const uint4*>(xq + xrow[nt] * L.x_stride +
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
    }
  };

  const float* wscale = static_cast<const float*>(p.scale);  // FP8: F32 [1] or [rows]
  // The outputs of tile `tile` from acc: v[h][e] = rows g + 8h, B columns 2t + e of n-tile nt. INT4 adds a
  // row's S subset columns first (S = 2: the lane's two columns; 4: also lane t ^ 1's, even lanes store).
  auto epilogue = [&](int64_t tile) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float v[2][2] = {{acc[nt][0], acc[nt][1]}, {acc[nt][2], acc[nt][3]}};
      // acc[nt][2h + e]: tile row tcs::acc_tile_row(lane, 2h) = g + 8h, B column 8 nt + acc_token(lane, e).
      const int col0 = 8 * nt + tcs::acc_token(lane, 0);
      int tokens = 2, token0 = col0;
      bool stores = true;
      if constexpr (S >= 2) {
#pragma unroll
        for (int h = 0; h < 2; ++h) v[h][0] += v[h][1];
        tokens = 1;
        token0 = col0 / S;
      }
      if constexpr (S == 4) {
#pragma unroll
        for (int h = 0; h < 2; ++h) v[h][0] += __shfl_xor_sync(0xffffffffu, v[h][0], 1);
        stores = t % 2 == 0;
      }
      if (!stores) continue;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int token = token0 + e;
        if (e >= tokens || token >= p.m) continue;
        if constexpr (kSilu) {
          const int r = tcs::acc_tile_row(lane, 0);  // gate row r, its up row in tile row r + 8
          if (!tcs::tile_row_stored(tile, r, p.rows, p.f, true)) continue;
          const int64_t j = tile * 8 + r;
          const float b0 = p.bias ? p.bias[j] : 0.0f, b1 = p.bias ? p.bias[p.f + j] : 0.0f;
          float out;
          if constexpr (!kFp8Format)
            out = silu_fast(v[0][e] + b0) * (v[1][e] + b1);
          else
            out = w8a8_silu_up(v[0][e], v[1][e], xs[token], wscale[p.per_channel ? j : 0], b0,
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
            float out;
            if constexpr (!kFp8Format)
              out = v[h][e] + b;
            else
              out = w8a8_value(v[h][e], xs[token], wscale[p.per_channel ? row : 0], b);
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

  // The warp's batch after batch bb of tile nn: the next of the tile's segment, else its first of the next
  // tile (the register pipeline, and the ring's issuing and consuming cursors alike).
  auto advance = [&](int64_t& nn, int& bb) {
    if (++bb == b_hi) {
      bb = b_lo;
      nn += slots;
    }
  };
  // Batch b of tile n is in `cur`: fill `nxt` with the warp's next batch, multiply `cur`, finish the tile
  // at its end. False after the warp's last batch.
  int b = b_lo;
  auto step = [&](const Batch& cur, Batch& nxt) {
    int next_b = b;
    int64_t next_n = n;
    advance(next_n, next_b);
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

  if constexpr (kRing) {
    // A lane copies its own granules (cp.async, 16 bytes each, L2 only) into its own slots and reads them
    // back itself, so the ring needs no CTA barrier and no mbarrier: each thread waits for its own groups.
    const int depth = L.ring;  // 3 or 4
    uint8_t* const ring = smem + L.ring_off + static_cast<int64_t>(wib) * depth * U * 2 * kWarp * 16;
    auto slot_at = [&](int slot, int r, int u) {
      return ring + ((static_cast<int64_t>(slot) * 2 + r) * U + u) * kWarp * 16 + lane * 16;
    };
    // The issuing cursor runs depth - 1 batches ahead of the consuming one over the same sequence; a
    // commit without copies (past the last batch) keeps every thread's group count in step.
    int64_t an = n;
    int ab = b_lo, issued = 0;
    auto issue = [&] {
      if (an < L.tiles) {
        const int slot = issued % depth;
        const uint8_t* lo =
            p.w + tcs::tile_row(an, g, p.rows, p.f, kSilu) * p.row_bytes + tcs::granule_offset(0, t);
        const uint8_t* hi =
            p.w + tcs::tile_row(an, g + 8, p.rows, p.f, kSilu) * p.row_bytes + tcs::granule_offset(0, t);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t c = static_cast<int64_t>(ab) * U + u;
          if (c < chunks) {
            cp_async16(slot_at(slot, 0, u), lo + c * tcs::kChunkBytes, 16);
            cp_async16(slot_at(slot, 1, u), hi + c * tcs::kChunkBytes, 16);
          }
        }
        advance(an, ab);
      }
      cp_async_commit();
      ++issued;
    };
    if (active)
      for (int i = 0; i < depth - 1; ++i) issue();
    pdl_wait();  // the ring's first batches are in flight
    if (!active) pdl_launch_dependents();
    if constexpr (kFp8Format) {
      quantize_x(p, smem + L.x_off, L.x_stride, xs, scratch);
      __syncthreads();
    }
    if (!active) return;
    Batch cur = {}, ext = {};  // ext: INT4's group scales and zero points of the next batch
    set_rows(n);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (static_cast<int64_t>(b) * U + u < chunks) load_groups(static_cast<int64_t>(b) * U + u, u, ext);
    for (int consumed = 0;; ++consumed) {
      if (depth == 3)
        cp_async_wait<1>();
      else
        cp_async_wait<2>();
      __syncwarp();  // the reads below after the wait (bulk_copy.cuh: the waits carry no memory clobber)
      const int slot = consumed % depth;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (static_cast<int64_t>(b) * U + u < chunks) {
          cur.w[0][u] = *reinterpret_cast<const uint4*>(slot_at(slot, 0, u));
          cur.w[1][u] = *reinterpret_cast<const uint4*>(slot_at(slot, 1, u));
        }
      }
      cur.grp = ext.grp;  // INT4's group scales and zero points (FP8, BF16: nothing)
      issue();            // into the slot read one round ago
      int next_b = b;
      int64_t next_n = n;
      advance(next_n, next_b);
      const bool more = next_n < L.tiles;
      if (more) {
        if constexpr (kInt4) {
          if (next_n != n) set_rows(next_n);
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (static_cast<int64_t>(next_b) * U + u < chunks)
              load_groups(static_cast<int64_t>(next_b) * U + u, u, ext);
        }
      } else {
        pdl_launch_dependents();  // after the weight stream (kernels_gemv.cu)
      }
      multiply(cur, b);
      if (next_n != n) finish(n);
      n = next_n;
      b = next_b;
      if (!more) break;
    }
    cp_async_wait<0>();  // no copy outlives the CTA's shared memory
    return;
  }

  Batch a = {}, c = {};
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
  if constexpr (kFp8Format) {
    quantize_x(p, smem + L.x_off, L.x_stride, xs, scratch);
    __syncthreads();
  }
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
// And the cp.async ring's slots per warp (0: off, the register pipeline; 3 or 4): set_gemv_v5_shape's ring,
// else INFERX_GEMV_V5_RING (default 0).
std::atomic<int> g_v5_chunks{0}, g_v5_smem_kb{-1}, g_v5_ring{-1};
int v5_ring() {
  static const int env = env_int("INFERX_GEMV_V5_RING", 0, 4, 0);
  const int o = g_v5_ring.load(std::memory_order_relaxed);
  const int v = o >= 0 ? o : env;
  return v == 3 || v == 4 ? v : 0;
}
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

template <int S, int U, int NT, bool kSilu, bool kRing>
cudaError_t launch_tc_stream(const GemvParams& p, cudaStream_t stream) {
  const auto kernel = gemv_tc_stream_kernel<S, U, NT, kSilu, kRing>;
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
  in.fp8 = S == 0;  // x's codes in shared memory (BF16 and INT4 read x from L1)
  in.nt = NT;
  in.u = U;
  in.ring = kRing ? v5_ring() : 0;
  in.staging_kb = v5_smem_kb();
  in.by_regs = by_regs;
  in.sms = sms;
  in.sm_bytes = sm_bytes;
  in.reserved = reserved;
  const tcs::Plan plan = tcs::plan_launch(in);
  if (plan.per_sm < 1) return cudaErrorNotSupported;
  const V5Layout& L = plan.layout;
  const int64_t smem = plan.smem;
  if (smem > 48 * 1024) {  // the opt-in above 48 KB, once per device and instance
    static unsigned smem_set = 0;
    const int most = static_cast<int>(tcs::kMaxCtaSmem - tcs::kStaticBytes);
    if (const cudaError_t st = allow_dynamic_smem(kernel, most, smem_set); st != cudaSuccess) return st;
  }
  return launch_pdl(kernel, dim3(static_cast<unsigned>(plan.ctas)), dim3(kV5Threads),
                    static_cast<size_t>(smem), stream, p, L);
}

// NT n-tiles of B columns (activation rows x S). U: FP8 from v5_chunks(); INT4 2, because with 4 its batch
// buffers, group scales and zero points spill at the 128 registers of two CTAs per SM (ptxas: 400-1100 bytes
// of spills per thread) - so INT4 keeps 2 KB per warp in flight in registers (32 KB per SM), which may be
// short of an H200's bandwidth-latency product; a cp.async ring in shared memory would lift that bound.
// With the ring (v5_ring()), 4 chunks per batch for both formats: the batch ahead lives in shared memory.
template <int S, bool kSilu>
cudaError_t launch_tc_stream_of(const GemvParams& p, cudaStream_t stream) {
  const bool two = p.m * (S > 0 ? S : 1) > tcs::kTokens;
  if (v5_ring() != 0)
    return two ? launch_tc_stream<S, 4, 2, kSilu, true>(p, stream)
               : launch_tc_stream<S, 4, 1, kSilu, true>(p, stream);
  if constexpr (S > 0) {
    return two ? launch_tc_stream<S, 2, 2, kSilu, false>(p, stream)
               : launch_tc_stream<S, 2, 1, kSilu, false>(p, stream);
  } else if constexpr (S < 0) {  // BF16: 4 chunks (128 columns) per batch, like v4's 8 loads of 8 KB rows
    return two ? launch_tc_stream<S, 4, 2, kSilu, false>(p, stream)
               : launch_tc_stream<S, 4, 1, kSilu, false>(p, stream);
  } else {
    const bool c2 = v5_chunks() == 2;
    if (two)
      return c2 ? launch_tc_stream<S, 2, 2, kSilu, false>(p, stream)
                : launch_tc_stream<S, 4, 2, kSilu, false>(p, stream);
    return c2 ? launch_tc_stream<S, 2, 1, kSilu, false>(p, stream)
              : launch_tc_stream<S, 4, 1, kSilu, false>(p, stream);
  }
}

}  // namespace

template <int R>
cudaError_t launch_v5(DType dtype, const GemvParams& p, cudaStream_t stream) {
  constexpr bool kSilu = R == 2;
  if (p.residual != nullptr || p.in_partials != nullptr || p.row_bytes % tcs::kChunkBytes != 0 || p.m < 1 ||
      !is_aligned(p.w, 16) || !is_aligned(p.x, 16))
    return cudaErrorNotSupported;
  if (dtype == DType::BF16) {
    if (p.m > tcs::kMaxTokens) return cudaErrorNotSupported;
    return launch_tc_stream_of<-1, kSilu>(p, stream);
  }
  if (p.scale == nullptr) return cudaErrorNotSupported;
  if (dtype == DType::F8_E4M3) {
    if (p.m > tcs::kMaxTokens || p.m * (p.k + 16) > tcs::kMaxXBytes) return cudaErrorNotSupported;
    return launch_tc_stream_of<0, kSilu>(p, stream);
  }
  if (dtype == DType::INT4) {
    const int subsets = 4 >> p.group_shift;  // 128-column chunks over groups of 32 / 64 / 128
    if (p.m * subsets > tcs::kMaxTokens) return cudaErrorNotSupported;
    if (subsets == 4) return launch_tc_stream_of<4, kSilu>(p, stream);
    if (subsets == 2) return launch_tc_stream_of<2, kSilu>(p, stream);
    return launch_tc_stream_of<1, kSilu>(p, stream);
  }
  return cudaErrorNotSupported;
}
template cudaError_t launch_v5<1>(DType, const GemvParams&, cudaStream_t);
template cudaError_t launch_v5<2>(DType, const GemvParams&, cudaStream_t);

}  // namespace inferx::cuda::gemv_impl

namespace inferx::cuda {

void set_gemv_v5_shape(int chunks, int smem_kb, int ring) {
  gemv_impl::g_v5_chunks.store(chunks, std::memory_order_relaxed);
  gemv_impl::g_v5_smem_kb.store(smem_kb, std::memory_order_relaxed);
  gemv_impl::g_v5_ring.store(ring, std::memory_order_relaxed);
}

}  // namespace inferx::cuda
