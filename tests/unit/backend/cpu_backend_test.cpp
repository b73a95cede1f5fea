// CPU backend ops against straightforward double-precision references written here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/rope.h"
#include "core/error.h"

namespace inferx {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

Tensor view(std::vector<float>& v, int64_t rows, int64_t cols) {
  return Tensor(DType::F32, {rows, cols}, v.data());
}

TEST(CpuBackend, RmsnormMatchesReference) {
  auto be = make_cpu_backend({2});
  const int64_t rows = 5, n = 96;
  auto x = randn(rows * n, 1), w = randn(n, 2), out(x);
  Tensor tx = view(x, rows, n), tw(DType::F32, {n}, w.data()), to = view(out, rows, n);
  be->rmsnorm(tx, tw, 1e-5f, to);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
    double inv = 1 / std::sqrt(ss / n + 1e-5);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[r * n + i], x[r * n + i] * inv * w[i], 1e-5);
  }
}

TEST(CpuBackend, AddRmsnormUpdatesResidual) {
  auto be = make_cpu_backend({2});
  const int64_t n = 32;
  auto res = randn(n, 3), x = randn(n, 4), w = randn(n, 5);
  std::vector<float> out(n);
  auto expect_res = res;
  for (int64_t i = 0; i < n; ++i) expect_res[i] += x[i];
  Tensor tr = view(res, 1, n), tx = view(x, 1, n), tw(DType::F32, {n}, w.data()), to = view(out, 1, n);
  be->add_rmsnorm(tr, tx, tw, 1e-6f, to);
  double ss = 0;
  for (float v : expect_res) ss += double(v) * v;
  double inv = 1 / std::sqrt(ss / n + 1e-6);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_FLOAT_EQ(res[i], expect_res[i]);
    EXPECT_NEAR(out[i], expect_res[i] * inv * w[i], 1e-5);
  }
}

TEST(CpuBackend, SiluMul) {
  auto be = make_cpu_backend({2});
  auto g = randn(10000, 6, 3), u = randn(10000, 7);
  std::vector<float> o(10000);
  Tensor tg = view(g, 100, 100), tu = view(u, 100, 100), to = view(o, 100, 100);
  be->silu_mul(tg, tu, to);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5);
}

TEST(CpuBackend, InterleaveRowBlocksAndShapeErrors) {
  auto be = make_cpu_backend({1});
  const int64_t blocks = 3, L = 4, cols = 5;
  auto x = randn(blocks * L * cols, 8);
  std::vector<float> out(x.size(), -1.0f);
  Tensor tx = view(x, blocks * L, cols), to = view(out, L, blocks * cols);
  be->interleave_row_blocks(tx, blocks, to);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_EQ(out[(l * blocks + b) * cols + c], x[(b * L + l) * cols + c]) << l << " " << b << " " << c;
  Tensor wrong = view(out, L + 1, blocks * cols - cols);
  EXPECT_THROW(be->interleave_row_blocks(tx, blocks, wrong), Error);
  EXPECT_THROW(be->interleave_row_blocks(tx, 5, to), Error);  // 12 rows are not 5 blocks
}

TEST(RopeFrequencies, Llama3ScalingBands) {
  // Llama 3.1 8B: theta 500000, factor 8, low 1, high 4, original 8192, head_dim 128.
  RopeScaling s{RopeScaling::Kind::Llama3, 8, 1, 4, 8192};
  auto plain = rope_inverse_frequencies(128, 500000, {});
  auto scaled = rope_inverse_frequencies(128, 500000, s);
  const double pi = 3.14159265358979323846;
  for (size_t i = 0; i < plain.size(); ++i) {
    double wl = 2 * pi / plain[i];
    if (wl < 8192 / 4.0) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i]);  // high frequencies kept
    } else if (wl > 8192 / 1.0) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i] / 8);  // low frequencies divided by factor
    } else {
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 8);
    }
  }
}

// A reference paged attention + RoPE path: builds a batch of two sequences (one prefill chunk on top of
// cached tokens, one decode) with a shuffled block table, and checks against dense math.
struct AttnCase {
  RopeLayout layout;
  int64_t window;
};
class CpuAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CpuAttention, PagedMatchesDense) {
  const AttnCase pc = GetParam();
  auto be = make_cpu_backend({2});
  const int64_t hq = 4, hkv = 2, hd = 16, bs = 4, num_blocks = 16;
  const int64_t len0 = 11, new0 = 5;  // seq 0: 6 cached + 5 new
  const int64_t len1 = 7, new1 = 1;   // seq 1: 6 cached + 1 new
  const int64_t total0 = len0, total1 = len1;
  std::vector<float> kc(num_blocks * bs * hkv * hd), vc(kc.size());
  KvCacheLayer cache{Tensor(DType::F32, {num_blocks, bs, hkv, hd}, kc.data()),
                     Tensor(DType::F32, {num_blocks, bs, hkv, hd}, vc.data())};
  const int32_t max_blocks = 4;
  std::vector<int32_t> tables = {9, 2, 14, 5, 7, 0, 11, 3};  // shuffled physical blocks
  // Full dense q/k/v for every position of both sequences.
  auto q_all0 = randn(total0 * hq * hd, 10), k_all0 = randn(total0 * hkv * hd, 11),
       v_all0 = randn(total0 * hkv * hd, 12);
  auto q_all1 = randn(total1 * hq * hd, 13), k_all1 = randn(total1 * hkv * hd, 14),
       v_all1 = randn(total1 * hkv * hd, 15);
  RopeParams rope{hd, 10000.0f, pc.layout, {}};
  AttentionParams ap{hq, hkv, hd, 1.0f / 4.0f, pc.window};

