// CudaBackend against the CPU backend on the same random inputs, and against independent double-precision
// references written here from the definitions in backend.h (so a misreading shared by both backends
// still fails). Needs a GPU: every test skips when none is visible.
#include "backend/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numbers>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda_test_util.h"

namespace inferx {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Rounds values to what `t` can hold (so both paths see the same inputs) and returns the encoding.
std::vector<uint8_t> encode(DType t, std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * (t == DType::F32 ? 4 : 2));
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == DType::F32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      continue;
    }
    const uint16_t h = t == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
    values[i] = t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  return bytes;
}

// Largest |a - b| / (atol + rtol * |ref|) over the arrays; <= 1 passes.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - want[i]);
    const double err = diff == 0 ? 0.0 : diff / (atol + rtol * std::fabs(double(want[i])));  // tol 0: exact
    if (!(err <= worst)) {  // also catches NaN
      worst = std::isnan(err) ? INFINITY : err;
      at = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << at << " got " << got[at] << " want " << want[at];
}

// A flattened batch; every sequence s has new tokens at positions [start[s], start[s] + count[s]).
struct HostBatch {
  std::vector<int32_t> positions, query_start{0}, seq_lens, block_tables, seq_of;
  int32_t max_blocks = 0;
};
HostBatch make_batch(const std::vector<int32_t>& start, const std::vector<int32_t>& count, int32_t max_blocks,
                     int32_t num_blocks, uint32_t seed) {
  HostBatch h;
  h.max_blocks = max_blocks;
  for (size_t s = 0; s < start.size(); ++s) {
    for (int32_t i = 0; i < count[s]; ++i) {
      h.positions.push_back(start[s] + i);
      h.seq_of.push_back(static_cast<int32_t>(s));
    }
    h.query_start.push_back(static_cast<int32_t>(h.positions.size()));
    h.seq_lens.push_back(start[s] + count[s]);
  }
  // Distinct physical blocks in a shuffled order, so a wrong block lookup reads the wrong data.
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(seed));
  EXPECT_GE(num_blocks, max_blocks * static_cast<int32_t>(start.size()));
  h.block_tables.assign(blocks.begin(), blocks.begin() + max_blocks * static_cast<int64_t>(start.size()));
  return h;
}
class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    INFERX_SKIP_WITHOUT_GPU();
    gpu_ = make_cuda_backend(0);
    cpu_ = make_cpu_backend();
    // These tests pin the v0 attention kernel (float math, tight tolerances); the v1 kernels are checked
    // in cuda_kernels_test.cpp with BF16-appropriate tolerances.
    static_cast<CudaBackend&>(*gpu_).set_attention_kernel(CudaAttentionKernel::Reference);
  }

  // The same bytes as a tensor in each backend: first the CPU one, then the CUDA one.
  struct Both {
    Tensor cpu, gpu;
  };
  Both both(DType t, std::initializer_list<int64_t> shape, const void* bytes) {
    Tensor probe(t, shape, nullptr);
    const auto n = static_cast<size_t>(probe.nbytes());
    Both out;
    out.cpu = on(*cpu_, t, shape, bytes, n);
    out.gpu = on(*gpu_, t, shape, bytes, n);
    return out;
  }
  Both both_f32(std::initializer_list<int64_t> shape, const std::vector<float>& v) {
    return both(DType::F32, shape, v.data());
  }
  Tensor on(Backend& b, DType t, std::initializer_list<int64_t> shape, const void* bytes, size_t n) {
    buffers_.push_back(b.allocate(std::max<size_t>(n, 1)));
    if (bytes) b.copy_to_device(buffers_.back()->data(), bytes, n);
    return Tensor(t, shape, buffers_.back()->data(), b.device());
  }
  const int32_t* ints(Backend& b, const std::vector<int32_t>& v) {
    buffers_.push_back(b.allocate(std::max<size_t>(v.size() * 4, 4)));
    b.copy_to_device(buffers_.back()->data(), v.data(), v.size() * 4);
    return static_cast<const int32_t*>(buffers_.back()->data());
  }
  std::vector<float> read(Backend& b, const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    b.synchronize();
    b.copy_to_host(v.data(), t.data, v.size() * 4);
    return v;
  }

  BatchView view(Backend& b, const HostBatch& h) {
    BatchView v;
    v.num_tokens = static_cast<int32_t>(h.positions.size());
    v.num_seqs = static_cast<int32_t>(h.seq_lens.size());
    v.positions = ints(b, h.positions);
    v.query_start = ints(b, h.query_start);
    v.seq_lens = ints(b, h.seq_lens);
    v.block_tables = ints(b, h.block_tables);
    v.max_blocks_per_seq = h.max_blocks;
    v.max_seq_len = *std::max_element(h.seq_lens.begin(), h.seq_lens.end());
    v.max_query_len = 0;
    for (size_t s = 0; s + 1 < h.query_start.size(); ++s)
      v.max_query_len = std::max(v.max_query_len, h.query_start[s + 1] - h.query_start[s]);
    return v;
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

// Embedding --------------------------------------------------------------------------------------------

TEST_F(CudaBackendTest, EmbeddingGathersAndConvertsEveryTableType) {
  const int64_t vocab = 50, dim = 72;
  const std::vector<int32_t> ids = {3, 0, 49, 17, 17, 8};
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    std::vector<float> table = random_floats(vocab * dim, 1);
    const std::vector<uint8_t> bytes = encode(t, table);
    Both tab = both(t, {vocab, dim}, bytes.data());
    const auto n = static_cast<int64_t>(ids.size());
    Both out = both_f32({n, dim}, std::vector<float>(n * dim));
    gpu_->embedding(tab.gpu, ints(*gpu_, ids), n, out.gpu);
    cpu_->embedding(tab.cpu, ints(*cpu_, ids), n, out.cpu);
    std::vector<float> want(n * dim);
    for (int64_t i = 0; i < n; ++i) std::copy_n(table.begin() + ids[i] * dim, dim, want.begin() + i * dim);
    expect_close(read(*gpu_, out.gpu), want, 0, 0, dtype_name(t).data());
    expect_close(read(*cpu_, out.cpu), want, 0, 0, "cpu");
  }
}

