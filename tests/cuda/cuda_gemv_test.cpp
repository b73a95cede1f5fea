// The decode GEMV (kernels_gemv*.cu) through CudaBackend::matmul / matmul_split / matmul_silu_mul, for
// every weight format it reads and every kernel that reads it (v1, v2, v3: set_gemv_kernel), against
// float64 references computed here from the dequantized weights (quant/ on the host) and the BF16-rounded
// activations the kernel reads. Odd shapes: N not a multiple of the rows of a CTA, M = 1..16 (and 20:
// chunks of 16), K spanning several load batches (and, for v3, uneven splits among warps), bias or not.
// Host tests (no GPU): the v2 step decoders and the v3 chunk decoders against quant/, and a model of the
// v3 kernel's operand layout against the float64 reference.
// Model level: dummy:tiny with fused projections against the same model without (cuBLASLt), and GGUF
// quantized dummies kept native on CUDA against the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels_gemv.h"
#include "backend/cuda/kernels_gemv_decode.h"
#include "backend/fused_linear.h"
#include "core/error.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "model/model.h"
#include "quant/fp8.h"
#include "quant/gguf_blocks.h"
#include "quant/int4.h"

namespace inferx {
namespace {

std::vector<float> randoms(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// A weight in one format: the bytes for the device, and the dequantized values [n, k] the reference uses.
struct HostWeight {
  DType dtype = DType::BF16;
  int64_t n = 0, k = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;
  std::vector<float> fp8_scale;      // F8_E4M3
  std::vector<uint16_t> int4_scale;  // INT4
  std::vector<uint8_t> int4_zero;    // INT4 asymmetric
  int64_t group = 0;
  std::vector<int32_t> perm;  // INT4 input permutation (empty: none)
};

struct Variant {
  std::string name;
  DType dtype;
  int64_t group = 0;
  bool symmetric = true;
  bool per_channel = false;
  bool perm = false;
  bool random_zero = false;  // INT4 asymmetric: zero points drawn from 0..15 (the quantizer's lie near 8)
};

HostWeight make_weight(const Variant& v, int64_t n, int64_t k, uint32_t seed) {
  HostWeight h;
  h.dtype = v.dtype;
  h.n = n;
  h.k = k;
  std::vector<float> w = randoms(static_cast<size_t>(n * k), seed);
  h.deq.resize(w.size());
  switch (v.dtype) {
    case DType::BF16:
      h.bytes.resize(w.size() * 2);
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t b = f32_to_bf16(w[i]);
        std::memcpy(h.bytes.data() + 2 * i, &b, 2);
        h.deq[i] = bf16_to_f32(b);
      }
      break;
    case DType::F8_E4M3: {
      for (int64_t r = 0; r < n; ++r)  // rows of different magnitudes: per-channel scales matter
        for (int64_t c = 0; c < k; ++c) w[static_cast<size_t>(r * k + c)] *= 0.25f + float(r % 7);
      Fp8Weight q = quantize_fp8_weight(
          w.data(), n, k, v.per_channel ? Fp8Granularity::PerChannel : Fp8Granularity::PerTensor);
      h.bytes = q.codes;
      h.fp8_scale = q.scale;
      for (int64_t r = 0; r < n; ++r)
        dequantize_fp8_row(q.codes.data() + r * k, q.scale[q.scale.size() == 1 ? 0 : size_t(r)],
                           h.deq.data() + r * k, k);
      break;
    }
    case DType::INT4: {
      Int4Weight q = quantize_int4_weight(w.data(), n, k, v.group, v.symmetric);
      if (v.random_zero) {
        std::mt19937 rz(seed + 2);
        for (uint8_t& z : q.zero) z = static_cast<uint8_t>(rz() % 16);
      }
      h.bytes = q.codes;
      h.int4_scale = q.scale;
      h.int4_zero = q.zero;
      h.group = v.group;
      const int64_t groups = k / v.group;
      for (int64_t r = 0; r < n; ++r)
        dequantize_int4_row(q.codes.data() + r * k / 2, q.scale.data() + r * groups,
                            q.symmetric() ? nullptr : q.zero.data() + r * groups, v.group,
                            h.deq.data() + r * k, k);
      if (v.perm) {
        h.perm.resize(static_cast<size_t>(k));
        std::iota(h.perm.begin(), h.perm.end(), 0);
        std::shuffle(h.perm.begin(), h.perm.end(), std::mt19937(seed + 1));
      }
      break;
    }
    case DType::Q8_0:
    case DType::Q4_K: {
      const int64_t rb = row_bytes(v.dtype, k);
      h.bytes.resize(static_cast<size_t>(n * rb));
      for (int64_t r = 0; r < n; ++r) {
        quantize_row(v.dtype, w.data() + r * k, h.bytes.data() + r * rb, k);
        dequantize_row(v.dtype, h.bytes.data() + r * rb, h.deq.data() + r * k, k);
      }
      break;
    }
    default:
      ADD_FAILURE() << "no such variant";
  }
  return h;
}

// out[r, c] = sum_i W[c, i] x[r, perm(i)] + bias[c] in float64, and sum |W x| for the tolerance.
void float64_product(const HostWeight& h, const std::vector<float>& x, int64_t m,
                     const std::vector<float>& bias, std::vector<double>& out, std::vector<double>& mag) {
  out.assign(static_cast<size_t>(m * h.n), 0.0);
  mag.assign(out.size(), 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < h.n; ++c) {
      double acc = bias.empty() ? 0.0 : bias[size_t(c)], a = 0;
      for (int64_t i = 0; i < h.k; ++i) {
        const int64_t src = h.perm.empty() ? i : h.perm[size_t(i)];
        const double p = double(h.deq[size_t(c * h.k + i)]) * x[size_t(r * h.k + src)];
        acc += p;
        a += std::fabs(p);
      }
      out[size_t(r * h.n + c)] = acc;
      mag[size_t(r * h.n + c)] = a;
    }
}

// v4's INT4 plain product of one activation row, bit for bit (kernels_gemv_stream.cu StreamInt4, with the run
// arithmetic of kernels_gemv_decode.h): the row's runs split into ks parts of consecutive runs (the warps of
// a K split), lane l of a part's warp adds the terms of its runs l, l + 32, ... in order, the lanes' sums
// times 256 are added by the warp's butterfly (warp_sum), the parts in order (from 0), then the bias.
std::vector<float> model_v4_int4(const HostWeight& h, const std::vector<float>& x,
                                 const std::vector<float>& bias, int ks) {
  namespace g = cuda::gemv;
  const int64_t runs = h.k / 32, groups = h.k / h.group;
  std::vector<float> xsum(static_cast<size_t>(runs));
  for (int64_t r = 0; r < runs; ++r) xsum[size_t(r)] = g::int4_run_sum(x.data() + 32 * r);
  std::vector<float> out(static_cast<size_t>(h.n));
  for (int64_t c = 0; c < h.n; ++c) {
    float total = 0.0f;
    for (int j = 0; j < ks; ++j) {
      float lanes[32] = {};
      for (int64_t r = j * runs / ks; r < (j + 1) * runs / ks; ++r) {
        uint32_t v[4];
        std::memcpy(v, h.bytes.data() + c * h.k / 2 + 16 * r, 16);
        const size_t at = size_t(c * groups + r * 32 / h.group);
        const uint32_t sz = g::int4_scale_zero(h.int4_scale[at], h.int4_zero.empty() ? 8u : h.int4_zero[at]);
        lanes[r % 32] = g::int4_run_term(v, sz, x.data() + 32 * r, xsum[size_t(r)], lanes[r % 32]);
      }
      for (float& l : lanes) l *= g::kInt4RunFactor;
      for (int off = 16; off > 0; off /= 2) {
        float t[32];
        for (int l = 0; l < 32; ++l) t[l] = lanes[l] + lanes[l ^ off];
        std::memcpy(lanes, t, sizeof t);
      }
      total = ks == 1 ? lanes[0] : total + lanes[0];
    }
    out[size_t(c)] = total + (bias.empty() ? 0.0f : bias[size_t(c)]);
  }
  return out;
}

// float64 references of a one-row plain product (want, mag) and of the stacked gate/up product (gu, gmag).
struct OneRowRefs {
  std::vector<double> want, mag, gu, gmag;
};
OneRowRefs one_row_refs(const HostWeight& h, const HostWeight& hs, const std::vector<float>& x,
                        const std::vector<float>& bias) {
  OneRowRefs r;
  float64_product(h, x, 1, bias, r.want, r.mag);
  float64_product(hs, x, 1, {}, r.gu, r.gmag);
  return r;
}

class CudaGemvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    INFERX_SKIP_WITHOUT_GPU();
    gpu_ = make_cuda_backend(0, CudaBackendOptions{});
  }

  void* upload(const void* p, size_t bytes) {
    keep_.push_back(gpu_->allocate(std::max<size_t>(bytes, 16)));  // zero-filled
    if (p && bytes) gpu_->copy_to_device(keep_.back()->data(), p, bytes);
    return keep_.back()->data();
  }
  Tensor f32(std::initializer_list<int64_t> shape, const std::vector<float>& v) {
    return Tensor(DType::F32, shape, upload(v.data(), v.size() * 4), Device::CUDA);
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    gpu_->synchronize();
    gpu_->copy_to_host(v.data(), t.data, v.size() * 4);
    return v;
  }
  Linear linear(const HostWeight& h, const std::vector<float>& bias) {
    Linear l;
    l.weight = Tensor(h.dtype, {h.n, h.k}, upload(h.bytes.data(), h.bytes.size()), Device::CUDA);
    if (!bias.empty()) l.bias = f32({h.n}, bias);
    if (h.dtype == DType::F8_E4M3) l.scale = f32({int64_t(h.fp8_scale.size())}, h.fp8_scale);
    if (h.dtype == DType::INT4) {
      const int64_t groups = h.k / h.group;
      l.scale = Tensor(DType::F16, {h.n, groups}, upload(h.int4_scale.data(), h.int4_scale.size() * 2),
                       Device::CUDA);
      if (!h.int4_zero.empty())
        l.zero =
            Tensor(DType::U8, {h.n, groups}, upload(h.int4_zero.data(), h.int4_zero.size()), Device::CUDA);
      l.group_size = h.group;
      if (!h.perm.empty())
        l.input_perm = Tensor(DType::I32, {h.k}, upload(h.perm.data(), h.perm.size() * 4), Device::CUDA);
    }
    return l;
  }

