// The quantized GEMM of large row counts (backend/cuda/quantized_gemm.h): FP8 W8A8 through cuBLASLt and
// the dequantizing BF16 path for INT4 / Q8_0 / Q4_K, each against the CPU backend on the same quantized
// weights and against a double-precision product of the dequantized weights written here; then whole tiny
// models quantized at load (fp8, int4, fp8-int4) against the CPU backend's quantized model, and a dummy
// model generated quantized on the device. GPU tests skip without a GPU (fail with INFERX_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dot_kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_quant_math.h"
#include "backend/cuda/quantized_gemm.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "quant/fp8.h"
#include "quant/gguf_blocks.h"
#include "quant/int4.h"
#include "quant/plan.h"
#include "text/tokenizer.h"

namespace inferx {
namespace {

// NaN entries of a downloaded tensor (outputs poisoned with NaN: how many a path left unwritten).
int64_t nans(const std::vector<float>& v) {
  return std::count_if(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

using cuda::QuantizedGemm;

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// max |got - want| <= rel * max |want| (+ a tiny floor), with the worst element reported.
void expect_close_to_scale(const std::vector<float>& got, const std::vector<double>& want, double rel,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, worst = 0;
  size_t at = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  ASSERT_GT(scale, 0.0) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= worst)) {  // NaN counts as the worst
      worst = std::isnan(d) ? INFINITY : d;
      at = i;
    }
  }
  EXPECT_LE(worst, rel * scale + 1e-6) << what << ": element " << at << " got " << got[at] << " want "
                                       << want[at] << " (output scale " << scale << ")";
}

// The largest |a - b| as a fraction of max |b|: how far a perturbation moved an output.
double moved_by(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, worst = 0;
  for (size_t i = 0; i < b.size() && i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(double(b[i])));
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  }
  return scale > 0 ? worst / scale : 0.0;
}

// Host Tensors for the supports()/prefers() checks: never dereferenced.
Tensor fake(DType t, std::initializer_list<int64_t> shape, Device d = Device::CUDA) {
  static char byte;
  return Tensor(t, shape, &byte, d);
}

TEST(QuantizedGemmDispatch, SupportsTheFormatsWithValidScales) {
  const int64_t n = 48, k = 256;
  Linear fp8;
  fp8.weight = fake(DType::F8_E4M3, {n, k});
  fp8.scale = fake(DType::F32, {n});
  EXPECT_TRUE(QuantizedGemm::supports(fp8));
  fp8.scale = fake(DType::F32, {1});
  EXPECT_TRUE(QuantizedGemm::supports(fp8));
  fp8.scale = fake(DType::F32, {n - 1});  // neither per tensor nor per channel
  EXPECT_FALSE(QuantizedGemm::supports(fp8));
  fp8.scale = fake(DType::F16, {n});
  EXPECT_FALSE(QuantizedGemm::supports(fp8));
  Linear fp8_odd;  // K not a multiple of 16 (cuBLASLt FP8's requirement): taken, through BF16
  fp8_odd.weight = fake(DType::F8_E4M3, {n, 40});
  fp8_odd.scale = fake(DType::F32, {1});
  EXPECT_TRUE(QuantizedGemm::supports(fp8_odd));
  Linear host = fp8;  // host memory is never taken
  host.scale = fake(DType::F32, {1});
  host.weight = fake(DType::F8_E4M3, {n, k}, Device::CPU);
  EXPECT_FALSE(QuantizedGemm::supports(host));

  Linear int4;
  int4.weight = fake(DType::INT4, {n, k});
  int4.group_size = 64;
  int4.scale = fake(DType::F16, {n, k / 64});
  EXPECT_TRUE(QuantizedGemm::supports(int4));
  int4.zero = fake(DType::U8, {n, k / 64});
  EXPECT_TRUE(QuantizedGemm::supports(int4));
  int4.input_perm = fake(DType::I32, {k});
  EXPECT_TRUE(QuantizedGemm::supports(int4));
  int4.group_size = 48;
  EXPECT_FALSE(QuantizedGemm::supports(int4));
  int4.group_size = 64;
  int4.zero = fake(DType::U8, {n, k / 32});
  EXPECT_FALSE(QuantizedGemm::supports(int4));

  for (DType t : {DType::Q8_0, DType::Q4_K}) {
    Linear q;
    q.weight = fake(t, {n, k});
    EXPECT_TRUE(QuantizedGemm::supports(q)) << dtype_name(t);
  }
  Linear q40;  // no CUDA kernel reads Q4_0 / Q6_K
  q40.weight = fake(DType::Q4_0, {n, k});
  EXPECT_FALSE(QuantizedGemm::supports(q40));
  Linear bf16;
  bf16.weight = fake(DType::BF16, {n, k});
  EXPECT_FALSE(QuantizedGemm::supports(bf16));
}

TEST(QuantizedGemmDispatch, LeavesDecodeSizedProductsToTheGemv) {
  for (DType t : {DType::F8_E4M3, DType::INT4, DType::Q8_0, DType::Q4_K}) {
    Linear w;
    w.weight = fake(t, {32, 256});
    EXPECT_FALSE(QuantizedGemm::prefers(w, 1)) << dtype_name(t);
    EXPECT_FALSE(QuantizedGemm::prefers(w, 16)) << dtype_name(t);  // one GEMV launch
    EXPECT_TRUE(QuantizedGemm::prefers(w, 17)) << dtype_name(t);
    EXPECT_FALSE(QuantizedGemm::prefers_fused(w, 20)) << dtype_name(t);
    EXPECT_TRUE(QuantizedGemm::prefers_fused(w, 64)) << dtype_name(t);
    EXPECT_TRUE(QuantizedGemm::prefers_fused(w, 4000)) << dtype_name(t);
  }
}

// A quantized layer in host bytes plus its dequantized weight (the reference).
struct HostLinear {
  DType dtype = DType::F32;
  int64_t n = 0, k = 0, group = 0;
  std::vector<uint8_t> weight, scale, zero;  // raw bytes
  std::vector<int32_t> perm;
  std::vector<float> bias;
  std::vector<double> dequant;  // [n, k], in the layer's column order
};

HostLinear make_layer(DType t, int64_t n, int64_t k, uint32_t seed, bool per_channel = true,
                      int64_t group = 0, bool symmetric = true) {
  HostLinear h;
  h.dtype = t;
  h.n = n;
  h.k = k;
  h.group = group;
  const std::vector<float> w = random_floats(static_cast<size_t>(n * k), seed, -0.5f, 0.5f);
  std::vector<float> row(static_cast<size_t>(k));
  h.dequant.resize(static_cast<size_t>(n * k));
  auto keep_row = [&](int64_t r) {
    for (int64_t c = 0; c < k; ++c) h.dequant[static_cast<size_t>(r * k + c)] = row[static_cast<size_t>(c)];
  };
  if (t == DType::F8_E4M3) {
    const Fp8Weight q = quantize_fp8_weight(
        w.data(), n, k, per_channel ? Fp8Granularity::PerChannel : Fp8Granularity::PerTensor);
    h.weight = q.codes;
    h.scale.resize(q.scale.size() * 4);
    std::memcpy(h.scale.data(), q.scale.data(), h.scale.size());
    for (int64_t r = 0; r < n; ++r) {
      dequantize_fp8_row(q.codes.data() + r * k, q.scale[q.scale.size() == 1 ? 0 : static_cast<size_t>(r)],
                         row.data(), k);
      keep_row(r);
    }
  } else if (t == DType::INT4) {
    const Int4Weight q = quantize_int4_weight(w.data(), n, k, group, symmetric);
    h.weight = q.codes;
    h.scale.resize(q.scale.size() * 2);
    std::memcpy(h.scale.data(), q.scale.data(), h.scale.size());
    h.zero = q.zero;
    const int64_t groups = k / group;
    for (int64_t r = 0; r < n; ++r) {
      dequantize_int4_row(q.codes.data() + r * k / 2, q.scale.data() + r * groups,
                          q.symmetric() ? nullptr : q.zero.data() + r * groups, group, row.data(), k);
      keep_row(r);
    }
  } else {
    const int64_t rb = row_bytes(t, k);
    h.weight.resize(static_cast<size_t>(n * rb));
    for (int64_t r = 0; r < n; ++r) {
      quantize_row(t, w.data() + r * k, h.weight.data() + r * rb, k);
      dequantize_row(t, h.weight.data() + r * rb, row.data(), k);
      keep_row(r);
    }
  }
  return h;
}