// A tensor-parallel rank's vocabulary shard (rows first_id .. first_id + 9 of a 37-wide table): ids of other
// ranks, and ids outside the vocabulary, give zero rows on both backends (the GPU path ran only inside the
// multi-GPU tests before).
TEST_F(CudaBackendTest, EmbeddingShardZeroesOtherRanksIds) {
  const int64_t rows = 10, dim = 37, first_id = 10;
  const std::vector<int32_t> ids = {-1, 9, 10, 15, 19, 20, 1000};
  for (DType t : {DType::F32, DType::BF16}) {
    std::vector<float> table = random_floats(rows * dim, 4);
    const std::vector<uint8_t> bytes = encode(t, table);
    Both tab = both(t, {rows, dim}, bytes.data());
    const auto n = static_cast<int64_t>(ids.size());
    Both out = both_f32({n, dim}, std::vector<float>(n * dim, 7.0f));
    gpu_->embedding_shard(tab.gpu, ints(*gpu_, ids), n, first_id, out.gpu);
    cpu_->embedding_shard(tab.cpu, ints(*cpu_, ids), n, first_id, out.cpu);
    std::vector<float> want(n * dim, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = ids[i] - first_id;
      if (row >= 0 && row < rows) std::copy_n(table.begin() + row * dim, dim, want.begin() + i * dim);
    }
    expect_close(read(*gpu_, out.gpu), want, 0, 0, dtype_name(t).data());
    expect_close(read(*cpu_, out.cpu), want, 0, 0, "cpu");
  }
}

// Norms ------------------------------------------------------------------------------------------------

std::vector<float> rmsnorm_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t n,
                               float eps) {
  std::vector<float> out(x.size());
  for (size_t r = 0; r < x.size() / n; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
    const double scale = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = float(x[r * n + i] * scale * w[i]);
  }
  return out;
}