  // One activation row through the plain product of weight w (h uploaded once by the caller) with `bias`.
  std::vector<float> one_row(const HostWeight& h, const Linear& w, const std::vector<float>& x,
                             const std::vector<float>& bias) {
    Linear l = w;
    l.bias = f32({h.n}, bias);
    Tensor tx = f32({1, h.k}, x), out = f32({1, h.n}, std::vector<float>(size_t(h.n), NAN));
    gpu_->matmul(tx, l, out);
    return read(out);
  }
  // The one-row plain product of h (w) against float64, and the SiLU product of hs (ws: gate rows [0, f)
  // over up rows [f, 2f)) against silu(g) * u from float64 products, each within the GEMV's error bound.
  // Returns the plain product's output. refs: the references of these inputs (one_row_refs), else computed.
  std::vector<float> expect_one_row_products(const HostWeight& h, const Linear& w, const HostWeight& hs,
                                             const Linear& ws, const std::vector<float>& x,
                                             const std::vector<float>& bias, const std::string& what,
                                             const OneRowRefs* refs = nullptr) {
    const OneRowRefs own = refs ? OneRowRefs{} : one_row_refs(h, hs, x, bias);
    const OneRowRefs& ref = refs ? *refs : own;
    const std::vector<double>&want = ref.want, &mag = ref.mag, &gu = ref.gu, &gmag = ref.gmag;
    const std::vector<float> got = one_row(h, w, x, bias);
    expect_matches(got, want, mag, what, 2e-6);
    const int64_t f = hs.n / 2;
    Tensor tx = f32({1, h.k}, x), act = f32({1, f}, std::vector<float>(size_t(f), NAN)),
           gate = f32({1, f}, std::vector<float>(size_t(f))), up = f32({1, f}, std::vector<float>(size_t(f)));
    gpu_->matmul_silu_mul(tx, ws, gate, up, act);
    const std::vector<float> silu = read(act);
    for (int64_t j = 0; j < f; ++j) {
      const double g = gu[size_t(j)], u = gu[size_t(f + j)], sg = g / (1 + std::exp(-g));
      const double tol = (2e-6 * gmag[size_t(j)] + 1e-6) * 1.1 * std::fabs(u) +
                         (2e-6 * gmag[size_t(f + j)] + 1e-6) * std::fabs(sg) + 1e-6 * std::fabs(sg * u);
      if (!(std::fabs(silu[size_t(j)] - sg * u) <= tol)) {
        ADD_FAILURE() << what << " silu: element " << j << " got " << silu[size_t(j)] << " want " << sg * u;
        break;
      }
    }
    return got;
  }

  static void reference(const HostWeight& h, const std::vector<float>& x, int64_t m,
                        const std::vector<float>& bias, std::vector<double>& out, std::vector<double>& mag) {
    float64_product(h, x, m, bias, out, mag);
  }

  // fp32 accumulation in another order: |error| <= rel * sum |w x| (+ a small floor). Measured on the
  // H200 run: every GEMV case within 2e-6.
  static void expect_matches(const std::vector<float>& got, const std::vector<double>& want,
                             const std::vector<double>& mag, const std::string& what, double rel = 2e-6) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      const double tol = rel * mag[i] + 1e-6;
      if (!(std::fabs(got[i] - want[i]) <= tol)) {
        ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i] << " (tol "
                      << tol << ")";
        return;
      }
    }
  }

  std::unique_ptr<Backend> gpu_;
  std::vector<std::unique_ptr<DeviceBuffer>> keep_;
};

const Variant kVariants[] = {
    {"bf16", DType::BF16},
    {"fp8 per-tensor", DType::F8_E4M3, 0, true, false},
    {"fp8 per-channel", DType::F8_E4M3, 0, true, true},
    {"int4 g32 sym", DType::INT4, 32, true},
    {"int4 g64 asym", DType::INT4, 64, false},
    {"int4 g128 asym perm", DType::INT4, 128, false, false, true},
    {"int4 g128 sym perm", DType::INT4, 128, true, false, true},
    {"q8_0", DType::Q8_0},
    {"q4_k", DType::Q4_K},
    {"int4 g32 asym", DType::INT4, 32, false},
    {"int4 g64 sym", DType::INT4, 64, true},
    {"int4 g128 sym", DType::INT4, 128, true},
};
// INT4 weights for v4's own tests: every group size, symmetric and with zero points anywhere in 0..15.
const Variant kStreamInt4Variants[] = {
    {"int4 g32 sym", DType::INT4, 32, true},
    {"int4 g32 asym", DType::INT4, 32, false, false, false, true},
    {"int4 g64 sym", DType::INT4, 64, true},
    {"int4 g64 asym", DType::INT4, 64, false, false, false, true},
    {"int4 g128 sym", DType::INT4, 128, true},
    {"int4 g128 asym", DType::INT4, 128, false, false, false, true},
};

using cuda::GemvKernel;

// The kernels that read a format; a scope that runs products on one of them (set_gemv_kernel) and
// restores the default choice when it ends.
// The weight-only kernels (v5 is W8A8, other numerics: W8a8KernelMatchesQuantizedReference tests it).
std::vector<GemvKernel> kernels_for(DType t) {
  std::vector<GemvKernel> ks;
  for (GemvKernel k : {GemvKernel::V1, GemvKernel::V2, GemvKernel::V3, GemvKernel::V4})
    if (cuda::gemv_kernel_reads(k, t)) ks.push_back(k);
  return ks;
}
struct KernelScope {
  DType dtype;
  KernelScope(DType t, GemvKernel k) : dtype(t) { cuda::set_gemv_kernel(t, k); }
  ~KernelScope() { cuda::set_gemv_kernel(dtype, GemvKernel::Default); }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
};
std::string kname(GemvKernel k) { return std::string(" [") + cuda::gemv_kernel_name(k) + "]"; }

int64_t k_for(DType t, bool long_rows) {
  switch (t) {
    case DType::BF16:
      return long_rows ? 2120 : 264;  // 265 granules: a second load batch
    case DType::F8_E4M3:
      return long_rows ? 4112 : 272;
    case DType::INT4:
      return long_rows ? 8448 : 384;
    case DType::Q8_0:
      return long_rows ? 8224 : 224;
    default:
      return long_rows ? 3072 : 768;  // Q4_K
  }
}

// v3 takes rows of whole 4-chunk sets (K a multiple of 32 BF16 / 64 FP8 / 128 INT4; others fall back
// to v1): 3 sets (one partial batch), or 66 sets (8 warps of 9 sets: batches of 4, 4, 1; the last warp 3).
int64_t k_for(DType t, bool long_rows, GemvKernel kernel) {
  if (kernel != GemvKernel::V3) return k_for(t, long_rows);
  const int64_t set_cols = t == DType::BF16 ? 32 : t == DType::F8_E4M3 ? 64 : 128;
  return set_cols * (long_rows ? 66 : 3);
}

TEST_F(CudaGemvTest, EveryFormatMatchesFloat64Reference) {
  uint32_t seed = 100;
  for (const Variant& v : kVariants) {
    for (GemvKernel kernel : kernels_for(v.dtype)) {
      const KernelScope scope(v.dtype, kernel);
      for (bool long_rows : {false, true}) {
        const int64_t k = k_for(v.dtype, long_rows, kernel);
        for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{133}}) {
          if (long_rows && n != 37) continue;
          const HostWeight h = make_weight(v, n, k, ++seed);
          for (int64_t m : {1, 2, 3, 5, 8, 9, 16, 20}) {
            if (long_rows && m != 1 && m != 5 && m != 16) continue;
            std::vector<float> x = randoms(static_cast<size_t>(m * k), ++seed);
            for (float& e : x) e = bf16_round(e);  // the kernel reads x in BF16
            std::vector<double> want0, mag;
            reference(h, x, m, {}, want0, mag);
            for (bool with_bias : {false, true}) {
              const std::string what = v.name + kname(kernel) + " n=" + std::to_string(n) +
                                       " k=" + std::to_string(k) + " m=" + std::to_string(m) +
                                       (with_bias ? " bias" : "");
              const std::vector<float> bias = with_bias ? randoms(size_t(n), ++seed) : std::vector<float>{};
              const Linear l = linear(h, bias);
              Tensor tx = f32({m, k}, x), out = f32({m, n}, std::vector<float>(size_t(m * n), NAN));
              // Beyond 16 rows matmul may hand FP8 to the quantized GEMM (W8A8: other numerics); a
              // one-output split keeps the GEMV (in chunks of 16 rows) for every format it reads.
              Tensor* one[] = {&out};
              if (m > 16)
                gpu_->matmul_split(tx, l, one);
              else
                gpu_->matmul(tx, l, out);
              std::vector<double> want = want0;
              if (with_bias)
                for (int64_t r = 0; r < m; ++r)
                  for (int64_t c = 0; c < n; ++c) want[size_t(r * n + c)] += bias[size_t(c)];
              // BF16 with more than one row runs on cuBLASLt (tensor-core accumulation): a wider bound.
              expect_matches(read(out), want, mag, what, v.dtype == DType::BF16 && m > 1 ? 2e-5 : 2e-6);
            }
          }
        }
      }
    }
  }
}

// Products of 8192 rows or more give each v2 warp two rows (kernels_gemv_v1v2.cu v2_pairs): an odd row count
// leaves the last warp one row, and split outputs cut between the two rows of a warp (and, for v3, the
// 16 rows of a CTA). BF16 with one row takes the GEMV too.
TEST_F(CudaGemvTest, TallWeightsMatchFloat64Reference) {
  uint32_t seed = 700;
  for (const Variant& v :
       {kVariants[0], kVariants[2], kVariants[4], kVariants[5], kVariants[7], kVariants[8]})
    for (GemvKernel kernel : kernels_for(v.dtype)) {
      const KernelScope scope(v.dtype, kernel);
      const int64_t k = k_for(v.dtype, false, kernel), n = 8193;
      const HostWeight h = make_weight(v, n, k, ++seed);
      for (int64_t m : {1, 5}) {
        const std::string what = v.name + kname(kernel) + " n=8193 m=" + std::to_string(m);
        std::vector<float> x = randoms(static_cast<size_t>(m * k), ++seed);
        for (float& e : x) e = bf16_round(e);
        const std::vector<float> bias = randoms(size_t(n), ++seed);
        const Linear l = linear(h, bias);
        std::vector<double> want, mag;
        reference(h, x, m, bias, want, mag);
        Tensor tx = f32({m, k}, x), out = f32({m, n}, std::vector<float>(size_t(m * n), NAN));
        gpu_->matmul(tx, l, out);
        const double rel = v.dtype == DType::BF16 && m > 1 ? 2e-5 : 2e-6;  // BF16, m > 1: cuBLASLt
        expect_matches(read(out), want, mag, what, rel);
        // Three outputs of 4097, 2047 and 2049 rows: boundaries inside a warp's pair of rows.
        const int64_t parts[3] = {4097, 2047, 2049};
        Tensor outs[3];
        for (int i = 0; i < 3; ++i)
          outs[i] = f32({m, parts[i]}, std::vector<float>(size_t(m * parts[i]), NAN));
        Tensor* ptrs[] = {&outs[0], &outs[1], &outs[2]};
        gpu_->matmul_split(tx, l, ptrs);
        std::vector<float> joined(size_t(m * n));
        int64_t begin = 0;
        for (int i = 0; i < 3; ++i) {
          const std::vector<float> part = read(outs[i]);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t c = 0; c < parts[i]; ++c)
              joined[size_t(r * n + begin + c)] = part[size_t(r * parts[i] + c)];
          begin += parts[i];
        }
        expect_matches(joined, want, mag, what + " split", rel);
      }
    }
}