// The element formats on the host: kernels_quant_math.h is the code the kernels run (host+device), so
// its decoding can be checked here without a GPU against quant/'s reference functions.
TEST(QuantizedGemmFormats, Fp8ConversionsMatchQuantFp8) {
  for (int c = 0; c < 256; ++c) {
    const float want = fp8_e4m3_to_f32(static_cast<uint8_t>(c)),
                got = cuda::fp8_to_float(static_cast<uint8_t>(c));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << c;
    else
      EXPECT_EQ(got, want) << c;
  }
  std::vector<float> xs = random_floats(20000, 77, -600.0f, 600.0f);
  for (int c = 0; c < 255; ++c) {  // exact values and the midpoints between neighbours (ties to even)
    const float a = fp8_e4m3_to_f32(static_cast<uint8_t>(c)),
                b = fp8_e4m3_to_f32(static_cast<uint8_t>(c + 1));
    if (std::isnan(a) || std::isnan(b)) continue;
    xs.push_back(a);
    xs.push_back(0.5f * (a + b));
  }
  for (float x : {0.0f, -0.0f, 1e-30f, 448.0f, 464.0f, 1e9f, -1e9f}) xs.push_back(x);
  for (float x : xs) EXPECT_EQ(cuda::float_to_fp8(x), f32_to_fp8_e4m3(x)) << x;
}

TEST(QuantizedGemmFormats, DequantizeMatchesQuantReferences) {
  std::vector<HostLinear> layers;
  layers.push_back(make_layer(DType::F8_E4M3, 5, 96, 1, true));
  layers.push_back(make_layer(DType::F8_E4M3, 5, 96, 2, false));
  for (int64_t g : {32, 64, 128})
    for (bool sym : {true, false}) layers.push_back(make_layer(DType::INT4, 5, 2 * g, 3, true, g, sym));
  layers.push_back(make_layer(DType::Q8_0, 5, 96, 4));
  layers.push_back(make_layer(DType::Q4_K, 5, 512, 5));
  for (const HostLinear& h : layers) {
    cuda::DequantWeight w;
    w.dtype = h.dtype;
    w.data = h.weight.data();
    w.k = h.k;
    if (h.dtype == DType::F8_E4M3) {
      w.fp8_scale = reinterpret_cast<const float*>(h.scale.data());
      w.per_channel = h.scale.size() / 4 > 1;
    } else if (h.dtype == DType::INT4) {
      w.int4_scale = reinterpret_cast<const uint16_t*>(h.scale.data());
      w.int4_zero = h.zero.empty() ? nullptr : h.zero.data();
      w.group = h.group;
    }
    double worst = 0;
    for (int64_t r = 0; r < h.n; ++r)
      for (int64_t c0 = 0; c0 < h.k; c0 += 8) {
        float v[8];
        cuda::dequantize8(w, r, c0, v);
        for (int e = 0; e < 8; ++e) {
          const double want = h.dequant[static_cast<size_t>(r * h.k + c0 + e)];
          worst = std::max(worst, std::fabs(v[e] - want) / (1e-6 + std::fabs(want)));
        }
      }
    EXPECT_LE(worst, 1e-6) << dtype_name(h.dtype) << " group " << h.group << (h.zero.empty() ? "" : " asym");
  }
}

// GPU tests --------------------------------------------------------------------------------------------

class QuantizedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    INFERX_SKIP_WITHOUT_GPU();
    CudaBackendOptions o;
    o.kv_cache_dtype = DType::F32;
    gpu_ = make_cuda_backend(0, o);
    cpu_ = make_cpu_backend({1});
    // The F32 accumulator (also when INFERX_CUDA_FP8_ACC is set); the BF16 one (the default) has its own
    // cases at its own tolerance.
    qgemm().set_bf16_accumulator(false);
  }

  Tensor on(Backend& b, DType t, std::initializer_list<int64_t> shape, const void* bytes, size_t n) {
    buffers_.push_back(b.allocate(std::max<size_t>(n, 1)));
    if (bytes) b.copy_to_device(buffers_.back()->data(), bytes, n);
    return Tensor(t, shape, buffers_.back()->data(), b.device());
  }
  std::vector<float> read(Backend& b, const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    b.synchronize();
    b.copy_to_host(v.data(), t.data, v.size() * 4);
    return v;
  }
  QuantizedGemm& qgemm() { return static_cast<CudaBackend&>(*gpu_).quantized_gemm(); }

  Linear upload(Backend& b, const HostLinear& h) {
    Linear l;
    l.weight = on(b, h.dtype, {h.n, h.k}, h.weight.data(), h.weight.size());
    if (h.dtype == DType::F8_E4M3)
      l.scale = on(b, DType::F32, {static_cast<int64_t>(h.scale.size() / 4)}, h.scale.data(), h.scale.size());
    if (h.dtype == DType::INT4) {
      l.scale = on(b, DType::F16, {h.n, h.k / h.group}, h.scale.data(), h.scale.size());
      if (!h.zero.empty()) l.zero = on(b, DType::U8, {h.n, h.k / h.group}, h.zero.data(), h.zero.size());
      l.group_size = h.group;
    }
    if (!h.perm.empty()) l.input_perm = on(b, DType::I32, {h.k}, h.perm.data(), h.perm.size() * 4);
    if (!h.bias.empty()) l.bias = on(b, DType::F32, {h.n}, h.bias.data(), h.bias.size() * 4);
    return l;
  }

  // Runs x [t, k] through both backends and the double reference; checks the GPU path taken.
  void check(const HostLinear& h, int64_t t, QuantizedGemm::Path want_path, double rel_exact, double rel_cpu,
             const std::string& what) {
    const std::vector<float> x = random_floats(static_cast<size_t>(t * h.k), 1000 + static_cast<uint32_t>(t));
    std::vector<double> ref(static_cast<size_t>(t * h.n));
    for (int64_t r = 0; r < t; ++r)
      for (int64_t j = 0; j < h.n; ++j) {
        double s = h.bias.empty() ? 0.0 : h.bias[static_cast<size_t>(j)];
        for (int64_t i = 0; i < h.k; ++i) {
          const int64_t src = h.perm.empty() ? i : h.perm[static_cast<size_t>(i)];
          s += h.dequant[static_cast<size_t>(j * h.k + i)] * x[static_cast<size_t>(r * h.k + src)];
        }
        ref[static_cast<size_t>(r * h.n + j)] = s;
      }
    const Linear wg = upload(*gpu_, h), wc = upload(*cpu_, h);
    const Tensor xg = on(*gpu_, DType::F32, {t, h.k}, x.data(), x.size() * 4);
    const Tensor xc = on(*cpu_, DType::F32, {t, h.k}, x.data(), x.size() * 4);
    Tensor og = on(*gpu_, DType::F32, {t, h.n}, nullptr, static_cast<size_t>(t * h.n) * 4);
    Tensor oc = on(*cpu_, DType::F32, {t, h.n}, nullptr, static_cast<size_t>(t * h.n) * 4);
    gpu_->matmul(xg, wg, og);
    cpu_->matmul(xc, wc, oc);
    const std::vector<float> got = read(*gpu_, og), cpu = read(*cpu_, oc);
    const std::string label =
        what + " t=" + std::to_string(t) + " n=" + std::to_string(h.n) + " k=" + std::to_string(h.k);
    const QuantizedGemm::Path path = qgemm().last_path();
    if (want_path == QuantizedGemm::Path::None) {  // FP8 with a shape cuBLASLt's FP8 kernels may refuse
      EXPECT_TRUE(path == QuantizedGemm::Path::Fp8 || path == QuantizedGemm::Path::Fp8OuterScale ||
                  path == QuantizedGemm::Path::Fp8ViaBf16)
          << label;
      if (path == QuantizedGemm::Path::Fp8ViaBf16) rel_cpu = std::max(rel_cpu, 1e-2);
    } else if (want_path == QuantizedGemm::Path::Fp8OuterScale) {  // taken when cuBLASLt offers it
      EXPECT_TRUE(path == QuantizedGemm::Path::Fp8 || path == QuantizedGemm::Path::Fp8OuterScale) << label;
      std::printf("[ path     ] %s: %s\n", label.c_str(),
                  path == QuantizedGemm::Path::Fp8OuterScale
                      ? "FP8 GEMM with outer-vector scales"
                      : "FP8 GEMM + epilogue (no outer-vector algorithm)");
    } else {
      EXPECT_EQ(path, want_path) << label;
    }
    expect_close_to_scale(got, std::vector<double>(cpu.begin(), cpu.end()), rel_cpu,
                          label + " vs CPU backend");
    expect_close_to_scale(got, ref, rel_exact, label + " vs dequantized reference");
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

// FP8 W8A8: the same E4M3 codes as the CPU backend (weights and per-token activations), so the only
// differences are summation order (tolerance 2e-3 of the output scale). Against the unquantized-activation
// double reference the FP8 rounding of x (3 mantissa bits) dominates: 5e-2 (the CPU backend is at 2.6e-2).
TEST_F(QuantizedGemmTest, Fp8MatchesTheCpuW8A8OnOddShapes) {
  // Output features a multiple of 16 (cuBLASLt FP8's requirement) with odd row counts and K = 13 * 16;
  // then 77 outputs, which may run through the BF16 fallback (either path is accepted there).
  // Both FP8 variants: cuBLASLt's outer-vector scales when offered (the default), and the plain FP8 GEMM
  // with the epilogue kernel.
  // The epilogue variant with the F32 and the BF16 accumulator (set_bf16_accumulator: each product rounded to
  // BF16, 2^-9 of its value, before scaling; 5e-3 of the output scale).
  for (int variant : {0, 1, 2}) {
    const bool outer = variant == 0, bf16_acc = variant == 2;
    qgemm().set_outer_scale(outer);
    qgemm().set_bf16_accumulator(bf16_acc);
    for (bool per_channel : {true, false})
      for (int64_t t : {17, 61, 300}) {
        HostLinear h = make_layer(DType::F8_E4M3, 80, 208, 7 + static_cast<uint32_t>(t), per_channel);
        if (t == 61) h.bias = random_floats(80, 3);
        check(h, t, outer ? QuantizedGemm::Path::Fp8OuterScale : QuantizedGemm::Path::Fp8, 5e-2,
              bf16_acc ? 5e-3 : 2e-3,
              std::string(per_channel ? "fp8 per-channel" : "fp8 per-tensor") + (outer ? " outer"
                                                                                 : bf16_acc
                                                                                     ? " epilogue bf16 acc"
                                                                                     : " epilogue"));
      }
  }
  qgemm().set_outer_scale(true);
  qgemm().set_bf16_accumulator(false);
  HostLinear odd = make_layer(DType::F8_E4M3, 77, 208, 8, true);
  odd.bias = random_floats(77, 3);
  check(odd, 33, QuantizedGemm::Path::None, 5e-2, 2e-3, "fp8 77 outputs");
  // K that cuBLASLt FP8 refuses (stories260K's down_proj: 172; 100: not a multiple of 8 either): the same
  // W8A8 values through BF16 (the activations' FP8 values are exact in BF16; code x scale of the weights is
  // rounded, 2^-9: 1e-2 against the CPU, as the 77-output case when it takes this path).
  for (int64_t k : {172, 100}) {
    HostLinear h = make_layer(DType::F8_E4M3, 64, k, 9 + static_cast<uint32_t>(k), k == 172);
    h.bias = random_floats(64, 4);
    check(h, 45, QuantizedGemm::Path::Fp8ViaBf16, 5e-2, 1e-2, "fp8 K " + std::to_string(k));
  }
}

// The FP8 GEMMs share the BF16 GEMM's algorithm autotuning (gemm_cublaslt.h): a new row bucket is tuned
// once (on the real operands), a second row count of the bucket reuses it, and tuning off
// (INFERX_GEMM_TUNE=0's switch) times nothing; every variant still matches the CPU W8A8.
TEST_F(QuantizedGemmTest, Fp8GemmIsTunedOncePerRowBucket) {
  HostLinear h = make_layer(DType::F8_E4M3, 256, 512, 31, true);
  h.bias = random_floats(256, 5);
  const uint64_t tunings = qgemm().tuning_stats().tunings;
  check(h, 1000, QuantizedGemm::Path::Fp8OuterScale, 5e-2, 2e-3, "fp8 tuned");
  const uint64_t after_first = qgemm().tuning_stats().tunings;
  EXPECT_GT(after_first, tunings);
  check(h, 900, QuantizedGemm::Path::Fp8OuterScale, 5e-2, 2e-3, "fp8 same bucket");
  EXPECT_EQ(qgemm().tuning_stats().tunings, after_first);
  qgemm().set_tuning(false);
  check(h, 300, QuantizedGemm::Path::Fp8OuterScale, 5e-2, 2e-3, "fp8 untuned");
  EXPECT_EQ(qgemm().tuning_stats().tunings, after_first);
  qgemm().set_tuning(true);
}

// The BF16 fallback of FP8 (used when cuBLASLt has no FP8 algorithm): the same W8A8 values rounded to
// BF16 (2^-9 relative): 1e-2 of the output scale against the CPU backend.
TEST_F(QuantizedGemmTest, Fp8FallbackThroughBf16MatchesTheCpuW8A8) {
  qgemm().set_force_dequant(true);
  HostLinear h = make_layer(DType::F8_E4M3, 130, 96, 21, true);
  h.bias = random_floats(130, 4);
  check(h, 45, QuantizedGemm::Path::Fp8ViaBf16, 5e-2, 1e-2, "fp8 via bf16");
  qgemm().set_force_dequant(false);
}

// FP8 fused projections: one FP8 GEMM over the stacked weight and one epilogue that splits the columns
// (q / k / v) or applies SiLU * up give the CPU backend's per-part W8A8 values (the same codes and scales;
// only the summation order differs). Column counts: multiples of 4 (the float4 epilogue) and, for the
// split, one that is not (the scalar epilogue).
TEST_F(QuantizedGemmTest, Fp8FusedProjectionsMatchTheCpuBackend) {
  for (bool bf16_acc : {false, true})  // the BF16 accumulator: 5e-3 (see Fp8MatchesTheCpuW8A8OnOddShapes)
    for (bool per_channel : {true, false})
      for (int64_t t : {64, 300}) {
        qgemm().set_bf16_accumulator(bf16_acc);
        // SiLU * up multiplies two rounded products: 2 x 2^-9 more of the element (H200: 5.7e-3 of the
        // output scale at an element near it), so 8e-3 there.
        const double tol = bf16_acc ? 5e-3 : 2e-3, tol_silu = bf16_acc ? 8e-3 : 2e-3;
        for (const std::vector<int64_t>& cols :
             {std::vector<int64_t>{96, 32, 32}, std::vector<int64_t>{58, 38}}) {
          const int64_t n = std::accumulate(cols.begin(), cols.end(), int64_t{0}), k = 208;
          SCOPED_TRACE(::testing::Message() << "split " << cols.size() << " per_channel " << per_channel
                                            << " t " << t << " bf16 acc " << bf16_acc);
          HostLinear h = make_layer(DType::F8_E4M3, n, k, 31 + static_cast<uint32_t>(t), per_channel);
          if (t == 300) h.bias = random_floats(static_cast<size_t>(n), 5);
          const std::vector<float> x = random_floats(static_cast<size_t>(t * k), 41);
          const Linear wg = upload(*gpu_, h), wc = upload(*cpu_, h);
          const Tensor xg = on(*gpu_, DType::F32, {t, k}, x.data(), x.size() * 4);
          const Tensor xc = on(*cpu_, DType::F32, {t, k}, x.data(), x.size() * 4);
          std::vector<Tensor> og, oc;
          for (int64_t c : cols) {
            og.push_back(on(*gpu_, DType::F32, {t, c}, nullptr, static_cast<size_t>(t * c) * 4));
            oc.push_back(on(*cpu_, DType::F32, {t, c}, nullptr, static_cast<size_t>(t * c) * 4));
          }
          std::vector<Tensor*> pg, pc;
          for (size_t j = 0; j < cols.size(); ++j) {
            pg.push_back(&og[j]);
            pc.push_back(&oc[j]);
          }
          gpu_->matmul_split(xg, wg, pg);
          cpu_->matmul_split(xc, wc, pc);
          EXPECT_EQ(qgemm().last_path(), QuantizedGemm::Path::Fp8Fused);
          for (size_t j = 0; j < cols.size(); ++j) {
            const std::vector<float> cpu = read(*cpu_, oc[j]);
            expect_close_to_scale(read(*gpu_, og[j]), std::vector<double>(cpu.begin(), cpu.end()), tol,
                                  "part " + std::to_string(j));
          }
        }
        // [G; U] with f = 96 and 40 (2f a multiple of 16, as the FP8 GEMM needs, makes f one of 4: float4s).
        for (int64_t f : {96, 40}) {
          const int64_t k = 208;
          SCOPED_TRACE(::testing::Message() << "silu f " << f << " per_channel " << per_channel << " t " << t
                                            << " bf16 acc " << bf16_acc);
          HostLinear h = make_layer(DType::F8_E4M3, 2 * f, k, 51 + static_cast<uint32_t>(t + f), per_channel);
          if (t == 64) h.bias = random_floats(static_cast<size_t>(2 * f), 6);
          const std::vector<float> x = random_floats(static_cast<size_t>(t * k), 42, -2.0f, 2.0f);
          const Linear wg = upload(*gpu_, h), wc = upload(*cpu_, h);
          const Tensor xg = on(*gpu_, DType::F32, {t, k}, x.data(), x.size() * 4);
          const Tensor xc = on(*cpu_, DType::F32, {t, k}, x.data(), x.size() * 4);
          const size_t bytes = static_cast<size_t>(t * f) * 4;
          Tensor gg = on(*gpu_, DType::F32, {t, f}, nullptr, bytes),
                 ug = on(*gpu_, DType::F32, {t, f}, nullptr, bytes),
                 outg = on(*gpu_, DType::F32, {t, f}, nullptr, bytes);
          Tensor gc = on(*cpu_, DType::F32, {t, f}, nullptr, bytes),
                 uc = on(*cpu_, DType::F32, {t, f}, nullptr, bytes),
                 outc = on(*cpu_, DType::F32, {t, f}, nullptr, bytes);
          gpu_->matmul_silu_mul(xg, wg, gg, ug, outg);
          cpu_->matmul_silu_mul(xc, wc, gc, uc, outc);
          EXPECT_EQ(qgemm().last_path(), QuantizedGemm::Path::Fp8Fused);
          const std::vector<float> cpu = read(*cpu_, outc);
          expect_close_to_scale(read(*gpu_, outg), std::vector<double>(cpu.begin(), cpu.end()), tol_silu,
                                "silu * up");
        }
      }
  qgemm().set_bf16_accumulator(false);
}

// The norm before the FP8 products fused into their activation quantization (QuantizedGemm::
// norm_matmul_split / norm_mlp, kernels_quant_fused.cu): the same codes and scales as add_rmsnorm + the
// quantizing products (and, for the MLP, SiLU * up + the down product's quantization), so against the
// unfused passes on the same backend only the GEMMs' own run-to-run differences remain (1e-6 of the
// output scale), the residual stream is updated the same (exactly), and the CPU backend agrees as for the
// unfused products. Row counts at the fused threshold and above, with and without the add (the MLP then
// writes over it, as in the model), per-channel and per-tensor scales, with and without biases.
TEST_F(QuantizedGemmTest, Fp8NormFusionMatchesTheUnfusedPasses) {
  // Both accumulators (the BF16 one: the SiLU pass reads BF16; the CPU backend rounds the same sums).
  for (bool bf16_acc : {false, true})
    for (bool per_channel : {true, false})
      for (int64_t t : {64, 300})
        for (bool with_add : {true, false}) {
          qgemm().set_bf16_accumulator(bf16_acc);
          cpu::set_fp8_bf16_accumulator(bf16_acc);
          // f: a multiple of 16 (the down GEMM's K; the SiLU pass then takes float4s); the down product
          // writes over the add.
          const int64_t k = 208, f = 112, n_down = k;
          SCOPED_TRACE(::testing::Message() << "bf16 acc " << bf16_acc << " per_channel " << per_channel
                                            << " t " << t << " add " << with_add);
          const std::vector<float> res = random_floats(static_cast<size_t>(t * k), 61, -2.0f, 2.0f),
                                   add = random_floats(static_cast<size_t>(t * k), 62),
                                   gamma = random_floats(static_cast<size_t>(k), 63, 0.5f, 1.5f);
          HostLinear qkv = make_layer(DType::F8_E4M3, 160, k, 71 + static_cast<uint32_t>(t), per_channel);
          HostLinear gu = make_layer(DType::F8_E4M3, 2 * f, k, 72 + static_cast<uint32_t>(t), per_channel);
          HostLinear dn = make_layer(DType::F8_E4M3, n_down, f, 73 + static_cast<uint32_t>(t), per_channel);
          if (t == 300) {
            qkv.bias = random_floats(160, 7);
            gu.bias = random_floats(static_cast<size_t>(2 * f), 8);
            dn.bias = random_floats(static_cast<size_t>(n_down), 9);
          }
          const size_t xb = res.size() * 4;
          struct Run {
            std::vector<float> residual, q, k, v, mlp, act;
          };
          // kind 0: GPU fused, 1: GPU unfused, 2: CPU.
          auto run = [&](int kind) {
            Backend& b = kind == 2 ? *cpu_ : *gpu_;
            if (kind < 2) qgemm().set_fused_passes(kind == 0);
            const Linear wq = upload(b, qkv), wg = upload(b, gu), wd = upload(b, dn);
            Tensor r = on(b, DType::F32, {t, k}, res.data(), xb),
                   a = on(b, DType::F32, {t, k}, add.data(), xb);
            Tensor g = on(b, DType::F32, {k}, gamma.data(), gamma.size() * 4);
            Tensor h = on(b, DType::F32, {t, k}, nullptr, xb);
            Tensor q = on(b, DType::F32, {t, 96}, nullptr, static_cast<size_t>(t * 96) * 4),
                   kk = on(b, DType::F32, {t, 32}, nullptr, static_cast<size_t>(t * 32) * 4),
                   v = on(b, DType::F32, {t, 32}, nullptr, static_cast<size_t>(t * 32) * 4);
            Tensor* outs[] = {&q, &kk, &v};
            b.norm_matmul_split(r, with_add ? &a : nullptr, g, 1e-5f, h, wq, outs);
            // The fused norm's own path, so that a fusion that did not engage fails (and the separate passes
            // must not report it).
            if (kind < 2) {
              EXPECT_EQ(qgemm().last_path() == QuantizedGemm::Path::Fp8NormFused, kind == 0);
            }
            Run out;
            out.q = read(b, q);
            out.k = read(b, kk);
            out.v = read(b, v);
            // The MLP on the updated residual, its output written over the add (as the model does).
            const size_t fb = static_cast<size_t>(t * f) * 4;
            Tensor gate = on(b, DType::F32, {t, f}, nullptr, fb), up = on(b, DType::F32, {t, f}, nullptr, fb),
                   act = on(b, DType::F32, {t, f}, nullptr, fb);
            Tensor proj = with_add ? a : on(b, DType::F32, {t, n_down}, nullptr, xb);
            b.norm_mlp(r, with_add ? &a : nullptr, g, 1e-5f, h, wg, gate, up, act, wd, proj, nullptr);
            // The fused norm's own path, so that a fusion that did not engage fails (and the separate passes
            // must not report it).
            if (kind < 2) {
              EXPECT_EQ(qgemm().last_path() == QuantizedGemm::Path::Fp8NormFused, kind == 0);
            }
            out.mlp = read(b, proj);
            out.residual = read(b, r);
            if (kind == 2) out.act = read(b, act);  // the CPU writes it (F32, before its FP8 codes)
            return out;
          };
          const Run fused = run(0), unfused = run(1), cpu = run(2);
          qgemm().set_fused_passes(true);
          EXPECT_EQ(fused.residual, unfused.residual);
          const auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
          expect_close_to_scale(fused.q, d(unfused.q), 1e-6, "q fused vs unfused");
          expect_close_to_scale(fused.k, d(unfused.k), 1e-6, "k fused vs unfused");
          expect_close_to_scale(fused.v, d(unfused.v), 1e-6, "v fused vs unfused");
          expect_close_to_scale(fused.mlp, d(unfused.mlp), 1e-6, "mlp fused vs unfused");
          expect_close_to_scale(fused.residual, d(cpu.residual), 1e-6, "residual vs CPU");
          // BF16 sums (both backends round them): two sums the summation orders put on either side of a
          // rounding boundary differ by one BF16 step, up to 2^-7 of the value (8 significant bits; the
          // step is 2^-7 of a value just above a power of two): 2e-3 + 2^-7 = 1e-2.
          const double tol = bf16_acc ? 1e-2 : 2e-3;
          expect_close_to_scale(fused.q, d(cpu.q), tol, "q vs CPU");
          expect_close_to_scale(fused.v, d(cpu.v), tol, "v vs CPU");
          // Two quantized products in a row: an activation that differs in its last bits between the
          // backends may take the neighbouring E4M3 code (as TinyModelQuantizedAtLoadMatchesTheCpuBackend):
          // 2e-2 of the scale. With BF16 sums, gate/up sums that differ in their last bits round to BF16
          // values a step (2^-8) apart, and such an activation takes the neighbouring code far more often
          // (measured: one output off by 3.1% of the scale, its row's largest term moved): there each
          // output may also differ by one E4M3 step (2^-3 of the value) of one activation of its row.
          if (!bf16_acc) {
            expect_close_to_scale(fused.mlp, d(cpu.mlp), 2e-2, "mlp vs CPU");
          } else {
            double scale = 0;
            for (float w : cpu.mlp) scale = std::max(scale, std::fabs(double(w)));
            int over = 0;
            for (int64_t r = 0; r < t; ++r)
              for (int64_t i = 0; i < n_down; ++i) {
                double flip = 0;  // the largest one-code change of one activation of row r in output i
                for (int64_t j = 0; j < f; ++j)
                  flip = std::max(flip, 0.125 * std::fabs(cpu.act[static_cast<size_t>(r * f + j)] *
                                                          dn.dequant[static_cast<size_t>(i * f + j)]));
                const size_t at = static_cast<size_t>(r * n_down + i);
                const double diff = std::fabs(double(fused.mlp[at]) - cpu.mlp[at]);
                if (!(diff <= 2e-2 * scale + flip) && over++ < 3)
                  ADD_FAILURE() << "mlp vs CPU: row " << r << " output " << i << " got " << fused.mlp[at]
                                << " want " << cpu.mlp[at] << " (scale " << scale << ", one flip " << flip
                                << ")";
              }
            EXPECT_EQ(over, 0) << "mlp outputs beyond 2e-2 of the scale + one activation code";
          }
        }
  qgemm().set_bf16_accumulator(false);
  cpu::set_fp8_bf16_accumulator(false);
}

// Deferred products (quantized_gemm.h): o and down leave their W8A8 epilogue to the norm that consumes them,
// which adds the values as it reads the BF16 sums. The residual stream, and so the codes of the norms and
// every product after them, must be those of the launched epilogues to the bit. A deferred product's own
// output stays unwritten (NaN here), which shows that the deferral engaged; a consumer that does not take
// it (a plain pre_norm) and a read of the output (copy_to_host) get the epilogue launched first.
TEST_F(QuantizedGemmTest, DeferredEpiloguesMatchTheLaunchedOnes) {
  qgemm().set_bf16_accumulator(true);  // deferral needs the BF16 sums
  for (bool per_channel : {true, false})
    for (int64_t t : {64, 300}) {
      const int64_t k = 208, f = 112, qd = 96;
      SCOPED_TRACE(::testing::Message() << "per_channel " << per_channel << " t " << t);
      HostLinear o = make_layer(DType::F8_E4M3, k, qd, 81 + static_cast<uint32_t>(t), per_channel);
      HostLinear gu = make_layer(DType::F8_E4M3, 2 * f, k, 82 + static_cast<uint32_t>(t), per_channel);
      HostLinear dn = make_layer(DType::F8_E4M3, k, f, 83 + static_cast<uint32_t>(t), per_channel);
      HostLinear qkv = make_layer(DType::F8_E4M3, 160, k, 84 + static_cast<uint32_t>(t), per_channel);
      if (t == 300) {
        o.bias = random_floats(static_cast<size_t>(k), 11);
        dn.bias = random_floats(static_cast<size_t>(k), 12);
      }
      const std::vector<float> res = random_floats(static_cast<size_t>(t * k), 91, -2.0f, 2.0f),
                               attn = random_floats(static_cast<size_t>(t * qd), 92),
                               g1 = random_floats(static_cast<size_t>(k), 93, 0.5f, 1.5f),
                               g2 = random_floats(static_cast<size_t>(k), 94, 0.5f, 1.5f),
                               nan(static_cast<size_t>(t * k), std::nanf(""));
      struct Run {
        std::vector<float> residual, q, k, v, proj, h, proj2, residual2, proj3;
      };
      auto run = [&](bool defer) {
        qgemm().set_deferred_epilogues(defer);
        Backend& b = *gpu_;
        const Linear wo = upload(b, o), wg = upload(b, gu), wd = upload(b, dn), wq = upload(b, qkv);
        const size_t xb = static_cast<size_t>(t * k) * 4, fb = static_cast<size_t>(t * f) * 4;
        Tensor r = on(b, DType::F32, {t, k}, res.data(), xb);
        const Tensor a = on(b, DType::F32, {t, qd}, attn.data(), attn.size() * 4);
        const Tensor n1 = on(b, DType::F32, {k}, g1.data(), g1.size() * 4),
                     n2 = on(b, DType::F32, {k}, g2.data(), g2.size() * 4);
        Tensor proj = on(b, DType::F32, {t, k}, nan.data(), xb), h = on(b, DType::F32, {t, k}, nullptr, xb);
        Tensor gate = on(b, DType::F32, {t, f}, nullptr, fb), up = on(b, DType::F32, {t, f}, nullptr, fb),
               act = on(b, DType::F32, {t, f}, nullptr, fb);
        Tensor q = on(b, DType::F32, {t, 96}, nullptr, static_cast<size_t>(t * 96) * 4),
               kk = on(b, DType::F32, {t, 32}, nullptr, static_cast<size_t>(t * 32) * 4),
               v = on(b, DType::F32, {t, 32}, nullptr, static_cast<size_t>(t * 32) * 4);
        // The model's order: o before the MLP's norm, the MLP (down before the next layer's norm), q/k/v.
        b.matmul_before_norm(a, wo, proj, r, n1, 1e-5f);
        b.norm_mlp(r, &proj, n1, 1e-5f, h, wg, gate, up, act, wd, proj, &n2);
        Tensor* outs[] = {&q, &kk, &v};
        b.norm_matmul_split(r, &proj, n2, 1e-5f, h, wq, outs);
        Run out;
        out.residual = read(b, r);
        out.q = read(b, q);
        out.k = read(b, kk);
        out.v = read(b, v);
        out.proj = read(b, proj);
        // A consumer that does not take a deferred product: the epilogue runs before the plain norm.
        Tensor proj2 = on(b, DType::F32, {t, k}, nan.data(), xb);
        b.matmul_before_norm(a, wo, proj2, r, n1, 1e-5f);
        b.pre_norm(r, &proj2, n1, 1e-5f, h);
        out.h = read(b, h);
        out.proj2 = read(b, proj2);
        out.residual2 = read(b, r);
        // A read of a deferred product's output launches its epilogue.
        Tensor proj3 = on(b, DType::F32, {t, k}, nan.data(), xb);
        b.matmul_before_norm(a, wo, proj3, r, n1, 1e-5f);
        out.proj3 = read(b, proj3);
        return out;
      };
      const Run launched = run(false), deferred = run(true);
      qgemm().set_deferred_epilogues(true);
      EXPECT_EQ(deferred.residual, launched.residual);
      EXPECT_EQ(deferred.q, launched.q);
      EXPECT_EQ(deferred.k, launched.k);
      EXPECT_EQ(deferred.v, launched.v);
      EXPECT_EQ(deferred.h, launched.h);
      EXPECT_EQ(deferred.proj2, launched.proj2);
      EXPECT_EQ(deferred.residual2, launched.residual2);
      EXPECT_EQ(deferred.proj3, launched.proj3);
      EXPECT_EQ(nans(launched.proj), 0) << "the launched epilogues write the down product";
      EXPECT_EQ(nans(deferred.proj), t * k) << "deferred: neither o nor down wrote their output";
      EXPECT_EQ(nans(deferred.proj2) + nans(deferred.proj3), 0);
    }
  qgemm().set_bf16_accumulator(false);
}

// The q/k/v split of a fused FP8 projection deferred to RoPE + KV write (quantized_gemm.h defer_split; from
// CudaBackendOptions::defer_split_rows rows): the RoPE kernel reads the BF16 sums and forms the split
// epilogue's values itself. q after RoPE and the cache must be those of the launched epilogue to the bit, for
// every RoPE kernel (blocks of heads, the token kernel, its four-pairs-per-thread form: mode 0, 1, 2); the
// deferred k and v tensors stay unwritten (NaN), which shows that the deferral engaged (and below the
// threshold, that it did not).
TEST_F(QuantizedGemmTest, DeferredQkvProductMatchesTheLaunchedSplit) {
  qgemm().set_bf16_accumulator(true);
  const int64_t k = 208, hq = 4, hkv = 2, hd = 64, qd = hq * hd, kvd = hkv * hd, bs = 16;
  const RopeParams rope{hd, 500000.0f, RopeLayout::NeoX, {}};
  for (int token_blocks : {0, 1, 2})
    for (bool per_channel : {true, false})
      for (int64_t t : {40, 300, 1100}) {  // below defer_split_rows (launched) and above it (deferred)
        SCOPED_TRACE(::testing::Message()
                     << "token blocks " << token_blocks << " per_channel " << per_channel << " t " << t);
        cuda::set_rope_token_blocks(token_blocks > 0 ? 1 : 0);
        cuda::set_rope_vector(token_blocks == 2 ? 1 : 0);
        HostLinear qkv =
            make_layer(DType::F8_E4M3, qd + 2 * kvd, k, 101 + static_cast<uint32_t>(t), per_channel);
        if (t == 1100) qkv.bias = random_floats(static_cast<size_t>(qd + 2 * kvd), 13);
        const std::vector<float> res = random_floats(static_cast<size_t>(t * k), 102, -2.0f, 2.0f),
                                 gamma = random_floats(static_cast<size_t>(k), 103, 0.5f, 1.5f),
                                 nan(static_cast<size_t>(t * qd), std::nanf(""));
        // One sequence prefilled from position 0 through shuffled blocks.
        const int64_t blocks = (t + bs - 1) / bs;
        std::vector<int32_t> meta;  // positions, query_start, seq_lens, block table
        for (int64_t i = 0; i < t; ++i) meta.push_back(static_cast<int32_t>(i));
        meta.push_back(0);
        meta.push_back(static_cast<int32_t>(t));
        meta.push_back(static_cast<int32_t>(t));
        std::vector<int32_t> table(static_cast<size_t>(blocks));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), std::mt19937(7));
        meta.insert(meta.end(), table.begin(), table.end());
        struct Run {
          std::vector<float> q, k, v, residual;
          std::vector<uint16_t> k_cache, v_cache;
        };
        auto run = [&](bool defer) {
          qgemm().set_deferred_epilogues(defer);
          Backend& b = *gpu_;
          const Linear w = upload(b, qkv);
          Tensor r = on(b, DType::F32, {t, k}, res.data(), res.size() * 4);
          const Tensor g = on(b, DType::F32, {k}, gamma.data(), gamma.size() * 4);
          Tensor h = on(b, DType::F32, {t, k}, nullptr, res.size() * 4);
          Tensor q = on(b, DType::F32, {t, qd}, nan.data(), static_cast<size_t>(t * qd) * 4),
                 kk = on(b, DType::F32, {t, kvd}, nan.data(), static_cast<size_t>(t * kvd) * 4),
                 v = on(b, DType::F32, {t, kvd}, nan.data(), static_cast<size_t>(t * kvd) * 4);
          const size_t cache_bytes = static_cast<size_t>(blocks * bs * kvd) * 2;
          KvCacheLayer cache{on(b, DType::BF16, {blocks, bs, hkv, hd}, nullptr, cache_bytes),
                             on(b, DType::BF16, {blocks, bs, hkv, hd}, nullptr, cache_bytes)};
          const Tensor m =
              on(b, DType::I32, {static_cast<int64_t>(meta.size())}, meta.data(), meta.size() * 4);
          const auto* mp = static_cast<const int32_t*>(m.data);
          BatchView batch;
          batch.num_tokens = static_cast<int32_t>(t);
          batch.num_seqs = 1;
          batch.positions = mp;
          batch.query_start = mp + t;
          batch.seq_lens = mp + t + 2;
          batch.block_tables = mp + t + 3;
          batch.max_blocks_per_seq = static_cast<int32_t>(blocks);
          batch.max_query_len = batch.max_seq_len = static_cast<int32_t>(t);
          Tensor* outs[] = {&q, &kk, &v};
          b.norm_matmul_split(r, nullptr, g, 1e-5f, h, w, outs);
          b.rope_and_write_kv(q, kk, v, batch, rope, cache);
          Run out;
          out.q = read(b, q);
          out.k = read(b, kk);
          out.v = read(b, v);
          out.residual = read(b, r);
          out.k_cache.resize(cache_bytes / 2);
          out.v_cache.resize(cache_bytes / 2);
          b.copy_to_host(out.k_cache.data(), cache.k.data, cache_bytes);
          b.copy_to_host(out.v_cache.data(), cache.v.data, cache_bytes);
          return out;
        };
        const Run launched = run(false), deferred = run(true);
        qgemm().set_deferred_epilogues(true);
        EXPECT_EQ(deferred.q, launched.q);
        EXPECT_EQ(deferred.k_cache, launched.k_cache);
        EXPECT_EQ(deferred.v_cache, launched.v_cache);
        EXPECT_EQ(deferred.residual, launched.residual);
        EXPECT_EQ(nans(launched.q) + nans(launched.k) + nans(launched.v), 0);
        EXPECT_EQ(nans(deferred.q), 0);
        const bool defers = t >= CudaBackendOptions{}.defer_split_rows;  // the fixture backend's options
        EXPECT_EQ(nans(deferred.k) + nans(deferred.v), defers ? 2 * t * kvd : 0)
            << (defers ? "deferred: k and v are not written" : "decode sizes: the split epilogue runs");
      }
  cuda::set_rope_token_blocks(-1);
  cuda::set_rope_vector(-1);
  qgemm().set_bf16_accumulator(false);
}

