#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/matmul_cpu.h"
#include "backend/rope.h"
#include "core/buffer.h"
#include "core/error.h"
#include "quant/gguf_blocks.h"

namespace inferx {

namespace {

class HostDeviceBuffer final : public DeviceBuffer {
 public:
  explicit HostDeviceBuffer(size_t bytes) : buffer_(bytes) {}
  void* data() const override { return buffer_.data(); }
  size_t size() const override { return buffer_.size(); }

 private:
  HostBuffer buffer_;
};

void check_f32(const Tensor& t, const char* what) {
  INFERX_CHECK(t.dtype == DType::F32 && t.device == Device::CPU,
               "cpu backend: {} must be an F32 host tensor, got {}", what, dtype_name(t.dtype));
}

// Row-wise RMSNorm: out = x * rsqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019). Sums in double so the
// result does not depend on the vector width.
void rmsnorm_row(const float* x, const float* w, float eps, int64_t n, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options) : pool_(options.num_threads) {}

std::string CpuBackend::name() const { return "cpu (" + std::to_string(pool_.size()) + " threads)"; }

std::unique_ptr<DeviceBuffer> CpuBackend::allocate(size_t bytes) {
  return std::make_unique<HostDeviceBuffer>(bytes);
}

void CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::embedding(const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) {
  // The whole vocabulary is one shard; an id outside it is the caller's error here, not a zero row.
  const int64_t vocab = table.dim(0);
  for (int64_t t = 0; t < n; ++t)
    INFERX_CHECK(ids[t] >= 0 && ids[t] < vocab, "token id {} is out of range (vocabulary of {})", ids[t],
                 vocab);
  embedding_shard(table, ids, n, 0, out);
}

void CpuBackend::embedding_shard(const Tensor& table, const int32_t* ids, int64_t n, int64_t first_id,
                                 Tensor& out) {
  check_f32(out, "embedding output");
  const int64_t rows = table.dim(0), dim = table.cols();
  INFERX_CHECK(out.cols() == dim && out.rows() >= n, "embedding: output {} does not fit {} rows of {}",
               out.shape_string(), n, dim);
  const int64_t rb = table.row_bytes();
  for (int64_t t = 0; t < n; ++t) {
    float* dst = out.ptr<float>() + t * dim;
    const int64_t row = static_cast<int64_t>(ids[t]) - first_id;
    if (row >= 0 && row < rows) {
      dequantize_row(table.dtype, static_cast<const char*>(table.data) + row * rb, dst, dim);
    } else {
      std::fill(dst, dst + dim, 0.0f);
    }
  }
}

void CpuBackend::rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  check_f32(x, "rmsnorm input");
  check_f32(weight, "rmsnorm weight");
  const int64_t n = x.cols();
  pool_.parallel_for(
      x.rows(),
      [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r)
          rmsnorm_row(x.ptr<float>() + r * n, weight.ptr<float>(), eps, n, out.ptr<float>() + r * n);
      },
      8);
}

void CpuBackend::add_rmsnorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                             Tensor& out) {
  check_f32(residual, "residual");
  check_f32(x, "add_rmsnorm input");
  const int64_t n = residual.cols();
  pool_.parallel_for(
      residual.rows(),
      [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
          float* res = residual.ptr<float>() + r * n;
          const float* add = x.ptr<float>() + r * n;
          for (int64_t i = 0; i < n; ++i) res[i] += add[i];
          rmsnorm_row(res, weight.ptr<float>(), eps, n, out.ptr<float>() + r * n);
        }
      },
      8);
}

void CpuBackend::head_rmsnorm(Tensor& x, int64_t head_dim, const Tensor& weight, float eps) {
  check_f32(x, "head_rmsnorm input");
  const int64_t heads = x.numel() / head_dim;
  float* p = x.ptr<float>();
  for (int64_t h = 0; h < heads; ++h)
    rmsnorm_row(p + h * head_dim, weight.ptr<float>(), eps, head_dim, p + h * head_dim);
}

void CpuBackend::matmul(const Tensor& x, const Linear& w, Tensor& out) {
  check_f32(x, "matmul input");
  check_f32(out, "matmul output");
  INFERX_CHECK(x.cols() == w.in_features() && out.cols() == w.out_features() && out.rows() == x.rows(),
               "matmul: x {} @ W {}^T does not give out {}", x.shape_string(), w.weight.shape_string(),
               out.shape_string());
  matmul_cpu(x.ptr<float>(), x.rows(), w, out.ptr<float>(), pool_);
}