// v4's warps stream several rows each, the next batch of loads in flight across a row's end: long rows
// (two batches, the second partial) over few warps (one CTA per SM: 4 warps per SM for 3001 rows), both
// batch sizes, plain products with one or two rows per warp, and SiLU products; with the shared-memory
// prefetch off, staging some of the first rows' batches, and staging all their full batches. INT4 (every
// group size, with and without zero points; even row counts for the symmetric weights) also with x in
// shared memory as F32 and as BF16, alternately; one x for all its launch shapes, whose plain products must
// all be model_v4_int4's bits (which v1's are not: the launch ran on v4).
TEST_F(CudaGemvTest, StreamKernelCarriesBatchesAcrossRows) {
  uint32_t seed = 1300;
  std::vector<Variant> variants = {kVariants[0], kVariants[1], kVariants[2]};
  variants.insert(variants.end(), std::begin(kStreamInt4Variants), std::end(kStreamInt4Variants));
  for (const Variant& v : variants) {
    const KernelScope scope(v.dtype, GemvKernel::V4);
    const bool int4 = v.dtype == DType::INT4;
    const int64_t k = k_for(v.dtype, true), n = int4 && v.symmetric ? 3000 : 3001;
    const HostWeight h = make_weight(v, n, k, ++seed), hs = make_weight(v, 2 * 1501, k, ++seed);
    const Linear w = linear(h, {}), ws = linear(hs, {});  // SiLU: gate rows [0, 1501) over up [1501, 3002)
    std::vector<float> x0, bias0;                         // INT4: one x and bias for all launch shapes
    OneRowRefs refs;
    std::vector<float> model;
    if (int4) {
      x0 = randoms(static_cast<size_t>(k), ++seed);
      for (float& e : x0) e = bf16_round(e);
      bias0 = randoms(size_t(n), ++seed);
      refs = one_row_refs(h, hs, x0, bias0);
      model = model_v4_int4(h, x0, bias0, 1);
      cuda::set_gemv_kernel(v.dtype, GemvKernel::V1);
      EXPECT_NE(one_row(h, w, x0, bias0), model) << v.name << ": v1 gives v4's bits";
      cuda::set_gemv_kernel(v.dtype, GemvKernel::V4);
    }
    int shape = 0;
    for (int loads : {4, 8}) {
      for (int ctas : {1, 0})
        for (int pairs : {1, 0})  // plain products two rows per warp or one (n odd: a last half pair)
          for (int smem_kb : {0, 48, 200}) {  // shared-memory prefetch: off, part of a row, all full batches
            const int x_f32 = int4 ? 2 * (shape++ % 2) : -1;  // INT4: x as BF16 (0) or F32 (2)
            cuda::set_gemv_v4_shape(loads, ctas, pairs, smem_kb, -1, x_f32);
            const std::string what = v.name + " loads=" + std::to_string(loads) +
                                     " ctas/SM=" + std::to_string(ctas) + " pairs=" + std::to_string(pairs) +
                                     " smem KB=" + std::to_string(smem_kb) +
                                     (int4 ? x_f32 ? " x F32" : " x BF16" : "");
            if (int4) {
              EXPECT_EQ(expect_one_row_products(h, w, hs, ws, x0, bias0, what, &refs), model)
                  << what << ": not v4's INT4 bits";
              continue;
            }
            std::vector<float> x = randoms(static_cast<size_t>(k), ++seed);
            for (float& e : x) e = bf16_round(e);
            const std::vector<float> bias = randoms(size_t(n), ++seed);
            expect_one_row_products(h, w, hs, ws, x, bias, what);
          }
    }
    cuda::set_gemv_v4_shape(0, -1);
  }
}

// v4's K split: the warps of a CTA that share a row group each stream 1/ks of its batches and the group's
// first warp adds their sums. Forced to 2 and 4 (K a whole number of batches for every batch size: 8192
// columns, INT4 16384), with few and many warps, one or two rows per warp (3001 rows: a last half pair and,
// split, a CTA with an idle group), the shared-memory prefetch off and staging part or all of a warp's
// segment; plain and SiLU products. The split in force is the one gemv_v4_ksplit gives for the launch's
// shape. INT4 (group 32 and 128 with zero points, 64 without; x as F32 and BF16 alternately): one x for
// all launch shapes, the plain products the bits of model_v4_int4 for the split in force.
TEST_F(CudaGemvTest, StreamKernelSplitsRowsOverWarps) {
  uint32_t seed = 1700;
  for (const Variant& v : {kVariants[0], kVariants[1], kVariants[2], kStreamInt4Variants[1],
                           kStreamInt4Variants[2], kStreamInt4Variants[5]}) {
    const KernelScope scope(v.dtype, GemvKernel::V4);
    const bool int4 = v.dtype == DType::INT4;
    const int64_t k = int4 ? 16384 : 8192, n = 3001, f = 1501;
    const HostWeight h = make_weight(v, n, k, ++seed), hs = make_weight(v, 2 * f, k, ++seed);
    const Linear w = linear(h, {}), ws = linear(hs, {});
    const int elems = v.dtype == DType::BF16 ? 8 : v.dtype == DType::F8_E4M3 ? 16 : 32;
    std::vector<float> x0, bias0;  // INT4: one x and bias for all launch shapes
    OneRowRefs refs;
    std::vector<float> model[5];  // INT4: by the split in force (2, 4)
    if (int4) {
      x0 = randoms(static_cast<size_t>(k), ++seed);
      for (float& e : x0) e = bf16_round(e);
      bias0 = randoms(size_t(n), ++seed);
      refs = one_row_refs(h, hs, x0, bias0);
      model[2] = model_v4_int4(h, x0, bias0, 2);
      model[4] = model_v4_int4(h, x0, bias0, 4);
    }
    int shape = 0;
    for (int ksplit : {2, 4})
      for (int loads : {4, 8})
        for (int ctas : {1, 0})
          for (int pairs : {1, 0})
            for (int smem_kb : {0, 48, 200}) {
              const int x_f32 = int4 ? 2 * (shape++ % 2) : -1;
              cuda::set_gemv_v4_shape(loads, ctas, pairs, smem_kb, ksplit, x_f32);
              const int64_t batches = k / (int64_t{32} * (loads / (pairs + 1)) * elems);
              const int in_force = cuda::gemv_v4_ksplit(n, batches, 1, ksplit);
              ASSERT_GT(in_force, 1) << "the case must split";
              const std::string what =
                  v.name + " ksplit=" + std::to_string(ksplit) + " (" + std::to_string(in_force) +
                  ") loads=" + std::to_string(loads) + " ctas/SM=" + std::to_string(ctas) +
                  " pairs=" + std::to_string(pairs) + " smem KB=" + std::to_string(smem_kb) +
                  (int4 ? x_f32 ? " x F32" : " x BF16" : "");
              std::vector<float> x = x0, bias = bias0;
              if (!int4) {
                x = randoms(static_cast<size_t>(k), ++seed);
                for (float& e : x) e = bf16_round(e);
                bias = randoms(size_t(n), ++seed);
              }
              const std::vector<float> got =
                  expect_one_row_products(h, w, hs, ws, x, bias, what, int4 ? &refs : nullptr);
              if (int4) {
                EXPECT_EQ(got, model[in_force]) << what << ": not v4's INT4 bits";
              }
              // The same launch again gives the same bits (the split's sums are added in a fixed order).
              EXPECT_EQ(one_row(h, w, x, bias), got) << what;
              // And the split really ran: unsplit, the 3001 sums are added in another order, so some of
              // their last bits differ (a launcher that ignored the request would pass the checks above).
              cuda::set_gemv_v4_shape(loads, ctas, pairs, smem_kb, 1, x_f32);
              EXPECT_NE(one_row(h, w, x, bias), got) << what << ": the same bits as unsplit";
            }
    cuda::set_gemv_v4_shape(0, -1);
  }
}

// v4's K split choice (host arithmetic, no GPU needed). 4224 warps = 1056 CTAs of 4 (8 per SM on 132 SMs).
TEST(CudaGemvV4Split, ChoosesTheFewestBatchesPerWarp) {
  const int64_t w = 4224;
  // 8B FP8 at batch 1 (pairs, 4 loads: 1 KB batches): o 2048 pairs x 4 batches -> 2; qkv 3072 x 4 -> 4;
  // down 2048 x 14 -> 2; gate/up 14336 x 4 -> 1 (16 batches per warp unsplit, 14 split: less than the
  // quarter the split must save); the lm_head 64128 x 4 -> 1 (64 -> 61).
  EXPECT_EQ(cuda::gemv_v4_ksplit(2048, 4, w, 0), 2);
  EXPECT_EQ(cuda::gemv_v4_ksplit(3072, 4, w, 0), 4);
  EXPECT_EQ(cuda::gemv_v4_ksplit(2048, 14, w, 0), 2);
  EXPECT_EQ(cuda::gemv_v4_ksplit(14336, 4, w, 0), 1);
  EXPECT_EQ(cuda::gemv_v4_ksplit(64128, 4, w, 0), 1);
  // 70B FP8: qkv 5120 pairs x 8 -> 4 (10 batches in the busiest warp against 16 unsplit); o 4096 x 8 and
  // down 4096 x 28 gain nothing -> 1.
  EXPECT_EQ(cuda::gemv_v4_ksplit(5120, 8, w, 0), 4);
  EXPECT_EQ(cuda::gemv_v4_ksplit(4096, 8, w, 0), 1);
  EXPECT_EQ(cuda::gemv_v4_ksplit(4096, 28, w, 0), 1);
  // Never a split that does not divide the batches; a request is capped to one that does.
  EXPECT_EQ(cuda::gemv_v4_ksplit(100, 7, w, 0), 1);
  EXPECT_EQ(cuda::gemv_v4_ksplit(100, 6, w, 4), 2);
  EXPECT_EQ(cuda::gemv_v4_ksplit(100, 6, w, 3), 2);
  EXPECT_EQ(cuda::gemv_v4_ksplit(100, 8, w, 4), 4);
  EXPECT_EQ(cuda::gemv_v4_ksplit(100, 8, w, 1), 1);
  EXPECT_EQ(cuda::gemv_v4_ksplit(0, 8, w, 0), 1);
  for (int64_t groups : {1, 7, 1000, 4224, 5000, 100000})
    for (int64_t batches : {1, 2, 3, 4, 6, 8, 14, 28})
      for (int req : {0, 1, 2, 4}) {
        const int ks = cuda::gemv_v4_ksplit(groups, batches, w, req);
        EXPECT_TRUE(ks == 1 || ks == 2 || ks == 4);
        EXPECT_EQ(batches % ks, 0);
        if (req > 0) {
          EXPECT_LE(ks, req);
        }
      }
}