// INT4 / Q8_0 / Q4_K: BF16 activations and BF16-rounded weights (2^-9 relative each): 1e-2 of the output
// scale against the exact product; the CPU backend quantizes activations to int8 blocks (4e-3 from the
// exact product on these shapes): 1.5e-2.
TEST_F(QuantizedGemmTest, Int4MatchesOnOddShapes) {
  for (int64_t g : {32, 64, 128})
    for (bool sym : {true, false}) {
      HostLinear h = make_layer(DType::INT4, 91, 3 * g, 11 + static_cast<uint32_t>(g), true, g, sym);
      h.bias = random_floats(91, 5);
      check(h, 133, QuantizedGemm::Path::Dequant, 1e-2, 1.5e-2,
            "int4 g" + std::to_string(g) + (sym ? " sym" : " asym"));
    }
}

TEST_F(QuantizedGemmTest, Int4WithActOrderPermutation) {
  HostLinear h = make_layer(DType::INT4, 64, 256, 31, true, 128, false);
  h.perm.resize(256);
  std::iota(h.perm.begin(), h.perm.end(), 0);
  std::shuffle(h.perm.begin(), h.perm.end(), std::mt19937(9));
  check(h, 128, QuantizedGemm::Path::Dequant, 1e-2, 1.5e-2, "int4 act-order");
}

