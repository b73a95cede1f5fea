// The v1 CUDA kernels against float64 references: split-KV decode attention and tensor-core prefill
// attention over random batch mixes (prefill chunks + decodes, GQA ratios, shuffled block tables, sliding
// windows, block sizes, forced split counts), the BF16 activation copies (fused norm / SiLU -> GEMM) and
// their invalidation, the GEMM bias epilogue, GPU argmax and sampling, device random fill, and decode
// steps replayed from a CUDA graph against eager ones. Fresh random inputs every run (the seed is printed
// on failure). Outputs are poisoned with NaN before each run, so an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels_quant.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "model/model.h"

namespace inferx {
namespace {

uint32_t fresh_seed() { return std::random_device{}(); }

std::vector<float> uniform(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16(std::vector<float>& v) {  // rounds v in place, returns the encoding
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = f32_to_bf16(v[i]);
    v[i] = bf16_to_f32(out[i]);
  }
  return out;
}

using cuda_test::compare;
using cuda_test::Errors;

class CudaKernelsTest : public ::testing::Test {
 public:  // the free helpers below drive the fixture
  void SetUp() override {
    INFERX_SKIP_WITHOUT_GPU();
    CudaBackendOptions o;
    o.kv_cache_dtype = DType::BF16;
    backend_ = make_cuda_backend(0, o);
    gpu_ = static_cast<CudaBackend*>(backend_.get());
  }
  template <class T>
  void* upload(const std::vector<T>& v) {
    buffers_.push_back(gpu_->allocate(std::max<size_t>(v.size() * sizeof(T), 4)));
    gpu_->copy_to_device(buffers_.back()->data(), v.data(), v.size() * sizeof(T));
    return buffers_.back()->data();
  }
  template <class T>
  std::vector<T> download(const void* p, size_t n) {
    std::vector<T> v(n);
    gpu_->synchronize();
    gpu_->copy_to_host(v.data(), p, n * sizeof(T));
    return v;
  }
  Tensor f32(std::vector<float> v, std::vector<int64_t> shape) {
    Tensor t(DType::F32, {shape[0], shape[1]}, upload(v), Device::CUDA);
    return t;
  }

  // SamplingFollowsTemperatureTopKTopPMinP's check of one vocabulary size on the current sampler kernel.
  void check_sampling(int64_t vocab, std::mt19937& rng);