// v4's staging plan (host arithmetic, no GPU needed): whole batches, never more than a row's whole batches,
// and the CTAs that share an SM within the budget; the shapes of the 8B decode give the figures the
// measurements were taken with (o projection, FP8 pairs: 512 CTAs on 132 SMs, 96 KB -> 2 of 4 batches).
TEST(CudaGemvV4Staging, WholeBatchesWithinTheBudget) {
  EXPECT_EQ(cuda::gemv_v4_staged_batches(512, 132, 2, 4, 4096, 96), 2);
  EXPECT_EQ(cuda::gemv_v4_staged_batches(512, 132, 2, 4, 4096, 200), 4);  // the whole row pair
  EXPECT_EQ(cuda::gemv_v4_staged_batches(512, 132, 2, 4, 4096, 0), 0);    // off
  EXPECT_EQ(cuda::gemv_v4_staged_batches(512, 132, 2, 4, 4096, 8), 0);    // less than a batch per warp
  EXPECT_EQ(cuda::gemv_v4_smem_bytes(2, 4, 0), 0u);
  for (int64_t ctas : {1, 132, 400, 512, 1056})
    for (int r : {1, 2})
      for (int loads : {4, 8})
        for (int64_t row_bytes : {int64_t{512}, int64_t{4112}, int64_t{28672}})
          for (int kb : {16, 48, 96, 160, 200}) {
            const int b = cuda::gemv_v4_staged_batches(ctas, 132, r, loads, row_bytes, kb);
            const int64_t batch = int64_t{32} * (loads / r) * 16, on_sm = (ctas + 131) / 132;
            SCOPED_TRACE(::testing::Message() << "ctas " << ctas << " rows/warp " << r << " loads " << loads
                                              << " row " << row_bytes << " KB " << kb << " -> " << b);
            EXPECT_GE(b, 0);
            EXPECT_LE(b * batch, row_bytes);  // whole batches of the row only
            EXPECT_LE(static_cast<int64_t>(cuda::gemv_v4_smem_bytes(r, loads, b)) * on_sm,
                      int64_t{kb} * 1024);
            // Maximal: one batch more would overflow the budget or the row.
            const int64_t more = static_cast<int64_t>(cuda::gemv_v4_smem_bytes(r, loads, b + 1));
            EXPECT_TRUE((b + 1) * batch > row_bytes || more * on_sm > int64_t{kb} * 1024);
          }
}

// The norm fusion of one-row products (kernels_gemv.h GemvResidual / GemvPrenorm, driven through the
// Backend calls the model makes): matmul_before_norm adds o's output into the residual in its epilogue,
// then norm_matmul_split / norm_matmul_silu_mul read the prepared row. Checked against float64: the
// residual against residual + x . Wo + bias, the products against rsqrt(mean(s^2) + eps) * (W .
// BF16(s * weight)) with s the residual the GPU wrote. Residual widths with few and with hundreds of
// producing CTAs; consumers of 3001 rows and of 5 (one CTA, idle warps); three calls in a row with fresh
// inputs (the partials are rewritten each time) and a repeated call that must give the same bits. An INT4
// consumer does not fuse: the prepared norm becomes a norm kernel over the already added residual.
// The fusion on for a test's scope, whatever the default.
struct NormFusionScope {
  NormFusionScope() { cuda::set_gemv_norm_fusion(1); }
  ~NormFusionScope() { cuda::set_gemv_norm_fusion(-1); }
  NormFusionScope(const NormFusionScope&) = delete;
  NormFusionScope& operator=(const NormFusionScope&) = delete;
};

TEST_F(CudaGemvTest, NormFusionMatchesNormThenProduct) {
  const NormFusionScope on;
  uint32_t seed = 2100;
  const float eps = 1e-5f;
  const int64_t k_in = 512;
  for (const Variant& v : {kVariants[0], kVariants[1], kVariants[2], kVariants[11]}) {
    const Variant& pv = v.dtype == DType::INT4 ? kVariants[0] : v;  // the producer's format
    for (const int64_t k : {v.dtype == DType::INT4 ? int64_t{384} : k_for(v.dtype, false), int64_t{4096}}) {
      const bool fused = cuda::gemv_norm_fuses(v.dtype, k);
      EXPECT_EQ(fused, v.dtype != DType::INT4) << v.name << " k=" << k;
      const HostWeight ho = make_weight(pv, k, k_in, ++seed);
      const std::vector<float> bias_o = randoms(size_t(k), ++seed);
      const Linear lo = linear(ho, bias_o);
      const std::vector<float> gamma = randoms(size_t(k), ++seed, 0.5f, 1.5f);
      Tensor tgamma = f32({k}, gamma), hbuf = f32({1, k}, std::vector<float>(size_t(k)));
      for (const int64_t n : {int64_t{3001}, int64_t{5}}) {
        const HostWeight h = make_weight(v, n, k, ++seed), hs = make_weight(v, 2 * n, k, ++seed);
        std::vector<float> first_out;
        for (int call = 0; call < 4; ++call) {
          // Call 3 repeats call 2's inputs: the same bits (partials summed in a fixed order).
          const uint32_t in_seed = call == 3 ? seed : ++seed;
          const bool with_bias = call >= 2;
          const std::string what = v.name + " k=" + std::to_string(k) + " n=" + std::to_string(n) + " call " +
                                   std::to_string(call) + (with_bias ? " bias" : "") +
                                   (fused ? " (fused)" : " (unfused)");
          const std::vector<float> res = randoms(size_t(k), in_seed, -2.0f, 2.0f);
          std::vector<float> xin = randoms(size_t(k_in), in_seed + 7);
          for (float& e : xin) e = bf16_round(e);
          const std::vector<float> bias =
              with_bias ? randoms(size_t(2 * n), in_seed + 9) : std::vector<float>{};
          std::vector<double> dot_o, mag_o;
          reference(ho, xin, 1, bias_o, dot_o, mag_o);
          for (int product = 0; product < 2; ++product) {  // 0: split outputs, 1: SiLU
            const std::string pwhat = what + (product ? " silu" : " split");
            Tensor tres = f32({1, k}, res), tx = f32({1, k_in}, xin),
                   proj = f32({1, k}, std::vector<float>(size_t(k)));
            gpu_->matmul_before_norm(tx, lo, proj, tres, tgamma, eps);
            Tensor o0, o1, act, gate, up;
            const int64_t p0 = n > 8 ? n / 3 : n, p1 = n - p0;
            if (product == 0) {
              o0 = f32({1, p0}, std::vector<float>(size_t(p0), NAN));
              o1 = f32({1, std::max<int64_t>(p1, 1)},
                       std::vector<float>(size_t(std::max<int64_t>(p1, 1)), NAN));
              std::vector<Tensor*> outs{&o0};
              if (p1 > 0) outs.push_back(&o1);
              const std::vector<float> b(bias.begin(), bias.begin() + (with_bias ? n : 0));
              gpu_->norm_matmul_split(tres, &proj, tgamma, eps, hbuf, linear(h, b), outs);
            } else {
              act = f32({1, n}, std::vector<float>(size_t(n), NAN));
              gate = f32({1, n}, std::vector<float>(size_t(n)));
              up = f32({1, n}, std::vector<float>(size_t(n)));
              gpu_->norm_matmul_silu_mul(tres, &proj, tgamma, eps, hbuf, linear(hs, bias), gate, up, act);
            }
            // The residual stream: res + x . Wo + bias_o.
            const std::vector<float> s = read(tres);
            for (int64_t j = 0; j < k; ++j) {
              const double want = res[size_t(j)] + dot_o[size_t(j)];
              if (!(std::fabs(s[size_t(j)] - want) <=
                    2e-6 * (mag_o[size_t(j)] + std::fabs(res[size_t(j)])) + 1e-6)) {
                ADD_FAILURE() << pwhat << ": residual " << j << " got " << s[size_t(j)] << " want " << want;
                break;
              }
            }
            double ss = 0;
            for (float e : s) ss += double(e) * e;
            const double rstd = 1.0 / std::sqrt(ss / double(k) + eps);
            std::vector<float> xq(static_cast<size_t>(k));
            for (int64_t j = 0; j < k; ++j)
              xq[size_t(j)] = fused ? bf16_round(s[size_t(j)] * gamma[size_t(j)])
                                    : bf16_round(float(s[size_t(j)] * rstd) * gamma[size_t(j)]);
            const double factor = fused ? rstd : 1.0;
            const double rel =
                fused ? 4e-6 : 0x1p-7;  // unfused: the norm kernel's float rounding, not modelled
            std::vector<double> dot, mag;
            reference(product ? hs : h, xq, 1, {}, dot, mag);
            std::vector<float> got;
            if (product == 0) {
              got = read(o0);
              if (p1 > 0) {
                const std::vector<float> g1 = read(o1);
                got.insert(got.end(), g1.begin(), g1.end());
              }
            } else {
              got = read(act);
            }
            for (int64_t j = 0; j < n; ++j) {
              double want, tol;
              if (product == 0) {
                want = dot[size_t(j)] * factor + (with_bias ? bias[size_t(j)] : 0.0);
                tol = rel * mag[size_t(j)] * rstd + 1e-5;
              } else {
                const double g = dot[size_t(j)] * factor + (with_bias ? bias[size_t(j)] : 0.0),
                             u = dot[size_t(n + j)] * factor + (with_bias ? bias[size_t(n + j)] : 0.0),
                             sg = g / (1 + std::exp(-g));
                want = sg * u;
                tol = (rel * mag[size_t(j)] * rstd + 1e-5) * 1.1 * std::fabs(u) +
                      (rel * mag[size_t(n + j)] * rstd + 1e-5) * std::fabs(sg) + 1e-6 * std::fabs(sg * u);
              }
              if (!(std::fabs(got[size_t(j)] - want) <= tol)) {
                ADD_FAILURE() << pwhat << ": element " << j << " got " << got[size_t(j)] << " want " << want
                              << " (tol " << tol << ")";
                break;
              }
            }
            if (product == 0 && call == 2) first_out = got;
            if (product == 0 && call == 3) {
              EXPECT_EQ(got, first_out) << pwhat << ": not deterministic";
            }
          }
        }
      }
    }
  }
}

