// The attention kernels over every cache element type, against float64 references: the FP8 E4M3 KV
// cache (RoPE + cache write with per-tensor scales, then the split-KV decode, tensor-core prefill and v0
// kernels reading it) and the BF16 cache over the shape grid of issue 5 (GQA ratios 1/4/8/16, head_dim
// 64/128, batch mixes of prefill chunks, chunks after many cached keys and decodes, shuffled block
// tables, sliding windows). Fresh random inputs every run (the seed is printed on failure); outputs are
// poisoned with NaN first, so an unwritten element fails.
//
// Tolerances: the reference uses exactly the values the cache holds (BF16, or E4M3 code * scale), so a
// kernel's own error is its arithmetic: F32 in the v0 kernel and F32-equivalent in the decode kernel (rel
// 1e-5, abs 1e-4) but over an FP8 cache with its default single F16 terms of Q and P (decode_tolerance),
// BF16 Q and P on the tensor cores in the prefill kernel (rel 1e-2, abs 3e-2). The
// end-to-end FP8 check compares against unquantized K/V: E4M3 keeps 3 mantissa bits (rounding error up to
// 2^-4 relative, ~1.8% RMS), so the output may differ by a few percent (rel norm <= 0.06).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_quant.h"
#include "backend/rope.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "quant/fp8.h"

namespace inferx {
namespace {

std::vector<float> uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

using cuda_test::compare;
using cuda_test::Errors;

// One batch: per sequence, `start` cached tokens before this step and `count` new ones.
struct Case {
  int64_t hq, hkv, hd, window, bs;
  std::vector<int32_t> start, count;
};

struct Layout {
  std::vector<int32_t> positions, query_start{0}, seq_lens, tables, seq_of;
  int32_t max_blocks = 0, num_blocks = 0, max_q = 0, max_len = 0;
};

Layout make_layout(const Case& c, std::mt19937& rng) {
  Layout d;
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
  d.max_blocks = static_cast<int32_t>((d.max_len + c.bs - 1) / c.bs) + 1;
  d.num_blocks = d.max_blocks * static_cast<int32_t>(c.start.size()) + 2;
  std::vector<int32_t> blocks(static_cast<size_t>(d.num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  d.tables.assign(blocks.begin(), blocks.begin() + d.max_blocks * static_cast<int64_t>(c.start.size()));
  return d;
}

// out[t, h, :] = softmax over the visible keys of q . k * scale, times v; k/v [blocks, bs, hkv, hd].
// Tokens are spread over the host's cores (the float64 loops dominate the test's time).
std::vector<double> reference(const Case& c, const Layout& d, const std::vector<float>& q,
                              const std::vector<double>& k, const std::vector<double>& v, double scale) {
  const int64_t T = static_cast<int64_t>(d.positions.size());
  std::vector<double> out(static_cast<size_t>(T * c.hq * c.hd), 0.0);
  const auto tokens = [&](int64_t t_begin, int64_t t_end) {
    std::vector<double> sc;
    std::vector<int64_t> slots;
    for (int64_t t = t_begin; t < t_end; ++t) {
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
          for (int64_t i = 0; i < c.hd; ++i) dot += double(q[(t * c.hq + h) * c.hd + i]) * k[slot + i];
          sc.push_back(dot * scale);
          slots.push_back(slot);
        }
        if (sc.empty()) continue;
        const double mx = *std::max_element(sc.begin(), sc.end());
        double den = 0;
        for (double& x : sc) den += (x = std::exp(x - mx));
        for (int64_t i = 0; i < c.hd; ++i) {
          double acc = 0;
          for (size_t j = 0; j < sc.size(); ++j) acc += sc[j] * v[slots[j] + i];
          out[(t * c.hq + h) * c.hd + i] = acc / den;
        }
      }
    }
  };
  const int64_t workers = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32);
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) pool.emplace_back(tokens, T * w / workers, T * (w + 1) / workers);
  for (std::thread& th : pool) th.join();
  return out;
}