TEST_F(CudaBackendTest, RmsNormMatchesReference) {
  // Widths for each kernel: register-resident rows of 2 / 4 / 8 float4s per thread (1000, 4096, 8192),
  // the loop for rows that are not whole float4s (1001) or too wide for registers (12288).
  for (int64_t cols : {1000, 1001, 4096, 8192, 12288}) {
    SCOPED_TRACE(cols);
    const int64_t rows = 5;
    const auto x = random_floats(rows * cols, 2, -3, 3), w = random_floats(cols, 3);
    Both tx = both_f32({rows, cols}, x), tw = both_f32({cols}, w), out = both_f32({rows, cols}, x);
    gpu_->rmsnorm(tx.gpu, tw.gpu, 1e-6f, out.gpu);
    cpu_->rmsnorm(tx.cpu, tw.cpu, 1e-6f, out.cpu);
    const auto want = rmsnorm_ref(x, w, cols, 1e-6f);
    expect_close(read(*gpu_, out.gpu), want, 1e-6, 1e-5, "gpu");
    expect_close(read(*gpu_, out.gpu), read(*cpu_, out.cpu), 1e-6, 1e-5, "gpu vs cpu");
  }
}

TEST_F(CudaBackendTest, AddRmsNormUpdatesResidualAndNormalises) {
  // Each kernel's residual add: register rows of 2 / 4 / 8 float4s per thread (1000, 4096, 8192; every load
  // of the row and of the addend is issued before the first store), the loop kernel (1001, 12288).
  for (int64_t cols : {1000, 1001, 4096, 8192, 12288}) {
    SCOPED_TRACE(cols);
    const int64_t rows = 3;
    const auto res = random_floats(rows * cols, 4), x = random_floats(rows * cols, 5),
               w = random_floats(cols, 6);
    Both tr = both_f32({rows, cols}, res), tx = both_f32({rows, cols}, x), tw = both_f32({cols}, w);
    Both out = both_f32({rows, cols}, std::vector<float>(rows * cols));
    gpu_->add_rmsnorm(tr.gpu, tx.gpu, tw.gpu, 1e-5f, out.gpu);
    cpu_->add_rmsnorm(tr.cpu, tx.cpu, tw.cpu, 1e-5f, out.cpu);
    std::vector<float> sum(res.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = res[i] + x[i];
    expect_close(read(*gpu_, tr.gpu), sum, 0, 0, "residual");
    expect_close(read(*gpu_, out.gpu), rmsnorm_ref(sum, w, cols, 1e-5f), 1e-6, 1e-5, "out");
    expect_close(read(*gpu_, out.gpu), read(*cpu_, out.cpu), 1e-6, 1e-5, "gpu vs cpu");
  }
}

TEST_F(CudaBackendTest, HeadRmsNormNormalisesEachHead) {
  for (int64_t hd : {64, 128}) {
    const int64_t rows = 4, heads = 6;
    const auto x = random_floats(rows * heads * hd, 7, -2, 2), w = random_floats(hd, 8);
    Both tx = both_f32({rows, heads * hd}, x), tw = both_f32({hd}, w);
    gpu_->head_rmsnorm(tx.gpu, hd, tw.gpu, 1e-6f);
    cpu_->head_rmsnorm(tx.cpu, hd, tw.cpu, 1e-6f);
    expect_close(read(*gpu_, tx.gpu), rmsnorm_ref(x, w, hd, 1e-6f), 1e-6, 1e-5, "gpu");
    expect_close(read(*gpu_, tx.gpu), read(*cpu_, tx.cpu), 1e-6, 1e-5, "gpu vs cpu");
  }
}

// Matmul -----------------------------------------------------------------------------------------------

TEST_F(CudaBackendTest, MatmulMatchesReferenceForEveryFloatWeightType) {
  const int64_t k = 96, n = 80;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t rows : {1, 7, 33}) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " T=" << rows << " bias=" << with_bias);
        std::vector<float> w = random_floats(n * k, 9), x = random_floats(rows * k, 10);
        const auto bias = random_floats(n, 11);
        const std::vector<uint8_t> wb = encode(t, w);
        // The CUDA path rounds activations to a 16-bit weight's type; pre-round so both paths agree.
        if (t != DType::F32) (void)encode(t, x);
        Linear lin_gpu, lin_cpu;
        Both tw = both(t, {n, k}, wb.data()), tb = both_f32({n}, bias);
        lin_gpu.weight = tw.gpu;
        lin_cpu.weight = tw.cpu;
        if (with_bias) {
          lin_gpu.bias = tb.gpu;
          lin_cpu.bias = tb.cpu;
        }
        Both tx = both_f32({rows, k}, x), out = both_f32({rows, n}, std::vector<float>(rows * n));
        gpu_->matmul(tx.gpu, lin_gpu, out.gpu);
        cpu_->matmul(tx.cpu, lin_cpu, out.cpu);
        std::vector<float> want(rows * n);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < n; ++c) {
            double acc = with_bias ? bias[c] : 0.0;
            for (int64_t i = 0; i < k; ++i) acc += double(x[r * k + i]) * w[c * k + i];
            want[r * n + c] = float(acc);
          }
        expect_close(read(*gpu_, out.gpu), want, 1e-4, 1e-4, "gpu");
        expect_close(read(*gpu_, out.gpu), read(*cpu_, out.cpu), 1e-4, 1e-4, "gpu vs cpu");
      }
    }
  }
}

