// GEMV v5's operand layout (src/backend/cuda/gemv_tc_stream_layout.h) without a GPU: each lane's registers
// are gathered from memory exactly as the kernel gathers them (tile_row, granule_offset, step_operands), then
// placed into the A and B matrices by the PTX ISA's fragment tables for mma.m16n8k32 with 8-bit types
// (written out here independently of the header), multiplied, and read back through acc_tile_row /
// acc_token. The result must be every (row, token) dot product over all K columns, each term once; in
// float64 the E4M3 products and their sums are exact, so the comparison is exact. Also the launch policy:
// the K split's segments, its choice, and the staging plan.
#include "backend/cuda/gemv_tc_stream_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/fp8.h"

namespace inferx {
namespace {

namespace w8 = cuda::tcs;

// Random finite E4M3 codes (no NaN: 0x7F / 0xFF).
std::vector<uint8_t> codes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& c : v) {
    do {
      c = static_cast<uint8_t>(rng());
    } while ((c & 0x7F) == 0x7F);
  }
  return v;
}

uint8_t byte_of(uint32_t word, int j) { return static_cast<uint8_t>(word >> (8 * j)); }

// One k32 step of mma.m16n8k32 (.row.col, 8-bit A and B) over the registers of all 32 lanes, per the PTX ISA
// ("Matrix Fragments for mma.m16n8k32"): lane = 4 g + t; a0: A[g][4t + j], a1: A[g + 8][4t + j], a2: A[g][16
// + 4t + j], a3: A[g + 8][16 + 4t + j]; b0: B[4t + j][g], b1: B[16 + 4t + j][g]; c0, c1: D[g][2t], D[g][2t +
// 1], c2, c3: D[g + 8][2t], D[g + 8][2t + 1]; byte j of a register holds element j.
void emulate_mma(const w8::Operands (&ops)[32], double (&d)[32][4]) {
  double a[16][32] = {}, b[32][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 4; ++j) {
      a[g][4 * t + j] = fp8_e4m3_to_f32(byte_of(ops[lane].a[0], j));
      a[g + 8][4 * t + j] = fp8_e4m3_to_f32(byte_of(ops[lane].a[1], j));
      a[g][16 + 4 * t + j] = fp8_e4m3_to_f32(byte_of(ops[lane].a[2], j));
      a[g + 8][16 + 4 * t + j] = fp8_e4m3_to_f32(byte_of(ops[lane].a[3], j));
      b[4 * t + j][g] = fp8_e4m3_to_f32(byte_of(ops[lane].b[0], j));
      b[16 + 4 * t + j][g] = fp8_e4m3_to_f32(byte_of(ops[lane].b[1], j));
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 32; ++k) d[lane][i] += a[rows[i]][k] * b[k][cols[i]];
  }
}

void words_at(const uint8_t* p, uint32_t (&w)[4]) { std::memcpy(w, p, 16); }

// The kernel's sums for tile n of a product with `rows` weight rows (SiLU: gate rows [0, f) over up rows
// [f, 2f)), k columns and up to 8 activation rows: acc[lane][i] as the lane holds them after every chunk.
void tile_sums(const std::vector<uint8_t>& w, const std::vector<uint8_t>& x, int64_t m, int64_t k, int64_t n,
               int64_t rows, int64_t f, bool silu, double (&acc)[32][4]) {
  std::memset(acc, 0, sizeof acc);
  const uint32_t zero[4] = {0, 0, 0, 0};
  for (int64_t c = 0; c < k / w8::kChunkBytes; ++c) {
    for (int s = 0; s < 2; ++s) {
      w8::Operands ops[32];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        uint32_t lo[4], hi[4], xv[4];
        words_at(w.data() + w8::tile_row(n, g, rows, f, silu) * k + w8::granule_offset(c, t), lo);
        words_at(w.data() + w8::tile_row(n, g + 8, rows, f, silu) * k + w8::granule_offset(c, t), hi);
        if (g < m)
          words_at(x.data() + g * k + w8::granule_offset(c, t), xv);
        else
          std::memcpy(xv, zero, sizeof xv);
        ops[lane] = w8::step_operands(lo, hi, xv, s);
      }
      emulate_mma(ops, acc);
    }
  }
}

