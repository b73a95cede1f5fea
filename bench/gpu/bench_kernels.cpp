// Kernel micro-benchmarks of the CUDA backend against ceilings measured in the same run:
//   copy ceiling  = a 1 GiB device-to-device cudaMemcpy, (bytes read + bytes written) / time;
//   matrix ceiling = cuBLASLt BF16 x BF16 -> F32 GEMM of 8192 x 4096 x 14336 (the 8B MLP shape).
// Each kernel is run through the backend's public calls on random data (never zeros), warmed up, then
// timed over `reps` launches (host clock around a synchronised batch, so launch gaps count against us),
// and reported as achieved GB/s or TFLOP/s and the fraction of the ceiling. Usage: bench_cuda_kernels
// [--quick]. Prints one table; the numbers go to docs/benchmarks.md.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "core/error.h"

namespace inferx {
namespace {

struct Bench {
  CudaBackend& gpu;
  std::vector<std::unique_ptr<DeviceBuffer>> keep;

  void* random(size_t bytes, uint64_t seed) {
    keep.push_back(gpu.allocate(bytes));
    Tensor t(DType::BF16, {static_cast<int64_t>(bytes / 2)}, keep.back()->data(), Device::CUDA);
    gpu.fill_random(t, seed, 1.0f, 0.0f);  // BF16 bit patterns of values in [-1, 1]: finite as F32 pairs too
    return keep.back()->data();
  }
  Tensor f32(int64_t rows, int64_t cols, uint64_t seed) {
    keep.push_back(gpu.allocate(static_cast<size_t>(rows * cols) * 4));
    Tensor t(DType::F32, {rows, cols}, keep.back()->data(), Device::CUDA);
    gpu.fill_random(t, seed, 1.0f, 0.0f);
    return t;
  }
  const int32_t* ints(const std::vector<int32_t>& v) {
    keep.push_back(gpu.allocate(v.size() * 4));
    gpu.copy_to_device(keep.back()->data(), v.data(), v.size() * 4);
    return static_cast<const int32_t*>(keep.back()->data());
  }
  // Seconds per call: 3 warm-up calls, then `reps` calls between two synchronisations.
  double time(const std::function<void()>& f, int reps) {
    for (int i = 0; i < 3; ++i) f();
    gpu.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    gpu.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  }
};

// snprintf rather than string concatenation (GCC 12 -O3 warns spuriously on operator+ with to_string).
std::string fmt_shape(const char* f, long long a, long long b = 0) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

void row(const char* kernel, const std::string& shape, double seconds, double amount, bool flops,
         double ceiling) {
  const double rate = amount / seconds / (flops ? 1e12 : 1e9);
  std::printf("%-22s %-34s %10.1f us %9.1f %-7s %5.1f%% of %.0f\n", kernel, shape.c_str(), seconds * 1e6,
              rate, flops ? "TFLOP/s" : "GB/s", 100.0 * rate / ceiling, ceiling);
}

int run(bool quick) {
  auto backend = make_cuda_backend(0);
  auto& gpu = static_cast<CudaBackend&>(*backend);
  Bench b{gpu, {}};
  const int reps = quick ? 5 : 20;
  std::printf("device: %s, %d SMs\n", gpu.name().c_str(), gpu.sm_count());

  // Ceilings.
  const size_t copy_bytes = size_t{1} << 30;
  void* src = b.random(copy_bytes, 1);
  b.keep.push_back(gpu.allocate(copy_bytes));
  void* dst = b.keep.back()->data();
  const double t_copy =
      b.time([&] { CUDA_CHECK(cudaMemcpy(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); }, reps);
  const double copy_gbs = 2.0 * copy_bytes / t_copy / 1e9;
  b.keep.pop_back();
  b.keep.erase(b.keep.begin());
  std::printf("ceiling: device copy %.0f GB/s (read + write)\n", copy_gbs);

  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  double gemm_tflops = 0;
  {
    cuda::CublasLtGemm gemm(stream);
    const int64_t t = 8192, k = 4096, n = 14336;
    void* x = b.random(static_cast<size_t>(t * k) * 2, 2);
    void* w = b.random(static_cast<size_t>(n * k) * 2, 3);
    Tensor out = b.f32(t, n, 4);
    gpu.synchronize();
    const auto once = [&] {
      gemm.matmul(x, DType::BF16, t, k, DType::BF16, w, n, nullptr, out.ptr<float>());
    };
    for (int i = 0; i < 3; ++i) once();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) once();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    gemm_tflops = 2.0 * t * k * n / s / 1e12;
    std::printf("ceiling: cuBLASLt bf16 GEMM %.0f TFLOP/s (8192 x 4096 x 14336)\n", gemm_tflops);
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("%-22s %-34s %13s %17s\n", "kernel", "shape", "time", "achieved");

  // Decode attention, Llama-3-8B heads: bytes = K and V of every visible key, BF16.
  const int64_t hq = 32, hkv = 8, hd = 128, bs = 16;
  struct DecodeShape {
    int64_t batch, context;
  };
  const DecodeShape decode_shapes[] = {{1, 1024}, {1, 8192}, {1, 32768}, {32, 1024}, {256, 1024}, {64, 4096}};
  for (const DecodeShape& ds : decode_shapes) {
    if (quick && ds.context > 8192) continue;
    const size_t mark = b.keep.size();
    const int64_t blocks_per_seq = (ds.context + bs - 1) / bs;
    const int64_t num_blocks = blocks_per_seq * ds.batch;
    std::vector<int32_t> table(static_cast<size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(5));
    std::vector<int32_t> positions(ds.batch, static_cast<int32_t>(ds.context - 1)), qs(ds.batch + 1),
        lens(ds.batch, static_cast<int32_t>(ds.context));
    std::iota(qs.begin(), qs.end(), 0);
    BatchView view;
    view.num_tokens = view.num_seqs = static_cast<int32_t>(ds.batch);
    view.positions = b.ints(positions);
    view.query_start = b.ints(qs);
    view.seq_lens = b.ints(lens);
    view.block_tables = b.ints(table);
    view.max_blocks_per_seq = static_cast<int32_t>(blocks_per_seq);
    view.max_query_len = 1;
    view.max_seq_len = static_cast<int32_t>(ds.context);
    const size_t cache_bytes = static_cast<size_t>(num_blocks * bs * hkv * hd) * 2;
    KvCacheLayer cache{
        Tensor(DType::BF16, {num_blocks, bs, hkv, hd}, b.random(cache_bytes, 6), Device::CUDA),
        Tensor(DType::BF16, {num_blocks, bs, hkv, hd}, b.random(cache_bytes, 7), Device::CUDA)};
    Tensor q = b.f32(ds.batch, hq * hd, 8), out = b.f32(ds.batch, hq * hd, 9);
    const AttentionParams p{hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0};
    gpu.set_attention_kernel(CudaAttentionKernel::Decode);
    const double s = b.time([&] { gpu.attention(q, cache, view, p, out); }, reps);
    const double bytes = 2.0 * ds.batch * ds.context * hkv * hd * 2;
    row("decode attention", fmt_shape("b%lld ctx%lld 32/8x128", ds.batch, ds.context), s, bytes, false,
        copy_gbs);
    b.keep.resize(mark);
  }

  // Prefill attention: causal FLOPs 4 * hd * hq * T^2 / 2.
  for (int64_t T : {int64_t{2048}, int64_t{8192}}) {
    const size_t mark = b.keep.size();
    const int64_t blocks = (T + bs - 1) / bs;
    std::vector<int32_t> table(static_cast<size_t>(blocks)), positions(T), qs = {0, static_cast<int32_t>(T)},
                                                                           lens = {static_cast<int32_t>(T)};
    std::iota(table.begin(), table.end(), 0);
    std::iota(positions.begin(), positions.end(), 0);
    BatchView view;
    view.num_tokens = static_cast<int32_t>(T);
    view.num_seqs = 1;
    view.positions = b.ints(positions);
    view.query_start = b.ints(qs);
    view.seq_lens = b.ints(lens);
    view.block_tables = b.ints(table);
    view.max_blocks_per_seq = static_cast<int32_t>(blocks);
    view.max_query_len = static_cast<int32_t>(T);
    view.max_seq_len = static_cast<int32_t>(T);
    const size_t cache_bytes = static_cast<size_t>(blocks * bs * hkv * hd) * 2;
    KvCacheLayer cache{Tensor(DType::BF16, {blocks, bs, hkv, hd}, b.random(cache_bytes, 10), Device::CUDA),
                       Tensor(DType::BF16, {blocks, bs, hkv, hd}, b.random(cache_bytes, 11), Device::CUDA)};
    Tensor q = b.f32(T, hq * hd, 12), out = b.f32(T, hq * hd, 13);
    const AttentionParams p{hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0};
    gpu.set_attention_kernel(CudaAttentionKernel::Prefill);
    const double s = b.time([&] { gpu.attention(q, cache, view, p, out); }, quick ? 2 : 5);
    row("prefill attention", fmt_shape("T%lld causal 32/8x128", T), s, 4.0 * hd * hq * T * T / 2, true,
        gemm_tflops);
    b.keep.resize(mark);
  }
  gpu.set_attention_kernel(CudaAttentionKernel::Auto);

  // Fused element-wise kernels at the 8k-prefill shape. A BF16 matmul first makes the norms and SiLU
  // write their BF16 copies (the path a BF16 model takes).
  {
    const int64_t T = 8192, D = 4096, F = 14336;
    Tensor res = b.f32(T, D, 14), x = b.f32(T, D, 15), h = b.f32(T, D, 16), w = b.f32(1, D, 17);
    w = Tensor(DType::F32, {D}, w.data, Device::CUDA);
    Linear lin;
    lin.weight = Tensor(DType::BF16, {8, D}, b.random(size_t{8} * D * 2, 18), Device::CUDA);
    Tensor small = b.f32(T, 8, 19);
    gpu.matmul(h, lin, small);
    double s = b.time([&] { gpu.add_rmsnorm(res, x, w, 1e-5f, h); }, reps);
    row("add_rmsnorm+bf16", "8192x4096", s, double(T) * D * (4 * 4 + 2), false, copy_gbs);
    Tensor gate = b.f32(T, F, 20), up = b.f32(T, F, 21), act = b.f32(T, F, 22);
    s = b.time([&] { gpu.silu_mul(gate, up, act); }, reps);
    row("silu_mul+bf16", "8192x14336", s, double(T) * F * (3 * 4 + 2), false, copy_gbs);
  }

  // Sampling over the Llama 3 vocabulary: bytes = the logits read once (argmax) per row.
  for (int64_t rows : {int64_t{1}, int64_t{256}}) {
    const int64_t vocab = 128256;
    Tensor logits = b.f32(rows, vocab, 23);
    std::vector<int32_t> ids(rows);
    double s = b.time([&] { gpu.argmax(logits, ids.data()); }, reps);
    row("argmax (+D2H)", fmt_shape("%lldx128256", rows), s, double(rows) * vocab * 4, false, copy_gbs);
    std::vector<cuda::SampleParams> params(rows, cuda::SampleParams{0.8f, 50, 0.95f, 0.05f, 0.5f});
    s = b.time([&] { gpu.sample(logits, params.data(), ids.data()); }, reps);
    row("sample k/p/min-p", fmt_shape("%lldx128256", rows), s, double(rows) * vocab * 4, false, copy_gbs);
  }
  return 0;
}

}  // namespace
}  // namespace inferx

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  try {
    if (inferx::cuda_device_count() == 0) {
      std::fprintf(stderr, "bench_cuda_kernels: no CUDA device\n");
      return 2;
    }
    return inferx::run(quick);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
}