class CudaAttentionTest : public ::testing::Test {
 public:  // the free helpers below drive the fixture
  void SetUp() override {
    INFERX_SKIP_WITHOUT_GPU();
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  // RopeWritesScaledE4M3CodesIntoTheCache's body, once per RoPE kernel.
  void rope_writes_scaled_codes();
  CudaBackend& backend(DType kv, float k_scale = 1.0f, float v_scale = 1.0f) {
    CudaBackendOptions o;
    o.kv_cache_dtype = kv;
    o.kv_k_scale = k_scale;
    o.kv_v_scale = v_scale;
    buffers_.clear();
    backend_ = make_cuda_backend(0, o);
    return static_cast<CudaBackend&>(*backend_);
  }
  template <class T>
  void* upload(const std::vector<T>& v) {
    buffers_.push_back(backend_->allocate(std::max<size_t>(v.size() * sizeof(T), 4)));
    backend_->copy_to_device(buffers_.back()->data(), v.data(), v.size() * sizeof(T));
    return buffers_.back()->data();
  }
  // upload's form for buffers of one comparison: release_scoped() frees them (upload keeps its buffers to
  // the test's end, too many for tests that compare hundreds of cache copies).
  template <class T>
  void* upload_scoped(const std::vector<T>& v) {
    scoped_.push_back(backend_->allocate(std::max<size_t>(v.size() * sizeof(T), 4)));
    backend_->copy_to_device(scoped_.back()->data(), v.data(), v.size() * sizeof(T));
    return scoped_.back()->data();
  }
  void release_scoped() { scoped_.clear(); }
  template <class T>
  std::vector<T> download(const void* p, size_t n) {
    std::vector<T> v(n);
    backend_->synchronize();
    backend_->copy_to_host(v.data(), p, n * sizeof(T));
    return v;
  }
  Tensor f32(const std::vector<float>& v, int64_t rows, int64_t cols) {
    return Tensor(DType::F32, {rows, cols}, upload(v), Device::CUDA);
  }
  BatchView view(const Layout& d) {
    BatchView b;
    b.num_tokens = static_cast<int32_t>(d.positions.size());
    b.num_seqs = static_cast<int32_t>(d.seq_lens.size());
    b.positions = static_cast<const int32_t*>(upload(d.positions));
    b.query_start = static_cast<const int32_t*>(upload(d.query_start));
    b.seq_lens = static_cast<const int32_t*>(upload(d.seq_lens));
    b.block_tables = static_cast<const int32_t*>(upload(d.tables));
    b.max_blocks_per_seq = d.max_blocks;
    b.max_query_len = d.max_q;
    b.max_seq_len = d.max_len;
    return b;
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  std::unique_ptr<Backend> backend_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::vector<std::unique_ptr<DeviceBuffer>> scoped_;
};

// A cache of random values held exactly (codes uploaded, the reference gets their values).
struct Cache {
  KvCacheLayer layer;
  std::vector<double> k, v;
  std::vector<uint8_t> k_codes, v_codes;  // the uploaded bytes (for copies of the same cache)
};

// nan_unused: every slot outside the sequences (the rest of their last blocks, blocks no table holds) holds
// NaN codes, as a cache may after earlier sequences' garbage: no kernel may let them reach an output.
Cache random_cache(CudaAttentionTest& f, const Case& c, const Layout& d, DType dtype, float k_scale,
                   float v_scale, std::mt19937& rng, bool nan_unused = false) {
  const size_t n = static_cast<size_t>(d.num_blocks * c.bs * c.hkv * c.hd);
  std::vector<bool> used(n, !nan_unused);
  for (size_t s = 0; nan_unused && s < d.seq_lens.size(); ++s) {
    for (int32_t pos = 0; pos < d.seq_lens[s]; ++pos) {
      const int64_t slot = int64_t(d.tables[s * d.max_blocks + pos / c.bs]) * c.bs + pos % c.bs;
      std::fill_n(used.begin() + slot * c.hkv * c.hd, c.hkv * c.hd, true);
    }
  }
  Cache out;
  out.k.resize(n);
  out.v.resize(n);
  const auto tensor = [&](void* data) {
    return Tensor(dtype, {d.num_blocks, c.bs, c.hkv, c.hd}, data, Device::CUDA);
  };
  const auto kf = uniform(n, rng, -2.0f, 2.0f), vf = uniform(n, rng, -1.0f, 1.0f);
  if (dtype == DType::F8_E4M3) {
    std::vector<uint8_t> kc(n), vc(n);
    for (size_t i = 0; i < n; ++i) {
      kc[i] = used[i] ? f32_to_fp8_e4m3(kf[i] / k_scale) : 0x7f;  // 0x7f: E4M3's NaN
      vc[i] = used[i] ? f32_to_fp8_e4m3(vf[i] / v_scale) : 0x7f;
      out.k[i] = double(fp8_e4m3_to_f32(kc[i])) * k_scale;
      out.v[i] = double(fp8_e4m3_to_f32(vc[i])) * v_scale;
    }
    out.layer = {tensor(f.upload(kc)), tensor(f.upload(vc))};
    out.k_codes = std::move(kc);
    out.v_codes = std::move(vc);
  } else {
    std::vector<uint16_t> kc(n), vc(n);
    for (size_t i = 0; i < n; ++i) {
      kc[i] = used[i] ? f32_to_bf16(kf[i]) : 0x7fc0;  // BF16's quiet NaN
      vc[i] = used[i] ? f32_to_bf16(vf[i]) : 0x7fc0;
      out.k[i] = bf16_to_f32(kc[i]);
      out.v[i] = bf16_to_f32(vc[i]);
    }
    out.layer = {tensor(f.upload(kc)), tensor(f.upload(vc))};
    const auto bytes = [](const std::vector<uint16_t>& codes) {
      std::vector<uint8_t> b(codes.size() * sizeof(uint16_t));
      std::memcpy(b.data(), codes.data(), b.size());
      return b;
    };
    out.k_codes = bytes(kc);
    out.v_codes = bytes(vc);
  }
  return out;
}

// The case grid: GQA ratios 1/4/8/16, head_dim 64/128, windows, block sizes, mixes of decodes, fresh
// prefills, chunks after cached keys, and (long) one long chunk after many cached keys.
std::vector<Case> cases(std::mt19937& rng, bool decode_only, bool long_chunks) {
  std::vector<Case> out;
  const int64_t shapes[][3] = {{8, 8, 64}, {32, 8, 128}, {16, 2, 128}, {32, 4, 64}, {16, 1, 128}};
  std::uniform_int_distribution<int32_t> ctx(0, 1200), chunk(2, 100);
  for (const auto& sh : shapes) {
    for (int64_t window : {int64_t{0}, int64_t{100}}) {
      const int64_t bs = rng() % 2 ? 16 : 32;
      Case c{sh[0], sh[1], sh[2], window, bs, {}, {}};
      const int seqs = 1 + static_cast<int>(rng() % 4);
      for (int s = 0; s < seqs; ++s) {
        const bool prefill = !decode_only && rng() % 2 == 0;
        c.start.push_back(prefill && rng() % 3 == 0 ? 0 : ctx(rng));
        c.count.push_back(prefill ? chunk(rng) : 1);
      }
      if (long_chunks && !decode_only && c.hq <= 16) {  // a 130-token chunk after 1000-2000 cached tokens
        c.start.push_back(1000 + static_cast<int32_t>(rng() % 1000));
        c.count.push_back(130);
      }
      out.push_back(c);
    }
  }
  return out;
}

// A kernel to check: splits > 0 forces the decode kernel's split count, min_tiles its tiles per split (the
// split plan's cut of contexts shorter than the plan's capacity, DecodeSplitPlan).
struct KernelChoice {
  CudaAttentionKernel kernel;
  int splits = 0;
  int min_tiles = 1;
};

struct Tolerance {
  double rel, abs;
};
// The decode kernel's tolerance: F32-equivalent products (BF16 caches, or an FP8 cache with
// INFERX_DECODE_ATTN_TERMS=2) against the exact reference, scaled with q_amp (queries uniform in [-q_amp,
// q_amp]: the scores, and the softmax's sensitivity to their rounding, grow with it). Over an FP8 cache the
// v3 kernel by default multiplies Q and P rounded to F16 once (kernels.h, decode_attention_terms): checked
// against a reference over the same F16 queries (f16_queries), where only P's rounding is left, so the
// bound does not grow with q_amp; against the exact reference the F16 queries alone moved the output by up
// to 2.4e-4 (rel norm) / 2.6e-4 (abs) at q_amp 1 and 2e-2 / 0.14 at q_amp 1000 (near-ties of a nearly
// one-hot softmax; H200 2026-12-05), which the mixed-step test's q_amp-1 bound covers.
Tolerance decode_tolerance(bool single_term, float q_amp) {
  if (single_term) return {1e-3, 2e-3};
  return {1e-5 * q_amp, 1e-4 * q_amp};
}

// The queries as the single-term FP8-cache decode kernel multiplies them: times its multiplier in F32,
// rounded to F16 (cuda::decode_query_scaling), divided by the multiplier again, so that the reference's own
// scaling applies.
std::vector<float> f16_queries(const std::vector<float>& q, float scale, float k_scale) {
  const float m = cuda::decode_query_scaling(scale, DType::F8_E4M3, k_scale).q_mult;
  std::vector<float> out(q.size());
  for (size_t i = 0; i < q.size(); ++i) out[i] = f16_to_f32(f32_to_f16(q[i] * m)) / m;
  return out;
}

// INFERX_ATTN_TEST_ERRORS=1 prints every comparison's errors (to set the tolerances from measurements).
void log_errors(const char* what, DType dt, int kernel, float q_amp, const Errors& e) {
  static const bool on = std::getenv("INFERX_ATTN_TEST_ERRORS") != nullptr;
  if (on)
    std::printf("attention errors: %s dtype %.*s kernel %d q_amp %g rel_norm %.3e max_abs %.3e\n", what,
                static_cast<int>(dtype_name(dt).size()), dtype_name(dt).data(), kernel, q_amp, e.rel_norm,
                e.max_abs);
}

// INFERX_ATTN_TEST_QUICK=1 keeps a few iterations of the RoPE-in-attention tests' loops, for
// compute-sanitizer runs (bench/gpu/sanitize.sh), where every launch is one to two orders of magnitude
// slower: the first three decode cases of the grid (head_dim 64 and 128, with and without a window) and fewer
// split settings.
bool quick_subset() {
  static const bool on = std::getenv("INFERX_ATTN_TEST_QUICK") != nullptr;
  return on;
}

// One case's random inputs, in the order every check draws them (layout, cache, then queries uniform in
// [-q_amp, q_amp]), with the attention parameters and the batch and queries uploaded.
struct Inputs {
  Layout d;
  Cache cache;
  int64_t T;
  std::vector<float> qv;
  AttentionParams p;
  BatchView b;
  Tensor q;
};
Inputs make_inputs(CudaAttentionTest& f, const Case& c, DType dtype, float k_scale, float v_scale,
                   std::mt19937& rng, float q_amp, bool nan_unused = false) {
  Layout d = make_layout(c, rng);
  Cache cache = random_cache(f, c, d, dtype, k_scale, v_scale, rng, nan_unused);
  const int64_t T = static_cast<int64_t>(d.positions.size());
  std::vector<float> qv = uniform(static_cast<size_t>(T * c.hq * c.hd), rng, -q_amp, q_amp);
  const AttentionParams p{c.hq, c.hkv, c.hd, 1.0f / std::sqrt(float(c.hd)), c.window};
  const BatchView b = f.view(d);
  const Tensor q = f.f32(qv, T, c.hq * c.hd);
  return Inputs{std::move(d), std::move(cache), T, std::move(qv), p, b, q};
}

// q_amp: queries uniform in [-q_amp, q_amp] (decode_tolerance).
void check_kernels(CudaAttentionTest& f, CudaBackend& gpu, DType dtype, float k_scale, float v_scale,
                   const Case& c, std::mt19937& rng, const std::vector<KernelChoice>& kernels,
                   float q_amp = 1.0f, bool nan_unused = false) {
  const Inputs in = make_inputs(f, c, dtype, k_scale, v_scale, rng, q_amp, nan_unused);
  const auto& [d, cache, T, qv, p, b, q] = in;
  const std::vector<double> want = reference(c, d, qv, cache.k, cache.v, p.scale);
  const bool single = cuda::decode_attention_rounds_once(dtype, c.bs);
  const std::vector<double> want_f16 =
      single ? reference(c, d, f16_queries(qv, p.scale, k_scale), cache.k, cache.v, p.scale) : want;
  for (const auto& [kernel, splits, min_tiles] : kernels) {
    SCOPED_TRACE(::testing::Message() << "kernel " << static_cast<int>(kernel) << " splits " << splits
                                      << " min tiles " << min_tiles);
    Tensor out = f.f32(std::vector<float>(qv.size(), std::nanf("")), T, c.hq * c.hd);
    gpu.set_attention_kernel(kernel, splits, min_tiles);
    gpu.attention(q, cache.layer, b, p, out);
    const bool decode = kernel == CudaAttentionKernel::Decode;
    const Errors e = compare(f.download<float>(out.data, qv.size()), decode && single ? want_f16 : want);
    log_errors("check", dtype, static_cast<int>(kernel), q_amp, e);
    // F32 arithmetic (v0), the decode kernel's (decode_tolerance), BF16 Q and P (prefill).
    const Tolerance tol = kernel == CudaAttentionKernel::Reference ? Tolerance{1e-5 * q_amp, 1e-4 * q_amp}
                          : decode                                 ? decode_tolerance(single, q_amp)
                                                                   : Tolerance{1e-2, 3e-2};
    EXPECT_TRUE(e.all_finite) << "unwritten or NaN outputs";
    EXPECT_LE(e.rel_norm, tol.rel) << "max abs " << e.max_abs;
    EXPECT_LE(e.max_abs, tol.abs) << "rel norm " << e.rel_norm;
  }
  gpu.set_attention_kernel(CudaAttentionKernel::Auto);
}

// (a Message, not string concatenation: GCC 12 -O3 warns spuriously on operator+ with to_string)
::testing::Message describe(const Case& c, DType dt) {
  ::testing::Message m;
  m << "hq " << c.hq << " hkv " << c.hkv << " hd " << c.hd << " window " << c.window << " bs " << c.bs
    << " dtype " << dtype_name(dt) << " seqs";
  for (size_t i = 0; i < c.start.size(); ++i) m << " " << c.start[i] << "+" << c.count[i];
  return m;
}

// Every decode-only case of the grid over a BF16 cache and an FP8 cache (k_scale 0.02, v_scale 1.5) through
// `kernels`; block_size > 0 replaces the cases' block sizes, q_amp as check_kernels.
void check_decode_cases(CudaAttentionTest& f, std::mt19937& rng, const std::vector<KernelChoice>& kernels,
                        float q_amp = 1.0f, int64_t block_size = 0, bool nan_unused = false) {
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    const float ks = dt == DType::F8_E4M3 ? 0.02f : 1.0f, vs = dt == DType::F8_E4M3 ? 1.5f : 1.0f;
    CudaBackend& gpu = f.backend(dt, ks, vs);
    for (Case c : cases(rng, /*decode_only=*/true, false)) {
      if (block_size > 0) c.bs = block_size;
      SCOPED_TRACE(describe(c, dt));
      check_kernels(f, gpu, dt, ks, vs, c, rng, kernels, q_amp, nan_unused);
    }
  }
}

TEST_F(CudaAttentionTest, DecodeKernelOverBf16AndFp8CachesMatchesFloat64) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  check_decode_cases(*this, rng_,
                     {{CudaAttentionKernel::Decode, 0},
                      {CudaAttentionKernel::Decode, 1},
                      {CudaAttentionKernel::Decode, 5},
                      {CudaAttentionKernel::Decode, 64},
                      {CudaAttentionKernel::Reference, 0}});
}

