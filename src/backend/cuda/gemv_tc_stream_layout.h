#pragma once
// GEMV v5's tile layout and launch policy (kernels_gemv_tc_stream.cu), as plain C++ shared by the kernel
// and the host tests (tests/unit/backend/gemv_tc_stream_layout_test.cpp emulates mma.m16n8k32 from the PTX
// ISA's fragment tables over these functions, without a GPU).
//
// A warp's tile is 16 weight rows, the A operand of the tensor-core products; lane (g, t) = (lane / 4,
// lane % 4) holds rows g and g + 8. A row is read in chunks of 64 bytes: lane t takes bytes 16t .. 16t + 15
// of each chunk, one 16-byte load per row.
//
// FP8 is W8A8: E4M3 weights times E4M3 activations (x quantized per token, as the FP8 GEMM of prefill and
// the CPU backend do) on mma.sync.m16n8k32.e4m3.e4m3.f32, x as B (8 activation rows per n-tile). A weight
// byte then costs no instruction of its own: one mma takes 512 of them, where v4 spends ~3 instructions per
// E4M3 weight on its conversion and FMA (the FP8 products of the 8B model ran at 72-88% of copy bandwidth
// in the graph against BF16's 94-100%, and the persistent decode kernel's FP8 phases reached 76% of the
// roofline where its BF16 ones reached 97%: issue-bound, docs/benchmarks.md 2026-12-05). The lane's 16
// bytes of a chunk and the same 16 bytes of its activation row g (from shared memory) feed the chunk's two
// k32 steps: step s takes bytes 8s .. 8s + 3 as the PTX fragment's columns 4t .. 4t + 3 and bytes 8s + 4 ..
// 8s + 7 as columns 16 + 4t .. 16 + 4t + 3, for A (a0 / a2 from row g, a1 / a3 from row g + 8) and B (b0 /
// b1, column g) alike, so the products pair each weight with its own activation and every column of the
// chunk is taken once: the dot product's order changes, not its terms.
#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define INFERX_TCS_HD __host__ __device__ __forceinline__
#else
#define INFERX_TCS_HD inline
#endif

namespace inferx::cuda::tcs {

constexpr int kTileRows = 16;    // weight rows of a warp's tile: the M of mma.m16n8k32
constexpr int kTokens = 8;       // activation rows of one n-tile: its N
constexpr int kChunkBytes = 64;  // columns of a row per chunk: four lanes x 16 bytes, two k32 steps
constexpr int kChunks = 4;       // chunks per row and batch: 8 16-byte loads per lane in flight per batch
constexpr int kMaxTokens = 16;   // two n-tiles

// Tiles of a product: plain, 16 consecutive rows each; SiLU (gate rows [0, f) over up rows [f, 2f)), 8
// gate rows over the same 8 up rows, so that a lane holds a gate row's sums (row g) and its up row's (g + 8).
INFERX_TCS_HD int64_t tile_count(int64_t rows, int64_t f, bool silu) {
  return silu ? (f + 7) / 8 : (rows + kTileRows - 1) / kTileRows;
}

// The stored weight row behind row r (0..15) of tile n. Rows past the end read the last row (in bounds; their
// sums are not stored).
INFERX_TCS_HD int64_t tile_row(int64_t n, int r, int64_t rows, int64_t f, bool silu) {
  if (silu) {
    const int64_t j = n * 8 + (r & 7);
    return (r < 8 ? 0 : f) + (j < f ? j : f - 1);
  }
  const int64_t row = n * kTileRows + r;
  return row < rows ? row : rows - 1;
}

// Whether tile row r of tile n is an output (plain: a row below `rows`; SiLU: r < 8 with a gate row below f,
// whose output also takes up row r + 8).
INFERX_TCS_HD bool tile_row_stored(int64_t n, int r, int64_t rows, int64_t f, bool silu) {
  return silu ? r < 8 && n * 8 + r < f : n * kTileRows + r < rows;
}

// Byte offset, within a row, of lane t's 16 bytes of chunk c.
INFERX_TCS_HD int64_t granule_offset(int64_t c, int t) { return c * kChunkBytes + 16 * t; }

// The mma operands of step s (0, 1) of a chunk from the lane's 16 bytes of weight rows g (lo) and g + 8
// (hi) and of activation row g (x), as 32-bit words (byte 0 lowest): {a0, a1, a2, a3} and {b0, b1}.
struct Operands {
  uint32_t a[4];
  uint32_t b[2];
};
INFERX_TCS_HD Operands step_operands(const uint32_t (&lo)[4], const uint32_t (&hi)[4], const uint32_t (&x)[4],
                                     int s) {
  return Operands{{lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1]}, {x[2 * s], x[2 * s + 1]}};
}