double dot(const std::vector<uint8_t>& w, int64_t row, const std::vector<uint8_t>& x, int64_t token,
           int64_t k) {
  double s = 0;
  for (int64_t c = 0; c < k; ++c)
    s += double(fp8_e4m3_to_f32(w[size_t(row * k + c)])) * fp8_e4m3_to_f32(x[size_t(token * k + c)]);
  return s;
}

TEST(GemvTcStreamLayout, LaneSumsAreEveryDotProductOfThePlainTile) {
  for (int64_t k : {64, 192, 4096}) {
    for (int64_t m : {1, 3, 8}) {
      const int64_t rows = 37;  // tiles 0..2, the last one partial
      const auto w = codes(size_t(rows * k), uint32_t(k + m)), x = codes(size_t(m * k), uint32_t(7 * k + m));
      for (int64_t n = 0; n < w8::tile_count(rows, 0, false); ++n) {
        double acc[32][4];
        tile_sums(w, x, m, k, n, rows, 0, false, acc);
        int checked = 0;
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < 4; ++i) {
            const int r = w8::acc_tile_row(lane, i), token = w8::acc_token(lane, i);
            const int64_t row = n * w8::kTileRows + r;
            if (!w8::tile_row_stored(n, r, rows, 0, false)) {
              EXPECT_GE(row, rows);
              continue;
            }
            const double want = token < m ? dot(w, row, x, token, k) : 0.0;
            ASSERT_EQ(acc[lane][i], want)
                << "k=" << k << " m=" << m << " tile " << n << " row " << row << " token " << token;
            ++checked;
          }
        // Every stored row of the tile for all 8 tokens of the n-tile, once.
        EXPECT_EQ(checked, int(std::min<int64_t>(16, rows - n * 16)) * 8);
      }
    }
  }
}

TEST(GemvTcStreamLayout, SiluTilesHoldEachGateRowBesideItsUpRow) {
  const int64_t k = 128, f = 21, m = 2;  // tiles of 8 gate rows: 0..2, the last one partial
  const auto w = codes(size_t(2 * f * k), 11), x = codes(size_t(m * k), 12);
  EXPECT_EQ(w8::tile_count(0, f, true), 3);
  for (int64_t n = 0; n < 3; ++n) {
    double acc[32][4];
    tile_sums(w, x, m, k, n, 0, f, true, acc);
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 2; ++i) {  // d[i]: the gate row's sums, d[i + 2]: the up row's
        const int r = w8::acc_tile_row(lane, i), token = w8::acc_token(lane, i);
        ASSERT_EQ(w8::acc_tile_row(lane, i + 2), r + 8);
        ASSERT_EQ(w8::acc_token(lane, i + 2), token);
        const int64_t j = n * 8 + r;
        EXPECT_EQ(w8::tile_row_stored(n, r, 0, f, true), j < f);
        EXPECT_FALSE(w8::tile_row_stored(n, r + 8, 0, f, true));
        if (j >= f || token >= m) continue;
        EXPECT_EQ(acc[lane][i], dot(w, j, x, token, k)) << "gate " << j;
        EXPECT_EQ(acc[lane][i + 2], dot(w, f + j, x, token, k)) << "up " << j;
      }
  }
}

TEST(GemvTcStreamLayout, RowsPastTheEndReadTheLastRow) {
  EXPECT_EQ(w8::tile_row(2, 15, 37, 0, false), 36);
  EXPECT_EQ(w8::tile_row(2, 4, 37, 0, false), 36);
  EXPECT_EQ(w8::tile_row(2, 3, 37, 0, false), 35);
  EXPECT_EQ(w8::tile_row(2, 7, 0, 21, true), 20);        // gate j = 23 >= f
  EXPECT_EQ(w8::tile_row(2, 15, 0, 21, true), 21 + 20);  // its up row
  EXPECT_EQ(w8::tile_row(1, 9, 0, 21, true), 21 + 9);
}