// Split plans that cut a token's keys into fewer, longer splits than the launch has (min_tiles > 1: a graph
// planned for a longer capacity than the contexts): the unused splits return at once and the merge takes
// the used ones; a token needing one split writes its output directly. With the cluster form off, so that
// the global merge (partials, ticket, the last CTA's merge) is checked on the small launches too; the
// cluster form's own test follows.
// The v3 decode kernel's cluster form for a test's scope, back to the environment's choice at its end (also
// when an assertion returns early), as cuda_gemv_test.cpp's KernelScope does for the GEMV kernels.
struct ClusterFormScope {
  explicit ClusterFormScope(int mode) { cuda::set_decode_attention_cluster(mode); }
  ~ClusterFormScope() { cuda::set_decode_attention_cluster(-1); }
  ClusterFormScope(const ClusterFormScope&) = delete;
  ClusterFormScope& operator=(const ClusterFormScope&) = delete;
};

TEST_F(CudaAttentionTest, DecodeKernelWithMinimumTilesPerSplitMatchesFloat64) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const ClusterFormScope global_merge(0);
  check_decode_cases(*this, rng_,
                     {{CudaAttentionKernel::Decode, 0},
                      {CudaAttentionKernel::Decode, 5},
                      {CudaAttentionKernel::Decode, 8, 3},
                      {CudaAttentionKernel::Decode, 64, 5},
                      {CudaAttentionKernel::Decode, 3, 16},
                      {CudaAttentionKernel::Decode, 2, 100}});
}

// The cluster form of the v3 decode kernel (cuda::decode_attention_cluster: the splits of a group as one
// thread-block cluster merging through rank 0's shared memory), over every decode case it takes (launches
// that run in one wave with one n-tile; the rest take the global merge in the same calls): forced split
// counts up to the launch's (64 runs as 16), and plans with fewer, longer splits than the cluster has.
TEST_F(CudaAttentionTest, DecodeKernelClusterFormMatchesFloat64) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const ClusterFormScope cluster_form(1);
  const uint64_t before = cuda::decode_attention_cluster_launches();
  check_decode_cases(*this, rng_,
                     {{CudaAttentionKernel::Decode, 0},
                      {CudaAttentionKernel::Decode, 2},
                      {CudaAttentionKernel::Decode, 5},
                      {CudaAttentionKernel::Decode, 16},
                      {CudaAttentionKernel::Decode, 64},
                      {CudaAttentionKernel::Decode, 8, 3},
                      {CudaAttentionKernel::Decode, 16, 100}});
  EXPECT_GT(cuda::decode_attention_cluster_launches(), before) << "no launch took the cluster form";
}