// The K split's segments: warp seg of ks streams batches [segment_begin(seg), segment_begin(seg + 1)) of
// every tile it shares.
INFERX_TCS_HD int segment_begin(int seg, int ks, int batches) { return seg * batches / ks; }

// The lane's accumulator d[i] (i = 0..3) of one n-tile: tile row lane / 4 (+ 8 for i >= 2), activation row
// 2 (lane % 4) + (i & 1) of the n-tile.
INFERX_TCS_HD int acc_tile_row(int lane, int i) { return lane / 4 + (i >= 2 ? 8 : 0); }
INFERX_TCS_HD int acc_token(int lane, int i) { return 2 * (lane % 4) + (i & 1); }

// ---- launch policy (host) --------------------------------------------------------------------------------
// The K split: how many warps of a CTA (1, 2, 4, 8, dividing warps_per_cta) share each tile, each streaming
// about batches / ks of its batches, so that products with few tiles still engage every warp. Chosen: the
// fewest batches in the busiest warp, ceil(tiles * ks / warps) rounds of ceil(batches / ks), where that is
// at most 3/4 of the unsplit count (v4's margin: a split that only evens out the rounds, as for the
// 128256-row vocabulary projection, adds a partial-sum exchange per tile for a few percent, and lost in
// v4's measurements); ties go to the smaller split. No split beyond the batches.
inline int ksplit_for(int64_t tiles, int64_t batches, int64_t warps, int warps_per_cta) {
  if (tiles <= 0 || batches <= 0 || warps <= 0) return 1;
  const int64_t unsplit = (tiles + warps - 1) / warps * batches;
  int best = 1;
  int64_t best_cost = unsplit;
  for (int ks = 2; ks <= warps_per_cta && ks <= batches; ks *= 2) {
    if (warps_per_cta % ks != 0) break;
    const int64_t cost = (tiles * ks + warps - 1) / warps * ((batches + ks - 1) / ks);
    if (cost < best_cost && 4 * cost <= 3 * unsplit) {
      best = ks;
      best_cost = cost;
    }
  }
  return best;
}

// Batches of each warp's first tile staged in shared memory before the PDL wait: as many as `per_warp_bytes`
// holds at stage_row_bytes(batches) per row, at most the fewest batches any warp of the split streams.
// A staged row is padded to 64 mod 128 bytes, so that the 8 rows a warp's lanes read at once fall on
// distinct 64-byte halves of the 128-byte bank window (4 wavefronts per 512-byte read, the least).
inline int64_t stage_row_bytes(int batches, int chunks_per_batch) {
  const int64_t bytes = int64_t{batches} * chunks_per_batch * kChunkBytes;
  return bytes % 128 == 0 ? bytes + 64 : bytes;
}
inline int staged_batches(int64_t per_warp_bytes, int64_t batches, int ks, int chunks_per_batch) {
  const int64_t most = batches / ks;
  int b = 0;
  while (b < most && kTileRows * stage_row_bytes(b + 1, chunks_per_batch) <= per_warp_bytes) ++b;
  return b;
}