// A prepared norm must be taken by the call it was prepared for: another residual or norm weight is a
// contract violation, reported instead of computing with the wrong row.
TEST_F(CudaGemvTest, NormFusionRefusesAnotherNorm) {
  const NormFusionScope on;
  const Variant& v = kVariants[0];
  const int64_t k = 256;
  const HostWeight ho = make_weight(v, k, 64, 3), h = make_weight(v, 16, k, 4);
  Tensor res = f32({1, k}, randoms(size_t(k), 5)), other = f32({1, k}, randoms(size_t(k), 6));
  Tensor gamma = f32({k}, randoms(size_t(k), 7)), x = f32({1, 64}, randoms(64, 8));
  Tensor proj = f32({1, k}, std::vector<float>(size_t(k))), hb = f32({1, k}, std::vector<float>(size_t(k)));
  Tensor out = f32({1, 16}, std::vector<float>(16));
  Tensor* outs[] = {&out};
  gpu_->matmul_before_norm(x, linear(ho, {}), proj, res, gamma, 1e-5f);
  EXPECT_THROW(gpu_->norm_matmul_split(other, &proj, gamma, 1e-5f, hb, linear(h, {}), outs), Error);
}

TEST_F(CudaGemvTest, SplitOutputsEqualSeparateProducts) {
  uint32_t seed = 500;
  for (const Variant& v : {kVariants[0], kVariants[2], kVariants[5], kVariants[8], kVariants[9]})
    for (GemvKernel kernel : kernels_for(v.dtype)) {
      const KernelScope scope(v.dtype, kernel);
      const int64_t k = k_for(v.dtype, false, kernel);
      const int64_t parts[3] = {64, 37, 11};
      const HostWeight h = make_weight(v, parts[0] + parts[1] + parts[2], k, ++seed);
      for (int64_t m : {1, 4, 16}) {
        SCOPED_TRACE(v.name + kname(kernel) + " m=" + std::to_string(m));
        std::vector<float> x = randoms(static_cast<size_t>(m * k), ++seed);
        const Linear l = linear(h, randoms(size_t(h.n), ++seed));
        Tensor tx = f32({m, k}, x);
        Tensor outs[3], sep[3];
        for (int i = 0; i < 3; ++i) {
          outs[i] = f32({m, parts[i]}, std::vector<float>(size_t(m * parts[i]), NAN));
          sep[i] = f32({m, parts[i]}, std::vector<float>(size_t(m * parts[i]), NAN));
        }
        Tensor* ptrs[] = {&outs[0], &outs[1], &outs[2]};
        gpu_->matmul_split(tx, l, ptrs);
        int64_t begin = 0;
        for (int i = 0; i < 3; ++i) {
          gpu_->matmul(tx, linear_rows(l, begin, parts[i]), sep[i]);
          begin += parts[i];
        }
        for (int i = 0; i < 3; ++i) EXPECT_EQ(read(outs[i]), read(sep[i])) << "part " << i;
        // And the parts against the reference (row ranges of the stacked weight).
        std::vector<double> want, mag;
        std::vector<float> xr = x;
        for (float& e : xr) e = bf16_round(e);
        reference(h, xr, m, {}, want, mag);
        std::vector<float> got0 = read(outs[1]);
        const std::vector<float> bias = [&] {
          std::vector<float> b(size_t(h.n));
          gpu_->copy_to_host(b.data(), l.bias.data, b.size() * 4);
          return b;
        }();
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < parts[1]; ++c) {
            const size_t at = size_t(r * h.n + parts[0] + c);
            EXPECT_NEAR(got0[size_t(r * parts[1] + c)], want[at] + bias[size_t(parts[0] + c)],
                        (v.dtype == DType::BF16 && m > 1 ? 2e-5 : 2e-6) * mag[at] + 1e-6);
          }
      }
    }
}

TEST_F(CudaGemvTest, SiluProductMatchesReferenceAndFeedsTheNextProduct) {
  uint32_t seed = 900;
  for (const Variant& v :
       {kVariants[0], kVariants[1], kVariants[4], kVariants[7], kVariants[8], kVariants[9], kVariants[11]})
    for (GemvKernel kernel : kernels_for(v.dtype)) {
      const KernelScope scope(v.dtype, kernel);
      // 64: the 16-byte path of the stacked SiLU
      for (int64_t f : {int64_t{37}, int64_t{130}, int64_t{64}}) {
        const int64_t k = k_for(v.dtype, false, kernel);
        const HostWeight h = make_weight(v, 2 * f, k, ++seed);
        for (int64_t m : {1, 3, 16, 20}) {
          for (bool with_bias : {false, true}) {
            const std::string what = v.name + kname(kernel) + " f=" + std::to_string(f) +
                                     " m=" + std::to_string(m) + (with_bias ? " bias" : "");
            std::vector<float> x = randoms(static_cast<size_t>(m * k), ++seed);
            for (float& e : x) e = bf16_round(e);
            const std::vector<float> bias = with_bias ? randoms(size_t(2 * f), ++seed) : std::vector<float>{};
            const Linear l = linear(h, bias);
            Tensor tx = f32({m, k}, x), act = f32({m, f}, std::vector<float>(size_t(m * f), NAN));
            Tensor gate = f32({m, f}, std::vector<float>(size_t(m * f))),
                   up = f32({m, f}, std::vector<float>(size_t(m * f)));
            gpu_->matmul_silu_mul(tx, l, gate, up, act);
            std::vector<double> gu, mag;
            reference(h, x, m, bias, gu, mag);
            std::vector<double> want(size_t(m * f)), tol(size_t(m * f));
            for (int64_t r = 0; r < m; ++r)
              for (int64_t j = 0; j < f; ++j) {
                const double g = gu[size_t(r * 2 * f + j)], u = gu[size_t(r * 2 * f + f + j)];
                const double s = g / (1 + std::exp(-g));
                want[size_t(r * f + j)] = s * u;
                // silu' <= 1.1: the errors of g and u carry over scaled by |u| and |silu(g)|.
                tol[size_t(r * f + j)] = (2e-6 * mag[size_t(r * 2 * f + j)] + 1e-6) * 1.1 * std::fabs(u) +
                                         (2e-6 * mag[size_t(r * 2 * f + f + j)] + 1e-6) * std::fabs(s) +
                                         1e-6 * std::fabs(s * u);
                // BF16 weights, several rows, no bias: one GEMM writes g and u in BF16 (CudaBackend::
                // stacked_silu_mul), each rounded by at most 2^-9 relative before the SiLU product.
                if (v.dtype == DType::BF16 && m > 1 && !with_bias)
                  tol[size_t(r * f + j)] += 0x1p-8 * (1.1 * std::fabs(g) + std::fabs(s)) * std::fabs(u);
              }
            const std::vector<float> got = read(act);
            for (size_t i = 0; i < got.size(); ++i)
              if (!(std::fabs(got[i] - want[i]) <= tol[i])) {
                ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
                break;
              }
            // The next product reads act through its BF16 copy (swapped in by matmul_silu_mul): it must be
            // act's values, not the input's copy or a stale one.
            const HostWeight down = make_weight(kVariants[0], 5, f, ++seed);
            Tensor out = f32({m, 5}, std::vector<float>(size_t(m * 5), NAN));
            gpu_->matmul(act, linear(down, {}), out);
            std::vector<float> actr = got;
            for (float& e : actr) e = bf16_round(e);
            std::vector<double> dw, dmag;
            reference(down, actr, m, {}, dw, dmag);
            expect_matches(read(out), dw, dmag, what + " (next product)", m > 1 ? 2e-5 : 2e-6);
          }
        }
      }
    }
}

// v5 reads x as the FP8 GEMM and the CPU backend do (W8A8): each activation row quantized per token
// (quantize_fp8_activation_row, from the BF16 values the kernel reads) - the reference here, in float64:
// out[r, c] = s_r * sum_i W[c, i] q[r, i] + bias[c]. Its products are exact and each 64-column chunk's sum
// goes through a fresh F32 tensor-core fragment, so the bound is F32 summation's (1e-5 of sum |w x|, 5x the
// other kernels'); a kernel reading x in BF16 misses it by x's E4M3 rounding (~2^-5), so passing also shows
// that v5 ran. Shapes: one chunk to long rows, rows across tile ends (1, 37, 133, 8193), the 8B MLP's
// (14336 x 4096 and 4096 x 14336 with their SiLU products), m = 1..16 (one and two n-tiles), biases,
// per-tensor and per-channel scales, with and without the staging, 2 and 4 chunks per batch (the K split's
// choices vary with them), plain products with one and three outputs, SiLU products.
// K = 272 (not whole chunks) is declined and runs on the measured kernel, weight-only.
std::vector<double> w8a8_reference(const HostWeight& h, const std::vector<float>& x, int64_t m,
                                   const std::vector<float>& bias, std::vector<double>& mag) {
  std::vector<double> out(size_t(m * h.n));
  mag.assign(out.size(), 0.0);
  std::vector<float> q(size_t(h.k));
  for (int64_t r = 0; r < m; ++r) {
    const double s = quantize_fp8_activation_row(x.data() + r * h.k, h.k, q.data());
    for (int64_t c = 0; c < h.n; ++c) {
      double acc = 0, a = 0;
      for (int64_t i = 0; i < h.k; ++i) {
        const double p = double(h.deq[size_t(c * h.k + i)]) * q[size_t(i)] * s;
        acc += p;
        a += std::fabs(p);
      }
      out[size_t(r * h.n + c)] = acc + (bias.empty() ? 0.0 : bias[size_t(c)]);
      mag[size_t(r * h.n + c)] = a;
    }
  }
  return out;
}