// The decode kernel's own RoPE + cache write (cuda::DecodeRope) for a test's scope, back to the
// environment's choice at its end.
struct DecodeRopeScope {
  explicit DecodeRopeScope(int mode) { cuda::set_decode_rope_fused(mode); }
  ~DecodeRopeScope() { cuda::set_decode_rope_fused(-1); }
  DecodeRopeScope(const DecodeRopeScope&) = delete;
  DecodeRopeScope& operator=(const DecodeRopeScope&) = delete;
};

// Index of the first element where a and b differ in their bytes (-1: none; sizes must match).
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// Backend::rope_attention in one-token steps: the decode kernel rotating the queries and writing the newest
// keys itself (cuda::DecodeRope) against the RoPE kernel then the decode kernel, from copies of the same
// cache: the same cache bytes and the same outputs to the bit (one rotation, rope_math.cuh; the same
// kernel and split plan otherwise). Every decode case of the grid (GQA 1..16, head_dim 64/128, windows,
// block sizes 16/32, 1-4 sequences), BF16 and FP8 caches with scales, NeoX and interleaved pairs, automatic
// and forced split counts, the cluster form on and off.
TEST_F(CudaAttentionTest, RopeInTheDecodeKernelMatchesTheRopeKernel) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const uint64_t before = cuda::decode_rope_launches();
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    const float ks = dt == DType::F8_E4M3 ? 0.02f : 1.0f, vs = dt == DType::F8_E4M3 ? 1.5f : 1.0f;
    CudaBackend& gpu = backend(dt, ks, vs);
    std::vector<Case> grid = cases(rng_, /*decode_only=*/true, false);
    if (quick_subset()) grid.resize(3);
    std::vector<std::pair<int, int>> split_forms{{0, 1}, {0, 0}, {1, 1}, {7, 1}, {7, 0}, {64, 1}};
    if (quick_subset()) split_forms = {{0, 1}, {7, 0}};
    for (const Case& c : grid) {
      SCOPED_TRACE(describe(c, dt));
      const Layout d = make_layout(c, rng_);
      const Cache base = random_cache(*this, c, d, dt, ks, vs, rng_);
      const size_t bytes = base.k_codes.size();
      const int64_t T = static_cast<int64_t>(d.positions.size());
      const auto qv = uniform(static_cast<size_t>(T * c.hq * c.hd), rng_, -1.0f, 1.0f);
      const auto kv = uniform(static_cast<size_t>(T * c.hkv * c.hd), rng_, -2.0f, 2.0f);
      const auto vv = uniform(kv.size(), rng_, -1.0f, 1.0f);
      const BatchView b = view(d);
      const AttentionParams p{c.hq, c.hkv, c.hd, 1.0f / std::sqrt(float(c.hd)), c.window};
      for (RopeLayout layout : {RopeLayout::NeoX, RopeLayout::Interleaved}) {
        const RopeParams rope{c.hd, 500000.0f, layout, {}};
        for (const auto& [splits, cluster] : split_forms) {
          SCOPED_TRACE(::testing::Message() << "interleaved " << (layout == RopeLayout::Interleaved)
                                            << " splits " << splits << " cluster " << cluster);
          const ClusterFormScope cluster_form(cluster);
          gpu.set_attention_kernel(CudaAttentionKernel::Decode, splits);
          std::vector<float> outs[2];
          std::vector<uint8_t> k_bytes[2], v_bytes[2];
          for (int fused : {0, 1}) {
            const DecodeRopeScope scope(fused);
            release_scoped();
            KvCacheLayer layer = base.layer;  // the same shapes over copies of the same codes
            layer.k.data = upload_scoped(base.k_codes);
            layer.v.data = upload_scoped(base.v_codes);
            Tensor q(DType::F32, {T, c.hq * c.hd}, upload_scoped(qv), Device::CUDA);
            Tensor k(DType::F32, {T, c.hkv * c.hd}, upload_scoped(kv), Device::CUDA);
            Tensor v(DType::F32, {T, c.hkv * c.hd}, upload_scoped(vv), Device::CUDA);
            Tensor out(DType::F32, {T, c.hq * c.hd},
                       upload_scoped(std::vector<float>(qv.size(), std::nanf(""))), Device::CUDA);
            const uint64_t launches = cuda::decode_rope_launches();
            gpu.rope_attention(q, k, v, b, rope, layer, p, out);
            outs[fused] = download<float>(out.data, qv.size());
            k_bytes[fused] = download<uint8_t>(layer.k.data, bytes);
            v_bytes[fused] = download<uint8_t>(layer.v.data, bytes);
            EXPECT_EQ(cuda::decode_rope_launches() - launches, fused ? 1u : 0u) << "fused " << fused;
          }
          EXPECT_EQ(first_difference(k_bytes[0], k_bytes[1]), -1) << "k cache byte";
          EXPECT_EQ(first_difference(v_bytes[0], v_bytes[1]), -1) << "v cache byte";
          const int64_t at = first_difference(outs[0], outs[1]);
          EXPECT_EQ(at, -1) << "output " << (at >= 0 ? outs[0][at] : 0.0f) << " vs "
                            << (at >= 0 ? outs[1][at] : 0.0f);
          EXPECT_TRUE(std::all_of(outs[1].begin(), outs[1].end(), [](float x) { return std::isfinite(x); }));
        }
      }
    }
    gpu.set_attention_kernel(CudaAttentionKernel::Auto);
  }
  EXPECT_GT(cuda::decode_rope_launches(), before);
}