  std::unique_ptr<Backend> backend_;
  CudaBackend* gpu_ = nullptr;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

// Attention ----------------------------------------------------------------------------------------------

struct AttnCase {
  int64_t hq, hkv, hd, window, bs;
  std::vector<int32_t> start, count;  // per sequence: cached tokens before this step, new tokens
};

struct AttnData {
  std::vector<int32_t> positions, query_start{0}, seq_lens, tables, seq_of;
  int32_t max_blocks = 0, num_blocks = 0, max_q = 0, max_len = 0;
  std::vector<float> q, k, v;  // k, v already rounded to BF16
};

AttnData make_attention(const AttnCase& c, std::mt19937& rng) {
  AttnData d;
  for (size_t s = 0; s < c.start.size(); ++s) {
    for (int32_t i = 0; i < c.count[s]; ++i) {
      d.positions.push_back(c.start[s] + i);
      d.seq_of.push_back(static_cast<int32_t>(s));
    }
    d.query_start.push_back(static_cast<int32_t>(d.positions.size()));
    d.seq_lens.push_back(c.start[s] + c.count[s]);
    d.max_q = std::max(d.max_q, c.count[s]);
    d.max_len = std::max(d.max_len, c.start[s] + c.count[s]);
  }
  // Table width with slack (unused entries point at real blocks too); blocks shuffled across sequences.
  d.max_blocks = static_cast<int32_t>((d.max_len + c.bs - 1) / c.bs) + 2;
  d.num_blocks = d.max_blocks * static_cast<int32_t>(c.start.size()) + 3;
  std::vector<int32_t> blocks(static_cast<size_t>(d.num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  d.tables.assign(blocks.begin(), blocks.begin() + d.max_blocks * static_cast<int64_t>(c.start.size()));
  const int64_t T = static_cast<int64_t>(d.positions.size());
  d.q = uniform(static_cast<size_t>(T * c.hq * c.hd), rng);
  d.k = uniform(static_cast<size_t>(d.num_blocks * c.bs * c.hkv * c.hd), rng, -2.0f, 2.0f);
  d.v = uniform(d.k.size(), rng);
  return d;
}

std::vector<double> attention_reference(const AttnCase& c, const AttnData& d, double scale) {
  const int64_t T = static_cast<int64_t>(d.positions.size());
  std::vector<double> out(static_cast<size_t>(T * c.hq * c.hd), 0.0);
  std::vector<double> sc;
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = d.seq_of[t], pos = d.positions[t];
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t kvh = h / (c.hq / c.hkv);
      sc.clear();
      slots.clear();
      for (int64_t j = 0; j < d.seq_lens[s]; ++j) {
        if (j > pos || (c.window > 0 && j <= pos - c.window)) continue;
        const int64_t slot =
            ((int64_t(d.tables[s * d.max_blocks + j / c.bs]) * c.bs + j % c.bs) * c.hkv + kvh) * c.hd;
        double dot = 0;
        for (int64_t i = 0; i < c.hd; ++i) dot += double(d.q[(t * c.hq + h) * c.hd + i]) * d.k[slot + i];
        sc.push_back(dot * scale);
        slots.push_back(slot);
      }
      if (sc.empty()) continue;
      const double mx = *std::max_element(sc.begin(), sc.end());
      double den = 0;
      for (double& x : sc) den += (x = std::exp(x - mx));
      for (int64_t i = 0; i < c.hd; ++i) {
        double acc = 0;
        for (size_t j = 0; j < sc.size(); ++j) acc += sc[j] * d.v[slots[j] + i];
        out[(t * c.hq + h) * c.hd + i] = acc / den;
      }
    }
  }
  return out;
}

// Runs one kernel choice on the case and checks it against the reference.
void run_attention(CudaKernelsTest& f, CudaBackend& gpu, const AttnCase& c, std::mt19937& rng,
                   CudaAttentionKernel kernel, int splits, double tol_rel, double tol_abs) {
  AttnData d = make_attention(c, rng);
  auto kb = to_bf16(d.k), vb = to_bf16(d.v);
  const int64_t T = static_cast<int64_t>(d.positions.size());
  BatchView b;
  b.num_tokens = static_cast<int32_t>(T);
  b.num_seqs = static_cast<int32_t>(c.start.size());
  b.positions = static_cast<const int32_t*>(f.upload(d.positions));
  b.query_start = static_cast<const int32_t*>(f.upload(d.query_start));
  b.seq_lens = static_cast<const int32_t*>(f.upload(d.seq_lens));
  b.block_tables = static_cast<const int32_t*>(f.upload(d.tables));
  b.max_blocks_per_seq = d.max_blocks;
  b.max_query_len = d.max_q;
  b.max_seq_len = d.max_len;
  const std::vector<int64_t> cshape = {d.num_blocks, c.bs, c.hkv, c.hd};
  KvCacheLayer cache{Tensor(DType::BF16, {d.num_blocks, c.bs, c.hkv, c.hd}, f.upload(kb), Device::CUDA),
                     Tensor(DType::BF16, {d.num_blocks, c.bs, c.hkv, c.hd}, f.upload(vb), Device::CUDA)};
  Tensor q = f.f32(d.q, {T, c.hq * c.hd});
  Tensor out = f.f32(std::vector<float>(d.q.size(), std::nanf("")), {T, c.hq * c.hd});
  const AttentionParams p{c.hq, c.hkv, c.hd, 1.0f / std::sqrt(float(c.hd)), c.window};
  gpu.set_attention_kernel(kernel, splits);
  gpu.attention(q, cache, b, p, out);
  const auto got = f.download<float>(out.data, d.q.size());
  const Errors e = compare(got, attention_reference(c, d, p.scale));
  EXPECT_TRUE(e.all_finite) << "unwritten or NaN outputs";
  EXPECT_LE(e.rel_norm, tol_rel) << "max abs " << e.max_abs;
  EXPECT_LE(e.max_abs, tol_abs) << "rel norm " << e.rel_norm;
}

std::vector<AttnCase> attention_cases(std::mt19937& rng, bool decode_only) {
  std::vector<AttnCase> cases;
  const int64_t shapes[][3] = {{8, 8, 64},  {8, 2, 128},  {32, 8, 128},
                               {16, 2, 64}, {16, 1, 128}, {28, 4, 128}};
  std::uniform_int_distribution<int32_t> ctx(0, 1500), chunk(2, 150);
  for (const auto& sh : shapes) {
    for (int64_t window : {int64_t{0}, int64_t{77}}) {
      for (int64_t bs : {int64_t{16}, int64_t{32}}) {
        AttnCase c{sh[0], sh[1], sh[2], window, bs, {}, {}};
        const int seqs = 1 + static_cast<int>(rng() % 5);
        for (int s = 0; s < seqs; ++s) {
          const bool prefill = !decode_only && rng() % 2 == 0;
          c.start.push_back(prefill && rng() % 3 == 0 ? 0 : ctx(rng));
          c.count.push_back(prefill ? chunk(rng) : 1);
        }
        cases.push_back(c);
      }
    }
  }
  return cases;
}

TEST_F(CudaKernelsTest, DecodeAttentionMatchesFloat64OverRandomBatches) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const AttnCase& c : attention_cases(rng, /*decode_only=*/true)) {
    for (int splits : {0, 1, 3, 64}) {
      SCOPED_TRACE(::testing::Message()
                   << "hq " << c.hq << " hkv " << c.hkv << " hd " << c.hd << " window " << c.window << " bs "
                   << c.bs << " seqs " << c.start.size() << " splits " << splits);
      run_attention(*this, *gpu_, c, rng, CudaAttentionKernel::Decode, splits, 1e-5, 1e-4);
    }
  }
}

TEST_F(CudaKernelsTest, DecodeAttentionKernelIsCorrectForPrefillTokensToo) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const AttnCase& c : attention_cases(rng, /*decode_only=*/false)) {
    SCOPED_TRACE(::testing::Message()
                 << "hq " << c.hq << " hkv " << c.hkv << " hd " << c.hd << " window " << c.window);
    run_attention(*this, *gpu_, c, rng, CudaAttentionKernel::Decode, 0, 1e-5, 1e-4);
  }
}