TEST_F(CudaGemvTest, W8a8KernelMatchesQuantizedReference) {
  const KernelScope scope(DType::F8_E4M3, GemvKernel::V5);
  struct Shape {
    int64_t k, n;
    std::vector<int64_t> ms;
  };
  const Shape shapes[] = {{64, 37, {1, 2, 8, 9, 16}},
                          {192, 133, {1, 5, 16}},
                          {4096, 37, {1, 3}},
                          {14336, 16, {1, 6}},  // 6 rows of codes: 86 KB of the 96 (tcs::kMaxXBytes)
                          {4096, 8193, {1}},
                          // The 8B / Mistral MLP at batch 1 (the down projection; gate/up with f = 14336):
                          // hundreds of tiles over long rows, so the K split and the staging take other
                          // choices than in the short shapes.
                          {14336, 4096, {1}},
                          {4096, 14336, {1}}};
  uint32_t seed = 2100;
  // Staged before the PDL wait or not.
  for (const int smem_kb : {96, 0}) {
    cuda::set_gemv_v5_smem_kb(smem_kb);
    for (const Variant& v : {kVariants[1], kVariants[2]})
      for (const Shape& sh : shapes) {
        if (sh.n >= 4096 && !v.per_channel) continue;  // the long cases once per plan
        const HostWeight h = make_weight(v, sh.n, sh.k, ++seed);
        for (int64_t m : sh.ms) {
          const std::string what = v.name + " [v5] smem=" + std::to_string(smem_kb) +
                                   " n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k) +
                                   " m=" + std::to_string(m);
          std::vector<float> x = randoms(static_cast<size_t>(m * sh.k), ++seed);
          for (float& e : x) e = bf16_round(e);
          const std::vector<float> bias = m % 2 == 1 ? randoms(size_t(sh.n), ++seed) : std::vector<float>{};
          std::vector<double> mag;
          const std::vector<double> want = w8a8_reference(h, x, m, bias, mag);
          const Linear l = linear(h, bias);
          Tensor tx = f32({m, sh.k}, x), out = f32({m, sh.n}, std::vector<float>(size_t(m * sh.n), NAN));
          gpu_->matmul(tx, l, out);
          expect_matches(read(out), want, mag, what, 1e-5);
          if (sh.n < 48 || sh.n > 8193 || m != 1) continue;
          // Three outputs cutting through tiles (and, for 8193 rows, through the 16 rows of one tile).
          const int64_t parts[3] = {sh.n / 2 + 1, sh.n / 4 - 1, sh.n - (sh.n / 2 + 1) - (sh.n / 4 - 1)};
          Tensor outs[3];
          for (int i = 0; i < 3; ++i)
            outs[i] = f32({m, parts[i]}, std::vector<float>(size_t(m * parts[i]), NAN));
          Tensor* ptrs[] = {&outs[0], &outs[1], &outs[2]};
          gpu_->matmul_split(tx, l, ptrs);
          std::vector<float> joined;
          for (int i = 0; i < 3; ++i) {
            const std::vector<float> part = read(outs[i]);
            joined.insert(joined.end(), part.begin(), part.end());
          }
          expect_matches(joined, want, mag, what + " split", 1e-5);
        }
        // The SiLU product of gate rows [0, f) over up rows [f, 2f): silu(g) * u of the W8A8 values.
        if (sh.n == 8193) continue;
        const int64_t f = sh.n;
        const HostWeight hs = make_weight(v, 2 * f, sh.k, ++seed);
        const Linear ls = linear(hs, {});
        for (int64_t m : sh.ms) {
          std::vector<float> x = randoms(static_cast<size_t>(m * sh.k), ++seed);
          for (float& e : x) e = bf16_round(e);
          std::vector<double> gmag;
          const std::vector<double> gu = w8a8_reference(hs, x, m, {}, gmag);
          Tensor tx = f32({m, sh.k}, x), act = f32({m, f}, std::vector<float>(size_t(m * f), NAN)),
                 gate = f32({m, f}, std::vector<float>(size_t(m * f))),
                 up = f32({m, f}, std::vector<float>(size_t(m * f)));
          gpu_->matmul_silu_mul(tx, ls, gate, up, act);
          const std::vector<float> got = read(act);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t j = 0; j < f; ++j) {
              const size_t gi = size_t(r * 2 * f + j), ui = size_t(r * 2 * f + f + j);
              const double g = gu[gi], u = gu[ui], sg = g / (1 + std::exp(-g));
              // Each sum within 1e-5 of its magnitude (SiLU's slope is at most 1.1), the fast SiLU a few
              // ulp.
              const double tol = (1e-5 * gmag[gi] + 1e-6) * 1.1 * std::fabs(u) +
                                 (1e-5 * gmag[ui] + 1e-6) * std::fabs(sg) + 1e-5 * std::fabs(sg * u);
              ASSERT_LE(std::fabs(got[size_t(r * f + j)] - sg * u), tol)
                  << v.name << " [v5] silu smem=" << smem_kb << " k=" << sh.k << " f=" << f << " m=" << m
                  << " row " << r << " col " << j;
            }
        }
      }
  }
  cuda::set_gemv_v5_smem_kb(-1);
  // Declined, so the product runs on the measured kernel (weight-only, BF16 x): rows that are not whole
  // 64-column chunks, and activation codes beyond the shared memory's 96 KB (9 rows of 14336 columns).
  for (const auto& [k, m] : {std::pair<int64_t, int64_t>{272, 1}, {14336, 9}}) {
    const HostWeight h = make_weight(kVariants[2], 37, k, ++seed);
    std::vector<float> x = randoms(size_t(m * k), ++seed);
    for (float& e : x) e = bf16_round(e);
    std::vector<double> want, mag;
    reference(h, x, m, {}, want, mag);
    const Linear l = linear(h, {});
    Tensor tx = f32({m, k}, x), out = f32({m, 37}, std::vector<float>(size_t(m * 37), NAN));
    gpu_->matmul(tx, l, out);
    expect_matches(read(out), want, mag,
                   "fp8 [v5 declines k=" + std::to_string(k) + " m=" + std::to_string(m) + "]", 2e-6);
  }
}

TEST_F(CudaGemvTest, FormatsWithoutKernelsAreRefused) {
  const int64_t k = 64, n = 8;
  Linear l;
  l.weight =
      Tensor(DType::Q4_0, {n, k}, upload(nullptr, size_t(n * row_bytes(DType::Q4_0, k))), Device::CUDA);
  Tensor x = f32({2, k}, randoms(2 * k, 1)), out = f32({2, n}, std::vector<float>(2 * n));
  EXPECT_THROW(gpu_->matmul(x, l, out), Error);
}

// The v2 kernel's step decoders (kernels_gemv_decode.h), run here on the host: for every 8-column step
// of every row, the bytes at the step's offsets decode to quant/'s dequantized values once the kernel's
// scale (and Q4_K min) is applied. Runs without a GPU.
uint32_t word_at(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

TEST(GemvStepDecoders, BytesBecomeMagicFloats) {
  namespace g = cuda::gemv;
  std::mt19937 rng(3);
  for (int t = 0; t < 1000; ++t) {
    const uint32_t w = static_cast<uint32_t>(rng());
    float out[4];
    g::bytes_magic(w, out);
    for (int b = 0; b < 4; ++b)
      ASSERT_EQ(out[b], 8388608.0f + float((w >> (8 * b)) & 0xffu)) << w << " " << b;
  }
}

// The kernel reads step s0 + 32u at u strides past step s0, and decodes it with s0's shifts.
TEST(GemvStepDecoders, OffsetsAreLinearInStepsOf32) {
  namespace g = cuda::gemv;
  for (int64_t s = 0; s < 64; ++s)
    for (int64_t u = 0; u < 20; ++u) {
      const int64_t t = s + 32 * u;
      EXPECT_EQ(g::fp8_offset(t), g::fp8_offset(s) + u * g::kFp8Stride);
      EXPECT_EQ(g::int4_offset(t), g::int4_offset(s) + u * g::kInt4Stride);
      EXPECT_EQ(g::int4_shift(t), g::int4_shift(s));
      for (int shift : {2, 3, 4}) EXPECT_EQ(t >> shift, (s >> shift) + u * (32 >> shift));  // INT4 groups
      EXPECT_EQ(g::q8_0_offset(t), g::q8_0_offset(s) + u * g::kQ8_0Stride);
      EXPECT_EQ(g::q8_0_block_offset(t), g::q8_0_block_offset(s) + u * g::kQ8_0Stride);
      EXPECT_EQ(g::q4_k_offset(t), g::q4_k_offset(s) + u * g::kQ4KStride);
      EXPECT_EQ(g::q4_k_block_offset(t), g::q4_k_block_offset(s) + u * g::kQ4KStride);
      EXPECT_EQ(g::q4_k_shift(t), g::q4_k_shift(s));
      EXPECT_EQ(g::q4_k_sub_block(t), g::q4_k_sub_block(s));
    }
}

TEST(GemvStepDecoders, MatchQuantDequantizers) {
  namespace g = cuda::gemv;
  const int64_t n = 5, k = 1024;
  const std::vector<float> w = randoms(size_t(n * k), 7, -3.0f, 3.0f);
  std::vector<float> deq(static_cast<size_t>(k));
  float out[8];
  {  // FP8 per channel
    const Fp8Weight q = quantize_fp8_weight(w.data(), n, k, Fp8Granularity::PerChannel);
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t* row = q.codes.data() + r * k;
      dequantize_fp8_row(row, q.scale[size_t(r)], deq.data(), k);
      for (int64_t s = 0; s < k / 8; ++s) {
        g::fp8x8(word_at(row + g::fp8_offset(s)), word_at(row + g::fp8_offset(s) + 4), out);
        for (int e = 0; e < 8; ++e)
          ASSERT_FLOAT_EQ(out[e] * q.scale[size_t(r)], deq[size_t(8 * s + e)]) << "fp8 " << r << " " << s;
      }
    }
  }
  for (int64_t group : {32, 64, 128}) {
    for (bool symmetric : {true, false}) {
      const Int4Weight q = quantize_int4_weight(w.data(), n, k, group, symmetric);
      const int64_t groups = k / group;
      const int shift = group == 32 ? 2 : group == 64 ? 3 : 4;  // log2(group / 8), as the kernel
      for (int64_t r = 0; r < n; ++r) {
        const uint8_t* row = q.codes.data() + r * k / 2;
        dequantize_int4_row(row, q.scale.data() + r * groups,
                            symmetric ? nullptr : q.zero.data() + r * groups, group, deq.data(), k);
        for (int64_t s = 0; s < k / 8; ++s) {
          const int64_t at = r * groups + (s >> shift);
          const float bias = g::magic(symmetric ? 8u : q.zero[size_t(at)]);
          g::int4x8(word_at(row + g::int4_offset(s)), word_at(row + g::int4_offset(s) + 4), g::int4_shift(s),
                    bias, out);
          const float scale = f16_to_f32(q.scale[size_t(at)]);
          for (int e = 0; e < 8; ++e)
            ASSERT_FLOAT_EQ(scale * out[e], deq[size_t(8 * s + e)])
                << "int4 g" << group << (symmetric ? " sym " : " asym ") << r << " " << s << " " << e;
        }
      }
    }
  }
  {  // Q8_0
    const int64_t rb = row_bytes(DType::Q8_0, k);
    std::vector<uint8_t> bytes(static_cast<size_t>(rb));
    for (int64_t r = 0; r < n; ++r) {
      quantize_row(DType::Q8_0, w.data() + r * k, bytes.data(), k);
      dequantize_row(DType::Q8_0, bytes.data(), deq.data(), k);
      for (int64_t s = 0; s < k / 8; ++s) {
        const uint8_t* q = bytes.data() + g::q8_0_offset(s);
        g::q8x8(word_at(q), word_at(q + 4), out);
        const uint8_t* d = bytes.data() + g::q8_0_block_offset(s);
        const float scale = g::half_float(static_cast<uint16_t>(d[0] | (d[1] << 8)));
        for (int e = 0; e < 8; ++e) ASSERT_FLOAT_EQ(out[e] * scale, deq[size_t(8 * s + e)]) << "q8_0 " << s;
      }
    }
  }
  {  // Q4_K
    const int64_t rb = row_bytes(DType::Q4_K, k);
    std::vector<uint8_t> bytes(static_cast<size_t>(rb));
    for (int64_t r = 0; r < n; ++r) {
      quantize_row(DType::Q4_K, w.data() + r * k, bytes.data(), k);
      dequantize_row(DType::Q4_K, bytes.data(), deq.data(), k);
      for (int64_t s = 0; s < k / 8; ++s) {
        const uint8_t* h = bytes.data() + g::q4_k_block_offset(s);
        float scale = 0, min = 0;
        g::q4_k_scale_min(word_at(h), word_at(h + 4), word_at(h + 8), word_at(h + 12), g::q4_k_sub_block(s),
                          &scale, &min);
        const uint8_t* q = bytes.data() + g::q4_k_offset(s);
        g::q4_k_x8(word_at(q), word_at(q + 4), g::q4_k_shift(s), out);
        for (int e = 0; e < 8; ++e)
          ASSERT_NEAR(scale * out[e] - min, deq[size_t(8 * s + e)], 1e-6 * std::fabs(deq[size_t(8 * s + e)]))
              << "q4_k " << r << " " << s << " " << e;
      }
    }
  }
}