// The same from a deferred q/k/v product (cuda::DecodeRope::product: the FP8 projection's BF16 sums with
// per-row activation scales, per-channel or per-tensor weight scales and a bias, never written as F32), at
// the kernels' level: the RoPE kernel reading the product then the decode kernel, against the decode kernel
// alone - the same cache bytes and outputs to the bit. Decode batches of 3 and 70 tokens (the product is
// deferred from 64 rows in the engine).
TEST_F(CudaAttentionTest, RopeInTheDecodeKernelReadsTheDeferredProduct) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  struct Stream {  // the kernels' stream, destroyed also when an assertion returns early
    cudaStream_t s = nullptr;
    ~Stream() { cudaStreamDestroy(s); }
  } st;
  ASSERT_EQ(cudaStreamCreate(&st.s), cudaSuccess);
  const cudaStream_t stream = st.s;
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    const float ks = dt == DType::F8_E4M3 ? 0.05f : 1.0f, vs = dt == DType::F8_E4M3 ? 0.5f : 1.0f;
    backend(dt, ks, vs);
    std::vector<Case> shapes{Case{32, 8, 128, 0, 16, {}, {}}, Case{8, 8, 64, 100, 32, {}, {}},
                             Case{16, 2, 128, 0, 32, {}, {}}};
    if (quick_subset()) shapes.resize(2);
    for (const Case& c0 : shapes) {
      for (int tokens : {3, 70}) {
        Case c = c0;
        std::uniform_int_distribution<int32_t> ctx(0, tokens > 8 ? 300 : 1100);
        for (int i = 0; i < tokens; ++i) c.start.push_back(ctx(rng_)), c.count.push_back(1);
        SCOPED_TRACE(describe(c, dt));
        const Layout d = make_layout(c, rng_);
        const Cache base = random_cache(*this, c, d, dt, ks, vs, rng_);
        const size_t bytes = base.k_codes.size();
        const int64_t T = tokens, n = (c.hq + 2 * c.hkv) * c.hd;
        std::vector<uint16_t> sums(static_cast<size_t>(T * n));
        for (uint16_t& x : sums) x = f32_to_bf16(uniform(1, rng_, -60.0f, 60.0f)[0]);
        const auto x_scale = uniform(static_cast<size_t>(T), rng_, 0.01f, 0.03f);
        const auto w_scale = uniform(static_cast<size_t>(n), rng_, 0.5f, 1.5f);
        const auto bias = uniform(static_cast<size_t>(n), rng_, -0.5f, 0.5f);
        const BatchView b = view(d);
        const cuda::BatchArgs args{b.num_tokens, b.num_seqs,     b.positions,         b.query_start,
                                   b.seq_lens,   b.block_tables, b.max_blocks_per_seq};
        for (bool per_channel : {true, false}) {
          for (RopeLayout layout : {RopeLayout::NeoX, RopeLayout::Interleaved}) {
            for (int splits : {1, 5}) {
              SCOPED_TRACE(::testing::Message()
                           << "per channel " << per_channel << " interleaved "
                           << (layout == RopeLayout::Interleaved) << " splits " << splits);
              const std::vector<float> inv = rope_inverse_frequencies(c.hd, 500000.0f, {});
              release_scoped();
              cuda::Fp8Epilogue e;
              e.acc = upload_scoped(sums);
              e.acc_bf16 = true;
              e.t = T;
              e.n = n;
              e.x_scale = static_cast<const float*>(upload_scoped(x_scale));
              e.w_scale =
                  static_cast<const float*>(upload_scoped(per_channel ? w_scale : std::vector<float>{0.7f}));
              e.per_channel = per_channel;
              e.bias = per_channel ? static_cast<const float*>(upload_scoped(bias)) : nullptr;
              e.num_outs = 3;
              std::vector<uint8_t> k_bytes[2], v_bytes[2];
              std::vector<float> outs[2];
              const auto rows = [](int64_t t, int64_t heads, int64_t hd) {  // F32 rows, NaN until written
                return std::vector<float>(static_cast<size_t>(t * heads * hd), std::nanf(""));
              };
              for (int fused : {0, 1}) {
                void* kc = upload_scoped(base.k_codes);
                void* vc = upload_scoped(base.v_codes);
                auto* q = static_cast<float*>(upload_scoped(rows(T, c.hq, c.hd)));
                auto* k = static_cast<float*>(upload_scoped(rows(T, c.hkv, c.hd)));
                auto* v = static_cast<float*>(upload_scoped(rows(T, c.hkv, c.hd)));
                auto* out = static_cast<float*>(upload_scoped(rows(T, c.hq, c.hd)));
                e.out[0] = q, e.out[1] = k, e.out[2] = v;
                const cuda::PagedKv kv{kc, vc, dt, d.num_blocks, c.bs, ks, vs};
                const cuda::DecodeSplitPlan plan{splits, 1};
                const size_t scratch = cuda::decode_attention_scratch_bytes(T, c.hq, c.hd, splits);
                void* partials = scratch ? upload_scoped(std::vector<uint8_t>(scratch)) : nullptr;
                auto* counters = static_cast<int*>(upload_scoped(
                    std::vector<int>(static_cast<size_t>(cuda::decode_attention_counters(T, c.hq, c.hkv)))));
                const float scale = 1.0f / std::sqrt(float(c.hd));
                if (fused) {
                  cuda::DecodeRope r;
                  r.k = k;
                  r.v = v;
                  r.interleaved = layout == RopeLayout::Interleaved;
                  std::copy(inv.begin(), inv.end(), r.inv_freq);
                  r.product = &e;
                  ASSERT_TRUE(cuda::decode_attention_takes_rope(kv, c.hq, c.hkv, c.hd, q, out, nullptr));
                  ASSERT_EQ(cuda::launch_decode_attention(q, kv, args, c.hq, c.hkv, c.hd, scale, c.window,
                                                          plan, partials, counters, out, nullptr, stream, &r),
                            cudaSuccess);
                } else {
                  cuda::RopeFrequencies f{};
                  std::copy(inv.begin(), inv.end(), f.inv_freq);
                  ASSERT_EQ(
                      cuda::launch_rope_write_kv(q, k, v, c.hq, c.hkv, c.hd,
                                                 layout == RopeLayout::Interleaved, f, args, kv, stream, &e),
                      cudaSuccess);
                  ASSERT_EQ(cuda::launch_decode_attention(q, kv, args, c.hq, c.hkv, c.hd, scale, c.window,
                                                          plan, partials, counters, out, nullptr, stream),
                            cudaSuccess);
                }
                ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
                k_bytes[fused] = download<uint8_t>(kc, bytes);
                v_bytes[fused] = download<uint8_t>(vc, bytes);
                outs[fused] = download<float>(out, static_cast<size_t>(T * c.hq * c.hd));
              }
              EXPECT_EQ(first_difference(k_bytes[0], k_bytes[1]), -1) << "k cache byte";
              EXPECT_EQ(first_difference(v_bytes[0], v_bytes[1]), -1) << "v cache byte";
              EXPECT_EQ(first_difference(outs[0], outs[1]), -1) << "output";
              EXPECT_TRUE(std::all_of(outs[1].begin(), outs[1].end(), [](float x) {
                return std::isfinite(x);
              })) << "unwritten outputs";
            }
          }
        }
      }
    }
  }
}

// The split plan (host arithmetic, no GPU needed) on the H200's 132 SMs, Llama-3-8B heads: what the
// calibration measured (docs/benchmarks.md, 2026-12-04 evening: one split from 64 rows at 1-4k keys but
// 96 rows x 4k, more splits for fewer rows), and contexts shorter than a graph's capacity cut as one split
// where the launch fills the GPU.
TEST(DecodeSplitPlan, FollowsTheCalibration) {
  const auto plan = [](int64_t rows, int64_t keys) {
    return cuda::decode_attention_plan(rows, 8, 32, keys, 132, DType::F8_E4M3);
  };
  for (int64_t keys : {1024, 1536, 4096, 8192, 131072}) {
    SCOPED_TRACE(::testing::Message() << "keys " << keys);
    for (int64_t rows : {128, 256, 512, 1024}) EXPECT_EQ(plan(rows, keys).splits, 1) << rows;
    // Batch 1 spreads its 8 groups over the chip (latency-bound: every split of every token).
    const cuda::DecodeSplitPlan one = plan(1, keys);
    EXPECT_EQ(one.splits, std::min<int64_t>(cuda::kDecodeMaxSplits, keys / 64));
    EXPECT_EQ(one.min_tiles, 1);
    EXPECT_EQ(plan(8, keys).splits, 8);
    EXPECT_EQ(plan(64, keys).splits, 1);
  }
  EXPECT_EQ(plan(32, 4096).splits, 2);
  EXPECT_EQ(plan(96, 4096).splits, 2);
  EXPECT_EQ(plan(96, 1536).splits, 1);
  // 96 rows under an 8k-key capacity: split for 8k contexts, but a 1.5k one (24 tiles) stays one split.
  const cuda::DecodeSplitPlan wide = plan(96, 8192);
  EXPECT_GT(wide.splits, 1);
  EXPECT_GE(wide.min_tiles, 24);
  EXPECT_LE(wide.min_tiles * wide.splits, 8192 / 64 + wide.splits);
  // BF16 caches (3 CTAs per SM, half the fixed cost in tiles): one split at 512 rows x 1k.
  EXPECT_EQ(cuda::decode_attention_plan(512, 8, 32, 1024, 132, DType::BF16).splits, 1);
  EXPECT_EQ(cuda::decode_attention_plan(1, 8, 32, 0, 132, DType::BF16).splits, 1);  // no keys: one split
}