TEST_F(CudaKernelsTest, DecodeAttentionLongContexts) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int32_t len : {1, 63, 1024, 4095, 8192}) {
    SCOPED_TRACE(::testing::Message() << "context " << len);
    AttnCase c{32, 8, 128, 0, 16, {len - 1, len / 2}, {1, 1}};
    run_attention(*this, *gpu_, c, rng, CudaAttentionKernel::Auto, 0, 1e-5, 1e-4);
  }
}

// BF16 Q and P on the tensor cores: relative errors of a few 1e-3 are expected.
TEST_F(CudaKernelsTest, PrefillAttentionMatchesFloat64OverRandomBatchMixes) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (bool decode_only : {false, true}) {
    for (const AttnCase& c : attention_cases(rng, decode_only)) {
      SCOPED_TRACE(::testing::Message() << "hq " << c.hq << " hkv " << c.hkv << " hd " << c.hd << " window "
                                        << c.window << " bs " << c.bs << " seqs " << c.start.size());
      run_attention(*this, *gpu_, c, rng, CudaAttentionKernel::Prefill, 0, 1e-2, 3e-2);
      run_attention(*this, *gpu_, c, rng, CudaAttentionKernel::Auto, 0, 1e-2, 3e-2);
    }
  }
}

TEST_F(CudaKernelsTest, PrefillAttentionLongChunks) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // A 700-token prefill from 0, a 333-token chunk after 500 cached tokens, a windowed variant.
  for (int64_t window : {int64_t{0}, int64_t{256}}) {
    AttnCase c{8, 2, 128, window, 16, {0, 500}, {700, 333}};
    run_attention(*this, *gpu_, c, rng, CudaAttentionKernel::Prefill, 0, 1e-2, 3e-2);
  }
}

// Fused BF16 activations and the GEMM epilogue
// ----------------------------------------------------------------

std::vector<double> matmul_ref(const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>* bias, int64_t t, int64_t k, int64_t n) {
  std::vector<double> out(static_cast<size_t>(t * n));
  for (int64_t r = 0; r < t; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double acc = bias ? (*bias)[c] : 0.0;
      for (int64_t i = 0; i < k; ++i) acc += double(x[r * k + i]) * w[c * k + i];
      out[r * n + c] = acc;
    }
  return out;
}