// v4's INT4 run arithmetic (kernels_gemv_decode.h), run here on the host: a code byte placed under 0x3F is
// (128 + code) / 256 exactly; a run's X is its sum; and 256 times a run's term is scale * sum (code - z) x
// (quant/'s dequantized weights times x) within the FMA chain's rounding, which the 128 offset makes
// relative to scale * sum |x| rather than to the term (every group size, with and without zero points, zero
// points anywhere in 0..15). Runs without a GPU.
TEST(GemvStreamInt4Decoder, RunTermsMatchQuantDequantizers) {
  namespace g = cuda::gemv;
  for (uint32_t b = 0; b < 16; ++b)
    for (uint32_t i = 0; i < 4; ++i) {
      ASSERT_EQ(g::int4_half(b << (8 * i), i), 0.5f + float(b) / 256.0f) << "code " << b << " byte " << i;
      ASSERT_EQ(g::int4_scale_zero(0xabcdu, b), 0xabcdu | b << 16);
    }
  const int64_t n = 5, k = 1024;
  const std::vector<float> w = randoms(size_t(n * k), 9, -3.0f, 3.0f);
  std::vector<float> x = randoms(size_t(k), 10);
  for (float& e : x) e = bf16_round(e);
  std::vector<float> deq(static_cast<size_t>(k));
  for (int64_t r = 0; r < k / 32; ++r) {
    double sum = 0, abs = 0;
    for (int j = 0; j < 32; ++j) {
      sum += x[size_t(32 * r + j)];
      abs += std::fabs(x[size_t(32 * r + j)]);
    }
    ASSERT_NEAR(g::int4_run_sum(x.data() + 32 * r), sum, 0x1p-20 * abs) << "run " << r;
  }
  for (int64_t group : {32, 64, 128})
    for (bool symmetric : {true, false}) {
      Int4Weight q = quantize_int4_weight(w.data(), n, k, group, symmetric);
      std::mt19937 rz(static_cast<uint32_t>(group));
      for (uint8_t& z : q.zero) z = static_cast<uint8_t>(rz() % 16);
      const int64_t groups = k / group;
      for (int64_t row = 0; row < n; ++row) {
        const uint8_t* codes = q.codes.data() + row * k / 2;
        dequantize_int4_row(codes, q.scale.data() + row * groups,
                            symmetric ? nullptr : q.zero.data() + row * groups, group, deq.data(), k);
        for (int64_t r = 0; r < k / 32; ++r) {
          const size_t at = size_t(row * groups + r * 32 / group);
          uint32_t v[4];
          std::memcpy(v, codes + 16 * r, 16);
          const float* xr = x.data() + 32 * r;
          const uint32_t sz = g::int4_scale_zero(q.scale[at], symmetric ? 8u : q.zero[at]);
          const double got =
              double(g::int4_run_term(v, sz, xr, g::int4_run_sum(xr), 0.0f)) * g::kInt4RunFactor;
          double want = 0, abs = 0;
          for (int j = 0; j < 32; ++j) {
            want += double(deq[size_t(32 * r + j)]) * xr[j];
            abs += std::fabs(xr[j]);
          }
          // 33 roundings of partial sums below 1.12 sum |x| (f <= 0.56), times 256 and the scale.
          const double tol =
              33 * 1.12 * 256 * 0x1p-24 * f16_to_f32(q.scale[at]) * abs + 0x1p-22 * std::fabs(want);
          ASSERT_NEAR(got, want, tol)
              << "int4 g" << group << (symmetric ? " sym " : " asym ") << row << " run " << r;
        }
      }
    }
}

// The model of v4's INT4 products (model_v4_int4: the bits the stream-kernel tests require of the GPU)
// against the float64 reference within the GEMV's error bound, for the tests' shapes (8448 columns
// unsplit, 16384 split in 2 and 4) and every INT4 variant they run. Runs without a GPU.
TEST(GemvStreamInt4Decoder, ModelMatchesFloat64Reference) {
  uint32_t seed = 60;
  for (const Variant& v : kStreamInt4Variants)
    for (int ks : {1, 2, 4}) {
      const int64_t k = ks == 1 ? 8448 : 16384, n = 37;
      const HostWeight h = make_weight(v, n, k, ++seed);
      std::vector<float> x = randoms(size_t(k), ++seed);
      for (float& e : x) e = bf16_round(e);
      const std::vector<float> bias = randoms(size_t(n), ++seed);
      std::vector<double> want, mag;
      float64_product(h, x, 1, bias, want, mag);
      const std::vector<float> got = model_v4_int4(h, x, bias, ks);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-6 * mag[i] + 1e-6) << v.name << " ks=" << ks << " row " << i;
    }
}

// The v3 chunk decoders (kernels_gemv_decode.h): fragment j of a chunk holds the exact BF16 of columns
// 4p..4p+3 (p = piece(j)) of the chunk, as quant/ dequantizes them before the scale: the value (BF16),
// the E4M3 code's value, or INT4 code - zero point.
float bf16_half(uint32_t word, int half) {
  return cuda::gemv::bf16_bits_float((word >> (16 * half)) & 0xffffu);
}

// zz(c): the zero-point pair of chunk c (INT4); deq(i): the expected value of column i.
template <class Tc, class Zz, class Deq>
void expect_pieces(const uint8_t* row, int64_t k, Zz zz, Deq deq, const std::string& what) {
  for (int64_t c = 0; c < k / Tc::kCols; ++c) {
    uint32_t v[4];
    std::memcpy(v, row + 16 * c, 16);
    uint32_t frag[Tc::kMmas][2];
    Tc::decode(v, zz(c), frag);
    for (int j = 0; j < Tc::kMmas; ++j)
      for (int e = 0; e < 4; ++e) {
        const int64_t col = c * Tc::kCols + 4 * Tc::piece(j) + e;
        ASSERT_EQ(bf16_half(frag[j][e / 2], e % 2), deq(col)) << what << " chunk " << c << " j " << j;
      }
  }
}

TEST(GemvTensorCoreDecoders, PiecesMatchQuantDequantizers) {
  namespace g = cuda::gemv;
  const int64_t n = 3, k = 1024;
  std::vector<float> w = randoms(size_t(n * k), 11, -3.0f, 3.0f);
  // Zeros of both signs and E4M3's subnormals once scaled (per channel: the row's max becomes 448).
  w[5] = 0.0f;
  w[6] = -0.0f;
  w[7] = 3.0f * 0x1p-9f / 448.0f;
  w[8] = -3.0f * 0x1p-8f / 448.0f;
  std::vector<float> deq(static_cast<size_t>(k));
  auto deq_at = [&](int64_t i) { return deq[size_t(i)]; };
  auto no_zero = [](int64_t) { return 0u; };
  {  // BF16
    std::vector<uint8_t> bytes(size_t(k) * 2);
    for (int64_t i = 0; i < k; ++i) {
      const uint16_t b = f32_to_bf16(w[size_t(i)]);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
      deq[size_t(i)] = bf16_to_f32(b);
    }
    expect_pieces<g::TcBf16>(bytes.data(), k, no_zero, deq_at, "bf16");
  }
  {  // FP8: the code's value (the per-channel scale multiplies the F32 sum)
    const Fp8Weight q = quantize_fp8_weight(w.data(), n, k, Fp8Granularity::PerChannel);
    for (int64_t r = 0; r < n; ++r) {
      dequantize_fp8_row(q.codes.data() + r * k, 1.0f, deq.data(), k);
      expect_pieces<g::TcFp8>(q.codes.data() + r * k, k, no_zero, deq_at, "fp8 row " + std::to_string(r));
    }
    for (uint32_t c = 0; c < 256; ++c) {  // every code (NaN codes 0x7f / 0xff excepted)
      if ((c & 0x7f) == 0x7f) continue;
      uint32_t lo = 0, hi = 0;
      g::e4m3x4_bf16x4(c * 0x01010101u, lo, hi);
      const uint8_t code = static_cast<uint8_t>(c);
      float want = 0;
      dequantize_fp8_row(&code, 1.0f, &want, 1);
      for (int e = 0; e < 2; ++e) {
        ASSERT_EQ(bf16_half(lo, e), want) << "code " << c;
        ASSERT_EQ(bf16_half(hi, e), want) << "code " << c;
      }
    }
  }
  for (int64_t group : {32, 64, 128})
    for (bool symmetric : {true, false}) {
      const Int4Weight q = quantize_int4_weight(w.data(), n, k, group, symmetric);
      const int64_t groups = k / group;
      std::vector<uint8_t> codes(static_cast<size_t>(k));
      for (int64_t r = 0; r < n; ++r) {
        auto zero = [&](int64_t i) {
          return symmetric ? 8u : uint32_t{q.zero[size_t(r * groups + i / group)]};
        };
        unpack_int4_row(q.codes.data() + r * k / 2, codes.data(), k);
        for (int64_t i = 0; i < k; ++i) deq[size_t(i)] = float(codes[size_t(i)]) - float(zero(i));
        expect_pieces<g::TcInt4>(
            q.codes.data() + r * k / 2, k, [&](int64_t c) { return g::int4_zero_pair(zero(c * 32)); }, deq_at,
            "int4 g" + std::to_string(group) + (symmetric ? " sym" : " asym") + " row " + std::to_string(r));
      }
    }
}