TEST_F(QuantizedGemmTest, GgufBlocksMatchOnOddShapes) {
  check(make_layer(DType::Q8_0, 75, 224, 41), 150, QuantizedGemm::Path::Dequant, 1e-2, 1.5e-2, "q8_0");
  check(make_layer(DType::Q4_K, 75, 512, 43), 129, QuantizedGemm::Path::Dequant, 1e-2, 1.5e-2, "q4_k");
}

// A weight taller than one dequantized tile runs in several tiles (the last one partial).
TEST_F(QuantizedGemmTest, Int4SpansSeveralTiles) {
  const int64_t k = 256;
  qgemm().set_tile_bytes(static_cast<size_t>(64 * k * 2));  // 64 rows per tile
  HostLinear h = make_layer(DType::INT4, 200, k, 51, true, 128, true);
  h.bias = random_floats(200, 6);
  check(h, 128, QuantizedGemm::Path::Dequant, 1e-2, 1.5e-2, "int4 4 tiles");
  qgemm().set_tile_bytes(0);
}

// Whole models ------------------------------------------------------------------------------------------

const std::string kLlamaTiny = std::string(INFERX_SOURCE_DIR) + "/tests/golden/fixtures/llama-tiny";

// llama-tiny (hidden 64, ffn 96, vocab 256) quantized at load on both backends, a 150-token prompt (every
// product takes the quantized GEMM, fused projections included), logits of every position. The CPU
// backend is the reference: tolerance 3e-2 of the largest |logit| (FP8: an activation that differs in the
// last bits between the backends may round to a neighbouring E4M3 value; INT4: BF16 vs int8 activations).
// The BF16 accumulator (QuantizedGemm::set_bf16_accumulator) against the CPU backend with the same rounding
// (cpu::set_fp8_bf16_accumulator). This random-weight model is sensitive to any 2^-9 perturbation (an
// activation pushed across an E4M3 boundary flips its code; measured on the H200 2026-12-04: the CPU's own
// F32 -> BF16 sums move its fp8 logits by 6.2% of the largest, the GPU's by 5.9%, GPU vs CPU both BF16 5.0%),
// so with BF16 sums the bound is 3e-2 or what the rounding does to the CPU's own logits, whichever is larger.
// The accuracy that matters is on a trained model: stories260K on the GPU, mean KL to the unquantized model
// 0.01134 nats with BF16 sums against 0.01119 with F32 (docs/benchmarks.md).
TEST_F(QuantizedGemmTest, TinyModelQuantizedAtLoadMatchesTheCpuBackend) {
  std::vector<int32_t> prompt(150);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 37) % 250);
  for (bool bf16_acc : {false, true})
    for (const char* plan : {"fp8", "int4", "fp8-int4"}) {
      SCOPED_TRACE(::testing::Message() << "bf16 accumulator " << bf16_acc);
      qgemm().set_bf16_accumulator(bf16_acc);
      cpu::set_fp8_bf16_accumulator(bf16_acc);
      LoadOptions lo;
      lo.quantize = parse_quant_options(plan);
      auto gm = Model::load(kLlamaTiny, *gpu_, lo);
      auto cm = Model::load(kLlamaTiny, *cpu_, lo);
      const DType attn = std::string(plan) == "int4" ? DType::INT4 : DType::F8_E4M3;
      EXPECT_EQ(gm->weights().layers[0].q.weight.dtype, attn) << plan << ": kept quantized on the GPU";
      EXPECT_EQ(gm->weight_bytes_per_token(), cm->weight_bytes_per_token()) << plan;
      SequenceRunner gr(*gm, 256), cr(*cm, 256);
      const std::vector<float> got = gr.step_all_logits(prompt), want = cr.step_all_logits(prompt);
      EXPECT_NE(qgemm().last_path(), QuantizedGemm::Path::None) << plan;
      double tol = 3e-2;
      if (bf16_acc) {
        cpu::set_fp8_bf16_accumulator(false);
        SequenceRunner f32(*cm, 256);
        tol = std::max(tol, moved_by(f32.step_all_logits(prompt), want));
        cpu::set_fp8_bf16_accumulator(true);
      }
      expect_close_to_scale(got, std::vector<double>(want.begin(), want.end()), tol, plan);
    }
  qgemm().set_bf16_accumulator(false);
  cpu::set_fp8_bf16_accumulator(false);
}