TEST_F(CudaBackendTest, MatmulRejectsQuantizedWeights) {
  // Q8_0 / Q4_K / FP8 / INT4 now run on the GEMV (cuda_gemv_test.cpp); Q4_0 has no CUDA kernel.
  const int64_t k = 64, n = 8;
  Tensor w = on(*gpu_, DType::Q4_0, {n, k}, nullptr, static_cast<size_t>(n * row_bytes(DType::Q4_0, k)));
  Linear lin;
  lin.weight = w;
  Both x = both_f32({2, k}, random_floats(2 * k, 12)), out = both_f32({2, n}, std::vector<float>(2 * n));
  EXPECT_THROW(gpu_->matmul(x.gpu, lin, out.gpu), Error);
  EXPECT_THROW(gpu_->matmul(x.cpu, lin, out.gpu), Error);  // a host tensor is refused, not dereferenced
}

// RoPE + KV write --------------------------------------------------------------------------------------

// transformers' default / linear / llama3 inverse frequencies, written out again independently.
std::vector<double> inv_freq_ref(int64_t hd, double theta, const RopeScaling& s) {
  std::vector<double> inv(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) {
    double f = 1.0 / std::pow(theta, double(2 * i) / double(hd));
    if (s.kind == RopeScaling::Kind::Linear) f /= s.factor;
    if (s.kind == RopeScaling::Kind::Llama3) {
      const double wavelen = 2 * std::numbers::pi / f, old = double(s.original_max_position);
      if (wavelen > old / s.low_freq_factor) {
        f /= s.factor;
      } else if (wavelen >= old / s.high_freq_factor) {
        const double smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv[i] = f;
  }
  return inv;
}

void rotate_ref(float* head, int64_t hd, int32_t pos, const std::vector<double>& inv, RopeLayout layout) {
  for (int64_t i = 0; i < hd / 2; ++i) {
    const int64_t a = layout == RopeLayout::Interleaved ? 2 * i : i;
    const int64_t b = layout == RopeLayout::Interleaved ? 2 * i + 1 : i + hd / 2;
    const double angle = double(float(pos) * float(inv[i]));  // float angle, as transformers forms it
    const double x0 = head[a], x1 = head[b];
    head[a] = float(x0 * std::cos(angle) - x1 * std::sin(angle));
    head[b] = float(x1 * std::cos(angle) + x0 * std::sin(angle));
  }
}

// The three kernels (cuda::set_rope_token_blocks: blocks of heads, and one block per token with several
// passes over the heads: 6 heads in one pass, 40 in several; cuda::set_rope_vector: the token kernel with
// four pairs per thread, NeoX only - the interleaved case takes the scalar one) on every layout and scaling.
TEST_F(CudaBackendTest, RopeAndKvWriteMatchReferenceForEveryLayoutAndScaling) {
  const int64_t bs = 16, num_blocks = 12, max_blocks = 4;
  for (int token_blocks : {0, 1, 2})
    for (const auto& [hq, hkv] : {std::pair<int64_t, int64_t>{4, 2}, std::pair<int64_t, int64_t>{32, 8}})
      for (int64_t hd : {64, 128}) {  // scalar kernels: one thread per rotated pair, 32 and 64 per head
        cuda::set_rope_token_blocks(token_blocks > 0 ? 1 : 0);
        cuda::set_rope_vector(token_blocks == 2 ? 1 : 0);
        RopeParams cases[3];
        cases[0] = {hd, 10000.0f, RopeLayout::NeoX, {}};
        cases[1] = {
            hd, 500000.0f, RopeLayout::Interleaved, {RopeScaling::Kind::Llama3, 8.0f, 1.0f, 4.0f, 8192}};
        cases[2] = {hd, 1000000.0f, RopeLayout::NeoX, {RopeScaling::Kind::Linear, 2.0f}};
        for (const RopeParams& rope : cases) {
          SCOPED_TRACE(::testing::Message()
                       << "token blocks " << token_blocks << " heads " << hq << "/" << hkv << " hd " << hd
                       << " theta " << rope.theta << " layout " << int(rope.layout));
          // A prefill from 0, a chunk continuing at 20 (crossing a block edge) and a decode at 60.
          const HostBatch hb = make_batch({0, 20, 60}, {5, 14, 1}, max_blocks, num_blocks, 13);
          const auto tokens = static_cast<int64_t>(hb.positions.size());
          auto q = random_floats(tokens * hq * hd, 14), k = random_floats(tokens * hkv * hd, 15);
          const auto v = random_floats(tokens * hkv * hd, 16);
          Both tq = both_f32({tokens, hq * hd}, q), tk = both_f32({tokens, hkv * hd}, k),
               tv = both_f32({tokens, hkv * hd}, v);
          const std::vector<float> zeros(num_blocks * bs * hkv * hd);
          Both ck = both_f32({num_blocks, bs, hkv, hd}, zeros),
               cv = both_f32({num_blocks, bs, hkv, hd}, zeros);
          KvCacheLayer gpu_cache{ck.gpu, cv.gpu}, cpu_cache{ck.cpu, cv.cpu};
          gpu_->rope_and_write_kv(tq.gpu, tk.gpu, tv.gpu, view(*gpu_, hb), rope, gpu_cache);
          cpu_->rope_and_write_kv(tq.cpu, tk.cpu, tv.cpu, view(*cpu_, hb), rope, cpu_cache);

          const auto inv = inv_freq_ref(hd, rope.theta, rope.scaling);
          std::vector<float> want_k_cache = zeros, want_v_cache = zeros;
          for (int64_t t = 0; t < tokens; ++t) {
            const int32_t pos = hb.positions[t];
            for (int64_t h = 0; h < hq; ++h) rotate_ref(&q[(t * hq + h) * hd], hd, pos, inv, rope.layout);
            for (int64_t h = 0; h < hkv; ++h) rotate_ref(&k[(t * hkv + h) * hd], hd, pos, inv, rope.layout);
            const int32_t block = hb.block_tables[hb.seq_of[t] * max_blocks + pos / bs];
            const int64_t slot = (block * bs + pos % bs) * hkv * hd;
            std::copy_n(&k[t * hkv * hd], hkv * hd, &want_k_cache[slot]);
            std::copy_n(&v[t * hkv * hd], hkv * hd, &want_v_cache[slot]);
          }
          expect_close(read(*gpu_, tq.gpu), q, 2e-6, 1e-5, "q");
          expect_close(read(*gpu_, tk.gpu), k, 2e-6, 1e-5, "k");
          expect_close(read(*gpu_, ck.gpu), want_k_cache, 2e-6, 1e-5, "k cache");
          expect_close(read(*gpu_, cv.gpu), want_v_cache, 0, 0, "v cache");
          expect_close(read(*gpu_, tq.gpu), read(*cpu_, tq.cpu), 2e-6, 1e-5, "q gpu vs cpu");
          expect_close(read(*gpu_, ck.gpu), read(*cpu_, ck.cpu), 2e-6, 1e-5, "k cache gpu vs cpu");
        }
      }
  cuda::set_rope_token_blocks(-1);
  cuda::set_rope_vector(-1);
}

// Attention --------------------------------------------------------------------------------------------

struct AttentionCase {
  int64_t hq, hkv, hd, window;
};

std::vector<float> attention_ref(const std::vector<float>& q, const std::vector<float>& kc,
                                 const std::vector<float>& vc, const HostBatch& hb, const AttentionCase& c,
                                 int64_t bs, float scale) {
  const auto tokens = static_cast<int64_t>(hb.positions.size());
  std::vector<float> out(tokens * c.hq * c.hd, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t s = hb.seq_of[t], pos = hb.positions[t];
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t kvh = h / (c.hq / c.hkv);
      std::vector<double> scores;
      std::vector<int64_t> slots;
      for (int64_t j = 0; j < hb.seq_lens[s]; ++j) {
        if (j > pos || (c.window > 0 && j <= pos - c.window)) continue;
        const int64_t slot =
            ((hb.block_tables[s * hb.max_blocks + j / bs] * bs + j % bs) * c.hkv + kvh) * c.hd;
        double dot = 0;
        for (int64_t d = 0; d < c.hd; ++d) dot += double(q[(t * c.hq + h) * c.hd + d]) * kc[slot + d];
        scores.push_back(dot * scale);
        slots.push_back(slot);
      }
      if (scores.empty()) continue;
      const double mx = *std::max_element(scores.begin(), scores.end());
      double den = 0;
      for (double& sc : scores) den += (sc = std::exp(sc - mx));
      for (int64_t d = 0; d < c.hd; ++d) {
        double acc = 0;
        for (size_t j = 0; j < scores.size(); ++j) acc += scores[j] * vc[slots[j] + d];
        out[(t * c.hq + h) * c.hd + d] = float(acc / den);
      }
    }
  }
  return out;
}

TEST_F(CudaBackendTest, PagedAttentionMatchesReference) {
  const int64_t bs = 16, num_blocks = 24, max_blocks = 6;
  // GQA 4:1 and 2:1, MHA, a head_dim that is not a multiple of 32, the largest head_dim, sliding windows.
  const AttentionCase cases[] = {{8, 2, 64, 0},  {8, 4, 128, 0}, {4, 4, 80, 0},
                                 {4, 2, 256, 0}, {8, 2, 64, 8},  {4, 1, 128, 33}};
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "hq " << c.hq << " hkv " << c.hkv << " hd " << c.hd << " window " << c.window);
    // A chunk after 20 cached tokens, a long decode, a fresh prefill.
    const HostBatch hb = make_batch({20, 90, 0}, {5, 1, 7}, max_blocks, num_blocks, 17);
    const auto tokens = static_cast<int64_t>(hb.positions.size());
    const auto q = random_floats(tokens * c.hq * c.hd, 18);
    const auto kc = random_floats(num_blocks * bs * c.hkv * c.hd, 19, -2, 2);
    const auto vc = random_floats(num_blocks * bs * c.hkv * c.hd, 20);
    Both tq = both_f32({tokens, c.hq * c.hd}, q), out = both_f32({tokens, c.hq * c.hd}, q);
    Both ck = both_f32({num_blocks, bs, c.hkv, c.hd}, kc), cv = both_f32({num_blocks, bs, c.hkv, c.hd}, vc);
    AttentionParams p{c.hq, c.hkv, c.hd, 1.0f / std::sqrt(float(c.hd)), c.window};
    gpu_->attention(tq.gpu, KvCacheLayer{ck.gpu, cv.gpu}, view(*gpu_, hb), p, out.gpu);
    cpu_->attention(tq.cpu, KvCacheLayer{ck.cpu, cv.cpu}, view(*cpu_, hb), p, out.cpu);
    const auto want = attention_ref(q, kc, vc, hb, c, bs, p.scale);
    expect_close(read(*gpu_, out.gpu), want, 1e-5, 1e-4, "gpu");
    expect_close(read(*gpu_, out.gpu), read(*cpu_, out.cpu), 1e-5, 1e-4, "gpu vs cpu");
  }
}