// A host model of the v3 kernel's operands (kernels_gemv_tc.cu gemv_tc_kernel, kernels_gemv_decode.h): per
// CTA of 16 rows and per 4-chunk set, lane (g, t) puts the fragments of chunk 4c + t of rows g and
// g + 8 into the A operand (PTX m16n8k16 layout: a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g,
// 2t+8..), a3 = (g + 8, 2t+8..)), and x into B column n = 8 nt + g (b0 = (2t..2t+1, n), b1 = (2t+8..,
// n)): activation row n / S where lane t's subset is n % S, zeros elsewhere; each set's product times
// the group scale of (row, subset n % S). Splitting sets among warps only reorders the sum, so the model
// walks them in order. Checked against the float64 reference for every M bucket and subset count.
std::vector<double> model_v3(DType dtype, const std::vector<uint8_t>& bytes, int64_t n, int64_t k,
                             const std::vector<uint16_t>& scale, const std::vector<uint8_t>& zero,
                             int64_t group, const std::vector<float>& x, int64_t m) {
  namespace g = cuda::gemv;
  const int kcols = dtype == DType::BF16 ? 8 : dtype == DType::F8_E4M3 ? 16 : 32;
  const int mmas = kcols / 4, subsets = dtype == DType::INT4 ? int(128 / group) : 1;
  const int64_t rb = row_bytes(dtype, k), chunks = rb / 16, sets = chunks / 4, groups = group ? k / group : 0;
  const int mr = m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16, nt_count = mr * subsets > 8 ? 2 : 1;
  auto frags = [&](int64_t row, int64_t chunk, uint32_t(&f)[8][2]) {
    uint32_t v[4];
    std::memcpy(v, bytes.data() + row * rb + 16 * chunk, 16);
    if (dtype == DType::BF16) {
      uint32_t t[2][2];
      g::TcBf16::decode(v, 0, t);
      std::memcpy(f, t, sizeof t);
    } else if (dtype == DType::F8_E4M3) {
      uint32_t t[4][2];
      g::TcFp8::decode(v, 0, t);
      std::memcpy(f, t, sizeof t);
    } else {
      const uint32_t z = zero.empty() ? 8u : zero[size_t(row * groups + chunk * 32 / group)];
      g::TcInt4::decode(v, g::int4_zero_pair(z), f);
    }
  };
  auto piece = [&](int j) { return dtype == DType::INT4 ? g::TcInt4::piece(j) : j; };
  std::vector<double> out(size_t(m * n), 0.0);
  for (int64_t tile = 0; tile < n; tile += 16) {
    double acc[16][16] = {};
    for (int64_t c = 0; c < sets; ++c)
      for (int nt = 0; nt < nt_count; ++nt) {
        double cc[16][8] = {};
        uint32_t f[2][4][8][2];  // [row half][lane t][mma][register], per lane g below
        for (int j = 0; j < mmas; ++j) {
          double a[16][16] = {}, b[16][8] = {};
          for (int lane = 0; lane < 32; ++lane) {
            const int gi = lane / 4, t = lane % 4;
            for (int h = 0; h < 2; ++h) {
              const int64_t row = std::min(tile + gi + 8 * h, n - 1);
              frags(row, 4 * c + t, f[h][t]);
              const uint32_t r0 = f[h][t][j][0], r1 = f[h][t][j][1];
              a[gi + 8 * h][2 * t] = bf16_half(r0, 0);
              a[gi + 8 * h][2 * t + 1] = bf16_half(r0, 1);
              a[gi + 8 * h][2 * t + 8] = bf16_half(r1, 0);
              a[gi + 8 * h][2 * t + 9] = bf16_half(r1, 1);
            }
            const int col = 8 * nt + gi;
            const bool on = subsets == 1 || (col % subsets == g::tc_subset(t, subsets) && col / subsets < m);
            const int64_t xrow = std::min<int64_t>(col / subsets, m - 1);
            const int64_t x0 = (4 * c + t) * kcols + 4 * piece(j);
            for (int e = 0; e < 4; ++e)
              b[2 * t + (e / 2) * 8 + e % 2][gi] = on ? x[size_t(xrow * k + x0 + e)] : 0.0;
          }
          for (int r = 0; r < 16; ++r)
            for (int col = 0; col < 8; ++col)
              for (int kk = 0; kk < 16; ++kk) cc[r][col] += a[r][kk] * b[kk][col];
        }
        for (int r = 0; r < 16; ++r)
          for (int col = 0; col < 8; ++col) {
            const int bc = 8 * nt + col;
            double s = 1;
            if (dtype == DType::INT4) {
              const int64_t row = std::min(tile + r, n - 1);
              s = f16_to_f32(scale[size_t(row * groups + c * subsets + bc % subsets)]);
            }
            acc[r][bc] += cc[r][col] * s;
          }
      }
    for (int64_t i = 0; i < m; ++i)
      for (int r = 0; r < 16 && tile + r < n; ++r) {
        double v = 0;
        for (int sub = 0; sub < subsets; ++sub) v += acc[r][i * subsets + sub];
        out[size_t(i * n + tile + r)] = v;
      }
  }
  return out;
}

TEST(GemvTensorCoreDecoders, OperandModelMatchesFloat64Reference) {
  uint32_t seed = 40;
  const Variant variants[] = {{"bf16", DType::BF16},
                              {"fp8", DType::F8_E4M3, 0, true, true},
                              {"int4 g32 asym", DType::INT4, 32, false},
                              {"int4 g64 sym", DType::INT4, 64, true},
                              {"int4 g128 asym", DType::INT4, 128, false}};
  for (const Variant& v : variants) {
    const int64_t k = v.dtype == DType::BF16 ? 64 : v.dtype == DType::F8_E4M3 ? 128 : 256, n = 19;
    const HostWeight h = make_weight(v, n, k, ++seed);
    const int subsets = v.dtype == DType::INT4 ? int(128 / v.group) : 1;
    for (int64_t m : {1, 2, 5, 9, 16}) {
      if ((m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16) * subsets > 16) continue;  // v1's
      std::vector<float> x = randoms(size_t(m * k), ++seed);
      for (float& e : x) e = bf16_round(e);
      std::vector<double> want, mag;
      float64_product(h, x, m, {}, want, mag);
      std::vector<double> got = model_v3(v.dtype, h.bytes, n, k, h.int4_scale, h.int4_zero, h.group, x, m);
      for (size_t i = 0; i < got.size(); ++i) {
        const size_t row = i % size_t(n);
        const double s = v.dtype == DType::F8_E4M3 ? h.fp8_scale[h.fp8_scale.size() == 1 ? 0 : row] : 1.0;
        // (the reference rounds each dequantized weight to F32: 2^-24 relative)
        ASSERT_NEAR(got[i] * s, want[i], 1e-7 * mag[i] + 1e-12) << v.name << " m=" << m << " element " << i;
      }
    }
  }
}

// Logits of a few decode steps: max |a - b| relative to the largest |logit|.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

TEST_F(CudaGemvTest, FusedModelMatchesUnfusedModel) {
  CudaBackendOptions plain;
  plain.gemv = false;
  auto ref_backend = make_cuda_backend(0, plain);
  auto fused = Model::load("dummy:tiny:bf16", *gpu_);
  auto unfused = Model::load("dummy:tiny:bf16", *ref_backend);
  const LayerWeights& l = fused->weights().layers[0];
  ASSERT_FALSE(l.qkv.weight.empty());
  ASSERT_FALSE(l.gate_up.weight.empty());
  EXPECT_EQ(l.q.weight.data, l.qkv.weight.data) << "q is a view of the fused weight";
  EXPECT_EQ(l.up.weight.data, static_cast<char*>(l.gate_up.weight.data) + l.gate.weight.nbytes());
  EXPECT_TRUE(unfused->weights().layers[0].qkv.weight.empty());
  EXPECT_EQ(fused->weight_bytes_per_token(), unfused->weight_bytes_per_token());
  // Decode steps with the norms fused into the one-row products (kernels_gemv.h) and without.
  for (int norm_fusion : {0, 1}) {
    SCOPED_TRACE(norm_fusion ? "norm fusion on" : "norm fusion off");
    cuda::set_gemv_norm_fusion(norm_fusion);
    SequenceRunner a(*fused, 64), b(*unfused, 64);
    std::vector<float> la = a.step({1, 17, 300, 42, 5, 9, 77, 128, 3}),
                       lb = b.step({1, 17, 300, 42, 5, 9, 77, 128, 3});
    EXPECT_LE(relative_gap(la, lb), 2e-2) << "prefill";
    for (int i = 0; i < 12; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(lb.begin(), lb.end()) - lb.begin());
      la = a.step({next});
      lb = b.step({next});
      EXPECT_LE(relative_gap(la, lb), 2e-2) << "decode step " << i;
    }
  }
  cuda::set_gemv_norm_fusion(-1);
}

TEST_F(CudaGemvTest, NativeGgufQuantizedModelMatchesCpu) {
  auto cpu = make_cpu_backend();
  for (const char* spec : {"dummy:tiny:q8_0", "dummy:tiny:q4_k"}) {
    SCOPED_TRACE(spec);
    auto on_gpu = Model::load(spec, *gpu_);
    auto on_cpu = Model::load(spec, *cpu);
    EXPECT_EQ(on_gpu->weights().layers[0].down.weight.dtype, on_cpu->weights().layers[0].down.weight.dtype)
        << "kept in its stored format on CUDA";
    SequenceRunner a(*on_gpu, 64), b(*on_cpu, 64);
    // 20 prompt tokens: the prefill products take the GEMV in chunks of 16 rows.
    std::vector<int32_t> prompt(20);
    for (int i = 0; i < 20; ++i) prompt[size_t(i)] = 3 + 11 * i;
    std::vector<float> la = a.step(prompt), lb = b.step(prompt);
    // The CPU backend quantizes activations to 8 bits for these formats; BF16 here: a loose bound that a
    // wrong block layout (errors of order 1) still fails.
    EXPECT_LE(relative_gap(la, lb), 5e-2) << "prefill";
    for (int i = 0; i < 6; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(lb.begin(), lb.end()) - lb.begin());
      la = a.step({next});
      lb = b.step({next});
      EXPECT_LE(relative_gap(la, lb), 5e-2) << "decode step " << i;
    }
  }
}

}  // namespace
}  // namespace inferx