// Perplexity and KL of a trained model over tests/unit/model/fixtures/stories_eval.txt in ctx-token chunks,
// the KL against the base that the first run with save = true fills (the whole vocabulary: exact).
class TrainedModelEval {
 public:
  struct Result {
    double ppl;
    KlStats kl;
  };
  TrainedModelEval(std::string model, int64_t ctx) : model_(std::move(model)), ctx_(ctx) {
    std::ifstream text(std::string(INFERX_SOURCE_DIR) + "/tests/unit/model/fixtures/stories_eval.txt");
    std::stringstream ss;
    ss << text.rdbuf();
    GgufFile gguf(model_);
    tokens_ = load_gguf_tokenizer(gguf)->encode(ss.str(), true);
    base_ = KlBase::for_text(512, tokens_, ctx_);
  }
  size_t tokens() const { return tokens_.size(); }
  Result run(Backend& b, const char* plan, bool save = false, PerplexityMode mode = PerplexityMode::Prefill) {
    LoadOptions lo;
    lo.quantize = parse_quant_options(plan);
    auto m = Model::load(model_, b, lo);
    KlAccumulator acc(base_);
    const PerplexityResult r = compute_perplexity(
        *m, tokens_, ctx_,
        [&](const float* lp, int64_t v, int32_t) {
          if (save)
            base_.add(lp, v);
          else
            acc.add(lp, v);
        },
        mode);
    return {r.perplexity(), save ? KlStats{} : acc.stats()};
  }

