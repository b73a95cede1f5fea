// The persistent decode kernel's ring stages (src/backend/cuda/decode_stack_layout.h) without a GPU: a stage
// is filled as the producer's bulk copies fill it (each part of a source's rows, back to back at
// stage_row's offsets) and read as the consumers read it (stage_row, x chunk-major by x_chunked_index, and
// INT4's int4_vector_dot with the group scale per 32-column vector), then compared with src/quant/int4.h's
// dequantized rows times x in float64. Also what the bulk copies need: every destination offset and size a
// multiple of 16 bytes where the kernel takes the matrix, and a stage that holds its rows.
#include "backend/cuda/decode_stack_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "quant/int4.h"

namespace inferx {
namespace {

using cuda::StackMatrix;
namespace st = cuda::stack;

constexpr int32_t kStageBytes = 32 * 1024;

struct Int4Case {
  int64_t k, rows, group;
  bool zeros, paired;
};

StackMatrix int4_matrix(const Int4Case& c, const Int4Weight& w) {
  StackMatrix m;
  m.data = w.codes.data();
  m.scale = w.scale.data();
  m.zero = w.zero.empty() ? nullptr : w.zero.data();
  m.rows = static_cast<int32_t>(c.rows);
  m.k = static_cast<int32_t>(c.k);
  m.int4 = 1;
  m.group_shift = static_cast<uint8_t>(c.group == 32 ? 0 : c.group == 64 ? 1 : 2);
  return m;
}

TEST(DecodeStackLayout, Int4StagesDecodeToTheDequantizedProducts) {
  // The 8B's q/k/v / o rows (g128, symmetric), its down projection's long rows with zero points, gate/up
  // pairs in groups of 64 with zero points, and the tiny model's 256-column rows in groups of 32.
  const Int4Case cases[] = {{4096, 9, 128, false, false},
                            {14336, 5, 128, true, false},
                            {4096, 6, 64, true, true},
                            {256, 3, 32, false, true},
                            {512, 17, 32, true, false}};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Int4Case& c : cases) {
    const std::string what = "k=" + std::to_string(c.k) + " g=" + std::to_string(c.group) +
                             (c.zeros ? " asym" : " sym") + (c.paired ? " paired" : "");
    const int64_t stored = c.rows * (c.paired ? 2 : 1);
    std::vector<float> wf(static_cast<size_t>(stored * c.k));
    for (float& v : wf) v = normal(rng);
    const Int4Weight w = quantize_int4_weight(wf.data(), stored, c.k, c.group, !c.zeros);
    std::vector<uint16_t> xb(static_cast<size_t>(c.k));
    for (uint16_t& v : xb) v = f32_to_bf16(normal(rng));
    const StackMatrix m = int4_matrix(c, w);
    // x in shared memory as the phase lays it out (x_chunks: chunk-major), read back chunk by chunk.
    ASSERT_EQ(st::x_chunks(m), 4) << what;
    const int32_t nv = static_cast<int32_t>(c.k / 32);
    std::vector<uint16_t> xs(xb.size());
    for (int32_t i = 0; i < c.k; ++i) xs[size_t(st::x_chunked_index(i, nv, st::x_chunks(m)))] = xb[size_t(i)];

    const st::Geom g = st::stage_geometry(m, c.paired, kStageBytes);
    ASSERT_GE(g.rows_per_stage, 1) << what;
    ASSERT_LE(g.rows_per_stage * g.srcs, st::kMaxUnits) << what;
    ASSERT_LE(int64_t{g.rows_per_stage} * g.row_bytes * g.srcs, kStageBytes) << what;
    EXPECT_EQ(g.w_bytes, c.k / 2) << what;
    EXPECT_EQ(g.s_bytes, c.k / c.group * 2) << what;
    EXPECT_EQ(g.z_bytes, c.zeros ? c.k / c.group : 0) << what;
    // The bulk copies' destinations and sizes (n rows of each part, n <= rows_per_stage).
    for (int src = 0; src < g.srcs; ++src) {
      const st::StageRow at = st::stage_row(g, src, 0);
      EXPECT_EQ(at.w % 16, 0) << what;
      EXPECT_EQ(at.s % 16, 0) << what;
      EXPECT_EQ(at.z % 16, 0) << what;
    }
    EXPECT_EQ(g.w_bytes % 16, 0) << what;
    EXPECT_EQ(g.s_bytes % 16, 0) << what;
    EXPECT_EQ(g.z_bytes % 16, 0) << what;

    const int64_t groups = c.k / c.group;
    std::vector<uint8_t> stage(kStageBytes);
    for (int64_t row = 0; row < c.rows; row += g.rows_per_stage) {
      const int64_t n = std::min<int64_t>(g.rows_per_stage, c.rows - row);
      std::fill(stage.begin(), stage.end(), uint8_t{0xA5});  // rows past n hold stale bytes
      // The producer: for each source, its n rows of weights, scales and zero points.
      for (int src = 0; src < g.srcs; ++src) {
        const st::StageRow at = st::stage_row(g, src, 0);
        const int64_t first = src * c.rows + row;
        std::memcpy(stage.data() + at.w, w.codes.data() + first * g.w_bytes, size_t(n * g.w_bytes));
        std::memcpy(stage.data() + at.s, w.scale.data() + first * groups, size_t(n * g.s_bytes));
        if (c.zeros) std::memcpy(stage.data() + at.z, w.zero.data() + first * groups, size_t(n * g.z_bytes));
      }
      // The consumers: each row's vectors, scaled per group; against the dequantized row in float64.
      for (int src = 0; src < g.srcs; ++src)
        for (int64_t i = 0; i < n; ++i) {
          const st::StageRow r = st::stage_row(g, src, static_cast<int>(i));
          double got = 0;
          for (int64_t v = 0; v < c.k / 32; ++v) {
            uint32_t ww[4], xw[16];
            std::memcpy(ww, stage.data() + r.w + 16 * v, sizeof ww);
            for (int q = 0; q < 4; ++q) std::memcpy(xw + 4 * q, xs.data() + (q * nv + v) * 8, 16);
            const int64_t grp = v >> m.group_shift;
            uint16_t s16;
            std::memcpy(&s16, stage.data() + r.s + 2 * grp, 2);
            const float zero = c.zeros ? static_cast<float>(stage[size_t(r.z + grp)]) : 8.0f;
            got += double(st::int4_vector_dot(ww, xw, 8388608.0f + zero)) * f16_to_f32(s16);
          }
          const int64_t stored_row = src * c.rows + row + i;
          std::vector<float> deq(static_cast<size_t>(c.k));
          dequantize_int4_row(w.codes.data() + stored_row * g.w_bytes, w.scale.data() + stored_row * groups,
                              c.zeros ? w.zero.data() + stored_row * groups : nullptr, c.group, deq.data(),
                              c.k);
          double want = 0, mag = 0;
          for (int64_t j = 0; j < c.k; ++j) {
            const double p = double(deq[size_t(j)]) * bf16_to_f32(xb[size_t(j)]);
            want += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(got, want, 1e-5 * mag + 1e-6) << what << " row " << stored_row;
        }
    }
  }
}

// The 16-byte x loads of a quarter-warp (8 lanes on consecutive vectors, the same chunk) fall in 8 distinct
// 16-byte bank groups of the 128-byte bank window (one shared-memory wavefront each), for INT4's 4 chunks a
// vector, FP8's 2 and BF16's 1; the layout is a permutation of the k elements, and 1 chunk is column order.
TEST(DecodeStackLayout, ChunkedInputReadsAreConflictFree) {
  StackMatrix bf16, fp8, int4;
  fp8.fp8 = 1;
  int4.int4 = 1;
  EXPECT_EQ(st::x_chunks(bf16), 1);
  EXPECT_EQ(st::x_chunks(fp8), 2);
  EXPECT_EQ(st::x_chunks(int4), 4);
  for (int32_t i = 0; i < 4096; ++i) ASSERT_EQ(st::x_chunked_index(i, 4096 / 8, 1), i);
  for (const int chunks : {4, 2, 1})
    for (const int32_t k : {256, 4096, 14336}) {
      const int32_t nv = k / (8 * chunks);
      std::vector<int> seen(static_cast<size_t>(k), 0);
      for (int32_t i = 0; i < k; ++i) ++seen[size_t(st::x_chunked_index(i, nv, chunks))];
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), k) << "chunks " << chunks << " k " << k;
      for (int q = 0; q < chunks; ++q)
        for (int32_t v0 = 0; v0 + 8 <= nv; v0 += 8) {
          unsigned groups = 0;
          for (int lane = 0; lane < 8; ++lane) {
            const int32_t e = st::x_chunked_index((v0 + lane) * 8 * chunks + 8 * q, nv, chunks);  // chunk q
            ASSERT_EQ(e % 8, 0);
            groups |= 1u << ((e * 2 / 16) % 8);  // BF16: 2 bytes an element
          }
          EXPECT_EQ(groups, 0xFFu) << "chunks " << chunks << " k " << k << " chunk " << q << " at " << v0;
        }
    }
}