TEST(GemvTcStreamLayout, SegmentsCoverEveryBatchOnce) {
  for (int batches : {1, 2, 3, 7, 16, 56})
    for (int ks : {1, 2, 4, 8}) {
      if (ks > batches) continue;
      int covered = 0;
      for (int seg = 0; seg < ks; ++seg) {
        const int lo = w8::segment_begin(seg, ks, batches), hi = w8::segment_begin(seg + 1, ks, batches);
        EXPECT_EQ(lo, covered);
        EXPECT_GT(hi, lo) << "an empty segment: batches " << batches << " ks " << ks;
        covered = hi;
      }
      EXPECT_EQ(covered, batches);
    }
}

TEST(GemvTcStreamLayout, KSplitTakesTheFewestBatchesPerWarp) {
  // 132 SMs x 2 CTAs x 8 warps = 2112 warps. The 8B model's FP8 o projection (4096 x 4096): 256 tiles of 16
  // batches of 4 chunks: every warp of a CTA on one tile (2 batches each) beats 256 warps streaming 16.
  EXPECT_EQ(w8::ksplit_for(256, 16, 2112, 8), 8);
  // q/k/v (6144 rows, 384 tiles): 4 and 8 both give 4 batches in the busiest warp; the smaller split wins.
  EXPECT_EQ(w8::ksplit_for(384, 16, 2112, 8), 4);
  // gate/up (f = 14336, 1792 tiles): unsplit, one round of 16.
  EXPECT_EQ(w8::ksplit_for(1792, 16, 2112, 8), 1);
  // The 128256-row vocabulary projection (8016 tiles): 4 rounds of 16 unsplit; split in 8, 31 rounds of 2
  // (62 batches): not a quarter fewer.
  EXPECT_EQ(w8::ksplit_for(8016, 16, 2112, 8), 1);
  // Never more warps than batches, only divisors of the CTA's warps.
  EXPECT_EQ(w8::ksplit_for(1, 3, 2112, 8), 2);
  EXPECT_EQ(w8::ksplit_for(1, 1, 2112, 8), 1);
  EXPECT_EQ(w8::ksplit_for(0, 16, 2112, 8), 1);
}

TEST(GemvTcStreamLayout, StagingKeepsWholeBatchesWithinTheBudget) {
  // A staged row of b batches of 4 chunks: 256 b bytes, padded to 64 mod 128.
  EXPECT_EQ(w8::stage_row_bytes(1, 4), 320);
  EXPECT_EQ(w8::stage_row_bytes(2, 2), 320);
  EXPECT_EQ(w8::stage_row_bytes(3, 4), 832);
  for (int b = 1; b < 40; ++b) EXPECT_EQ(w8::stage_row_bytes(b, 4) % 128, 64);
  // 96 KB per SM over 2 CTAs of 8 warps: 6 KB per warp, 16 rows of 320 bytes (one batch) fit, two do not.
  EXPECT_EQ(w8::staged_batches(6144, 16, 1, 4), 1);
  EXPECT_EQ(w8::staged_batches(16 * 576, 16, 1, 4), 2);
  // At most the fewest batches of a segment.
  EXPECT_EQ(w8::staged_batches(1 << 20, 16, 8, 4), 2);
  EXPECT_EQ(w8::staged_batches(1 << 20, 3, 2, 4), 1);
  EXPECT_EQ(w8::staged_batches(100, 16, 1, 4), 0);
}

