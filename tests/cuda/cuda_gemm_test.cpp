// The cuBLASLt GEMM's algorithm autotuning (gemm_cublaslt.h): a tuned algorithm gives the untuned
// (heuristic's first choice) result within float rounding and matches a float64 reference; a shape's row
// bucket is tuned once and reused; nothing is timed while the stream is captured into a CUDA graph (a
// bucket tuned before is still taken); the tuning cache restores buckets across instances; the
// INFERX_GEMM_TUNE=0 switch. Needs a GPU: every test skips when
// none is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "core/half.h"
#include "cuda_test_util.h"

namespace inferx {
namespace {

using cuda::CublasLtGemm;

struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceMem() { (void)cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
};

// Random BF16 values (returned as the floats they encode) and their encoding on the device.
struct Bf16Matrix {
  std::vector<float> values;
  DeviceMem dev;
  Bf16Matrix(size_t count, uint32_t seed) : values(count), dev(count * 2) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<uint16_t> bits(count);
    for (size_t i = 0; i < count; ++i) {
      bits[i] = f32_to_bf16(dist(rng));
      values[i] = bf16_to_f32(bits[i]);
    }
    CUDA_CHECK(cudaMemcpy(dev.p, bits.data(), count * 2, cudaMemcpyHostToDevice));
  }
};

class CudaGemmTuningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    INFERX_SKIP_WITHOUT_GPU();
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  std::vector<float> download(const DeviceMem& m, size_t count) {
    std::vector<float> v(count);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(v.data(), m.p, count * 4, cudaMemcpyDeviceToHost));
    return v;
  }

  cudaStream_t stream_ = nullptr;
};

std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w, const float* bias,
                              int64_t t, int64_t k, int64_t n) {
  std::vector<double> out(static_cast<size_t>(t * n));
  for (int64_t r = 0; r < t; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double acc = bias ? bias[c] : 0.0;
      for (int64_t i = 0; i < k; ++i)
        acc += double(x[static_cast<size_t>(r * k + i)]) * w[static_cast<size_t>(c * k + i)];
      out[static_cast<size_t>(r * n + c)] = acc;
    }
  return out;
}

TEST_F(CudaGemmTuningTest, TunedMatchesUntunedAndTheReference) {
  struct Shape {
    int64_t t, k, n;
  };
  for (const Shape s : {Shape{1, 64, 96}, Shape{37, 256, 320}, Shape{300, 512, 200}, Shape{700, 512, 384}}) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "t=" << s.t << " k=" << s.k << " n=" << s.n << " bias=" << with_bias);
      Bf16Matrix x(static_cast<size_t>(s.t * s.k), 1), w(static_cast<size_t>(s.n * s.k), 2);
      std::vector<float> bias(static_cast<size_t>(s.n));
      for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.01f * static_cast<float>(i % 97) - 0.5f;
      DeviceMem bias_dev(bias.size() * 4), tuned_out(static_cast<size_t>(s.t * s.n) * 4),
          plain_out(static_cast<size_t>(s.t * s.n) * 4);
      CUDA_CHECK(cudaMemcpy(bias_dev.p, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
      const float* b = with_bias ? static_cast<const float*>(bias_dev.p) : nullptr;
      CublasLtGemm tuned(stream_), plain(stream_);
      tuned.set_tuning(true);
      plain.set_tuning(false);
      tuned.matmul(x.dev.p, DType::BF16, s.t, s.k, DType::BF16, w.dev.p, s.n, b,
                   static_cast<float*>(tuned_out.p));
      plain.matmul(x.dev.p, DType::BF16, s.t, s.k, DType::BF16, w.dev.p, s.n, b,
                   static_cast<float*>(plain_out.p));
      EXPECT_EQ(tuned.tuning_stats().tunings, 1u);
      EXPECT_EQ(plain.tuning_stats().tunings, 0u);
      const std::vector<float> got = download(tuned_out, static_cast<size_t>(s.t * s.n)),
                               base = download(plain_out, static_cast<size_t>(s.t * s.n));
      const std::vector<double> want =
          reference(x.values, w.values, with_bias ? bias.data() : nullptr, s.t, s.k, s.n);
      // BF16 products are exact in F32; only the F32 summation order differs between algorithms.
      const cuda_test::Errors vs_ref = cuda_test::compare(got, want);
      EXPECT_TRUE(vs_ref.all_finite);
      EXPECT_LT(vs_ref.rel_norm, 1e-5);
      const cuda_test::Errors vs_plain =
          cuda_test::compare(got, std::vector<double>(base.begin(), base.end()));
      EXPECT_LT(vs_plain.rel_norm, 1e-5);
      EXPECT_LT(cuda_test::compare(base, want).rel_norm, 1e-5);
    }
  }
}