TEST_F(CudaKernelsTest, Bf16MatmulWithBiasEpilogueForDecodeAndPrefillShapes) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t k = 256, n = 384;
  auto w = uniform(n * k, rng);
  auto wb = to_bf16(w);
  const auto bias = uniform(n, rng);
  Linear lin;
  lin.weight = Tensor(DType::BF16, {n, k}, upload(wb), Device::CUDA);
  lin.bias = Tensor(DType::F32, {n}, upload(bias), Device::CUDA);
  for (int64_t t : {1, 5, 64, 300}) {
    SCOPED_TRACE(::testing::Message() << "rows " << t);
    auto x = uniform(t * k, rng);
    (void)to_bf16(x);  // the GEMM rounds activations to BF16
    Tensor tx = f32(x, {t, k}), out = f32(std::vector<float>(t * n, std::nanf("")), {t, n});
    gpu_->matmul(tx, lin, out);
    const Errors e = compare(download<float>(out.data, t * n), matmul_ref(x, w, &bias, t, k, n));
    EXPECT_TRUE(e.all_finite);
    EXPECT_LE(e.max_abs, 1e-3);
  }
}

TEST_F(CudaKernelsTest, NormAndSiluBf16CopiesFeedTheNextMatmulAndGoStaleOnWrites) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t t = 7, d = 256, ff = 512;
  auto w1 = uniform(ff * d, rng, -0.1f, 0.1f), w2 = uniform(d * ff, rng, -0.1f, 0.1f);
  auto w1b = to_bf16(w1), w2b = to_bf16(w2);
  Linear l1, l2;
  l1.weight = Tensor(DType::BF16, {ff, d}, upload(w1b), Device::CUDA);
  l2.weight = Tensor(DType::BF16, {d, ff}, upload(w2b), Device::CUDA);
  const auto res = uniform(t * d, rng), add = uniform(t * d, rng), g = uniform(d, rng);
  Tensor tres = f32(res, {t, d}), tadd = f32(add, {t, d}), tg = f32(g, {1, d});
  tg = Tensor(DType::F32, {d}, tg.data, Device::CUDA);
  Tensor h = f32(std::vector<float>(t * d), {t, d}), up = f32(std::vector<float>(t * ff), {t, ff});
  Tensor gate = f32(uniform(t * ff, rng, -4, 4), {t, ff}), act = f32(std::vector<float>(t * ff), {t, ff});
  Tensor y = f32(std::vector<float>(t * d), {t, d});

  gpu_->matmul(h, l1, up);  // a BF16 matmul first: from now on the norms write BF16 copies
  gpu_->add_rmsnorm(tres, tadd, tg, 1e-5f, h);
  gpu_->matmul(h, l1, up);  // reads the BF16 copy of h
  auto hv = download<float>(h.data, t * d);
  (void)to_bf16(hv);
  Errors e = compare(download<float>(up.data, t * ff), matmul_ref(hv, w1, nullptr, t, d, ff));
  EXPECT_LE(e.max_abs, 1e-3) << "matmul after add_rmsnorm";

  // A write over h through the backend makes the copy stale: the next matmul must see the new values.
  auto fresh = uniform(t * d, rng);
  gpu_->copy_to_device(h.data, fresh.data(), fresh.size() * 4);
  gpu_->matmul(h, l1, up);
  (void)to_bf16(fresh);
  e = compare(download<float>(up.data, t * ff), matmul_ref(fresh, w1, nullptr, t, d, ff));
  EXPECT_LE(e.max_abs, 1e-3) << "matmul after overwriting h";

  gpu_->silu_mul(gate, up, act);
  gpu_->matmul(act, l2, y);
  auto av = download<float>(act.data, t * ff);
  const auto gv = download<float>(gate.data, t * ff), uv = download<float>(up.data, t * ff);
  std::vector<double> silu_ref(av.size());
  for (size_t i = 0; i < av.size(); ++i) silu_ref[i] = gv[i] / (1 + std::exp(-double(gv[i]))) * uv[i];
  EXPECT_LE(compare(av, silu_ref).max_abs, 1e-5) << "silu_mul F32 output";
  (void)to_bf16(av);
  e = compare(download<float>(y.data, t * d), matmul_ref(av, w2, nullptr, t, ff, d));
  EXPECT_LE(e.max_abs, 2e-3) << "matmul after silu_mul";
}

// Sampling -------------------------------------------------------------------------------------------------

