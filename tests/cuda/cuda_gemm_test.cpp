// The cuBLASLt GEMM's algorithm autotuning (gemm_cublaslt.h): a tuned algorithm gives the untuned
// (heuristic's first choice) result within float rounding and matches a float64 reference; a shape's row
// bucket is tuned once and reused; nothing is timed while the stream is captured into a CUDA graph (a
// bucket tuned before is still taken); the tuning cache restores buckets across instances; the
// INFERX_GEMM_TUNE=0 switch; cuBLASLt's workspace memsets moved earlier in a recorded graph
// (graph_rewrite.h) with the products on dedicated workspaces. Needs a GPU: every test skips when none is
// visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "backend/cuda/graph_rewrite.h"
#include "backend/cuda/kernels.h"
#include "core/half.h"
#include "core/random_fill.h"
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

// The nodes a node depends on.
std::vector<cudaGraphNode_t> dependencies(cudaGraphNode_t node) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> deps(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0) CUDA_CHECK(cudaGraphNodeGetDependencies(node, deps.data(), data.data(), &n));
  return deps;
}

// The graph's nodes of one type, in the order cudaGraphGetNodes gives (a captured chain's order).
std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t graph, cudaGraphNodeType type) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> all(n), out;
  if (n > 0) CUDA_CHECK(cudaGraphGetNodes(graph, all.data(), &n));
  for (cudaGraphNode_t node : all) {
    cudaGraphNodeType t{};
    CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    if (t == type) out.push_back(node);
  }
  return out;
}