 private:
  std::string model_;
  int64_t ctx_;
  std::vector<int32_t> tokens_;
  KlBase base_;
};

// The trained stories260K (odd shapes: down_proj K = 172, which cuBLASLt's FP8 GEMM refuses; head_dim 8)
// quantized on the GPU is as accurate as on the CPU reference: perplexity over the test text
// (tests/unit/model/fixtures/stories_eval.txt, 128-token chunks) and KL against the CPU's unquantized model,
// with the GPU's FP8 defaults (BF16 sums; then an FP8 KV cache too). Measured on the H200 (2026-12-04):
// mean KL 0.01131 on the GPU, 0.01089 on the CPU (top-1 95.1% both); the bound is 1.25x the CPU's + 0.002.
// The model is read from $INFERX_TESTDATA_DIR when set (the GPU machine's copy), else the shared test data
// folder.
TEST_F(QuantizedGemmTest, TrainedModelQuantizedOnTheGpuIsAsAccurateAsOnTheCpu) {
  const char* dir = std::getenv("INFERX_TESTDATA_DIR");
  const std::string model = std::string(dir ? dir : INFERX_TESTDATA_DIR) + "/stories260K.gguf";
  ASSERT_TRUE(std::filesystem::exists(model)) << model << " missing (set INFERX_TESTDATA_DIR)";
  TrainedModelEval eval(model, 128);
  ASSERT_GT(eval.tokens(), 1024u);
  using Eval = TrainedModelEval::Result;
  const Eval ref = eval.run(*cpu_, "none", true);
  const Eval cpu_fp8 = eval.run(*cpu_, "fp8");
  qgemm().set_bf16_accumulator(true);  // the GPU's default
  const Eval gpu_fp8 = eval.run(*gpu_, "fp8");
  EXPECT_NE(qgemm().last_path(), QuantizedGemm::Path::None);
  CudaBackendOptions o;
  o.kv_cache_dtype = DType::F8_E4M3;
  auto gpu_fp8_kv = make_cuda_backend(0, o);
  const Eval gpu_fp8_fp8kv = eval.run(*gpu_fp8_kv, "fp8");
  qgemm().set_bf16_accumulator(false);
  std::printf(
      "stories260K ppl: cpu %.4f; fp8 cpu %.4f (KL %.5f, top-1 %.3f), gpu %.4f (KL %.5f, top-1 %.3f), "
      "gpu + fp8 KV %.4f (KL %.5f, top-1 %.3f)\n",
      ref.ppl, cpu_fp8.ppl, cpu_fp8.kl.mean_kl, cpu_fp8.kl.top1_agreement, gpu_fp8.ppl, gpu_fp8.kl.mean_kl,
      gpu_fp8.kl.top1_agreement, gpu_fp8_fp8kv.ppl, gpu_fp8_fp8kv.kl.mean_kl,
      gpu_fp8_fp8kv.kl.top1_agreement);
  EXPECT_LT(gpu_fp8.kl.mean_kl, 1.25 * cpu_fp8.kl.mean_kl + 0.002);
  EXPECT_GT(gpu_fp8.kl.top1_agreement, cpu_fp8.kl.top1_agreement - 0.03);
  EXPECT_LT(std::fabs(gpu_fp8.ppl / ref.ppl - 1), 0.02);
  // The FP8 KV cache adds its own rounding (keys and values, 3 mantissa bits, scale 1.0; the CPU has no FP8
  // cache to compare with, and the kernels are checked against float64 over FP8 codes in test_cuda_backend):
  // measured KL 0.0304, perplexity +2.1% (head_dim 8: little averaging in each score). A band that a broken
  // cache path (a wrong scale or slot: KL > 1) cannot meet, below INT4 weights' 0.09.
  EXPECT_LT(gpu_fp8_fp8kv.kl.mean_kl, 0.05);
  EXPECT_LT(std::fabs(gpu_fp8_fp8kv.ppl / ref.ppl - 1), 0.05);
}