// ---- the launch plan (host): where a CTA's pieces sit in dynamic shared memory, its split and staging -----
constexpr int kWarps = 8;                 // warps per CTA
constexpr int kBarBytes = 128;            // one mbarrier per warp (the staging)
constexpr int64_t kMaxXBytes = 96 << 10;  // x's codes in shared memory: m * (k + 16) bytes at most
constexpr int64_t kStaticBytes = 32 * 4;  // the kernel's static shared memory (its block reduction's scratch)
constexpr int64_t kMaxCtaSmem = 227 * 1024;  // opt-in shared memory per CTA on sm_90

struct Layout {
  int64_t tiles = 0;
  int ks = 1;         // warps sharing a tile (K split)
  int pf = 0;         // staged batches of each warp's first tile (0: none)
  int stage_row = 0;  // bytes per staged row (stage_row_bytes)
  int x_stride = 0;   // bytes per activation row of codes, k + 16 (conflict-free reads of 8 rows)
  int sums_off = 0;   // K split: [2 parities][kWarps][4 NT][32 lanes] floats
  int x_off = 0;      // codes [m][x_stride]
  int xs_off = 0;     // activation scales [kMaxTokens] floats
  int stage_off = 0;  // [kWarps][16 rows][stage_row]
};
struct Plan {
  Layout layout;
  int per_sm = 0;    // CTAs per SM (0: the launch does not fit)
  int64_t smem = 0;  // dynamic shared memory per CTA
  int64_t ctas = 0;  // the grid: one wave, at most one CTA per tile
};
struct PlanInput {
  int64_t rows = 0, f = 0;  // plain: rows; SiLU: f (gate rows over up rows)
  bool silu = false;
  int64_t row_bytes = 0;  // a whole number of chunks
  int64_t k = 0;          // columns: x's codes per activation row
  int m = 1;              // activation rows
  int nt = 1;             // n-tiles
  int staging_kb = 96;    // staging budget per SM
  int by_regs = 2;        // CTAs per SM the registers allow
  int sms = 132, sm_bytes = 228 * 1024, reserved = 1024;
};
inline Plan plan_launch(const PlanInput& in) {
  Plan pl;
  Layout& L = pl.layout;
  L.tiles = tile_count(in.rows, in.f, in.silu);
  const int64_t chunks = in.row_bytes / kChunkBytes, batches = (chunks + kChunks - 1) / kChunks;
  auto up = [](int64_t v, int64_t a) { return (v + a - 1) / a * a; };
  L.sums_off = kBarBytes;
  L.x_stride = static_cast<int>(in.k + 16);
  L.x_off = static_cast<int>(up(L.sums_off + int64_t{2} * kWarps * 4 * in.nt * 32 * 4, 16));
  L.xs_off = static_cast<int>(up(L.x_off + int64_t{in.m} * L.x_stride, 16));
  L.stage_off = static_cast<int>(up(L.xs_off + kMaxTokens * 4, 128));
  // CTAs per SM: by registers, and by shared memory without staging; the staging then shares the budget.
  const int64_t fixed = L.stage_off;
  if (fixed + kStaticBytes > kMaxCtaSmem) return pl;
  pl.per_sm =
      static_cast<int>(std::min<int64_t>(in.by_regs, in.sm_bytes / (fixed + kStaticBytes + in.reserved)));
  if (pl.per_sm < 1) return pl;
  L.ks = ksplit_for(L.tiles, batches, int64_t{in.sms} * pl.per_sm * kWarps, kWarps);
  const int64_t room = std::min<int64_t>(int64_t{in.staging_kb} * 1024 / pl.per_sm,
                                         in.sm_bytes / pl.per_sm - fixed - kStaticBytes - in.reserved);
  L.pf = staged_batches(room / kWarps, batches, L.ks, kChunks);
  L.stage_row = L.pf > 0 ? static_cast<int>(stage_row_bytes(L.pf, kChunks)) : 0;
  pl.smem = fixed + int64_t{kWarps} * kTileRows * L.stage_row;
  pl.ctas = std::min<int64_t>(int64_t{in.sms} * pl.per_sm, L.tiles);
  return pl;
}

}  // namespace inferx::cuda::tcs