bool contains(const std::vector<cudaGraphNode_t>& v, cudaGraphNode_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// The chain the graph-rewrite tests record on `stream`: [Q: a -> e] -> P: a -> c -> M: memset of z's first
// zero_floats -> K: z's first k_floats -> d (conversions to BF16; K reads what M zeroed).
struct MemsetChain {
  int64_t n;
  cudaStream_t stream;
  DeviceMem a, z, c, d, e;
  RandomFill fill;
  std::vector<uint16_t> want_c;  // P's output, run eagerly

  MemsetChain(int64_t count, uint32_t seed, cudaStream_t s)
      : n(count),
        stream(s),
        a(count * 4),
        z(count * 4),
        c(count * 2),
        d(count * 2),
        e(count * 2),
        want_c(count) {
    fill.amplitude = 1.0f;
    fill.seed = seed;
    CUDA_CHECK(cuda::launch_fill_random(DType::F32, a.p, n, n, fill, stream));
    convert(a, n, c);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(want_c.data(), c.p, n * 2, cudaMemcpyDeviceToHost));
  }
  void convert(const DeviceMem& from, int64_t count, const DeviceMem& to) const {
    CUDA_CHECK(cuda::launch_convert_f32(static_cast<const float*>(from.p), count, DType::BF16, to.p, stream));
  }
  cudaGraph_t record(bool with_q, int64_t zero_floats, int64_t k_floats) const {
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    if (with_q) convert(a, n, e);                                  // Q
    convert(a, n, c);                                              // P
    CUDA_CHECK(cudaMemsetAsync(z.p, 0, zero_floats * 4, stream));  // M
    convert(z, k_floats, d);                                       // K
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    return graph;
  }
  bool in_z(const void* p) const { return p == z.p; }
  // Replays `exec` `replays` times, z dirtied (fill seeds seed, seed + 1, ...) and c and d poisoned before
  // each: c is P's output and d's first k_floats are zeros every time; with only_zeroed, fewer than 16 of z's
  // values past k_floats are zero (M zeroed its bytes and no others).
  void expect_replays(cudaGraphExec_t exec, int replays, uint32_t seed, int64_t k_floats,
                      bool only_zeroed) const {
    for (int replay = 0; replay < replays; ++replay) {
      RandomFill dirt = fill;
      dirt.seed = seed + static_cast<uint32_t>(replay);
      CUDA_CHECK(cuda::launch_fill_random(DType::F32, z.p, n, n, dirt, stream));  // nonzero again
      CUDA_CHECK(cudaMemsetAsync(c.p, 0xff, n * 2, stream));
      CUDA_CHECK(cudaMemsetAsync(d.p, 0xff, n * 2, stream));
      CUDA_CHECK(cudaGraphLaunch(exec, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> got_c(n), got_d(k_floats);
      std::vector<float> got_z(n);
      CUDA_CHECK(cudaMemcpy(got_c.data(), c.p, n * 2, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(got_d.data(), d.p, k_floats * 2, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(got_z.data(), z.p, n * 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(got_c, want_c) << "replay " << replay;
      EXPECT_EQ(got_d, std::vector<uint16_t>(k_floats, 0)) << "replay " << replay;
      if (only_zeroed) {
        size_t zeros_after = 0;
        for (int64_t i = k_floats; i < n; ++i) zeros_after += got_z[static_cast<size_t>(i)] == 0.0f;
        EXPECT_LT(zeros_after, 16u) << "replay " << replay;
      }
    }
  }
};

// The rewrite on a chain Q -> P -> M (memset of a dedicated buffer) -> K (reads that buffer): M then
// depends on Q, K on P and M, and a replay still zeroes the buffer before K reads it (every replay: the
// buffer is dirtied between them) while P's result is unchanged. A memset the predicate refuses stays, and
// so does one whose producer is preceded by a memset of the same buffer (the same product twice in a row).
TEST_F(CudaGemmTuningTest, HoistedWorkspaceMemsetStillZeroesBeforeItsKernel) {
  const int64_t n = 1 << 16;
  const MemsetChain ch(n, 17, stream_);
  const auto in_z = [&](const void* p) { return ch.in_z(p); };

  cudaGraph_t refused = ch.record(true, n, n);
  EXPECT_EQ(cuda::hoist_workspace_memsets(refused, [](const void*) { return false; }), 0);
  CUDA_CHECK(cudaGraphDestroy(refused));
  // The same product twice in a row: M' -> K' (z -> e) -> M -> K.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(cudaMemsetAsync(ch.z.p, 0, n * 4, stream_));
  ch.convert(ch.z, n, ch.e);
  CUDA_CHECK(cudaMemsetAsync(ch.z.p, 0, n * 4, stream_));
  ch.convert(ch.z, n, ch.d);
  cudaGraph_t twice = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &twice));
  EXPECT_EQ(cuda::hoist_workspace_memsets(twice, in_z), 0);
  CUDA_CHECK(cudaGraphDestroy(twice));

  cudaGraph_t graph = ch.record(true, n, n);
  const std::vector<cudaGraphNode_t> kernels = nodes_of(graph, cudaGraphNodeTypeKernel),
                                     memsets = nodes_of(graph, cudaGraphNodeTypeMemset);
  ASSERT_EQ(kernels.size(), 3u);
  ASSERT_EQ(memsets.size(), 1u);
  cudaGraphNode_t q = nullptr, p = nullptr, k = nullptr, m = memsets[0];
  for (cudaGraphNode_t node : kernels) {  // by their places in the chain
    const std::vector<cudaGraphNode_t> deps = dependencies(node);
    if (deps.empty())
      q = node;
    else if (deps[0] == m)
      k = node;
    else
      p = node;
  }
  ASSERT_TRUE(q && p && k);
  ASSERT_EQ(dependencies(m), std::vector<cudaGraphNode_t>{p});

  ASSERT_EQ(cuda::hoist_workspace_memsets(graph, in_z), 1);
  EXPECT_EQ(dependencies(m), std::vector<cudaGraphNode_t>{q});
  const std::vector<cudaGraphNode_t> k_deps = dependencies(k);
  EXPECT_EQ(k_deps.size(), 2u);
  EXPECT_TRUE(contains(k_deps, p) && contains(k_deps, m));
  EXPECT_EQ(dependencies(p), std::vector<cudaGraphNode_t>{q});

  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  ch.expect_replays(exec, 3, 100, n, /*only_zeroed=*/false);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

// The other rewrite on the same chain Q -> P -> M -> K, with a 256-byte memset (the largest it takes): M
// becomes a zeroing kernel Z between P and K (P -> Z -> K, the edge from P programmatic when asked), and a
// replay still zeroes the buffer before K reads it while P's result is unchanged. Memsets the predicate
// refuses, and larger ones, stay.
TEST_F(CudaGemmTuningTest, ReplacedWorkspaceMemsetZeroesBetweenProducerAndKernel) {
  const int64_t n = 1 << 16, zn = 64;  // zn floats: 256 bytes
  const MemsetChain ch(n, 23, stream_);
  const auto in_z = [&](const void* p) { return ch.in_z(p); };
  const void* zk = cuda::workspace_zero_kernel();

  cudaGraph_t refused = ch.record(true, zn, zn);
  EXPECT_EQ(cuda::replace_workspace_memsets(
                refused, [](const void*) { return false; }, zk, true),
            0);
  CUDA_CHECK(cudaGraphDestroy(refused));
  cudaGraph_t large = ch.record(true, zn + 1, zn);
  EXPECT_EQ(cuda::replace_workspace_memsets(large, in_z, zk, true), 0);
  EXPECT_EQ(nodes_of(large, cudaGraphNodeTypeMemset).size(), 1u);
  CUDA_CHECK(cudaGraphDestroy(large));

  for (bool programmatic : {true, false}) {
    cudaGraph_t graph = ch.record(true, zn, zn);
    std::vector<cudaGraphNode_t> kernels = nodes_of(graph, cudaGraphNodeTypeKernel);
    const cudaGraphNode_t m = nodes_of(graph, cudaGraphNodeTypeMemset).at(0);
    ASSERT_EQ(kernels.size(), 3u);
    const cudaGraphNode_t p = dependencies(m).at(0);
    cudaGraphNode_t k = nullptr;
    for (cudaGraphNode_t node : kernels)
      if (dependencies(node) == std::vector<cudaGraphNode_t>{m}) k = node;
    ASSERT_TRUE(k != nullptr);

    ASSERT_EQ(cuda::replace_workspace_memsets(graph, in_z, zk, programmatic), 1);
    EXPECT_TRUE(nodes_of(graph, cudaGraphNodeTypeMemset).empty());
    kernels = nodes_of(graph, cudaGraphNodeTypeKernel);
    ASSERT_EQ(kernels.size(), 4u);
    const std::vector<cudaGraphNode_t> k_deps = dependencies(k);
    ASSERT_EQ(k_deps.size(), 1u);
    const cudaGraphNode_t zn_node = k_deps[0];
    EXPECT_FALSE(contains(kernels, m));
    EXPECT_TRUE(contains(kernels, zn_node));
    EXPECT_EQ(dependencies(zn_node), std::vector<cudaGraphNode_t>{p});
    size_t ne = 1;
    cudaGraphNode_t from = nullptr;
    cudaGraphEdgeData edge{};
    CUDA_CHECK(cudaGraphNodeGetDependencies(zn_node, &from, &edge, &ne));
    if (programmatic) {
      EXPECT_EQ(edge.type, cudaGraphDependencyTypeProgrammatic);
    } else {
      EXPECT_EQ(edge.type, cudaGraphDependencyTypeDefault);
    }

    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    ch.expect_replays(exec, 3, 200, zn, /*only_zeroed=*/true);  // only the memset's 256 bytes zeroed
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
  }
}

// instantiate_rewritten: the rewrite works on a clone, so a rewrite that fails (returns -1) or whose graph
// does not instantiate (here: an edge that closes a cycle) leaves the recorded graph to be instantiated as it
// is, and a replay of it still zeroes the buffer before K; a rewrite that works is instantiated and the
// recorded graph keeps its memset.
TEST_F(CudaGemmTuningTest, RewriteThatFailsKeepsTheRecordedGraph) {
  const int64_t n = 1 << 12, zn = 64;
  const MemsetChain ch(n, 29, stream_);
  cudaGraph_t recorded = ch.record(false, zn, zn);
  const auto in_z = [&](const void* p) { return ch.in_z(p); };
  const auto replace = [&](cudaGraph_t g) {
    return cuda::replace_workspace_memsets(g, in_z, cuda::workspace_zero_kernel(), true);
  };
  const auto cyclic = [&](cudaGraph_t g) {
    const int count = replace(g);
    const std::vector<cudaGraphNode_t> kernels = nodes_of(g, cudaGraphNodeTypeKernel);
    cudaGraphNode_t first = nullptr, last = nullptr;  // P (no dependencies) and K (no dependents)
    for (cudaGraphNode_t node : kernels) {
      size_t out = 0;
      CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &out));
      if (dependencies(node).empty()) first = node;
      if (out == 0) last = node;
    }
    const cudaGraphEdgeData plain{};
    if (count < 0 || !first || !last ||
        cudaGraphAddDependencies(g, &last, &first, &plain, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return count;
  };
  const std::function<int(cudaGraph_t)> rewrites[] = {[](cudaGraph_t) { return -1; }, cyclic, replace};
  const int want_count[] = {-1, -1, 1};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(::testing::Message() << "rewrite " << i);
    cudaGraphExec_t exec = nullptr;
    int count = -2;
    ASSERT_EQ(cuda::instantiate_rewritten(recorded, rewrites[i], &exec, &count), cudaSuccess);
    ASSERT_TRUE(exec != nullptr);
    EXPECT_EQ(count, want_count[i]);
    EXPECT_EQ(nodes_of(recorded, cudaGraphNodeTypeMemset).size(), 1u);  // the clone was rewritten
    ch.expect_replays(exec, 1, 300 + static_cast<uint32_t>(i), zn, /*only_zeroed=*/false);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
  }
  CUDA_CHECK(cudaGraphDestroy(recorded));
}

// A recorded cuBLASLt product whose algorithm needs a small workspace (the Llama-3-8B lm_head's shape at
// 512 rows: every heuristic candidate of it has a 4-byte tile counter on Hopper, 2026-12-06) runs on its
// dedicated workspace, its memset moves beside the kernel before it (rewrite 1) or becomes a zeroing kernel
// (rewrite 2), and replays give the eager product's result each time (a counter left dirty by the previous
// replay would skip tiles).
void dedicated_workspace_product_replays(cudaStream_t stream_, int rewrite) {
  const int64_t t = 512, k = 4096, n = 128256;
  DeviceMem x(t * k * 2), w(n * k * 2), before(t * k * 2), out(t * n * 4), eager(t * n * 4);
  RandomFill fill;
  fill.amplitude = 1.0f;
  fill.seed = 3;
  CUDA_CHECK(cuda::launch_fill_random(DType::BF16, x.p, t * k, k, fill, stream_));
  fill.seed = 4;
  fill.amplitude = 0.05f;
  CUDA_CHECK(cuda::launch_fill_random(DType::BF16, w.p, n * k, k, fill, stream_));
  CublasLtGemm gemm(stream_);
  gemm.lt().set_dedicated_workspaces(true);
  // Eager first: tuned on the shared workspace (the graph below takes the same algorithm).
  gemm.matmul(x.p, DType::BF16, t, k, DType::BF16, w.p, n, nullptr, static_cast<float*>(eager.p));
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  gemm.set_capturing(true);  // as CudaBackend::begin_graph_capture does: recorded products take slots
  // A kernel ahead of the product (its producer in a decode step: here a fill of another buffer).
  CUDA_CHECK(cuda::launch_fill_random(DType::BF16, before.p, t * k, k, fill, stream_));
  gemm.matmul(x.p, DType::BF16, t, k, DType::BF16, w.p, n, nullptr, static_cast<float*>(out.p));
  gemm.set_capturing(false);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  const std::vector<cudaGraphNode_t> memsets = nodes_of(graph, cudaGraphNodeTypeMemset);
  if (memsets.empty()) {
    CUDA_CHECK(cudaGraphDestroy(graph));
    GTEST_SKIP() << "this cuBLASLt's algorithm for the shape needs no workspace memset: nothing to move";
  }
  ASSERT_EQ(memsets.size(), 1u);
  cudaMemsetParams mp{};
  CUDA_CHECK(cudaGraphMemsetNodeGetParams(memsets[0], &mp));
  EXPECT_TRUE(gemm.lt().in_dedicated_workspace(mp.dst)) << "the recorded product is on the shared workspace";
  const auto dedicated = [&](const void* p) { return gemm.lt().in_dedicated_workspace(p); };
  if (rewrite == 1) {
    EXPECT_EQ(cuda::hoist_workspace_memsets(graph, dedicated), 1);
    EXPECT_TRUE(dependencies(memsets[0]).empty());  // its producer was the graph's first node
  } else {
    EXPECT_EQ(cuda::replace_workspace_memsets(graph, dedicated, cuda::workspace_zero_kernel(), true), 1);
    EXPECT_TRUE(nodes_of(graph, cudaGraphNodeTypeMemset).empty());
  }
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> want(static_cast<size_t>(t * n));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaMemcpy(want.data(), eager.p, want.size() * 4, cudaMemcpyDeviceToHost));
  for (int replay = 0; replay < 3; ++replay) {
    CUDA_CHECK(cudaMemsetAsync(out.p, 0, t * n * 4, stream_));
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    std::vector<float> got(static_cast<size_t>(t * n));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(got.data(), out.p, got.size() * 4, cudaMemcpyDeviceToHost));
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << "replay " << replay;
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

TEST_F(CudaGemmTuningTest, DedicatedWorkspaceProductReplaysWithItsMemsetMoved) {
  dedicated_workspace_product_replays(stream_, 1);
}

TEST_F(CudaGemmTuningTest, DedicatedWorkspaceProductReplaysWithItsMemsetReplaced) {
  dedicated_workspace_product_replays(stream_, 2);
}

}  // namespace
}  // namespace inferx