// NaN codes in every cache slot outside the sequences (stale blocks, the tails of the last blocks): the
// decode kernels' tiles cover whole blocks (the tensor-copy loader, INFERX_DECODE_ATTN_TMA=1, copies 16 rows
// at a time), so the keys past a sequence's end must contribute exact zeros, not 0 * NaN.
TEST_F(CudaAttentionTest, DecodeKernelIgnoresNaNOutsideTheSequences) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  check_decode_cases(*this, rng_,
                     {{CudaAttentionKernel::Decode, 0},
                      {CudaAttentionKernel::Decode, 3},
                      {CudaAttentionKernel::Decode, 64},
                      {CudaAttentionKernel::Reference, 0}},
                     1.0f, /*block_size=*/0, /*nan_unused=*/true);
}

// Block sizes that are not powers of two: the launcher routes them past v3 (which finds a key's block by a
// shift) to v2; both must match the reference.
TEST_F(CudaAttentionTest, DecodeKernelWithBlocksNotAPowerOfTwo) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  check_decode_cases(*this, rng_, {{CudaAttentionKernel::Decode, 0}, {CudaAttentionKernel::Decode, 5}}, 1.0f,
                     /*block_size=*/24);
}

// Queries 1000x the usual size: the FP8-cache decode kernel multiplies q in F16 (its multiplier is scaled by
// a power of two into [1/32, 1/16)), which must neither overflow nor lose the small scale of the cache.
TEST_F(CudaAttentionTest, DecodeKernelTakesLargeQueries) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  check_decode_cases(*this, rng_, {{CudaAttentionKernel::Decode, 0}, {CudaAttentionKernel::Decode, 7}},
                     1000.0f);
}

TEST_F(CudaAttentionTest, PrefillKernelOverBf16AndFp8CachesMatchesFloat64) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    const float ks = dt == DType::F8_E4M3 ? 0.5f : 1.0f, vs = dt == DType::F8_E4M3 ? 0.01f : 1.0f;
    CudaBackend& gpu = backend(dt, ks, vs);
    for (const Case& c : cases(rng_, /*decode_only=*/false, /*long_chunks=*/true)) {
      SCOPED_TRACE(describe(c, dt));
      check_kernels(*this, gpu, dt, ks, vs, c, rng_,
                    {{CudaAttentionKernel::Prefill, 0},
                     {CudaAttentionKernel::Auto, 0},
                     {CudaAttentionKernel::Decode, 0},
                     {CudaAttentionKernel::Reference, 0}});
    }
  }
}

// The lazy rescale (cuda::attention_lazy_rescale: the running output's rescale skipped where every factor of
// a warp is exactly 1) changes no bit: the decode kernel (every split count it takes here) and every prefill
// variant, both caches, decode-only and prefill batches, against the same launches with the rescale always
// done. The ties that make a factor exactly 1 come from the data (a row's maximum not moving in a tile), so
// the cases include long contexts (many tiles after the maximum settles) and windows.
TEST_F(CudaAttentionTest, LazyRescaleChangesNoBit) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const std::vector<Case> grid = {
      {32, 8, 128, 0, 16, {1500, 37, 900, 3}, {1, 1, 1, 1}},
      {32, 8, 128, 0, 16, {0, 37, 1000, 500}, {300, 201, 1, 77}},
      {16, 2, 64, 100, 32, {700, 2000}, {1, 190}},
      {64, 8, 128, 0, 16, {2500, 41}, {1, 400}},
  };
  const char* variants[] = {"g3", "g2", "g3p"};
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    const float ks = dt == DType::F8_E4M3 ? 0.5f : 1.0f, vs = dt == DType::F8_E4M3 ? 0.01f : 1.0f;
    CudaBackend& gpu = backend(dt, ks, vs);
    for (const Case& c : grid) {
      SCOPED_TRACE(describe(c, dt));
      const Inputs in = make_inputs(*this, c, dt, ks, vs, rng_, 4.0f);
      const auto& [d, cache, T, qv, p, b, q] = in;
      const auto run = [&](int lazy) {
        cuda::set_attention_lazy_rescale(lazy);
        Tensor out = f32(std::vector<float>(qv.size(), std::nanf("")), T, c.hq * c.hd);
        gpu.attention(q, cache.layer, b, p, out);
        return download<float>(out.data, qv.size());
      };
      const auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
        return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
      };
      for (int splits : {0, 3}) {
        SCOPED_TRACE(::testing::Message() << "decode, splits " << splits);
        gpu.set_attention_kernel(CudaAttentionKernel::Decode, splits);
        const std::vector<float> always = run(0), lazy = run(1);
        EXPECT_TRUE(same_bits(always, lazy));
        EXPECT_EQ(std::count_if(lazy.begin(), lazy.end(), [](float v) { return std::isnan(v); }), 0);
      }
      gpu.set_attention_kernel(CudaAttentionKernel::Prefill);
      for (const char* v : variants) {
        SCOPED_TRACE(::testing::Message() << "prefill variant " << v);
        cuda::set_prefill_attention_variant(v);
        const std::vector<float> always = run(0), lazy = run(1);
        EXPECT_TRUE(same_bits(always, lazy));
      }
      cuda::set_prefill_attention_variant(nullptr);
      gpu.set_attention_kernel(CudaAttentionKernel::Auto);
    }
  }
  cuda::set_attention_lazy_rescale(-1);
}