TEST_F(CudaGemmTuningTest, RowBucketsAreTunedOnceAndReused) {
  const int64_t k = 256, n = 512, max_t = 200;
  Bf16Matrix x(static_cast<size_t>(max_t * k), 3), w(static_cast<size_t>(n * k), 4);
  DeviceMem out(static_cast<size_t>(max_t * n) * 4);
  CublasLtGemm gemm(stream_);
  gemm.set_tuning(true);
  const auto run = [&](int64_t t) {
    gemm.matmul(x.dev.p, DType::BF16, t, k, DType::BF16, w.dev.p, n, nullptr, static_cast<float*>(out.p));
  };
  run(33);  // bucket 64: tuned
  EXPECT_EQ(gemm.tuning_stats().plans, 1u);
  EXPECT_EQ(gemm.tuning_stats().tunings, 1u);
  for (int i = 0; i < 3; ++i) run(33);  // the cached plan
  EXPECT_EQ(gemm.tuning_stats().plans, 1u);
  EXPECT_EQ(gemm.tuning_stats().tunings, 1u);
  EXPECT_EQ(gemm.tuning_stats().queries, 1u);
  run(40);  // same bucket: a new plan, the bucket's algorithm without timing and without a heuristic query
  EXPECT_EQ(gemm.tuning_stats().plans, 2u);
  EXPECT_EQ(gemm.tuning_stats().tunings, 1u);
  EXPECT_EQ(gemm.tuning_stats().reused, 1u);
  EXPECT_EQ(gemm.tuning_stats().queries, 1u);
  run(65);  // bucket 128: tuned
  EXPECT_EQ(gemm.tuning_stats().plans, 3u);
  EXPECT_EQ(gemm.tuning_stats().tunings, 2u);
  EXPECT_EQ(gemm.tuning_stats().queries, 2u);
  // The reused algorithm still computes the product.
  run(40);
  const std::vector<float> got = download(out, static_cast<size_t>(40 * n));
  const std::vector<float> x40(x.values.begin(), x.values.begin() + 40 * k);
  EXPECT_LT(cuda_test::compare(got, reference(x40, w.values, nullptr, 40, k, n)).rel_norm, 1e-5);
}

// The tuning cache (LtMatmul::use_tuning_cache): a bucket tuned by one instance is written to the folder's
// file and restored by the next instance in the same context (from the process's copy of that file, which
// every LtMatmul shares; reading a file back is formats/gemm_tuning_file's test), which then runs the
// product without timing it and gets the same result; a damaged file on disk is ignored and replaced.
TEST_F(CudaGemmTuningTest, TuningCacheRestoresBucketsWithoutTiming) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("inferx-gemm-cache-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const int64_t t = 48, k = 256, n = 384;
  Bf16Matrix x(static_cast<size_t>(t * k), 7), w(static_cast<size_t>(n * k), 8);
  DeviceMem first(static_cast<size_t>(t * n) * 4), second(static_cast<size_t>(t * n) * 4);
  // A fresh tuned GEMM with the cache in `folder` runs the product once; its counters afterwards (loaded is
  // set when the cache is read, before the product).
  const auto run_cached = [&](const fs::path& folder, DeviceMem& out) {
    CublasLtGemm g(stream_);
    g.set_tuning(true);
    g.lt().use_tuning_cache(folder.string());
    g.matmul(x.dev.p, DType::BF16, t, k, DType::BF16, w.dev.p, n, nullptr, static_cast<float*>(out.p));
    return g.tuning_stats();
  };
  const cuda::LtMatmul::Stats filled = run_cached(dir, first);
  EXPECT_EQ(filled.loaded, 0u);
  EXPECT_EQ(filled.tunings, 1u);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("gemm-tuning-", 0), 0u) << files[0];
  EXPECT_GT(fs::file_size(files[0]), 100u);
  const cuda::LtMatmul::Stats restored = run_cached(dir, second);
  EXPECT_GE(restored.loaded, 1u);
  EXPECT_EQ(restored.tunings, 0u);
  EXPECT_EQ(restored.reused, 1u);
  const std::vector<float> a = download(first, static_cast<size_t>(t * n)),
                           b = download(second, static_cast<size_t>(t * n));
  EXPECT_EQ(a, b) << "the restored algorithm is the tuned one";
  EXPECT_LT(cuda_test::compare(b, reference(x.values, w.values, nullptr, t, k, n)).rel_norm, 1e-5);
  // The same file name (same context) in another folder, damaged (the header, then a cut-off context
  // length): read from disk, nothing restored, tuned again, and the file replaced by a whole one.
  const fs::path damaged_dir = dir / "damaged", damaged = damaged_dir / files[0].filename();
  fs::create_directories(damaged_dir);
  std::ofstream(damaged, std::ios::binary) << "IXGEMMTUNE1\n\x05";
  const cuda::LtMatmul::Stats retuned = run_cached(damaged_dir, second);
  EXPECT_EQ(retuned.loaded, 0u);
  EXPECT_EQ(retuned.tunings, 1u);
  EXPECT_EQ(fs::file_size(damaged), fs::file_size(files[0]));
  fs::remove_all(dir);
}