// The launch plan over the products of the models we serve (Llama-3 8B and 70B, plain and SiLU, 1 to 16
// activation rows), staged or not, and both SM shapes (H100/H200: 228 KB per SM, 1 KB reserved per CTA; 132
// SMs): a plan either fits one CTA's opt-in shared memory with its regions in order, aligned and apart, and
// its staging within the budget, or it declines (per_sm 0); and the launches v5 exists for all fit.
TEST(GemvTcStreamLayout, LaunchPlansFitSharedMemory) {
  struct Product {
    int64_t rows, f, k;
    bool silu;
  };
  // 8B: q/k/v, o, gate/up, down, lm_head; 70B: q/k/v, o, gate/up, down.
  const Product products[] = {{6144, 0, 4096, false},  {4096, 0, 4096, false},   {0, 14336, 4096, true},
                              {4096, 0, 14336, false}, {128256, 0, 4096, false}, {10240, 0, 8192, false},
                              {8192, 0, 8192, false},  {0, 28672, 8192, true},   {8192, 0, 28672, false}};
  int planned = 0;
  for (const Product& pr : products)
    for (int m : {1, 2, 5, 8, 9, 16})
      for (int staging_kb : {0, 96, 200}) {
        if (m * (pr.k + 16) > w8::kMaxXBytes) continue;  // declined before planning
        w8::PlanInput in;
        in.rows = pr.rows;
        in.f = pr.f;
        in.silu = pr.silu;
        in.row_bytes = pr.k;
        in.k = pr.k;
        in.m = m;
        in.nt = m > 8 ? 2 : 1;
        in.staging_kb = staging_kb;
        const w8::Plan pl = w8::plan_launch(in);
        const w8::Layout& L = pl.layout;
        const std::string what = "rows " + std::to_string(pr.rows) + " f " + std::to_string(pr.f) + " k " +
                                 std::to_string(pr.k) + " m " + std::to_string(m) + " staging " +
                                 std::to_string(staging_kb);
        // The launches v5 is for fit: x up to 16 rows of 4096 columns or 4 of 14336.
        if (m * (pr.k + 16) <= 64 * 1024) {
          EXPECT_GE(pl.per_sm, 1) << what;
        }
        if (pl.per_sm < 1) continue;
        ++planned;
        EXPECT_LE(pl.smem + w8::kStaticBytes, w8::kMaxCtaSmem) << what;
        EXPECT_LE(pl.per_sm * (pl.smem + w8::kStaticBytes + in.reserved), in.sm_bytes) << what;
        EXPECT_EQ(L.sums_off, w8::kBarBytes) << what;
        EXPECT_GE(L.x_off, L.sums_off + 2 * w8::kWarps * 4 * in.nt * 32 * 4) << what;
        EXPECT_EQ(L.x_off % 16, 0) << what;
        EXPECT_GE(L.xs_off, L.x_off + int64_t{m} * L.x_stride) << what;
        EXPECT_EQ(L.xs_off % 16, 0) << what;
        EXPECT_GE(L.stage_off, L.xs_off + w8::kMaxTokens * 4) << what;
        EXPECT_EQ(L.stage_off % 128, 0) << what;
        if (staging_kb == 0) {
          EXPECT_EQ(L.pf, 0) << what;
        }
        if (L.pf > 0) {
          EXPECT_EQ(L.stage_row % 128, 64) << what;
          // The staging of the CTAs on one SM within the budget.
          EXPECT_LE(int64_t{pl.per_sm} * w8::kWarps * w8::kTileRows * L.stage_row, int64_t{staging_kb} * 1024)
              << what;
        }
        EXPECT_EQ(pl.smem, L.stage_off + int64_t{w8::kWarps} * w8::kTileRows * L.stage_row) << what;
        EXPECT_GE(pl.ctas, 1) << what;
        EXPECT_LE(pl.ctas, int64_t{in.sms} * pl.per_sm) << what;
        EXPECT_LE(pl.ctas, L.tiles) << what;
        EXPECT_LE(L.ks, w8::kWarps) << what;
      }
  EXPECT_GT(planned, 100);
}

}  // namespace
}  // namespace inferx