  // Step 1: write the cached prefixes (6 tokens each) through rope_and_write_kv.
  auto run_step = [&](std::vector<int32_t> pos0, std::vector<int32_t> pos1, std::vector<float>* out) {
    const int32_t n0 = int32_t(pos0.size()), n1 = int32_t(pos1.size()), T = n0 + n1;
    std::vector<float> q(T * hq * hd), k(T * hkv * hd), v(T * hkv * hd);
    auto copy_rows = [&](const std::vector<float>& src, std::vector<float>& dst, int64_t width, int32_t from,
                         int32_t to_row) {
      std::copy_n(src.begin() + from * width, width, dst.begin() + to_row * width);
    };
    for (int32_t i = 0; i < n0; ++i) {
      copy_rows(q_all0, q, hq * hd, pos0[i], i);
      copy_rows(k_all0, k, hkv * hd, pos0[i], i);
      copy_rows(v_all0, v, hkv * hd, pos0[i], i);
    }
    for (int32_t i = 0; i < n1; ++i) {
      copy_rows(q_all1, q, hq * hd, pos1[i], n0 + i);
      copy_rows(k_all1, k, hkv * hd, pos1[i], n0 + i);
      copy_rows(v_all1, v, hkv * hd, pos1[i], n0 + i);
    }
    std::vector<int32_t> positions(pos0);
    positions.insert(positions.end(), pos1.begin(), pos1.end());
    std::vector<int32_t> qs = {0, n0, T}, lens = {pos0.back() + 1, pos1.back() + 1};
    BatchView b;
    b.num_tokens = T;
    b.num_seqs = 2;
    b.positions = positions.data();
    b.query_start = qs.data();
    b.seq_lens = lens.data();
    b.block_tables = tables.data();
    b.max_blocks_per_seq = max_blocks;
    Tensor tq(DType::F32, {T, hq * hd}, q.data()), tk(DType::F32, {T, hkv * hd}, k.data()),
        tv(DType::F32, {T, hkv * hd}, v.data());
    be->rope_and_write_kv(tq, tk, tv, b, rope, cache);
    if (out) {
      out->assign(T * hq * hd, 0);
      Tensor to(DType::F32, {T, hq * hd}, out->data());
      be->attention(tq, cache, b, ap, to);
    }
  };
  run_step({0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}, nullptr);
  std::vector<float> got;
  run_step({6, 7, 8, 9, 10}, {6}, &got);

  // Dense reference in double.
  auto inv = rope_inverse_frequencies(hd, 10000.0f, {});
  auto roped = [&](const float* x, int64_t pos, std::vector<double>& o) {
    o.assign(x, x + hd);
    for (int64_t i = 0; i < hd / 2; ++i) {
      int64_t a = pc.layout == RopeLayout::Interleaved ? 2 * i : i;
      int64_t b = pc.layout == RopeLayout::Interleaved ? 2 * i + 1 : i + hd / 2;
      double ang = double(float(pos) * inv[i]);
      o[a] = x[a] * std::cos(ang) - x[b] * std::sin(ang);
      o[b] = x[b] * std::cos(ang) + x[a] * std::sin(ang);
    }
  };
  auto check_seq = [&](const std::vector<float>& qa, const std::vector<float>& ka,
                       const std::vector<float>& va, int64_t first_pos, int64_t n, int64_t out_row0) {
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = first_pos + t;
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t g = h / (hq / hkv);
        std::vector<double> qv, kv;
        roped(&qa[(p * hq + h) * hd], p, qv);
        std::vector<double> s;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j <= p; ++j) {
          if (pc.window > 0 && j <= p - pc.window) continue;
          roped(&ka[(j * hkv + g) * hd], j, kv);
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qv[d] * kv[d];
          s.push_back(dot * 0.25);
          keys.push_back(j);
        }
        double m = *std::max_element(s.begin(), s.end()), den = 0;
        for (auto& e : s) den += (e = std::exp(e - m));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (size_t i = 0; i < keys.size(); ++i) acc += s[i] / den * va[(keys[i] * hkv + g) * hd + d];
          EXPECT_NEAR(got[((out_row0 + t) * hq + h) * hd + d], acc, 2e-5) << "pos " << p << " head " << h;
        }
      }
    }
  };
  check_seq(q_all0, k_all0, v_all0, 6, new0, 0);
  check_seq(q_all1, k_all1, v_all1, 6, new1, new0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpuAttention,
                         ::testing::Values(AttnCase{RopeLayout::NeoX, 0},
                                           AttnCase{RopeLayout::Interleaved, 0},
                                           AttnCase{RopeLayout::NeoX, 3}));

}  // namespace
}  // namespace inferx