TEST(DecodeStackLayout, Bf16AndFp8RowsFillStagesInPowersOfTwo) {
  StackMatrix m;
  m.rows = 100;
  m.k = 4096;
  st::Geom g = st::stage_geometry(m, false, kStageBytes);  // BF16: 8 KB rows
  EXPECT_EQ(g.row_bytes, 8192);
  EXPECT_EQ(g.rows_per_stage, 4);
  g = st::stage_geometry(m, true, kStageBytes);  // gate + up pairs: 16 KB
  EXPECT_EQ(g.rows_per_stage, 2);
  EXPECT_EQ(st::stage_row(g, 1, 0).w, 2 * 8192);  // the up rows after the gate rows
  m.fp8 = 1;
  g = st::stage_geometry(m, false, kStageBytes);  // 4 KB rows, at most kMaxUnits per stage
  EXPECT_EQ(g.rows_per_stage, 8);
  EXPECT_EQ(g.s_bytes + g.z_bytes, 0);
  m.k = 14336;
  m.fp8 = 0;
  g = st::stage_geometry(m, false, kStageBytes);  // 28 KB rows: one per stage
  EXPECT_EQ(g.rows_per_stage, 1);
  g = st::stage_geometry(m, true, kStageBytes);  // a gate + up pair does not fit
  EXPECT_EQ(g.rows_per_stage, 0);
}

}  // namespace
}  // namespace inferx