// The decode path on a trained model with Llama-3-wide heads: the student of stories260K
// (tests/unit/model/fixtures/stories-hd128.gguf, head_dim 128, 2 query heads per KV head; made by
// scripts/tiny_model/train.py), whose scored positions in --decode-steps mode each run as a one-token step
// through the v3 decode attention kernel (TMA tiles over an FP8 cache) and a replayed CUDA graph; the
// prefill mode runs the same positions through the prefill kernel. KL against the CPU's F32 run, per KV
// cache type: the decode path within 1.5x (+0.002) of the prefill path (its Q and P are F16 over an FP8
// cache, BF16 in the prefill kernel: no worse), and bands on KL and perplexity that a wrong scale, slot or
// rounding mode lands far outside. Expected from the CPU emulation of the FP8 cache (docs/benchmarks.md,
// "decode-path accuracy"; 256-token chunks): KL 0.00099 with F32, F16 (the decode kernel) or BF16 (the
// prefill kernel) Q and P alike, perplexity +0.3%; the GPU's BF16 weights add their own rounding on top.
// Then the weight plans fp8 / int4 / fp8-int4 through both paths (the batch-1 GEMV kernels of each format,
// the GEMMs) against the CPU's run of the same plan.
TEST_F(QuantizedGemmTest, TrainedStudentDecodeStepsAreAsAccurateAsThePrefill) {
  TrainedModelEval eval(std::string(INFERX_SOURCE_DIR) + "/tests/unit/model/fixtures/stories-hd128.gguf",
                        256);
  ASSERT_GT(eval.tokens(), 1024u);
  constexpr PerplexityMode kPrefill = PerplexityMode::Prefill, kDecode = PerplexityMode::DecodeSteps;
  const double ref = eval.run(*cpu_, "none", true).ppl;
  for (DType kv : {DType::BF16, DType::F8_E4M3}) {
    SCOPED_TRACE(dtype_name(kv));
    CudaBackendOptions o;
    o.kv_cache_dtype = kv;
    auto gpu = make_cuda_backend(0, o);
    const auto [pre_ppl, pre] = eval.run(*gpu, "none", false, kPrefill);
    const auto [dec_ppl, dec] = eval.run(*gpu, "none", false, kDecode);
    std::printf(
        "stories-hd128 %s KV: ppl cpu %.4f; gpu prefill %.4f (KL %.5f, top-1 %.3f), decode steps %.4f "
        "(KL %.5f, top-1 %.3f)\n",
        std::string(dtype_name(kv)).c_str(), ref, pre_ppl, pre.mean_kl, pre.top1_agreement, dec_ppl,
        dec.mean_kl, dec.top1_agreement);
    EXPECT_EQ(dec.positions, pre.positions);
    EXPECT_LT(dec.mean_kl, 1.5 * pre.mean_kl + 0.002);
    EXPECT_GT(dec.top1_agreement, pre.top1_agreement - 0.03);
    EXPECT_LT(std::fabs(dec_ppl / ref - 1), kv == DType::BF16 ? 0.01 : 0.02);
    EXPECT_LT(dec.mean_kl, kv == DType::BF16 ? 0.005 : 0.01);
  }
  // Quantized weights through the decode path (batch-1 GEMV kernels per format) and the prefill (GEMMs),
  // with the GPU's default BF16 sums, against the CPU's run of the same plan: KL within 1.25x (+0.002).
  // CPU figures (docs/benchmarks.md): fp8 0.00137, int4 0.01197, fp8-int4 0.00823.
  CudaBackendOptions o;
  o.kv_cache_dtype = DType::BF16;  // the default: the decode steps take the v3 decode kernel
  auto gpu = make_cuda_backend(0, o);
  static_cast<CudaBackend&>(*gpu).quantized_gemm().set_bf16_accumulator(true);
  for (const char* plan : {"fp8", "int4", "fp8-int4"}) {
    SCOPED_TRACE(plan);
    const KlStats cpu = eval.run(*cpu_, plan).kl;
    const auto [pre_ppl, pre] = eval.run(*gpu, plan, false, kPrefill);
    const auto [dec_ppl, dec] = eval.run(*gpu, plan, false, kDecode);
    std::printf("stories-hd128 %s: KL cpu %.5f; gpu prefill %.5f (ppl %.4f), decode steps %.5f (ppl %.4f)\n",
                plan, cpu.mean_kl, pre.mean_kl, pre_ppl, dec.mean_kl, dec_ppl);
    EXPECT_LT(pre.mean_kl, 1.25 * cpu.mean_kl + 0.002);
    EXPECT_LT(dec.mean_kl, 1.25 * cpu.mean_kl + 0.002);
    EXPECT_GT(dec.top1_agreement, cpu.top1_agreement - 0.03);
  }
}

// The last layer on the logits rows only (Model::set_last_layer_logit_rows_only, the default) on the GPU: a
// 200-token prefill with one logits row (199 rows left out, past CUDA's 64-row product tile) through the
// CUDA paths it crosses - the gathers, the attention output's BF16 copy dropped, the norms - then three
// decode steps over the caches it left. Narrowed, the last layer's o projection and MLP run on one row, so
// they take the decode GEMVs where every row takes the GEMMs: BF16 weights differ by summation order only
// (bound 1e-3 of the logits' scale), INT4 by the GEMM path's BF16 rounding of dequantized weights (1e-2),
// FP8 by W8A16 (GEMV) against W8A8 (cuBLASLt, activations in E4M3) in that one layer (5e-2). A wrong row
// gathered moves the logits by their own scale. The caches are the same either way (every row's keys and
// values are written before the narrowing), so the decode steps after it agree to 1e-4.
TEST_F(QuantizedGemmTest, LastLayerOnTheLogitsRowsMatchesEveryRowOnTheGpu) {
  const std::string model = std::string(INFERX_SOURCE_DIR) + "/tests/unit/model/fixtures/stories-hd128.gguf";
  std::vector<int32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 37) % 500);
  CudaBackendOptions o;
  o.kv_cache_dtype = DType::BF16;
  auto gpu = make_cuda_backend(0, o);
  for (const auto& [plan, tol] :
       {std::pair<const char*, double>{"none", 1e-3}, {"int4", 1e-2}, {"fp8", 5e-2}}) {
    SCOPED_TRACE(plan);
    LoadOptions lo;
    lo.quantize = parse_quant_options(plan);
    auto narrow = Model::load(model, *gpu, lo), every = Model::load(model, *gpu, lo);
    narrow->set_last_layer_logit_rows_only(true);
    every->set_last_layer_logit_rows_only(false);
    SequenceRunner rn(*narrow, 256), re(*every, 256);
    const std::vector<float> got = rn.step(prompt), want = re.step(prompt);
    std::printf("narrowed last layer, %s: logits moved by %.3g of their scale\n", plan, moved_by(got, want));
    expect_close_to_scale(got, std::vector<double>(want.begin(), want.end()), tol, "prefill");
    for (int32_t t : {5, 77, 300}) {
      const std::vector<float> g = rn.step({t}), w = re.step({t});
      expect_close_to_scale(g, std::vector<double>(w.begin(), w.end()), 1e-4, "decode step after it");
    }
  }
}

// dummy:tiny --quantize fp8 / int4 on the GPU: codes generated on the device; the weights stay quantized,
// weight_bytes_per_token counts codes + scales, and a 40-token prefill gives finite logits.
TEST_F(QuantizedGemmTest, DummyModelGeneratesQuantizedWeightsOnTheDevice) {
  for (const char* plan : {"fp8", "int4"}) {
    LoadOptions lo;
    lo.quantize = parse_quant_options(plan);
    auto m = Model::load("dummy:tiny", *gpu_, lo);
    const ModelConfig& c = m->config();
    const bool fp8 = std::string(plan) == "fp8";
    EXPECT_EQ(m->weights().layers[0].down.weight.dtype, fp8 ? DType::F8_E4M3 : DType::INT4) << plan;
    const int64_t D = c.hidden_size, F = c.intermediate_size, kvd = c.num_kv_heads * c.head_dim,
                  qd = c.num_heads * c.head_dim;
    const int64_t shapes[7][2] = {{qd, D}, {kvd, D}, {kvd, D}, {D, qd}, {F, D}, {F, D}, {D, F}};
    int64_t want = c.vocab_size * D * 2 + D * 4;  // BF16 lm_head, F32 final norm
    for (int64_t i = 0; i < c.num_layers; ++i) {
      want += 2 * D * 4;  // norms
      for (const auto& s : shapes) {
        const int64_t group = 128;  // the int4 plan's default; tiny's columns are multiples of it
        want += fp8 ? s[0] * s[1] + s[0] * 4 : s[0] * s[1] / 2 + s[0] * (s[1] / group) * 2;
      }
    }
    EXPECT_EQ(m->weight_bytes_per_token(), want) << plan;
    SequenceRunner r(*m, 64);
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + i * 7 % 500);
    const std::vector<float>& logits = r.step(prompt);
    ASSERT_EQ(static_cast<int64_t>(logits.size()), c.vocab_size);
    float amax = 0;
    for (float v : logits) {
      ASSERT_TRUE(std::isfinite(v)) << plan;
      amax = std::max(amax, std::fabs(v));
    }
    EXPECT_GT(amax, 0.0f) << plan;
  }
}

}  // namespace
}  // namespace inferx