// Both kernels: one CTA per row (cluster rows 0, and 9 rows past a limit of 8) and a cluster of eight CTAs
// per row over slices of the vocabulary (7 rows under a limit of 8), whose maxima meet in distributed shared
// memory. Ties inside one float4, across threads, across the cluster's slices and at a slice's edge.
TEST_F(CudaKernelsTest, ArgmaxPicksTheLowestIndexOfTheMaximum) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int64_t cluster_calls = 0;
  for (const auto& [cluster_rows, rows] : {std::pair<int64_t, int64_t>{0, 7}, {8, 7}, {8, 9}}) {
    gpu_->set_select_cluster_rows(cluster_rows);
    // 128256: Llama 3's vocabulary (the float4 path; slices of 16032); 1001: scalar loads (rows not
    // 16-byte aligned); 13: slices of 4, the last three empty.
    for (int64_t vocab : {int64_t{128256}, int64_t{1001}, int64_t{13}}) {
      SCOPED_TRACE(::testing::Message()
                   << "cluster rows " << cluster_rows << ", " << rows << " rows, vocab " << vocab);
      auto logits = uniform(rows * vocab, rng, -10, 10);
      const int64_t slice = ((vocab + 7) / 8 + 3) / 4 * 4;  // argmax_cluster_kernel's
      std::vector<int32_t> want(rows, -1);
      const auto set = [&](int64_t r, int64_t i, float v) { logits[r * vocab + std::min(i, vocab - 1)] = v; };
      set(1, 9, 70);
      set(1, 8, 70);  // tie inside one float4: 8 wins
      want[1] = 8;
      set(2, vocab - 7, 50);
      set(2, 5, 50);  // tie across threads and slices: 5 wins
      want[2] = 5;
      logits[3 * vocab + 2] = std::nanf("");  // NaN never wins
      set(3, 3, 40);
      want[3] = 3;
      std::fill_n(logits.begin() + 4 * vocab, vocab, -3.0f);  // all equal: index 0
      want[4] = 0;
      set(5, vocab - 1, 60);
      want[5] = static_cast<int32_t>(vocab - 1);
      if (slice < vocab) {
        set(6, slice, 80);  // a tie across the edge of slices 0 and 1: the last entry of slice 0 wins
        set(6, slice - 1, 80);
        want[6] = static_cast<int32_t>(slice - 1);
      }
      Tensor t = f32(logits, {rows, vocab});
      std::vector<int32_t> ids(rows, -1);
      const int64_t before = gpu_->cluster_select_launches();
      gpu_->argmax(t, ids.data());
      cluster_calls += gpu_->cluster_select_launches() - before;
      EXPECT_EQ(gpu_->cluster_select_launches() - before, rows <= cluster_rows ? 1 : 0);
      for (int64_t r = 0; r < rows; ++r) {
        const auto row = logits.begin() + r * vocab;
        const int32_t expected =
            want[r] >= 0 ? want[r] : static_cast<int32_t>(std::max_element(row, row + vocab) - row);
        EXPECT_EQ(ids[r], expected) << "row " << r;
      }
    }
  }
  EXPECT_EQ(cluster_calls, 3);
}

// The definition in kernels_sampling.cu, in double precision.
struct SampleRef {
  int32_t id;
  double theta, target, total;
  std::vector<double> z;
};
SampleRef sample_reference(const float* logits, int64_t vocab, const cuda::SampleParams& p) {
  SampleRef r;
  r.z.resize(vocab);
  for (int64_t i = 0; i < vocab; ++i) r.z[i] = double(logits[i] * (1.0f / p.temperature));
  const double zmax = *std::max_element(r.z.begin(), r.z.end());
  std::vector<double> sorted = r.z;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  double theta = -INFINITY;
  if (p.top_k > 0 && p.top_k < vocab) theta = sorted[p.top_k - 1];
  if (p.top_p < 1.0f) {
    double mass = 0;
    for (double z : sorted)
      if (z >= theta) mass += std::exp(z - zmax);
    double cum = 0;
    for (double z : sorted) {
      if (z < theta) break;
      cum += std::exp(z - zmax);
      if (cum >= p.top_p * mass) {
        theta = std::max(theta, z);
        break;
      }
    }
  }
  if (p.min_p > 0) theta = std::max(theta, zmax + std::log(double(p.min_p)));
  r.theta = theta;
  r.total = 0;
  for (double z : r.z)
    if (z >= theta) r.total += std::exp(z - zmax);
  r.target = p.uniform * r.total;
  double cum = 0;
  r.id = -1;
  for (int64_t i = 0; i < vocab; ++i)
    if (r.z[i] >= theta) {
      cum += std::exp(r.z[i] - zmax);
      r.id = static_cast<int32_t>(i);
      if (cum > r.target) break;
    }
  return r;
}