TEST_F(CudaBackendTest, PagedAttentionReadsBf16Cache) {
  const int64_t bs = 16, num_blocks = 8, max_blocks = 4;
  const AttentionCase c{8, 2, 128, 0};
  const HostBatch hb = make_batch({0, 40}, {9, 1}, max_blocks, num_blocks, 21);
  const auto tokens = static_cast<int64_t>(hb.positions.size());
  const auto q = random_floats(tokens * c.hq * c.hd, 22);
  auto kc = random_floats(num_blocks * bs * c.hkv * c.hd, 23),
       vc = random_floats(num_blocks * bs * c.hkv * c.hd, 24);
  const auto kb = encode(DType::BF16, kc), vb = encode(DType::BF16, vc);
  Both tq = both_f32({tokens, c.hq * c.hd}, q), out = both_f32({tokens, c.hq * c.hd}, q);
  Both ck = both(DType::BF16, {num_blocks, bs, c.hkv, c.hd}, kb.data());
  Both cv = both(DType::BF16, {num_blocks, bs, c.hkv, c.hd}, vb.data());
  AttentionParams p{c.hq, c.hkv, c.hd, 1.0f / std::sqrt(float(c.hd)), 0};
  gpu_->attention(tq.gpu, KvCacheLayer{ck.gpu, cv.gpu}, view(*gpu_, hb), p, out.gpu);
  expect_close(read(*gpu_, out.gpu), attention_ref(q, kc, vc, hb, c, bs, p.scale), 1e-5, 1e-4, "bf16 cache");
}