void CpuBackend::rope_and_write_kv(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch,
                                   const RopeParams& rope, KvCacheLayer& cache) {
  const int64_t hd = rope.head_dim, half = hd / 2;
  if (inv_freq_.empty() || !(inv_freq_params_ == rope)) {
    inv_freq_ = rope_inverse_frequencies(hd, rope.theta, rope.scaling);
    inv_freq_params_ = rope;
  }
  const int64_t hq = q.cols() / hd, hkv = k.cols() / hd;
  const int64_t bs = cache.block_size();
  INFERX_CHECK(cache.k.dim(2) == hkv && cache.k.dim(3) == hd,
               "kv cache layer {} does not match {} kv heads of {}", cache.k.shape_string(), hkv, hd);
  const int64_t kv_row = hkv * hd;  // floats per cached token
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    for (int32_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) {
      const int32_t pos = batch.positions[t];
      float cs[512], sn[512];
      INFERX_CHECK(half <= 512, "head_dim {} too large", hd);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos) * inv_freq_[static_cast<size_t>(i)];
        cs[i] = std::cos(angle);
        sn[i] = std::sin(angle);
      }
      auto rotate = [&](float* head) {
        for (int64_t i = 0; i < half; ++i) {
          const int64_t a = rope.layout == RopeLayout::Interleaved ? 2 * i : i;
          const int64_t b = rope.layout == RopeLayout::Interleaved ? 2 * i + 1 : i + half;
          const float x0 = head[a], x1 = head[b];
          head[a] = x0 * cs[i] - x1 * sn[i];
          head[b] = x1 * cs[i] + x0 * sn[i];
        }
      };
      for (int64_t h = 0; h < hq; ++h) rotate(q.ptr<float>() + t * q.cols() + h * hd);
      float* krow = k.ptr<float>() + t * k.cols();
      for (int64_t h = 0; h < hkv; ++h) rotate(krow + h * hd);
      const int32_t block = batch.block_tables[static_cast<int64_t>(s) * batch.max_blocks_per_seq + pos / bs];
      INFERX_CHECK(block >= 0 && block < cache.k.dim(0), "block id {} out of range", block);
      const int64_t slot = (static_cast<int64_t>(block) * bs + pos % bs) * kv_row;
      std::memcpy(cache.k.ptr<float>() + slot, krow, static_cast<size_t>(kv_row) * 4);
      std::memcpy(cache.v.ptr<float>() + slot, v.ptr<float>() + t * v.cols(),
                  static_cast<size_t>(kv_row) * 4);
    }
  }
}

void CpuBackend::attention(const Tensor& q, const KvCacheLayer& cache, const BatchView& batch,
                           const AttentionParams& p, Tensor& out) {
  const int64_t hd = p.head_dim, group = p.num_heads / p.num_kv_heads, bs = cache.block_size();
  const int64_t kv_row = p.num_kv_heads * hd;
  // Token -> sequence map for the flattened batch.
  std::vector<int32_t> seq_of(static_cast<size_t>(batch.num_tokens));
  for (int32_t s = 0; s < batch.num_seqs; ++s)
    for (int32_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t)
      seq_of[static_cast<size_t>(t)] = s;
  const int64_t work = static_cast<int64_t>(batch.num_tokens) * p.num_heads;
  pool_.parallel_for(work, [&](int64_t begin, int64_t end, int) {
    std::vector<float> scores;
    std::vector<double> acc(static_cast<size_t>(hd));
    for (int64_t w = begin; w < end; ++w) {
      const int64_t t = w / p.num_heads, h = w % p.num_heads, kvh = h / group;
      const int32_t s = seq_of[static_cast<size_t>(t)];
      const int64_t pos = batch.positions[t];
      const int64_t last = std::min<int64_t>(pos, batch.seq_lens[s] - 1);
      const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
      const float* qh = q.ptr<float>() + t * q.cols() + h * hd;
      const int32_t* table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
      scores.resize(static_cast<size_t>(std::max<int64_t>(0, last - first + 1)));
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t j = first; j <= last; ++j) {
        const float* kj = cache.k.ptr<float>() + (table[j / bs] * bs + j % bs) * kv_row + kvh * hd;
        float dot = 0;
        for (int64_t d = 0; d < hd; ++d) dot += qh[d] * kj[d];
        scores[static_cast<size_t>(j - first)] = dot * p.scale;
        max_score = std::max(max_score, dot * p.scale);
      }
      double denom = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = first; j <= last; ++j) {
        const double e = std::exp(static_cast<double>(scores[static_cast<size_t>(j - first)] - max_score));
        denom += e;
        const float* vj = cache.v.ptr<float>() + (table[j / bs] * bs + j % bs) * kv_row + kvh * hd;
        for (int64_t d = 0; d < hd; ++d) acc[static_cast<size_t>(d)] += e * vj[d];
      }
      float* oh = out.ptr<float>() + t * out.cols() + h * hd;
      for (int64_t d = 0; d < hd; ++d)
        oh[d] = denom > 0 ? static_cast<float>(acc[static_cast<size_t>(d)] / denom) : 0.f;
    }
  });
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = gate.numel();
  pool_.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        const float* g = gate.ptr<float>();
        const float* u = up.ptr<float>();
        float* o = out.ptr<float>();
        for (int64_t i = b; i < e; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      },
      4096);
}

void CpuBackend::gather_rows(const Tensor& x, const int32_t* rows, int64_t n, Tensor& out) {
  const int64_t rb = x.row_bytes();
  for (int64_t i = 0; i < n; ++i) {
    INFERX_CHECK(rows[i] >= 0 && rows[i] < x.rows(), "gather_rows: row {} out of range", rows[i]);
    std::memcpy(static_cast<char*>(out.data) + i * rb, static_cast<const char*>(x.data) + rows[i] * rb,
                static_cast<size_t>(rb));
  }
}

void CpuBackend::interleave_row_blocks(const Tensor& x, int64_t blocks, Tensor& out) {
  const int64_t L = check_row_blocks(x, blocks, out, "cpu backend");
  const int64_t rb = x.row_bytes();
  for (int64_t l = 0; l < L; ++l)
    for (int64_t b = 0; b < blocks; ++b)
      std::memcpy(static_cast<char*>(out.data) + (l * blocks + b) * rb,
                  static_cast<const char*>(x.data) + (b * L + l) * rb, static_cast<size_t>(rb));
}

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace inferx