// The sampler on one CTA per row and on a cluster per row (CudaBackendOptions::select_cluster_rows), on rows
// of 16-byte aligned float4s (vocab 32000), rows that are not (32003: scalar loads), rows shorter than a
// cluster has CTAs' worth of 4-entry units (13: empty slices) and rows whose warp segments on one CTA have
// more steps than shared memory keeps totals of (270001: the final walk sums those steps again).
TEST_F(CudaKernelsTest, SamplingFollowsTemperatureTopKTopPMinP) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const int64_t cluster_rows : {int64_t{0}, int64_t{1} << 20})
    for (const int64_t vocab : {int64_t{32000}, int64_t{32003}, int64_t{13}, int64_t{270001}}) {
      SCOPED_TRACE(::testing::Message() << "cluster rows " << cluster_rows << " vocab " << vocab);
      gpu_->set_select_cluster_rows(cluster_rows);
      const int64_t before = gpu_->cluster_select_launches();
      check_sampling(vocab, rng);
      EXPECT_EQ(gpu_->cluster_select_launches() - before, cluster_rows > 0 ? 1 : 0);
    }
}

void CudaKernelsTest::check_sampling(int64_t vocab, std::mt19937& rng) {
  std::vector<cuda::SampleParams> params;
  const cuda::SampleParams kinds[] = {{1.0f, 0, 1.0f, 0.0f, 0},    {0.7f, 40, 1.0f, 0.0f, 0},
                                      {1.0f, 0, 0.9f, 0.0f, 0},    {1.3f, 0, 1.0f, 0.05f, 0},
                                      {0.8f, 50, 0.95f, 0.02f, 0}, {0.0f, 0, 1.0f, 0.0f, 0},
                                      {1.0f, 1, 1.0f, 0.0f, 0},    {2.0f, 5000, 0.5f, 0.0f, 0}};
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  for (int rep = 0; rep < 8; ++rep)
    for (cuda::SampleParams p : kinds) {
      p.uniform = u01(rng);
      params.push_back(p);
    }
  const auto rows = static_cast<int64_t>(params.size());
  auto logits = uniform(rows * vocab, rng, -6, 6);
  Tensor t = f32(logits, {rows, vocab});
  std::vector<int32_t> ids(rows, -1);
  gpu_->sample(t, params.data(), ids.data());
  int unexplained = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    if (params[r].temperature <= 0) {
      EXPECT_EQ(ids[r], std::max_element(row, row + vocab) - row) << "greedy row " << r;
      continue;
    }
    const SampleRef ref = sample_reference(row, vocab, params[r]);
    if (ids[r] == ref.id) continue;
    // A float32 sum may land on the other side of a boundary that float64 puts within rounding.
    ASSERT_GE(ids[r], 0);
    ASSERT_LT(ids[r], vocab);
    const double zg = ref.z[ids[r]];
    double cum_before = 0;
    const double zmax = *std::max_element(ref.z.begin(), ref.z.end());
    for (int64_t i = 0; i < std::max(ids[r], ref.id); ++i)
      if (ref.z[i] >= ref.theta && i < ids[r]) cum_before += std::exp(ref.z[i] - zmax);
    const bool near = std::fabs(zg - ref.theta) < 1e-4 ||
                      std::fabs(cum_before - ref.target) < 1e-4 * ref.total ||
                      std::fabs(cum_before + std::exp(zg - zmax) - ref.target) < 1e-4 * ref.total;
    if (!near) {
      ++unexplained;
      ADD_FAILURE() << "row " << r << " (temperature " << params[r].temperature << " top_k "
                    << params[r].top_k << " top_p " << params[r].top_p << " min_p " << params[r].min_p
                    << " u " << params[r].uniform << "): got " << ids[r] << " want " << ref.id;
    }
  }
  EXPECT_EQ(unexplained, 0);
}

// Random fill ----------------------------------------------------------------------------------------------