TEST_F(CudaBackendTest, AttentionRejectsUnsupportedShapes) {
  const HostBatch hb = make_batch({0}, {2}, 1, 1, 25);
  Both tq = both_f32({2, 512}, random_floats(1024, 26)), out = both_f32({2, 512}, random_floats(1024, 26));
  Both ck = both_f32({1, 16, 1, 512}, std::vector<float>(16 * 512));
  AttentionParams p{1, 1, 512, 0.04f, 0};
  EXPECT_THROW(gpu_->attention(tq.gpu, KvCacheLayer{ck.gpu, ck.gpu}, view(*gpu_, hb), p, out.gpu), Error);
}

// Element-wise -----------------------------------------------------------------------------------------

TEST_F(CudaBackendTest, SiluMulMatchesReference) {
  const int64_t rows = 3, cols = 1111;
  const auto g = random_floats(rows * cols, 27, -8, 8), u = random_floats(rows * cols, 28);
  Both tg = both_f32({rows, cols}, g), tu = both_f32({rows, cols}, u), out = both_f32({rows, cols}, g);
  gpu_->silu_mul(tg.gpu, tu.gpu, out.gpu);
  cpu_->silu_mul(tg.cpu, tu.cpu, out.cpu);
  std::vector<float> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) want[i] = float(g[i] / (1 + std::exp(-double(g[i]))) * u[i]);
  expect_close(read(*gpu_, out.gpu), want, 1e-6, 1e-5, "gpu");
  expect_close(read(*gpu_, out.gpu), read(*cpu_, out.cpu), 1e-6, 1e-5, "gpu vs cpu");
}