// A mixed step as the engine builds it (decodes first, then prefill chunks, BatchView::num_decode_prefix
// set): the backend runs the decodes through the decode kernel and the rest through the prefill kernel
// (CudaBackend::attention). Every row against float64, the decode rows to the decode kernel's accuracy.
TEST_F(CudaAttentionTest, MixedStepSplitsDecodesFromPrefillChunks) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    CudaBackend& gpu = backend(dt);
    for (const auto& [hq, hkv, hd, window] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{32, 8, 128, 0}, {16, 2, 64, 100}, {8, 8, 128, 0}}) {
      Case c{hq, hkv, hd, window, 16, {}, {}};
      std::uniform_int_distribution<int32_t> ctx(0, 900), chunk(2, 150);
      const int decodes = 1 + static_cast<int>(rng_() % 5), prefills = 1 + static_cast<int>(rng_() % 3);
      for (int i = 0; i < decodes; ++i) {
        c.start.push_back(ctx(rng_));
        c.count.push_back(1);
      }
      for (int i = 0; i < prefills; ++i) {
        c.start.push_back(i == 0 ? 0 : ctx(rng_));
        c.count.push_back(chunk(rng_));
      }
      SCOPED_TRACE(describe(c, dt));
      const Layout d = make_layout(c, rng_);
      const Cache cache = random_cache(*this, c, d, dt, 1.0f, 1.0f, rng_);
      const int64_t T = static_cast<int64_t>(d.positions.size());
      const auto qv = uniform(static_cast<size_t>(T * c.hq * c.hd), rng_, -1.0f, 1.0f);
      const AttentionParams p{c.hq, c.hkv, c.hd, 1.0f / std::sqrt(float(c.hd)), c.window};
      const std::vector<double> want = reference(c, d, qv, cache.k, cache.v, p.scale);
      BatchView b = view(d);
      b.num_decode_prefix = decodes;
      const Tensor q = f32(qv, T, c.hq * c.hd);
      Tensor out = f32(std::vector<float>(qv.size(), std::nanf("")), T, c.hq * c.hd);
      gpu.set_attention_kernel(CudaAttentionKernel::Auto);
      gpu.attention(q, cache.layer, b, p, out);
      const std::vector<float> got = download<float>(out.data, qv.size());
      const Errors all = compare(got, want);
      EXPECT_TRUE(all.all_finite) << "unwritten or NaN outputs";
      EXPECT_LE(all.rel_norm, 1e-2) << "max abs " << all.max_abs;
      EXPECT_LE(all.max_abs, 3e-2) << "rel norm " << all.rel_norm;
      const size_t dec = static_cast<size_t>(decodes * c.hq * c.hd);  // the decode kernel's rows: F32-exact
      const Errors first =
          compare(std::vector<float>(got.begin(), got.begin() + static_cast<int64_t>(dec)),
                  std::vector<double>(want.begin(), want.begin() + static_cast<int64_t>(dec)));
      log_errors("mixed decode rows", dt, static_cast<int>(CudaAttentionKernel::Decode), 1.0f, first);
      EXPECT_LE(first.max_abs, decode_tolerance(cuda::decode_attention_rounds_once(dt, c.bs), 1.0f).abs)
          << "decode rows, rel norm " << first.rel_norm;
    }
  }
}

// Every prefill kernel configuration (kernels.h: "g3", "g2", "g3p") over both cache types, on the shapes
// their fast paths special-case: chunks that start mid-block, odd lengths, several query tiles per sequence
// (a partial last one), head_dim 64 and 128, GQA 1/3/4/8/12/16, sliding windows, decodes in the batch, and
// (window 40 over block size 32) tiles no row of a CTA sees.
TEST_F(CudaAttentionTest, PrefillVariantsOverBf16AndFp8CachesMatchFloat64) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const std::vector<Case> grid = {
      {32, 8, 128, 0, 16, {0, 37, 1000, 500}, {300, 201, 1, 77}},
      {8, 2, 64, 100, 32, {0, 130}, {250, 190}},
      {16, 16, 128, 64, 16, {3}, {400}},
      {4, 1, 128, 0, 16, {2000}, {700}},
      {16, 1, 64, 0, 16, {17, 0}, {517, 1}},
      {8, 2, 128, 40, 32, {900}, {333}},
      // g3p's packings past G = 4 (found missing in review): G = 8 (Llama-3-70B) with a chunk offset and
      // partial tiles; G = 12 and 3, whose positions straddle two warpgroups (64 % G != 0), one windowed;
      // G = 16 at head_dim 128 with a window.
      {64, 8, 128, 0, 16, {0, 41}, {400, 129}},
      {24, 2, 128, 50, 16, {5}, {300}},
      {48, 16, 64, 0, 32, {0}, {130}},
      {32, 2, 128, 40, 32, {700}, {200}},
  };
  const char* variants[] = {"g3", "g2", "g3p"};
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    const float ks = dt == DType::F8_E4M3 ? 0.5f : 1.0f, vs = dt == DType::F8_E4M3 ? 0.01f : 1.0f;
    CudaBackend& gpu = backend(dt, ks, vs);
    gpu.set_attention_kernel(CudaAttentionKernel::Prefill);
    for (const Case& c : grid) {
      SCOPED_TRACE(describe(c, dt));
      const Inputs in = make_inputs(*this, c, dt, ks, vs, rng_, 1.0f);
      const auto& [d, cache, T, qv, p, b, q] = in;
      const std::vector<double> want = reference(c, d, qv, cache.k, cache.v, p.scale);
      for (const char* v : variants) {
        SCOPED_TRACE(::testing::Message() << "variant " << v);
        cuda::set_prefill_attention_variant(v);
        Tensor out = f32(std::vector<float>(qv.size(), std::nanf("")), T, c.hq * c.hd);
        gpu.attention(q, cache.layer, b, p, out);
        const Errors e = compare(download<float>(out.data, qv.size()), want);
        EXPECT_TRUE(e.all_finite) << "unwritten or NaN outputs";
        EXPECT_LE(e.rel_norm, 1e-2) << "max abs " << e.max_abs;
        EXPECT_LE(e.max_abs, 3e-2) << "rel norm " << e.rel_norm;
      }
    }
    cuda::set_prefill_attention_variant(nullptr);
    gpu.set_attention_kernel(CudaAttentionKernel::Auto);
  }
}

// RoPE + cache write into an FP8 cache with scales: every code is the E4M3 rounding of the rotated k / v
// over the scale (at most one code away where the GPU's rotation differs from the host's in the last
// bit), saturated at +-448, and nothing outside the written slots changes - for the kernel of blocks of
// heads, the token kernel and its four-pairs-per-thread form (mode 0, 1, 2).
TEST_F(CudaAttentionTest, RopeWritesScaledE4M3CodesIntoTheCache) {
  for (int mode : {0, 1, 2}) {
    SCOPED_TRACE(::testing::Message() << "kernel mode " << mode);
    cuda::set_rope_token_blocks(mode > 0 ? 1 : 0);
    cuda::set_rope_vector(mode == 2 ? 1 : 0);
    rope_writes_scaled_codes();
  }
  cuda::set_rope_token_blocks(-1);
  cuda::set_rope_vector(-1);
}