TEST_F(CudaKernelsTest, FillRandomIsUniformInRangeAndDeterministic) {
  const int64_t n = 1 << 20;
  Tensor a(DType::BF16, {n}, upload(std::vector<uint16_t>(n)), Device::CUDA);
  Tensor b(DType::BF16, {n}, upload(std::vector<uint16_t>(n)), Device::CUDA);
  ASSERT_TRUE(gpu_->fill_random(a, RandomFill{0.5f, 0.25f, 42}));
  ASSERT_TRUE(gpu_->fill_random(b, RandomFill{0.5f, 0.25f, 42}));
  const auto va = download<uint16_t>(a.data, n), vb = download<uint16_t>(b.data, n);
  EXPECT_EQ(va, vb) << "same seed, same values";
  double sum = 0, sq = 0;
  for (uint16_t h : va) {
    const double x = bf16_to_f32(h);
    ASSERT_GE(x, -0.2505);
    ASSERT_LE(x, 0.7505);
    sum += x;
    sq += (x - 0.25) * (x - 0.25);
  }
  EXPECT_NEAR(sum / n, 0.25, 0.005);
  EXPECT_NEAR(std::sqrt(sq / n), 0.5 / std::sqrt(3.0), 0.01);
  ASSERT_TRUE(gpu_->fill_random(b, RandomFill{0.5f, 0.25f, 43}));
  EXPECT_NE(download<uint16_t>(b.data, n), va) << "another seed, other values";
}

// A tensor-parallel rank generates its slice of a dummy weight as a block of the whole tensor's fill
// (RandomFill::block): rows, columns and a nested block, BF16 values, FP8 codes and INT4 bytes.
TEST_F(CudaKernelsTest, FillRandomBlocksAreSlicesOfTheWholeTensor) {
  const int64_t R = 48, C = 160;
  for (DType dt : {DType::BF16, DType::F8_E4M3, DType::INT4}) {
    const int64_t unit = dt == DType::INT4 ? 2 : 1, esize = dt == DType::BF16 ? 2 : 1;  // elements per byte
    const int64_t row_bytes = C / unit * esize;
    const RandomFill whole{dt == DType::BF16 ? 0.5f : 400.0f, 0.0f, 7};
    Tensor full(dt, {R, C}, upload(std::vector<uint8_t>(static_cast<size_t>(R * row_bytes))), Device::CUDA);
    ASSERT_TRUE(gpu_->fill_random(full, whole));
    const auto all = download<uint8_t>(full.data, R * row_bytes);
    struct Case {
      int64_t r0, c0, rows, cols;
    };
    for (const Case& c : {Case{16, 0, 16, C}, Case{0, 64, R, 32}, Case{8, 96, 24, 64}}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " block at " << c.r0 << "," << c.c0);
      const int64_t brow = c.cols / unit * esize;
      Tensor part(dt, {c.rows, c.cols}, upload(std::vector<uint8_t>(static_cast<size_t>(c.rows * brow))),
                  Device::CUDA);
      // The INT4 fill counts bytes of two codes: its block is given in elements like the others.
      ASSERT_TRUE(gpu_->fill_random(part, whole.block(C, c.r0, c.c0)));
      const auto got = download<uint8_t>(part.data, c.rows * brow);
      for (int64_t r = 0; r < c.rows; ++r)
        ASSERT_EQ(
            0, std::memcmp(got.data() + r * brow, all.data() + (c.r0 + r) * row_bytes + c.c0 / unit * esize,
                           static_cast<size_t>(brow)))
            << "row " << r;
    }
  }
}

// CUDA graphs through SequenceRunner -------------------------------------------------------------------

TEST_F(CudaKernelsTest, DecodeStepsReplayedFromAGraphMatchEagerSteps) {
  auto model = Model::load("dummy:tiny", *gpu_);
  std::vector<int32_t> prompt = {1, 17, 300, 42, 5, 9, 77, 128, 3};
  setenv("INFERX_GRAPHS", "0", 1);
  SequenceRunner eager(*model, 64);
  unsetenv("INFERX_GRAPHS");
  SequenceRunner graphed(*model, 64);
  std::vector<float> a = eager.step(prompt), b = graphed.step(prompt);
  for (int i = 0; i < 20; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(a.begin(), a.end()) - a.begin());
    a = eager.step({next});
    b = graphed.step({next});
    std::vector<double> want(a.begin(), a.end());
    const Errors e = compare(b, want);
    ASSERT_TRUE(e.all_finite) << "step " << i;
    ASSERT_LE(e.max_abs, 1e-3) << "step " << i;
  }
}