TEST_F(CudaBackendTest, GatherRowsCopiesSelectedRows) {
  const int64_t rows = 9, cols = 37;
  const auto x = random_floats(rows * cols, 29);
  const std::vector<int32_t> pick = {8, 0, 3, 3};
  const auto n = static_cast<int64_t>(pick.size());
  Both tx = both_f32({rows, cols}, x), out = both_f32({n, cols}, std::vector<float>(n * cols));
  gpu_->gather_rows(tx.gpu, ints(*gpu_, pick), n, out.gpu);
  cpu_->gather_rows(tx.cpu, ints(*cpu_, pick), n, out.cpu);
  std::vector<float> want(n * cols);
  for (int64_t i = 0; i < n; ++i) std::copy_n(&x[pick[i] * cols], cols, &want[i * cols]);
  expect_close(read(*gpu_, out.gpu), want, 0, 0, "gpu");
  expect_close(read(*cpu_, out.cpu), want, 0, 0, "cpu");
}

// The tensor-parallel logits layout: 3 ranks' blocks of 5 rows (odd column count), rank after rank, as
// [5, 3 * cols] rows.
TEST_F(CudaBackendTest, InterleaveRowBlocksPutsEachBlocksRowsSideBySide) {
  const int64_t blocks = 3, L = 5, cols = 37;
  const auto x = random_floats(blocks * L * cols, 30);
  Both tx = both_f32({blocks * L, cols}, x), out = both_f32({L, blocks * cols}, std::vector<float>(x.size()));
  gpu_->interleave_row_blocks(tx.gpu, blocks, out.gpu);
  cpu_->interleave_row_blocks(tx.cpu, blocks, out.cpu);
  std::vector<float> want(x.size());
  for (int64_t l = 0; l < L; ++l)
    for (int64_t b = 0; b < blocks; ++b)
      std::copy_n(&x[(b * L + l) * cols], cols, &want[(l * blocks + b) * cols]);
  expect_close(read(*gpu_, out.gpu), want, 0, 0, "gpu");
  expect_close(read(*cpu_, out.cpu), want, 0, 0, "cpu");
}