void CudaAttentionTest::rope_writes_scaled_codes() {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const float ks = 0.05f, vs = 0.004f;  // v / 0.004 exceeds 448 for |v| > 1.79: saturation is exercised
  CudaBackend& gpu = backend(DType::F8_E4M3, ks, vs);
  const Case c{16, 4, 128, 0, 16, {0, 37, 200}, {50, 1, 9}};
  const Layout d = make_layout(c, rng_);
  const int64_t T = static_cast<int64_t>(d.positions.size());
  const auto qv = uniform(static_cast<size_t>(T * c.hq * c.hd), rng_, -3.0f, 3.0f);
  const auto kv = uniform(static_cast<size_t>(T * c.hkv * c.hd), rng_, -3.0f, 3.0f);
  const auto vv = uniform(kv.size(), rng_, -3.0f, 3.0f);
  const size_t n = static_cast<size_t>(d.num_blocks * c.bs * c.hkv * c.hd);
  const std::vector<uint8_t> fill(n, 0x5a);
  KvCacheLayer layer{Tensor(DType::F8_E4M3, {d.num_blocks, c.bs, c.hkv, c.hd}, upload(fill), Device::CUDA),
                     Tensor(DType::F8_E4M3, {d.num_blocks, c.bs, c.hkv, c.hd}, upload(fill), Device::CUDA)};
  Tensor q = f32(qv, T, c.hq * c.hd), k = f32(kv, T, c.hkv * c.hd), v = f32(vv, T, c.hkv * c.hd);
  const RopeParams rope{c.hd, 500000.0f, RopeLayout::NeoX, {}};
  gpu.rope_and_write_kv(q, k, v, view(d), rope, layer);
  const auto kc = download<uint8_t>(layer.k.data, n), vc = download<uint8_t>(layer.v.data, n);
  const std::vector<float> inv = rope_inverse_frequencies(c.hd, rope.theta, rope.scaling);
  std::vector<bool> written(n, false);
  int64_t exact = 0, total = 0;
  const auto check = [&](uint8_t code, double x, float scale) {
    const double want = x / scale;
    const double got = fp8_e4m3_to_f32(code);
    const double mag = std::min(std::fabs(want), 448.0);
    const double ulp =
        std::ldexp(1.0, std::max(-9, static_cast<int>(std::floor(std::log2(std::max(mag, 1e-30)))) - 3));
    EXPECT_LE(std::fabs(got - std::clamp(want, -448.0, 448.0)), ulp * 1.001)
        << "want " << want << " code " << int(code);
    exact += code == f32_to_fp8_e4m3(static_cast<float>(want));
    ++total;
  };
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = d.seq_of[t], pos = d.positions[t];
    const int64_t base =
        (int64_t(d.tables[s * d.max_blocks + pos / c.bs]) * c.bs + pos % c.bs) * c.hkv * c.hd;
    for (int64_t h = 0; h < c.hkv; ++h) {
      for (int64_t i = 0; i < c.hd / 2; ++i) {
        const double angle = double(float(pos) * inv[i]);
        const double x0 = kv[(t * c.hkv + h) * c.hd + i], x1 = kv[(t * c.hkv + h) * c.hd + i + c.hd / 2];
        const int64_t a = base + h * c.hd + i, b2 = a + c.hd / 2;
        check(kc[a], x0 * std::cos(angle) - x1 * std::sin(angle), ks);
        check(kc[b2], x1 * std::cos(angle) + x0 * std::sin(angle), ks);
        written[a] = written[b2] = true;
      }
      for (int64_t i = 0; i < c.hd; ++i) check(vc[base + h * c.hd + i], vv[(t * c.hkv + h) * c.hd + i], vs);
    }
  }
  EXPECT_GE(exact, total * 99 / 100) << "codes differing from the host's rounding: " << total - exact;
  for (size_t i = 0; i < n; ++i) {
    if (written[i]) continue;
    ASSERT_EQ(kc[i], 0x5a) << "k slot " << i << " was not to be written";
    ASSERT_EQ(vc[i], 0x5a) << "v slot " << i << " was not to be written";
  }
}

// Whole path, FP8 against exact K/V: write the cache with the RoPE kernel (a prefill of 3 sequences),
// then attention with the prefill and the decode kernels (the latter per token); the outputs stay within
// the stated E4M3 error of the float64 result over the unquantized rotated keys and values.
TEST_F(CudaAttentionTest, Fp8CacheEndToEndStaysWithinE4M3Error) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (int64_t hd : {int64_t{64}, int64_t{128}}) {
    CudaBackend& gpu = backend(DType::F8_E4M3, 1.0f, 1.0f);
    const Case c{32, 8, hd, 0, 16, {0, 0, 0}, {700, 130, 257}};
    const Layout d = make_layout(c, rng_);
    const int64_t T = static_cast<int64_t>(d.positions.size());
    const auto qv = uniform(static_cast<size_t>(T * c.hq * c.hd), rng_, -1.0f, 1.0f);
    const auto kv = uniform(static_cast<size_t>(T * c.hkv * c.hd), rng_, -2.0f, 2.0f);
    const auto vv = uniform(kv.size(), rng_, -1.0f, 1.0f);
    const size_t n = static_cast<size_t>(d.num_blocks * c.bs * c.hkv * c.hd);
    KvCacheLayer layer{Tensor(DType::F8_E4M3, {d.num_blocks, c.bs, c.hkv, c.hd},
                              upload(std::vector<uint8_t>(n)), Device::CUDA),
                       Tensor(DType::F8_E4M3, {d.num_blocks, c.bs, c.hkv, c.hd},
                              upload(std::vector<uint8_t>(n)), Device::CUDA)};
    Tensor q = f32(qv, T, c.hq * c.hd), k = f32(kv, T, c.hkv * c.hd), v = f32(vv, T, c.hkv * c.hd);
    const RopeParams rope{c.hd, 10000.0f, RopeLayout::NeoX, {}};
    const BatchView b = view(d);
    gpu.rope_and_write_kv(q, k, v, b, rope, layer);
    // The exact rotated q and k (float64 rotation of the inputs) in the reference's cache layout.
    const std::vector<float> inv = rope_inverse_frequencies(c.hd, rope.theta, rope.scaling);
    std::vector<double> kref(n, 0.0), vref(n, 0.0);
    std::vector<float> qrot(qv.size());
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = d.seq_of[t], pos = d.positions[t];
      const int64_t base =
          (int64_t(d.tables[s * d.max_blocks + pos / c.bs]) * c.bs + pos % c.bs) * c.hkv * c.hd;
      const auto rot = [&](const float* x, double* y_d, float* y_f) {
        for (int64_t i = 0; i < c.hd / 2; ++i) {
          const double angle = double(float(pos) * inv[i]);
          const double a = x[i] * std::cos(angle) - x[i + c.hd / 2] * std::sin(angle);
          const double bb = x[i + c.hd / 2] * std::cos(angle) + x[i] * std::sin(angle);
          if (y_d) {
            y_d[i] = a;
            y_d[i + c.hd / 2] = bb;
          }
          if (y_f) {
            y_f[i] = float(a);
            y_f[i + c.hd / 2] = float(bb);
          }
        }
      };
      for (int64_t h = 0; h < c.hkv; ++h) {
        rot(&kv[(t * c.hkv + h) * c.hd], &kref[base + h * c.hd], nullptr);
        for (int64_t i = 0; i < c.hd; ++i) vref[base + h * c.hd + i] = vv[(t * c.hkv + h) * c.hd + i];
      }
      for (int64_t h = 0; h < c.hq; ++h)
        rot(&qv[(t * c.hq + h) * c.hd], nullptr, &qrot[(t * c.hq + h) * c.hd]);
    }
    const AttentionParams p{c.hq, c.hkv, c.hd, 1.0f / std::sqrt(float(c.hd)), 0};
    const std::vector<double> want = reference(c, d, qrot, kref, vref, p.scale);
    for (CudaAttentionKernel kernel : {CudaAttentionKernel::Prefill, CudaAttentionKernel::Decode}) {
      Tensor out = f32(std::vector<float>(qv.size(), std::nanf("")), T, c.hq * c.hd);
      gpu.set_attention_kernel(kernel);
      gpu.attention(q, layer, b, p, out);  // q was rotated in place by the RoPE kernel
      const Errors e = compare(download<float>(out.data, qv.size()), want);
      EXPECT_TRUE(e.all_finite);
      EXPECT_LE(e.rel_norm, 0.06) << "hd " << hd << " kernel " << int(kernel) << " max abs " << e.max_abs;
    }
    gpu.set_attention_kernel(CudaAttentionKernel::Auto);
  }
}

}  // namespace
}  // namespace inferx