// The SiLU * up pass of a fused gate/up FP8 product quantized in the same pass (launch_fp8_silu_quantize)
// gives exactly the codes and scales of the unfused pair launch_fp8_epilogue + launch_quantize_fp8_rows,
// from a few columns (38: one column per load; 40; 5000) to Llama-3-8B's 14336 and Llama-3-70B's 28672
// and past them (40000), per-channel and per-tensor scales, with biases (4096, 8192 and 8196: row widths
// around the thread count's multiples), in both of its forms (the row in registers up to 16384 columns -
// rows of exactly its chunk counts, 4096 / 8192 / 14336 / 16384, take its guard-free instance, the others
// the guarded one - and in shared memory), and past the 65535 CTAs of one launch (rows looped over by each
// CTA).
TEST_F(CudaKernelsTest, SiluQuantizePassMatchesTheUnfusedPassesExactly) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct RestorePass {
    cuda::SiluPass was = cuda::fp8_silu_pass();
    ~RestorePass() { cuda::set_fp8_silu_pass(was); }
  } restore;
  for (cuda::SiluPass pass : {cuda::SiluPass::Registers, cuda::SiluPass::SharedMemory})
    for (int64_t f : {int64_t{40}, int64_t{38}, int64_t{4096}, int64_t{5000}, int64_t{8192}, int64_t{8196},
                      int64_t{14336}, int64_t{16384}, int64_t{28672}, int64_t{40000}})
      for (bool per_channel : {true, false})
        for (int64_t t : {int64_t{1}, int64_t{37}, int64_t{66000}}) {
          if (t > 1000 && f > 64) continue;  // the CTAs' row loop on narrow rows only
          cuda::set_fp8_silu_pass(pass);
          SCOPED_TRACE(::testing::Message() << "pass " << static_cast<int>(pass) << " f " << f
                                            << " per_channel " << per_channel << " t " << t);
          std::vector<float> acc = uniform(static_cast<size_t>(t * 2 * f), rng, -30.0f, 30.0f);
          const std::vector<uint16_t> acc_bf16 = to_bf16(acc);
          const std::vector<float> xs = uniform(static_cast<size_t>(t), rng, 0.01f, 0.1f),
                                   ws = uniform(per_channel ? static_cast<size_t>(2 * f) : 1, rng, 0.001f,
                                                0.01f),
                                   bias = uniform(static_cast<size_t>(2 * f), rng, -0.5f, 0.5f);
          cuda::Fp8Epilogue e;
          e.acc = upload(acc_bf16);
          e.acc_bf16 = true;
          e.t = t;
          e.n = 2 * f;
          e.x_scale = static_cast<const float*>(upload(xs));
          e.w_scale = static_cast<const float*>(upload(ws));
          e.per_channel = per_channel;
          e.bias = static_cast<const float*>(upload(bias));
          e.silu = true;
          ASSERT_TRUE(cuda::fp8_silu_quantize_takes(e));
          std::vector<uint8_t> none(static_cast<size_t>(t * f), 0);
          void* q_fused = upload(none);
          void* q_unfused = upload(none);
          void* s_fused = upload(std::vector<float>(static_cast<size_t>(t), -1.0f));
          void* s_unfused = upload(std::vector<float>(static_cast<size_t>(t), -1.0f));
          void* y = upload(std::vector<float>(static_cast<size_t>(t * f), 0.0f));
          // The register pass takes every whole-chunk width up to 16384 columns: it is the one under test.
          EXPECT_EQ(cuda::fp8_silu_registers_take(e, q_fused),
                    pass == cuda::SiluPass::Registers && f % 4 == 0 && f <= 16384);
          ASSERT_EQ(cuda::launch_fp8_silu_quantize(e, static_cast<uint8_t*>(q_fused),
                                                   static_cast<float*>(s_fused), nullptr),
                    cudaSuccess);
          cuda::Fp8Epilogue u = e;
          u.out[0] = static_cast<float*>(y);
          u.cols[0] = f;
          ASSERT_EQ(cuda::launch_fp8_epilogue(u, nullptr), cudaSuccess);
          ASSERT_EQ(cuda::launch_quantize_fp8_rows(static_cast<const float*>(y), t, f,
                                                   static_cast<uint8_t*>(q_unfused),
                                                   static_cast<float*>(s_unfused), nullptr, nullptr),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(download<float>(s_fused, static_cast<size_t>(t)),
                    download<float>(s_unfused, static_cast<size_t>(t)));
          const auto a = download<uint8_t>(q_fused, static_cast<size_t>(t * f)),
                     b = download<uint8_t>(q_unfused, static_cast<size_t>(t * f));
          size_t differ = 0;
          for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
          EXPECT_EQ(differ, 0u) << "codes differing from the unfused passes";
        }
}

}  // namespace
}  // namespace inferx