TEST_F(CudaGemmTuningTest, CaptureUsesTheHeuristicAndTunesAfterwards) {
  const int64_t t = 96, small_t = 6, k = 384, n = 256;
  Bf16Matrix x(static_cast<size_t>(t * k), 5), w(static_cast<size_t>(n * k), 6);
  DeviceMem out(static_cast<size_t>(t * n) * 4), small_out(static_cast<size_t>(small_t * n) * 4);
  float* o = static_cast<float*>(out.p);
  float* so = static_cast<float*>(small_out.p);
  {
    // The heuristic's choice once outside capture (another instance): its kernel is loaded before the
    // capture, as the engine's warm-up step does.
    CublasLtGemm warm(stream_);
    warm.set_tuning(false);
    warm.matmul(x.dev.p, DType::BF16, t, k, DType::BF16, w.dev.p, n, nullptr, o);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  CublasLtGemm gemm(stream_);
  gemm.set_tuning(true);
  gemm.matmul(x.dev.p, DType::BF16, 5, k, DType::BF16, w.dev.p, n, nullptr, so);  // bucket 8, tuned
  EXPECT_EQ(gemm.tuning_stats().tunings, 1u);
  CUDA_CHECK(cudaMemsetAsync(o, 0, static_cast<size_t>(t * n) * 4, stream_));
  CUDA_CHECK(cudaMemsetAsync(so, 0, static_cast<size_t>(small_t * n) * 4, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  // No set_capturing(): the capture is detected on the stream itself. Bucket 128 is new (the heuristic's
  // choice runs untimed); bucket 8 was tuned before and its algorithm is taken without timing.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  gemm.matmul(x.dev.p, DType::BF16, t, k, DType::BF16, w.dev.p, n, nullptr, o);
  gemm.matmul(x.dev.p, DType::BF16, small_t, k, DType::BF16, w.dev.p, n, nullptr, so);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  EXPECT_EQ(gemm.tuning_stats().plans, 3u);
  EXPECT_EQ(gemm.tuning_stats().tunings, 1u);
  EXPECT_EQ(gemm.tuning_stats().reused, 1u);
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  const std::vector<double> want = reference(x.values, w.values, nullptr, t, k, n);
  EXPECT_LT(cuda_test::compare(download(out, static_cast<size_t>(t * n)), want).rel_norm, 1e-5);
  const std::vector<double> small_want(want.begin(), want.begin() + small_t * n);
  EXPECT_LT(cuda_test::compare(download(small_out, static_cast<size_t>(small_t * n)), small_want).rel_norm,
            1e-5);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));

  CUDA_CHECK(cudaMemsetAsync(o, 0, static_cast<size_t>(t * n) * 4, stream_));
  gemm.matmul(x.dev.p, DType::BF16, t, k, DType::BF16, w.dev.p, n, nullptr, o);  // tuned now
  EXPECT_EQ(gemm.tuning_stats().plans, 3u);
  EXPECT_EQ(gemm.tuning_stats().tunings, 2u);
  EXPECT_LT(cuda_test::compare(download(out, static_cast<size_t>(t * n)), want).rel_norm, 1e-5);
}

TEST_F(CudaGemmTuningTest, EnvironmentSwitchDisablesTuning) {
  const char* old = std::getenv("INFERX_GEMM_TUNE");
  const std::string saved = old ? old : "";
  setenv("INFERX_GEMM_TUNE", "0", 1);
  const bool off = cuda::LtMatmul(stream_).tuning();
  setenv("INFERX_GEMM_TUNE", "1", 1);
  const bool on = cuda::LtMatmul(stream_).tuning();
  if (old)
    setenv("INFERX_GEMM_TUNE", saved.c_str(), 1);
  else
    unsetenv("INFERX_GEMM_TUNE");
  EXPECT_FALSE(off);
  EXPECT_TRUE(on);
}

}  // namespace
}  // namespace inferx