TEST_F(CudaBackendTest, ReportsItsDeviceAndRoundTripsMemory) {
  EXPECT_EQ(gpu_->device(), Device::CUDA);
  EXPECT_NE(gpu_->name().find("cuda:0"), std::string::npos);
  auto buf = gpu_->allocate(1000);
  std::vector<uint8_t> back(1000, 0xff);
  gpu_->copy_to_host(back.data(), buf->data(), back.size());
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](uint8_t b) { return b == 0; }))
      << "allocate zero-fills";
  std::vector<uint8_t> data(1000);
  std::iota(data.begin(), data.end(), uint8_t{0});
  gpu_->copy_to_device(buf->data(), data.data(), data.size());
  gpu_->copy_to_host(back.data(), buf->data(), back.size());
  EXPECT_EQ(back, data);
}

// A recorded graph stays valid while buffers are allocated (none it reads can move) and is refused once any
// device buffer is freed (a later allocation may reuse the address: the recorder re-records): a growth, which
// frees the old buffer, retires it, and a first allocation (the persistent kernel's scratch or tensor maps at
// the warm-up's batch-1 step) does not.
TEST_F(CudaBackendTest, RecordingsSurviveAllocationsAndAreRefusedAfterAFree) {
  constexpr uint64_t kKey = 7;
  auto src = gpu_->allocate(4096), dst = gpu_->allocate(4096);
  std::vector<uint8_t> data(4096);
  std::iota(data.begin(), data.end(), uint8_t{3});
  gpu_->copy_to_device(src->data(), data.data(), data.size());
  ASSERT_TRUE(gpu_->begin_graph_capture());
  gpu_->copy_on_device(dst->data(), src->data(), data.size());
  gpu_->end_graph_capture(kKey);
  ASSERT_TRUE(gpu_->replay_graph(kKey));
  std::vector<uint8_t> back(data.size());
  gpu_->copy_to_host(back.data(), dst->data(), back.size());
  EXPECT_EQ(back, data) << "the replay copied";
  auto unrelated = gpu_->allocate(1 << 20);
  EXPECT_TRUE(gpu_->replay_graph(kKey)) << "an allocation retired the recording";
  unrelated.reset();
  EXPECT_FALSE(gpu_->replay_graph(kKey)) << "a freed buffer left the recording replayable";
  EXPECT_FALSE(gpu_->has_graph(kKey));
}

}  // namespace
}  // namespace inferx
