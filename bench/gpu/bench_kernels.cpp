// Kernel micro-benchmarks of the CUDA backend against ceilings measured in the same run:
//   copy ceiling  = a 1 GiB device-to-device cudaMemcpy, (bytes read + bytes written) / time;
//   matrix ceiling = cuBLASLt BF16 x BF16 -> F32 GEMM of 8192 x 4096 x 14336 (the 8B MLP shape).
// Each kernel is run through the backend's public calls on random data (never zeros), warmed up, then
// timed over `reps` launches (host clock around a synchronised batch, so launch gaps count against us),
// and reported as achieved GB/s or TFLOP/s and the fraction of the ceiling. Usage: bench_cuda_kernels
// [--quick] [--gemm] (--gemm: the GEMM ceiling and GEMM rows only; INFERX_BENCH_ONLY=gemv: the copy
// ceiling and the GEMV rows only). Prints one table; the numbers go to docs/benchmarks.md.
#include <cuda.h>  // green contexts (the driver API: CUDA::cuda_driver)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_gemv.h"
#include "backend/cuda/kernels_quant.h"
#include "backend/cuda/quantized_gemm.h"
#include "core/error.h"

namespace inferx {
namespace {

struct Bench {
  CudaBackend& gpu;
  std::vector<std::unique_ptr<DeviceBuffer>> keep;

  void* random(size_t bytes, uint64_t seed) {
    keep.push_back(gpu.allocate(bytes));
    Tensor t(DType::BF16, {static_cast<int64_t>(bytes / 2)}, keep.back()->data(), Device::CUDA);
    gpu.fill_random(
        t, RandomFill{1.0f, 0.0f, seed});  // BF16 bit patterns of values in [-1, 1]: finite as F32 pairs too
    return keep.back()->data();
  }
  Tensor f32(int64_t rows, int64_t cols, uint64_t seed) {
    keep.push_back(gpu.allocate(static_cast<size_t>(rows * cols) * 4));
    Tensor t(DType::F32, {rows, cols}, keep.back()->data(), Device::CUDA);
    gpu.fill_random(t, RandomFill{1.0f, 0.0f, seed});
    return t;
  }
  const int32_t* ints(const std::vector<int32_t>& v) {
    keep.push_back(gpu.allocate(v.size() * 4));
    gpu.copy_to_device(keep.back()->data(), v.data(), v.size() * 4);
    return static_cast<const int32_t*>(keep.back()->data());
  }
  // A decode-only batch of `rows` sequences of `ctx` keys (the new token at position ctx - 1), their blocks
  // of `bs` slots shuffled over the cache (a wrong block-table lookup reads another sequence's keys);
  // num_blocks: what the cache must hold.
  struct DecodeBatch {
    BatchView view;
    int64_t num_blocks = 0;
  };
  // capacity > ctx: block-table rows of `capacity` keys, as a captured decode graph's (entries past ctx
  // unused).
  DecodeBatch decode_batch(int64_t rows, int64_t ctx, int64_t bs, int64_t capacity = 0) {
    return decode_batch(std::vector<int64_t>(static_cast<size_t>(rows), ctx), bs, capacity);
  }
  // One sequence per entry of `ctxs` (its context length), in that order.
  // shuffle: the blocks in a random order over the pool (as a long-running pool hands them out); false:
  // each sequence's blocks consecutive, sequences one after another.
  DecodeBatch decode_batch(const std::vector<int64_t>& ctxs, int64_t bs, int64_t capacity = 0,
                           bool shuffle = true) {
    const int64_t rows = static_cast<int64_t>(ctxs.size());
    const int64_t longest = *std::max_element(ctxs.begin(), ctxs.end());
    const int64_t width = std::max((longest + bs - 1) / bs, (capacity + bs - 1) / bs);
    DecodeBatch d;
    for (int64_t ctx : ctxs) d.num_blocks += (ctx + bs - 1) / bs;
    std::vector<int32_t> blocks(static_cast<size_t>(d.num_blocks));
    std::iota(blocks.begin(), blocks.end(), 0);
    if (shuffle) std::shuffle(blocks.begin(), blocks.end(), std::mt19937(5));
    std::vector<int32_t> table(static_cast<size_t>(rows * width), 0), positions,
        qs(static_cast<size_t>(rows) + 1), lens;
    int64_t next = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t ctx = ctxs[static_cast<size_t>(r)], per_seq = (ctx + bs - 1) / bs;
      std::copy_n(blocks.begin() + next, per_seq, table.begin() + r * width);
      next += per_seq;
      positions.push_back(static_cast<int32_t>(ctx - 1));
      lens.push_back(static_cast<int32_t>(ctx));
    }
    std::iota(qs.begin(), qs.end(), 0);
    BatchView& v = d.view;
    v.num_tokens = v.num_seqs = static_cast<int32_t>(rows);
    v.positions = ints(positions);
    v.query_start = ints(qs);
    v.seq_lens = ints(lens);
    v.block_tables = ints(table);
    v.max_blocks_per_seq = static_cast<int32_t>(width);
    v.max_query_len = 1;
    v.max_seq_len = static_cast<int32_t>(longest);
    return d;
  }
  // A prefill-only batch of `seqs` prompts of `len` tokens (positions 0..len - 1 each), every prompt's blocks
  // of `bs` slots consecutive in the cache (seqs * ceil(len / bs) blocks).
  BatchView prefill_batch(int64_t seqs, int64_t len, int64_t bs) {
    const int64_t per = (len + bs - 1) / bs;
    std::vector<int32_t> table(static_cast<size_t>(seqs * per)), positions, qs = {0}, lens;
    std::iota(table.begin(), table.end(), 0);
    for (int64_t sq = 0; sq < seqs; ++sq) {
      for (int64_t i = 0; i < len; ++i) positions.push_back(static_cast<int32_t>(i));
      qs.push_back(static_cast<int32_t>((sq + 1) * len));
      lens.push_back(static_cast<int32_t>(len));
    }
    BatchView v;
    v.num_tokens = static_cast<int32_t>(seqs * len);
    v.num_seqs = static_cast<int32_t>(seqs);
    v.positions = ints(positions);
    v.query_start = ints(qs);
    v.seq_lens = ints(lens);
    v.block_tables = ints(table);
    v.max_blocks_per_seq = static_cast<int32_t>(per);
    v.max_query_len = static_cast<int32_t>(len);
    v.max_seq_len = static_cast<int32_t>(len);
    return v;
  }
  // One layer's K and V cache [blocks, bs, kv heads, head dim] of `dtype` filled with random bytes (as FP8
  // codes a few are NaN, which costs the same time as any other value); seeds `seed` and `seed + 1`.
  KvCacheLayer kv_layer(DType dtype, int64_t blocks, int64_t bs, int64_t hkv, int64_t hd, uint64_t seed) {
    const size_t bytes = static_cast<size_t>(blocks * bs * hkv * hd) * (dtype == DType::F8_E4M3 ? 1 : 2);
    return {Tensor(dtype, {blocks, bs, hkv, hd}, random(bytes, seed), Device::CUDA),
            Tensor(dtype, {blocks, bs, hkv, hd}, random(bytes, seed + 1), Device::CUDA)};
  }
  // Seconds per call: 3 warm-up calls, then `reps` calls between two synchronisations (of the backend's
  // stream, or of `stream` for kernels launched directly on one).
  double time(const std::function<void()>& f, int reps, cudaStream_t stream = nullptr) {
    const auto sync = [&] {
      if (stream)
        CUDA_CHECK(cudaStreamSynchronize(stream));
      else
        gpu.synchronize();
    };
    for (int i = 0; i < 3; ++i) f();
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    sync();
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

// Decode GEMV (kernels_gemv.cu) against cuBLASLt on the Llama-3-8B projection shapes, each row on every
// GEMV kernel that reads its format (v1 / v2 / v3, same process; v3 also with at most 4 warps per CTA on
// some shapes). Each case cycles through enough copies of its weight to exceed the 50 MB L2 several times
// (so every launch streams from HBM), launched from a CUDA graph as a decode step is (launch gaps count).
// Bytes = the weight (+ its scales) per launch. x comes from the BF16 copy a norm writes, as in the model.
// BF16 products of more than one row run on cuBLASLt (CudaBackend::gemv_takes): timed once.
void bench_gemv(Bench& b, double copy_gbs, bool quick) {  // quick: fewer replays
  CudaBackend& gpu = b.gpu;
  CudaBackendOptions plain;
  plain.gemv = false;
  auto cublas_backend = make_cuda_backend(0, plain);
  auto& cub = static_cast<CudaBackend&>(*cublas_backend);
  struct Case {
    const char* name;
    DType dtype;
    int64_t n, k, m;
    bool silu;            // matmul_silu_mul of a stacked [gate; up] weight of n rows
    bool cublas;          // also time the same product through cuBLASLt (BF16 only)
    bool warps4;          // also time v3 with at most 4 warps per CTA
    bool zero = false;    // INT4: with zero points (asymmetric)
    int64_t group = 128;  // INT4: group size
  };
  const Case cases[] = {
      {"gemv bf16", DType::BF16, 4096, 4096, 1, false, true, false},
      {"gemv bf16", DType::BF16, 1024, 4096, 1, false, true, false},
      {"gemv bf16", DType::BF16, 6144, 4096, 1, false, true, false},  // fused q/k/v
      {"gemv bf16", DType::BF16, 14336, 4096, 1, false, true, false},
      {"gemv bf16 silu", DType::BF16, 28672, 4096, 1, true, false, false},  // fused gate/up
      {"gemv bf16", DType::BF16, 4096, 14336, 1, false, true, false},
      {"gemv bf16", DType::BF16, 128256, 4096, 1, false, true, false},
      {"gemv bf16", DType::BF16, 4096, 4096, 4, false, true, false},
      {"gemv bf16", DType::BF16, 4096, 4096, 16, false, true, false},
      {"gemv bf16", DType::BF16, 14336, 4096, 16, false, true, false},
      {"gemv fp8/ch", DType::F8_E4M3, 4096, 4096, 1, false, false, true},
      {"gemv fp8/ch", DType::F8_E4M3, 6144, 4096, 1, false, false, false},
      {"gemv fp8/ch", DType::F8_E4M3, 14336, 4096, 1, false, false, true},
      {"gemv fp8/ch silu", DType::F8_E4M3, 28672, 4096, 1, true, false, false},
      {"gemv fp8/ch", DType::F8_E4M3, 4096, 14336, 1, false, false, true},
      {"gemv fp8/ch", DType::F8_E4M3, 4096, 4096, 4, false, false, false},
      {"gemv fp8/ch", DType::F8_E4M3, 4096, 4096, 16, false, false, false},
      // Llama-3-70B's products at batch 1: q/k/v, o, gate/up, down.
      {"gemv fp8/ch", DType::F8_E4M3, 10240, 8192, 1, false, false, false},
      {"gemv fp8/ch", DType::F8_E4M3, 8192, 8192, 1, false, false, false},
      {"gemv fp8/ch silu", DType::F8_E4M3, 57344, 8192, 1, true, false, false},
      {"gemv fp8/ch", DType::F8_E4M3, 8192, 28672, 1, false, false, false},
      {"gemv int4 g128", DType::INT4, 4096, 4096, 1, false, false, true},
      {"gemv int4 g128", DType::INT4, 6144, 4096, 1, false, false, false},
      {"gemv int4 g128", DType::INT4, 14336, 4096, 1, false, false, true},
      {"gemv int4 g128 silu", DType::INT4, 28672, 4096, 1, true, false, false},
      {"gemv int4 g128", DType::INT4, 4096, 14336, 1, false, false, true},
      {"gemv int4 g128 asym", DType::INT4, 14336, 4096, 1, false, false, false, true},
      {"gemv int4 g128 asym", DType::INT4, 4096, 14336, 1, false, false, false, true},
      // The 8B int4 plans' group (g64: two subsets per set on v3), each projection of a layer.
      {"gemv int4 g64", DType::INT4, 4096, 4096, 1, false, false, false, false, 64},
      {"gemv int4 g64", DType::INT4, 6144, 4096, 1, false, false, false, false, 64},
      {"gemv int4 g64 silu", DType::INT4, 28672, 4096, 1, true, false, false, false, 64},
      {"gemv int4 g64", DType::INT4, 4096, 14336, 1, false, false, false, false, 64},
      {"gemv int4 g64", DType::INT4, 128256, 4096, 1, false, false, false, false, 64},
      {"gemv int4 g128", DType::INT4, 4096, 4096, 4, false, false, false},
      {"gemv int4 g128", DType::INT4, 4096, 4096, 16, false, false, false},
      {"gemv q8_0", DType::Q8_0, 14336, 4096, 1, false, false, false},
      {"gemv q8_0", DType::Q8_0, 4096, 14336, 1, false, false, false},
      {"gemv q4_k", DType::Q4_K, 14336, 4096, 1, false, false, false},
      {"gemv q4_k", DType::Q4_K, 4096, 14336, 1, false, false, false},
  };
  uint64_t seed = 1000;
  uint64_t key = 0x6e70;
  // INFERX_BENCH_GEMV_CASES: only the cases whose "name NxK mM" contains this text (e.g. "x8192").
  const char* only_cases = std::getenv("INFERX_BENCH_GEMV_CASES");
  for (const Case& c : cases) {
    if (only_cases != nullptr) {
      const std::string id = std::string(c.name) + " " + std::to_string(c.n) + "x" + std::to_string(c.k) +
                             " m" + std::to_string(c.m);
      if (id.find(only_cases) == std::string::npos) continue;
    }
    const size_t mark = b.keep.size();
    const int64_t rb = row_bytes(c.dtype, c.k);
    const size_t wbytes = static_cast<size_t>(c.n * rb);
    size_t sbytes = 0;
    if (c.dtype == DType::F8_E4M3) sbytes = static_cast<size_t>(c.n) * 4;
    if (c.dtype == DType::INT4) sbytes = static_cast<size_t>(c.n * (c.k / c.group)) * 2;
    const size_t zbytes = c.zero ? static_cast<size_t>(c.n * (c.k / c.group)) : 0;  // INT4 zero points
    sbytes += zbytes;
    const size_t per_launch = wbytes + sbytes;
    const int copies = static_cast<int>(std::max<size_t>(1, (size_t{400} << 20) / per_launch + 1));
    std::vector<Linear> ws(static_cast<size_t>(copies));
    for (Linear& l : ws) {
      l.weight = Tensor(c.dtype, {c.n, c.k}, b.random((wbytes + 1) / 2 * 2, ++seed), Device::CUDA);
      if (c.dtype == DType::F8_E4M3) {
        l.scale = b.f32(1, c.n, ++seed);
        l.scale = Tensor(DType::F32, {c.n}, l.scale.data, Device::CUDA);
      }
      if (c.dtype == DType::INT4) {
        l.scale = Tensor(DType::F16, {c.n, c.k / c.group}, b.random(sbytes - zbytes, ++seed), Device::CUDA);
        if (c.zero) l.zero = Tensor(DType::U8, {c.n, c.k / c.group}, b.random(zbytes, ++seed), Device::CUDA);
        l.group_size = c.group;
      }
    }
    Tensor src = b.f32(c.m, c.k, ++seed), x = b.f32(c.m, c.k, ++seed);
    Tensor norm_w = b.f32(1, c.k, ++seed);
    norm_w = Tensor(DType::F32, {c.k}, norm_w.data, Device::CUDA);
    const int64_t out_cols = c.silu ? c.n / 2 : c.n;
    Tensor out = b.f32(c.m, out_cols, ++seed), gate = b.f32(c.m, out_cols, ++seed),
           up = b.f32(c.m, out_cols, ++seed);
    Linear small;
    small.weight = Tensor(DType::BF16, {8, c.k}, b.random(size_t{8} * c.k * 2, ++seed), Device::CUDA);
    Tensor small_out = b.f32(c.m, 8, ++seed);
    const int launches = std::max(copies, 24);
    auto measure = [&](CudaBackend& be, bool via_gemv) {
      be.matmul(src, small, small_out);  // a BF16 product first: the norm then writes x's BF16 copy
      be.rmsnorm(src, norm_w, 1e-5f, x);
      auto step = [&] {
        for (int i = 0; i < launches; ++i) {
          const Linear& l = ws[static_cast<size_t>(i % copies)];
          if (c.silu && via_gemv)
            be.matmul_silu_mul(x, l, gate, up, out);
          else
            be.matmul(x, l, out);
        }
      };
      step();  // scratch sizing and cuBLASLt algorithm timing happen outside the capture
      be.synchronize();
      ++key;
      if (!be.begin_graph_capture()) return -1.0;
      step();
      be.end_graph_capture(key);
      be.replay_graph(key);
      be.synchronize();
      const int reps = quick ? 2 : 5;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) be.replay_graph(key);
      be.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      be.drop_graph(key);
      return s / reps / launches;
    };
    const std::string shape =
        fmt_shape("%lldx%lld", static_cast<long long>(c.n), static_cast<long long>(c.k)) +
        fmt_shape(" m%lld", static_cast<long long>(c.m));
    const bool gemv = c.dtype != DType::BF16 || c.m == 1;
    using cuda::GemvKernel;
    for (GemvKernel k : {GemvKernel::V1, GemvKernel::V2, GemvKernel::V3, GemvKernel::V4, GemvKernel::V5}) {
      if (!cuda::gemv_kernel_reads(k, c.dtype) || (!gemv && k != GemvKernel::V1)) continue;
      if (k == GemvKernel::V4 && c.m != 1)
        continue;  // v4 takes one activation row (more: v1, measured above)
      cuda::set_gemv_kernel(c.dtype, k);
      if (k == GemvKernel::V5) {
        // v5 (FP8 as W8A8 on tensor cores, v4's plan): 96 KB of staging per SM (its default), none
        // ("s0"), 160 KB ("s160").
        for (const auto& [suffix, smem_kb] :
             {std::pair<const char*, int>{"", 96}, {" s0", 0}, {" s160", 160}}) {
          cuda::set_gemv_v5_smem_kb(smem_kb);
          const std::string name = std::string(c.name) + " v5" + suffix;
          row(name.c_str(), shape, measure(gpu, true), double(per_launch), false, copy_gbs);
        }
        cuda::set_gemv_v5_smem_kb(-1);
        continue;
      }
      // Variants: v3 with CTAs of 4 warps (c.warps4); v4 with 8 loads per lane and batch ("l8"), with
      // its shared-memory prefetch at 96 / 160 / 200 KB per SM ("s96" ...), and with the K split forced to
      // 2 ("k2": every format, where the batches divide; the others unsplit); INT4 on v4 also with x in
      // shared memory as BF16 ("xb") and as F32 wherever it fits ("xf"; the other rows: F32 where that
      // costs no CTAs per SM). The rows without "l8" take 4 loads, not the launcher's choice by row length.
      struct Alt {
        const char* suffix;
        int v3_warps, v4_loads, v4_smem_kb, v4_ksplit, v4_x_f32;
      };
      const Alt alts[] = {{"", 0, 4, 0, 1, -1},        {" w4", 4, 4, 0, 1, -1},
                          {" l8", 0, 8, 0, 1, -1},     {" s96", 0, 4, 96, 1, -1},
                          {" s160", 0, 4, 160, 1, -1}, {" s200", 0, 4, 200, 1, -1},
                          {" k2", 0, 4, 0, 2, -1},     {" s96 k2", 0, 4, 96, 2, -1},
                          {" xb", 0, 4, 0, 1, 0},      {" xf", 0, 4, 0, 1, 2}};
      for (const Alt& a : alts) {
        const bool takes =
            a.suffix[0] == 0 || (k == GemvKernel::V3 && c.warps4 && a.v3_warps > 0) ||
            (k == GemvKernel::V4 && a.v3_warps == 0 && (a.v4_x_f32 < 0 || c.dtype == DType::INT4));
        if (!takes) continue;
        cuda::set_gemv_v3_max_warps(a.v3_warps);
        cuda::set_gemv_v4_shape(a.v4_loads, -1, -1, a.v4_smem_kb, a.v4_ksplit, a.v4_x_f32);
        const std::string name =
            std::string(c.name) + (gemv ? std::string(" ") + cuda::gemv_kernel_name(k) : "") + a.suffix;
        row(name.c_str(), shape, measure(gpu, true), double(per_launch), false, copy_gbs);
      }
      cuda::set_gemv_v3_max_warps(0);
      cuda::set_gemv_v4_shape(0, -1);
    }
    cuda::set_gemv_kernel(c.dtype, cuda::GemvKernel::Default);
    if (c.cublas) {
      const double sc = measure(cub, false);
      row("  cublasLt bf16", shape, sc, double(per_launch), false, copy_gbs);
    }
    b.keep.resize(mark);
  }
}

// The matrix ceiling: cuBLASLt BF16 x BF16 -> F32 of 8192 x 4096 x 14336 with the heuristic's algorithm
// (as every earlier run measured it); bench_gemm's tuned "gate|up 8192" row is the tuned rate of that shape.
double gemm_ceiling(Bench& b, int reps) {
  CudaBackend& gpu = b.gpu;
  const size_t mark = b.keep.size();
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  double gemm_tflops = 0;
  {
    cuda::CublasLtGemm gemm(stream);
    gemm.set_tuning(false);  // the heuristic's choice: the ceiling of every earlier run
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
  b.keep.resize(mark);
  return gemm_tflops;
}

// Heuristic vs tuned A/B of one product: both warmed up (tuning happens there), then kRounds alternating
// batches of `reps` calls each (so that clock and power drift hit both alike); seconds per call, the median
// batch of each. Returns {heuristic, tuned}.
constexpr int kRounds = 3;
std::pair<double, double> ab_seconds(const std::function<void(bool tuned)>& call,
                                     const std::function<void()>& sync, int reps) {
  std::vector<double> s[2];
  for (bool tuned : {false, true}) {
    for (int r = 0; r < 3; ++r) call(tuned);
  }
  sync();
  for (int round = 0; round < kRounds; ++round)
    for (int v = 0; v < 2; ++v) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) call(v == 1);
      sync();
      s[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
  for (std::vector<double>& v : s) std::sort(v.begin(), v.end());
  return {s[0][kRounds / 2], s[1][kRounds / 2]};
}

// The GEMMs of an 8B prefill (BF16 activations as the fused norms / SiLU provide them), per chunk size,
// each with cuBLASLt's heuristic choice ("heur") and with the autotuned algorithm ("tuned"; gemm_cublaslt.h;
// "tuned*": the tuner kept another algorithm than the heuristic's first, otherwise both rows run the same
// one and differ by noise only), against the heuristic's 8192 x 4096 x 14336 ceiling.
void bench_gemm(Bench& b, double gemm_tflops, int reps) {
  cudaStream_t gs = nullptr;
  CUDA_CHECK(cudaStreamCreate(&gs));
  {  // the GEMMs are destroyed before their stream
    cuda::CublasLtGemm heuristic(gs), tuned(gs);
    heuristic.set_tuning(false);
    tuned.set_tuning(true);
    const int64_t shapes[][2] = {{4096, 6144},  {4096, 4096},  {4096, 14336},
                                 {4096, 28672}, {14336, 4096}, {4096, 128256}};
    const char* names[] = {"qkv", "o", "gate|up", "gate+up", "down", "lm_head"};
    for (int64_t t : {int64_t{2048}, int64_t{8192}}) {
      for (int i = 0; i < 6; ++i) {
        if (i == 5 && t != 2048) continue;  // only the logits rows are computed in the engine; one check
        const int64_t k = shapes[i][0], n = shapes[i][1];
        const size_t mark = b.keep.size();
        void* x = b.random(static_cast<size_t>(t * k) * 2, 50);
        void* w = b.random(static_cast<size_t>(n * k) * 2, 51);
        Tensor o = b.f32(t, n, 52);
        b.gpu.synchronize();
        char shape[64];
        std::snprintf(shape, sizeof shape, "%s %lldx%lldx%lld", names[i], static_cast<long long>(t),
                      static_cast<long long>(k), static_cast<long long>(n));
        const uint64_t changed = tuned.tuning_stats().changed;
        const auto [heur_s, tuned_s] = ab_seconds(
            [&](bool tune) {
              (tune ? tuned : heuristic)
                  .matmul(x, DType::BF16, t, k, DType::BF16, w, n, nullptr, o.ptr<float>());
            },
            [&] { CUDA_CHECK(cudaStreamSynchronize(gs)); }, reps);
        const double flops = 2.0 * t * k * n;
        row("gemm bf16->f32 heur", shape, heur_s, flops, true, gemm_tflops);
        row(tuned.tuning_stats().changed > changed ? "gemm bf16->f32 tuned*" : "gemm bf16->f32 tuned", shape,
            tuned_s, flops, true, gemm_tflops);
        b.keep.resize(mark);
      }
    }
  }
  CUDA_CHECK(cudaStreamDestroy(gs));
}

// FP8 W8A8 GEMMs (per-channel weight scales) of an 8B prefill through the quantized GEMM the backend uses
// (quantized_gemm.h): F32 activations quantized per token, then cuBLASLt's FP8 GEMM (outer-vector scales
// when offered, else an epilogue kernel: "epi"), heuristic and tuned algorithm ("*" as above); FLOP rate
// against the BF16 ceiling (FP8's peak is twice it).
void bench_fp8_gemm(Bench& b, double gemm_tflops, int reps) {
  cudaStream_t qs = nullptr;
  CUDA_CHECK(cudaStreamCreate(&qs));
  {  // the GEMMs and their scratch are released before their stream
    std::unique_ptr<DeviceBuffer> scratch;
    size_t scratch_bytes = 0;
    const std::function<void*(size_t)> workspace = [&](size_t bytes) {
      if (bytes > scratch_bytes) {  // grows in the warm-up calls only
        CUDA_CHECK(cudaStreamSynchronize(qs));
        scratch = b.gpu.allocate(bytes);
        scratch_bytes = bytes;
      }
      return scratch->data();
    };
    cuda::QuantizedGemm heuristic(qs), tuned(qs);
    heuristic.set_tuning(false);
    tuned.set_tuning(true);
    const int64_t shapes[][2] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}};
    const char* names[] = {"qkv", "o", "gate+up", "down"};
    for (int64_t t : {int64_t{2048}, int64_t{8192}}) {
      for (int i = 0; i < 4; ++i) {
        const int64_t k = shapes[i][0], n = shapes[i][1];
        const size_t mark = b.keep.size();
        Linear lin;
        // BF16 bit patterns read as E4M3 codes: a few are NaN, which costs the GEMM the same time.
        lin.weight = Tensor(DType::F8_E4M3, {n, k}, b.random(static_cast<size_t>(n * k), 60), Device::CUDA);
        lin.scale = b.f32(1, n, 61);
        lin.scale = Tensor(DType::F32, {n}, lin.scale.data, Device::CUDA);
        Tensor x = b.f32(t, k, 62), o = b.f32(t, n, 63);
        b.gpu.synchronize();
        char shape[64];
        std::snprintf(shape, sizeof shape, "%s %lldx%lldx%lld", names[i], static_cast<long long>(t),
                      static_cast<long long>(k), static_cast<long long>(n));
        const uint64_t changed = tuned.tuning_stats().changed;
        const auto [heur_s, tuned_s] = ab_seconds(
            [&](bool tune) {
              (tune ? tuned : heuristic).matmul(x.ptr<float>(), t, lin, o.ptr<float>(), workspace);
            },
            [&] { CUDA_CHECK(cudaStreamSynchronize(qs)); }, reps);
        const cuda::QuantizedGemm::Path path = tuned.last_path();
        const char* variant = path == cuda::QuantizedGemm::Path::Fp8OuterScale ? ""
                              : path == cuda::QuantizedGemm::Path::Fp8         ? " epi"
                                                                               : " VIA-BF16";
        char label[40];
        std::snprintf(label, sizeof label, "fp8 w8a8%s heur", variant);
        row(label, shape, heur_s, 2.0 * t * k * n, true, gemm_tflops);
        std::snprintf(label, sizeof label, "fp8 w8a8%s tuned%s", variant,
                      tuned.tuning_stats().changed > changed ? "*" : "");
        row(label, shape, tuned_s, 2.0 * t * k * n, true, gemm_tflops);
        b.keep.resize(mark);
      }
    }
  }
  CUDA_CHECK(cudaStreamDestroy(qs));
}

// INFERX_BENCH_ONLY=fp8_rows: the FP8 GEMMs alone (E4M3 x E4M3 -> BF16 sums, as the served W8A8 products
// with the BF16 accumulator run them; no quantization pass, no epilogue) of one Llama-3-8B layer at a decode
// step's and a prefill step's row counts, each bucket tuned as the engine's warm-up tunes it (at its top
// first: 512 before 490 and 462), with the heuristic's 16 candidates (the default) and with 64
// (INFERX_GEMM_CANDIDATES); TFLOP/s against twice the BF16 ceiling (the FP8 tensor cores' peak rate).
void bench_fp8_rows(Bench& b, double gemm_tflops, int reps) {
  cudaStream_t st = nullptr;
  CUDA_CHECK(cudaStreamCreate(&st));
  {
    const int64_t shapes[][2] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}};  // k, n
    const char* names[] = {"qkv", "o", "gate+up", "down"};
    const int64_t max_t = 8192, max_k = 14336, max_n = 28672;
    std::vector<Tensor> w;
    for (int i = 0; i < 4; ++i) {
      b.keep.push_back(b.gpu.allocate(static_cast<size_t>(shapes[i][0] * shapes[i][1])));
      w.push_back(Tensor(DType::F8_E4M3, {shapes[i][1], shapes[i][0]}, b.keep.back()->data(), Device::CUDA));
      b.gpu.fill_random(w.back(), RandomFill{200.0f, 0.0f, 70 + static_cast<uint64_t>(i)});
    }
    b.keep.push_back(b.gpu.allocate(static_cast<size_t>(max_t * max_k)));
    Tensor x(DType::F8_E4M3, {max_t, max_k}, b.keep.back()->data(), Device::CUDA);
    b.gpu.fill_random(x, RandomFill{200.0f, 0.0f, 79});
    b.keep.push_back(b.gpu.allocate(static_cast<size_t>(max_t * max_n) * 2));
    void* d = b.keep.back()->data();
    b.gpu.synchronize();
    for (int cands : {16, 64}) {
      cuda::LtMatmul lt(st);
      lt.set_tuning(true);
      lt.set_candidates(cands);
      for (int64_t t : {int64_t{512}, int64_t{490}, int64_t{462}, int64_t{256}, int64_t{128}, int64_t{2048},
                        int64_t{8192}}) {
        double layer_s = 0, layer_flops = 0;
        for (int i = 0; i < 4; ++i) {
          const int64_t k = shapes[i][0], n = shapes[i][1];
          const cuda::LtOperands ops{w[static_cast<size_t>(i)].data, x.data, d, nullptr, nullptr, nullptr};
          const uint64_t changed = lt.stats().changed;
          cuda::LtMatmul::Plan* plan =
              lt.plan(cuda::lt_shape(CUDA_R_8F_E4M3, n, t, k, n, ops, CUDA_R_16BF), ops);
          if (plan == nullptr) {
            std::printf("fp8 gemm c%d %s: no algorithm\n", cands, names[i]);
            continue;
          }
          const double sec = b.time([&] { CUBLAS_CHECK(lt.run(*plan, ops)); }, reps, st);
          char label[40], shape[64];
          std::snprintf(label, sizeof label, "fp8 gemm c%d%s", cands,
                        lt.stats().changed > changed ? "*" : "");
          std::snprintf(shape, sizeof shape, "%s %lldx%lldx%lld", names[i], static_cast<long long>(t),
                        static_cast<long long>(k), static_cast<long long>(n));
          row(label, shape, sec, 2.0 * t * k * n, true, 2.0 * gemm_tflops);
          layer_s += sec;
          layer_flops += 2.0 * t * k * n;
        }
        std::printf("fp8 gemm c%d layer at %lld rows: %.1f us = %.0f TFLOP/s (x 32 layers: %.2f ms)\n", cands,
                    static_cast<long long>(t), 1e6 * layer_s, layer_flops / layer_s / 1e12, 32e3 * layer_s);
      }
    }
  }
  CUDA_CHECK(cudaStreamDestroy(st));
}

void bench_sampling(Bench& b, CudaBackend& gpu, double copy_gbs, int reps);

// A 1000 x 1000/1000 run's decode contexts: `rows` lengths uniform in 1000-2000 keys (fixed seed), and their
// mean.
std::vector<int64_t> run_contexts(int64_t rows, double& mean) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> len(1000, 2000);
  std::vector<int64_t> ctxs(static_cast<size_t>(rows));
  for (int64_t& c : ctxs) c = len(rng);
  mean = std::accumulate(ctxs.begin(), ctxs.end(), 0.0) / static_cast<double>(rows);
  return ctxs;
}

// INFERX_BENCH_ONLY=decode_splits: the decode attention (Llama-3-8B heads) over decode batches of 32-512 rows
// at 1k-4k context, FP8 cache (and BF16 at 1k and 4k), forced to 1-8 splits and with the split plan
// (decode_attention_plan) for the batch's own block-table width and for a captured graph's 4096- and
// 8192-key widths (the contexts stay as given): the data the plan's model is calibrated with.
void bench_decode_splits(double copy_gbs, int reps) {
  for (DType dt : {DType::F8_E4M3, DType::BF16}) {
    auto backend = make_cuda_backend(0, [dt] {
      CudaBackendOptions o;
      o.kv_cache_dtype = dt;
      return o;
    }());
    auto& gpu = static_cast<CudaBackend&>(*backend);
    Bench b{gpu, {}};
    const int64_t hq = 32, hkv = 8, hd = 128, bs = 16;
    const int64_t elem = dt == DType::F8_E4M3 ? 1 : 2;
    const AttentionParams p{hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0};
    const char* name = dt == DType::F8_E4M3 ? "fp8" : "bf16";
    for (int64_t ctx : {int64_t{1024}, int64_t{1536}, int64_t{4096}}) {
      if (dt == DType::BF16 && ctx == 1536) continue;
      for (int64_t rows : {int64_t{8}, int64_t{32}, int64_t{64}, int64_t{96}, int64_t{128}, int64_t{192},
                           int64_t{256}, int64_t{384}, int64_t{512}}) {
        const size_t mark = b.keep.size();
        const Bench::DecodeBatch batch = b.decode_batch(rows, ctx, bs);
        const KvCacheLayer cache = b.kv_layer(dt, batch.num_blocks, bs, hkv, hd, 6);
        Tensor q = b.f32(rows, hq * hd, 8), out = b.f32(rows, hq * hd, 9);
        const double bytes = 2.0 * rows * ctx * hkv * hd * elem;
        for (int splits : {1, 2, 3, 4, 8}) {
          gpu.set_attention_kernel(CudaAttentionKernel::Decode, splits);
          const double t = b.time([&] { gpu.attention(q, cache, batch.view, p, out); }, reps);
          char label[48];
          std::snprintf(label, sizeof label, "%s decode %d splits", name, splits);
          row(label, fmt_shape("b%lld ctx%lld", rows, ctx), t, bytes, false, copy_gbs);
        }
        gpu.set_attention_kernel(CudaAttentionKernel::Auto);
        for (int64_t capacity : {int64_t{0}, int64_t{4096}, int64_t{8192}}) {
          const Bench::DecodeBatch wide = b.decode_batch(rows, ctx, bs, capacity);
          const cuda::DecodeSplitPlan plan = cuda::decode_attention_plan(
              rows, hkv, hq, int64_t{wide.view.max_blocks_per_seq} * bs, gpu.sm_count(), dt);
          const double t = b.time([&] { gpu.attention(q, cache, wide.view, p, out); }, reps);
          char label[48];
          std::snprintf(label, sizeof label, "%s plan %d/%d cap%lld", name, plan.splits, plan.min_tiles,
                        static_cast<long long>(capacity));
          row(label, fmt_shape("b%lld ctx%lld", rows, ctx), t, bytes, false, copy_gbs);
        }
        b.keep.resize(mark);
      }
    }
    if (dt != DType::F8_E4M3) continue;
    // Mixed context lengths, as a 1000 x 1000/1000 run's decode steps hold (1k-2k keys, the oldest and
    // longest sequences first in the scheduler's order), against the same lengths shuffled and ascending, and
    // a uniform batch of their mean: how much of the run's per-row gap to the uniform bench (docs/
    // benchmarks.md, 2026-12-04 call 3) the mix and its order explain. The plan for a 4096-key capacity.
    for (int64_t rows : {int64_t{256}, int64_t{512}}) {
      double mean = 0;
      const std::vector<int64_t> ctxs = run_contexts(rows, mean);
      const double bytes = 2.0 * mean * static_cast<double>(rows) * hkv * hd * elem;
      std::vector<std::pair<const char*, std::vector<int64_t>>> orders;
      std::vector<int64_t> desc = ctxs, asc = ctxs;
      std::sort(desc.begin(), desc.end(), std::greater<>());
      std::sort(asc.begin(), asc.end());
      orders.push_back({"mix longest first", desc});
      orders.push_back({"mix shuffled", ctxs});
      orders.push_back({"mix shortest first", asc});
      orders.push_back({"uniform mean", std::vector<int64_t>(ctxs.size(), static_cast<int64_t>(mean))});
      for (const auto& [label, lens] : orders) {
        const size_t mark = b.keep.size();
        const Bench::DecodeBatch batch = b.decode_batch(lens, bs, 4096);
        const KvCacheLayer cache = b.kv_layer(dt, batch.num_blocks, bs, hkv, hd, 6);
        Tensor q = b.f32(rows, hq * hd, 8), out = b.f32(rows, hq * hd, 9);
        const double t = b.time([&] { gpu.attention(q, cache, batch.view, p, out); }, reps);
        char name_buf[48];
        std::snprintf(name_buf, sizeof name_buf, "fp8 %s", label);
        row(name_buf, fmt_shape("b%lld ctx1k-2k", rows), t, bytes, false, copy_gbs);
        b.keep.resize(mark);
      }
    }
  }
}

// INFERX_BENCH_ONLY=decode_context: the FP8-cache decode attention of a 1000 x 1000/1000 run's decode step
// (490 rows, 1k-2k keys, longest first as the scheduler orders them, a 4096-key graph capacity) in the
// settings the run has and the kernel rows lack, to find where the run's 76-81% of copy (docs/benchmarks.md,
// 2026-12-04) parts from the bench's 92%: alone back to back; behind RoPE + KV write (the PDL predecessor it
// waits for in a step; RoPE alone subtracted); the same two recorded in a CUDA graph and replayed; and
// cycling over 32 layers' caches, each its own allocation, as a step's 32 launches do.
void bench_decode_context(double copy_gbs, int reps) {
  CudaBackendOptions o;
  o.kv_cache_dtype = DType::F8_E4M3;
  auto backend = make_cuda_backend(0, o);
  auto& gpu = static_cast<CudaBackend&>(*backend);
  Bench b{gpu, {}};
  // INFERX_BENCH_CONTEXT_BS: the KV block size (default 16): larger blocks keep more of a sequence's keys
  // in one place whatever the block order.
  const char* bs_env = std::getenv("INFERX_BENCH_CONTEXT_BS");
  const int64_t hq = 32, hkv = 8, hd = 128, rows = 490, layers = 32,
                bs = bs_env != nullptr ? std::max<int64_t>(1, std::atoll(bs_env)) : 16;
  std::printf("decode_context: KV block size %lld\n", static_cast<long long>(bs));
  const AttentionParams p{hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0};
  const RopeParams rope{hd, 500000.0f, RopeLayout::NeoX, {}};
  double mean = 0;
  std::vector<int64_t> ctxs = run_contexts(rows, mean);
  std::sort(ctxs.begin(), ctxs.end(), std::greater<>());
  const double bytes = 2.0 * mean * static_cast<double>(rows) * hkv * hd;
  const Bench::DecodeBatch batch = b.decode_batch(ctxs, bs, 4096);
  std::vector<KvCacheLayer> caches;
  for (int64_t l = 0; l < layers; ++l)
    caches.push_back(
        b.kv_layer(DType::F8_E4M3, batch.num_blocks, bs, hkv, hd, 100 + 2 * static_cast<uint64_t>(l)));
  Tensor q = b.f32(rows, hq * hd, 8), k = b.f32(rows, hkv * hd, 9), v = b.f32(rows, hkv * hd, 10),
         out = b.f32(rows, hq * hd, 11);
  const std::string shape = fmt_shape("b%lld ctx1k-2k desc", rows);
  const auto attend = [&](int64_t l) {
    gpu.attention(q, caches[static_cast<size_t>(l)], batch.view, p, out);
  };
  const auto rope_write = [&](int64_t l) {
    gpu.rope_and_write_kv(q, k, v, batch.view, rope, caches[static_cast<size_t>(l)]);
  };
  const double alone = b.time([&] { attend(0); }, reps);
  row("fp8 attn alone", shape, alone, bytes, false, copy_gbs);
  const double t_rope = b.time([&] { rope_write(0); }, reps);
  const double both = b.time([&] { rope_write(0), attend(0); }, reps);
  row("fp8 attn after rope", shape, both - t_rope, bytes, false, copy_gbs);
  std::printf("%-22s %-34s %10.1f us\n", "rope + kv write", shape.c_str(), 1e6 * t_rope);
  // Graphs: `layers` launches per replay, as a step has.
  const auto graph_time = [&](const std::function<void()>& body, uint64_t key) {
    body();  // eager first: sizes every scratch buffer before the recording
    gpu.synchronize();
    if (!gpu.begin_graph_capture()) return -1.0;
    body();
    gpu.end_graph_capture(key);
    const double t =
        b.time([&] { INFERX_CHECK(gpu.replay_graph(key), "bench: graph {} was dropped", key); }, reps);
    gpu.drop_graph(key);
    return t / static_cast<double>(layers);
  };
  const double g_rope = graph_time(
      [&] {
        for (int64_t l = 0; l < layers; ++l) rope_write(l);
      },
      0xdec1);
  const double g_both = graph_time(
      [&] {
        for (int64_t l = 0; l < layers; ++l) rope_write(l), attend(l);
      },
      0xdec2);
  const double g_attn = graph_time(
      [&] {
        for (int64_t l = 0; l < layers; ++l) attend(l);
      },
      0xdec3);
  row("fp8 attn graph", shape, g_attn, bytes, false, copy_gbs);
  row("fp8 attn graph+rope", shape, g_both - g_rope, bytes, false, copy_gbs);
  const double cycled = b.time(
                            [&] {
                              for (int64_t l = 0; l < layers; ++l) attend(l);
                            },
                            reps) /
                        static_cast<double>(layers);
  row("fp8 attn 32 caches", shape, cycled, bytes, false, copy_gbs);
  // Where that parts from one cache (measured 2026-12-05: 88.9% alone, 78.5% over 32): how many caches the
  // launches cycle over (the GPU's TLB reach: 1.5 GB per layer here), and whether each sequence's blocks in
  // allocation order (its table sorted) win it back.
  for (int64_t k : {2, 4, 8, 16}) {
    const double t = b.time(
                         [&] {
                           for (int64_t l = 0; l < layers; ++l) attend(l % k);
                         },
                         reps) /
                     static_cast<double>(layers);
    char name[40];
    std::snprintf(name, sizeof name, "fp8 attn %lld caches", static_cast<long long>(k));
    row(name, shape, t, bytes, false, copy_gbs);
  }
  const Bench::DecodeBatch sorted = b.decode_batch(ctxs, bs, 4096, /*shuffle=*/false);
  const double sorted_one = b.time([&] { gpu.attention(q, caches[0], sorted.view, p, out); }, reps);
  row("fp8 attn sorted", shape, sorted_one, bytes, false, copy_gbs);
  const double sorted_cycled = b.time(
                                   [&] {
                                     for (int64_t l = 0; l < layers; ++l)
                                       gpu.attention(q, caches[static_cast<size_t>(l)], sorted.view, p, out);
                                   },
                                   reps) /
                               static_cast<double>(layers);
  row("fp8 attn 32 sorted", shape, sorted_cycled, bytes, false, copy_gbs);
}

// A space-separated list of integers from the environment variable `name`, or `fallback` when unset/empty.
std::vector<int64_t> env_ints(const char* name, std::vector<int64_t> fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  std::vector<int64_t> out;
  for (const char* p = v; *p != '\0';) {
    char* end = nullptr;
    const long long x = std::strtoll(p, &end, 10);
    if (end == p) break;
    out.push_back(x);
    p = end;
  }
  return out.empty() ? fallback : out;
}

// Two streams on disjoint SM sets of device 0 (green contexts, CUDA 12.4+): `sms` SMs (rounded as the driver
// requires: multiples of 8 on Hopper) for the first, the rest for the second. False, with the reason, when
// the driver offers no green contexts or refuses the split.
struct GreenStreams {
  cudaStream_t first = nullptr, second = nullptr;
  unsigned first_sms = 0, second_sms = 0;
};
void bench_overlap_once(int reps, int gemm_priority, const GreenStreams& green);
bool green_streams(unsigned sms, GreenStreams& out, std::string& why) {
  // Called directly (the bench links the driver library): on the H100 of 12-05 16:10 (driver 580.159)
  // cudaGetDriverEntryPointByVersion(..., 12040, ...) returned none of these five.
  const auto failed = [&why](const char* what, CUresult r) {
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    why = std::string(what) + " failed: " + (name != nullptr ? name : std::to_string(static_cast<int>(r)));
    return false;
  };
  CUdevResource all{}, part{}, rest{};
  unsigned groups = 1;
  CUresult r = cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM);
  if (r == CUDA_SUCCESS) r = cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, sms);
  if (r != CUDA_SUCCESS) return failed("cuDeviceGetDevResource / cuDevSmResourceSplitByCount", r);
  if (groups != 1) {
    why = "cuDevSmResourceSplitByCount made " + std::to_string(groups) + " groups";
    return false;
  }
  CUdevResourceDesc da = nullptr, db = nullptr;
  CUgreenCtx ga = nullptr, gb = nullptr;
  CUstream sa = nullptr, sb = nullptr;
  r = cuDevResourceGenerateDesc(&da, &part, 1);
  if (r == CUDA_SUCCESS) r = cuDevResourceGenerateDesc(&db, &rest, 1);
  if (r == CUDA_SUCCESS) r = cuGreenCtxCreate(&ga, da, 0, CU_GREEN_CTX_DEFAULT_STREAM);
  if (r == CUDA_SUCCESS) r = cuGreenCtxCreate(&gb, db, 0, CU_GREEN_CTX_DEFAULT_STREAM);
  if (r == CUDA_SUCCESS) r = cuGreenCtxStreamCreate(&sa, ga, CU_STREAM_NON_BLOCKING, 0);
  if (r == CUDA_SUCCESS) r = cuGreenCtxStreamCreate(&sb, gb, CU_STREAM_NON_BLOCKING, 0);
  if (r != CUDA_SUCCESS) return failed("green context or stream creation", r);
  // The contexts and streams live until the process ends (a bench run).
  out = {sa, sb, part.sm.smCount, rest.sm.smCount};
  return true;
}

// INFERX_BENCH_ONLY=overlap: what running a decode step's memory-bound attention and compute-bound GEMMs at
// the same time could give (docs/architecture.md: two half-batches on two streams). Two backends, two
// streams: one runs the FP8-cache decode attention of `rows` sequences at 1.5k context (Llama-3-8B heads),
// the other the four FP8 W8A8 products of one Llama-3-8B layer for `rows` tokens (q/k/v, o, gate/up, down),
// each `layers` times; printed: each alone, both launched together, the saving against their sum, the
// two-half-batch schedule (bench_overlap_pipelined), and a mixed step's decode attention beside its prefill
// attention (8 chunks of 1000 tokens) on the two streams. INFERX_BENCH_OVERLAP_ROWS: the row counts (default
// 128 256). INFERX_BENCH_SM_TARGETS: SM counts the GEMMs' cuBLASLt plans are told to use
// (INFERX_GEMM_SM_TARGET; 0, the default: the whole GPU), each pass with the default and the highest GEMM
// stream priority.
void bench_overlap(int reps) {
  for (int64_t target : env_ints("INFERX_BENCH_SM_TARGETS", {0})) {
    setenv("INFERX_GEMM_SM_TARGET", std::to_string(target).c_str(), 1);
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (int priority : {0, greatest}) {
      std::printf("overlap: GEMM SM target %lld, GEMM stream priority %d (attention's 0)\n",
                  static_cast<long long>(target), priority);
      bench_overlap_once(reps, priority, {});
    }
  }
  // INFERX_BENCH_GREEN_SMS: SM counts for the attention's green context (the GEMMs get the rest and are told
  // so through INFERX_GEMM_SM_TARGET).
  for (int64_t sms : env_ints("INFERX_BENCH_GREEN_SMS", {})) {
    GreenStreams g;
    std::string why;
    if (!green_streams(static_cast<unsigned>(sms), g, why)) {
      std::printf("overlap: green contexts of %lld SMs: %s\n", static_cast<long long>(sms), why.c_str());
      continue;
    }
    setenv("INFERX_GEMM_SM_TARGET", std::to_string(g.second_sms).c_str(), 1);
    std::printf("overlap: green contexts, attention on %u SMs, GEMMs on %u SMs\n", g.first_sms, g.second_sms);
    try {  // a green-context stream the runtime or cuBLASLt refuses is a finding, not the end of the run
      bench_overlap_once(reps, 0, g);
    } catch (const std::exception& e) {
      std::printf("overlap: green contexts of %lld SMs failed: %s\n", static_cast<long long>(sms), e.what());
      (void)cudaGetLastError();
    }
  }
}

// The schedule a decode step split into two half-batches would run (NanoFlow-style; docs/architecture.md):
// per layer the attention stream runs half A's attention, then half B's, each after its half's q/k/v
// product; the GEMM stream runs half A's o, gate/up and down (after A's attention) and A's next q/k/v while
// B's attention runs, then B's. The same Llama-3-8B layer shapes as bench_overlap_once, `layers` times;
// eager, and captured into one CUDA graph (the attention stream forked from the GEMM stream through an
// event) where the streams allow it. Printed beside the full batch's sequential estimate (attention alone +
// GEMMs alone at `rows`).
// The overlap benches' shapes: Llama-3-8B heads and projections, decode rows at 1.5k keys of 16-slot
// blocks, 8 layers per timed call.
namespace overlap_shape {
constexpr int64_t hq = 32, hkv = 8, hd = 128, bs = 16, ctx = 1536, D = 4096, F = 14336, layers = 8;
inline AttentionParams attention_params() { return {hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0}; }
}  // namespace overlap_shape

// Seconds per call of f (which queues work on both backends' streams): two warm-up calls, then `reps`
// timed between synchronisations of both streams.
double time_on_both(CudaBackend& a, CudaBackend& b, const std::function<void()>& f, int reps) {
  for (int i = 0; i < 2; ++i) f();
  a.synchronize();
  b.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  a.synchronize();
  b.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// "overlap rows R, L layers: A x us, B y us, sum, together z us (share of the sum; the larger alone)".
void print_overlap(int64_t rows, const char* a, double ta, const char* b, double tb, double both) {
  std::printf(
      "overlap rows %lld, %lld layers: %s %.1f us, %s %.1f us, sum %.1f us, together %.1f us (%.1f%% of "
      "the sum; the larger alone is %.1f%%)\n",
      static_cast<long long>(rows), static_cast<long long>(overlap_shape::layers), a, 1e6 * ta, b, 1e6 * tb,
      1e6 * (ta + tb), 1e6 * both, 100.0 * both / (ta + tb), 100.0 * std::max(ta, tb) / (ta + tb));
}

struct LayerWeights4 {
  const Linear *qkv, *o, *gate_up, *down;
};
void bench_overlap_pipelined(Bench& ba, Bench& bg, int64_t rows, int reps, LayerWeights4 w) {
  CudaBackend& ga = ba.gpu;
  CudaBackend& gg = bg.gpu;
  using namespace overlap_shape;
  const AttentionParams p = attention_params();
  struct Half {
    Bench::DecodeBatch batch;
    KvCacheLayer cache;
    Tensor q, out, x, y_qkv, y_o, act, y_gu, y_down;
  };
  Half h[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t r = i == 0 ? rows / 2 : rows - rows / 2;
    const uint64_t sd = 100 + 20 * static_cast<uint64_t>(i);
    h[i].batch = ba.decode_batch(r, ctx, bs);
    h[i].cache = ba.kv_layer(DType::F8_E4M3, h[i].batch.num_blocks, bs, hkv, hd, sd);
    h[i].q = ba.f32(r, hq * hd, sd + 1);
    h[i].out = ba.f32(r, hq * hd, sd + 2);
    h[i].x = bg.f32(r, D, sd + 3);
    h[i].y_qkv = bg.f32(r, 6144, sd + 4);
    h[i].y_o = bg.f32(r, D, sd + 5);
    h[i].act = bg.f32(r, F, sd + 6);
    h[i].y_gu = bg.f32(r, 2 * F, sd + 7);
    h[i].y_down = bg.f32(r, D, sd + 8);
  }
  const auto sa = static_cast<cudaStream_t>(ga.stream()), sg = static_cast<cudaStream_t>(gg.stream());
  cudaEvent_t ev[6];  // q/k/v done (A, B), attention done (A, B), fork, join
  for (cudaEvent_t& e : ev) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const auto qkv = [&](int i) { gg.matmul(h[i].x, *w.qkv, h[i].y_qkv); };
  const auto rest = [&](int i) {
    gg.matmul(h[i].x, *w.o, h[i].y_o);
    gg.matmul(h[i].x, *w.gate_up, h[i].y_gu);
    gg.matmul(h[i].act, *w.down, h[i].y_down);
  };
  const auto pipelined = [&] {
    for (int i = 0; i < 2; ++i) {
      qkv(i);
      CUDA_CHECK(cudaEventRecord(ev[i], sg));
    }
    for (int64_t l = 0; l < layers; ++l) {
      for (int i = 0; i < 2; ++i) {
        CUDA_CHECK(cudaStreamWaitEvent(sa, ev[i], 0));
        ga.attention(h[i].q, h[i].cache, h[i].batch.view, p, h[i].out);
        CUDA_CHECK(cudaEventRecord(ev[2 + i], sa));
      }
      for (int i = 0; i < 2; ++i) {
        CUDA_CHECK(cudaStreamWaitEvent(sg, ev[2 + i], 0));
        rest(i);
        if (l + 1 < layers) {
          qkv(i);
          CUDA_CHECK(cudaEventRecord(ev[i], sg));
        }
      }
    }
  };
  const auto timed = [&](const std::function<void()>& f) { return time_on_both(ga, gg, f, reps); };
  const double eager = timed(pipelined);
  // One graph of the whole schedule: the attention stream joins the capture through the fork event and is
  // joined back before the capture ends.
  std::string graph_note;
  double replay = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaStreamBeginCapture(sg, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    try {
      CUDA_CHECK(cudaEventRecord(ev[4], sg));
      CUDA_CHECK(cudaStreamWaitEvent(sa, ev[4], 0));
      pipelined();
      CUDA_CHECK(cudaEventRecord(ev[5], sa));
      CUDA_CHECK(cudaStreamWaitEvent(sg, ev[5], 0));
    } catch (const std::exception& ex) {
      graph_note = std::string("capture failed: ") + ex.what();
    }
    const cudaError_t end = cudaStreamEndCapture(sg, &graph);
    if (graph_note.empty() && end != cudaSuccess)
      graph_note = std::string("capture: ") + cudaGetErrorString(end);
  } else {
    graph_note = std::string("begin capture: ") + cudaGetErrorString(e);
  }
  if (graph_note.empty()) {
    e = cudaGraphInstantiate(&exec, graph, 0);
    if (e != cudaSuccess) graph_note = std::string("instantiate: ") + cudaGetErrorString(e);
  }
  if (graph_note.empty()) replay = timed([&] { CUDA_CHECK(cudaGraphLaunch(exec, sg)); });
  (void)cudaGetLastError();
  if (exec) CUDA_CHECK(cudaGraphExecDestroy(exec));
  if (graph) CUDA_CHECK(cudaGraphDestroy(graph));
  for (cudaEvent_t& ev1 : ev) CUDA_CHECK(cudaEventDestroy(ev1));
  if (graph_note.empty())
    std::printf("overlap rows %lld as two halves, %lld layers, pipelined: eager %.1f us, graph %.1f us\n",
                static_cast<long long>(rows), static_cast<long long>(layers), 1e6 * eager, 1e6 * replay);
  else
    std::printf("overlap rows %lld as two halves, %lld layers, pipelined: eager %.1f us; graph: %s\n",
                static_cast<long long>(rows), static_cast<long long>(layers), 1e6 * eager,
                graph_note.c_str());
}

void bench_overlap_once(int reps, int gemm_priority, const GreenStreams& green) {
  auto make = [](int priority, cudaStream_t stream) {
    CudaBackendOptions o;
    o.kv_cache_dtype = DType::F8_E4M3;
    o.stream_priority = priority;
    o.external_stream = stream;
    return make_cuda_backend(0, o);
  };
  auto attn_backend = make(0, green.first), gemm_backend = make(gemm_priority, green.second);
  auto& ga = static_cast<CudaBackend&>(*attn_backend);
  auto& gg = static_cast<CudaBackend&>(*gemm_backend);
  Bench ba{ga, {}}, bg{gg, {}};
  ga.set_attention_kernel(CudaAttentionKernel::Decode);
  using namespace overlap_shape;
  const AttentionParams p = attention_params();
  // FP8 weights of one layer (random codes, per-channel scales) on the GEMM backend.
  auto fp8_linear = [&](int64_t n, int64_t k, uint64_t seed) {
    Linear l;
    bg.keep.push_back(gg.allocate(static_cast<size_t>(n * k)));
    l.weight = Tensor(DType::F8_E4M3, {n, k}, bg.keep.back()->data(), Device::CUDA);
    gg.fill_random(l.weight, RandomFill{200.0f, 0.0f, seed});
    bg.keep.push_back(gg.allocate(static_cast<size_t>(n) * 4));
    l.scale = Tensor(DType::F32, {n}, bg.keep.back()->data(), Device::CUDA);
    gg.fill_random(l.scale, RandomFill{0.0005f, 0.001f, seed + 1});
    return l;
  };
  const Linear qkv = fp8_linear(6144, D, 51), o = fp8_linear(D, D, 53), gate_up = fp8_linear(2 * F, D, 55),
               down = fp8_linear(D, F, 57);
  for (int64_t rows : env_ints("INFERX_BENCH_OVERLAP_ROWS", {128, 256})) {
    const size_t mark_a = ba.keep.size(), mark_g = bg.keep.size();
    // Attention inputs.
    const Bench::DecodeBatch batch = ba.decode_batch(rows, ctx, bs);
    const BatchView& view = batch.view;
    const KvCacheLayer cache = ba.kv_layer(DType::F8_E4M3, batch.num_blocks, bs, hkv, hd, 6);
    Tensor q = ba.f32(rows, hq * hd, 8), attn_out = ba.f32(rows, hq * hd, 9);
    // GEMM inputs and outputs.
    Tensor x = bg.f32(rows, D, 61), y_qkv = bg.f32(rows, 6144, 62), y_o = bg.f32(rows, D, 63),
           act = bg.f32(rows, F, 64), y_gu = bg.f32(rows, 2 * F, 65), y_down = bg.f32(rows, D, 66);
    const auto attention = [&] {
      for (int64_t l = 0; l < layers; ++l) ga.attention(q, cache, view, p, attn_out);
    };
    const auto gemms = [&] {
      for (int64_t l = 0; l < layers; ++l) {
        gg.matmul(x, qkv, y_qkv);
        gg.matmul(x, o, y_o);
        gg.matmul(x, gate_up, y_gu);
        gg.matmul(act, down, y_down);
      }
    };
    const auto timed = [&](const std::function<void()>& f) { return time_on_both(ga, gg, f, reps); };
    const double ta = timed(attention), tg = timed(gemms), both = timed([&] {
                                                             attention();
                                                             gemms();
                                                           });
    print_overlap(rows, "attention", ta, "FP8 GEMMs", tg, both);
    bench_overlap_pipelined(ba, bg, rows, reps, {&qkv, &o, &gate_up, &down});
    // A mixed step's two attentions on the two streams: the decode rows' (memory-bound) beside 8 prefill
    // chunks of 1000 tokens (tensor cores; the 1000 x 1000/1000 run's mixed steps run them one after the
    // other).
    {
      gg.set_attention_kernel(CudaAttentionKernel::Prefill);
      const int64_t seqs = 8, len = 1000, pt = seqs * len;
      const BatchView pview = bg.prefill_batch(seqs, len, bs);
      const KvCacheLayer pcache = bg.kv_layer(DType::F8_E4M3, seqs * ((len + bs - 1) / bs), bs, hkv, hd, 90);
      Tensor pq = bg.f32(pt, hq * hd, 91), pout = bg.f32(pt, hq * hd, 92);
      const auto prefill = [&] {
        for (int64_t l = 0; l < layers; ++l) gg.attention(pq, pcache, pview, p, pout);
      };
      const double tp = timed(prefill), both2 = timed([&] {
                                          attention();
                                          prefill();
                                        });
      print_overlap(rows, "decode attention", ta, "prefill attention 8 x 1000", tp, both2);
    }
    ba.keep.resize(mark_a);
    bg.keep.resize(mark_g);
  }
}

// INFERX_BENCH_ONLY=boundary (see run): a chain of 1000 empty dependent kernels (kernels_sync_probes.cu)
// replayed from a CUDA graph, per grid size and with / without programmatic dependent launch; the word
// they count in must end at the number of launches (a dependency the chain really carried).
void bench_boundary(Bench& b, int reps) {
  CudaBackend& gpu = b.gpu;
  b.keep.push_back(gpu.allocate(sizeof(uint32_t)));
  auto* word = static_cast<uint32_t*>(b.keep.back()->data());
  const auto stream = static_cast<cudaStream_t>(gpu.stream());
  constexpr int kChain = 1000;
  uint64_t key = 0xb0d0;
  for (bool pdl : {true, false})
    for (int ctas : {1, gpu.sm_count(), 4 * gpu.sm_count(), 8 * gpu.sm_count()}) {
      const uint32_t zero = 0;
      gpu.copy_to_device(word, &zero, sizeof zero);
      ++key;
      INFERX_CHECK(gpu.begin_graph_capture(), "bench: the boundary chain could not be recorded");
      for (int i = 0; i < kChain; ++i) CUDA_CHECK(cuda::launch_boundary_probe(word, ctas, 128, pdl, stream));
      gpu.end_graph_capture(key);
      const double s = b.time([&] { gpu.replay_graph(key); }, reps);  // 3 warm-up replays, then reps
      gpu.drop_graph(key);
      uint32_t count = 0;
      gpu.copy_to_host(&count, word, sizeof count);
      INFERX_CHECK(count == uint32_t{kChain} * static_cast<uint32_t>(3 + reps),
                   "bench: the boundary chain counted {} of {} launches", count, kChain * (3 + reps));
      std::printf("kernel boundary, %s, %d CTAs of 128 threads: %.3f us per kernel\n", pdl ? "PDL" : "no PDL",
                  ctas, 1e6 * s / kChain);
    }
}

// INFERX_BENCH_ONLY=grid_barrier (see run): 20000 rounds per launch, on every SM and on half of them.
void bench_grid_barrier(Bench& b, int reps) {
  CudaBackend& gpu = b.gpu;
  b.keep.push_back(gpu.allocate(2 * sizeof(uint32_t)));
  auto* words = static_cast<uint32_t*>(b.keep.back()->data());
  const auto stream = static_cast<cudaStream_t>(gpu.stream());
  const char* names[] = {"persistent kernel's (release add, acquire spin)", "fence before the add",
                         "generation flag"};
  constexpr int kRounds = 20000;
  for (int ctas : {gpu.sm_count(), gpu.sm_count() / 2})
    for (int v = 0; v < 3; ++v) {
      const double s =
          b.time([&] { CUDA_CHECK(cuda::launch_barrier_probe(v, words, kRounds, ctas, stream)); }, reps);
      std::printf("grid barrier, %d CTAs, %s: %.3f us per round\n", ctas, names[v], 1e6 * s / kRounds);
    }
  // The same barrier (the persistent kernel's) while each CTA's producer warp keeps `depth` 16 KB bulk
  // copies of its own 8 MB slice in flight (1 GB in all: no L2 reuse): us per round against the bytes in
  // flight per SM, and the stream's rate (kernels_sync_probes.cu).
  const int sms = gpu.sm_count();
  constexpr int64_t kSlice = int64_t{8} << 20;
  const void* src = b.random(static_cast<size_t>(kSlice) * static_cast<size_t>(sms), 91);
  b.keep.push_back(gpu.allocate(static_cast<size_t>(sms) * sizeof(unsigned long long)));
  auto* streamed = static_cast<unsigned long long*>(b.keep.back()->data());
  std::vector<unsigned long long> host(static_cast<size_t>(sms));
  // The last launch's streamed bytes over `ctas` CTAs per second of one launch (s), in GB/s.
  auto stream_gbs = [&](int ctas, double s) {
    gpu.synchronize();
    gpu.copy_to_host(host.data(), streamed, static_cast<size_t>(ctas) * sizeof(unsigned long long));
    double bytes = 0.0;
    for (int i = 0; i < ctas; ++i) bytes += static_cast<double>(host[static_cast<size_t>(i)]);
    return bytes / s / 1e9;
  };
  // "+ writes": each CTA stores 64 floats before every round (a phase's outputs), so the release waits for
  // their acknowledgements. (A two-level barrier over clusters was probed here too and lost at every depth:
  // docs/benchmarks.md, H100 2026-12-06 00:42.)
  b.keep.push_back(gpu.allocate(static_cast<size_t>(sms) * 64 * sizeof(float)));
  auto* writes = static_cast<float*>(b.keep.back()->data());
  constexpr int kStreamRounds = 2000;
  for (bool with_writes : {false, true})
    for (int depth : {0, 1, 2, 3, 4, 6, 8, 12}) {
      if (with_writes && depth != 0 && depth != 2 && depth != 6 && depth != 12) continue;
      const double s = b.time(
          [&] {
            CUDA_CHECK(cuda::launch_barrier_stream_probe(words, kStreamRounds, sms, src, kSlice, depth,
                                                         streamed, with_writes ? writes : nullptr, stream));
          },
          reps);
      const double gbs = depth > 0 ? stream_gbs(sms, s) : 0.0;
      std::printf(
          "grid barrier under a stream%s, %d CTAs, %3d KB in flight per SM: %.3f us per round, stream %.0f "
          "GB/s\n",
          with_writes ? " + writes" : "", sms, depth * 16, 1e6 * s / kStreamRounds, gbs);
    }
}

int run(bool quick, bool gemm_only) {
  auto backend = make_cuda_backend(0);
  auto& gpu = static_cast<CudaBackend&>(*backend);
  Bench b{gpu, {}};
  const int reps = quick ? 5 : 20;
  std::printf("device: %s, %d SMs\n", gpu.name().c_str(), gpu.sm_count());

  // INFERX_BENCH_ONLY=prefill: the ceilings and the prefill attention rows only; =gemv: the copy ceiling
  // and the GEMV rows only (kernel A/B runs).
  const char* only = std::getenv("INFERX_BENCH_ONLY");
  const bool prefill_only = only != nullptr && std::strcmp(only, "prefill") == 0;
  const bool gemv_only = only != nullptr && std::strcmp(only, "gemv") == 0;
  // =decode_fp8: the FP8-cache decode attention rows only, at the offline benchmark's sizes (Nsight Compute
  // runs: the first 3 launches are the warm-up).
  const bool decode_fp8_only = only != nullptr && std::strcmp(only, "decode_fp8") == 0;

  // =grid_barrier: what one grid-wide barrier of the persistent decode kernel's shape costs by itself
  // (kernels_sync_probes.cu), per variant, on every SM and on half of them; =boundary: what a kernel
  // boundary costs with nothing else in the chain.
  if (only != nullptr && std::strcmp(only, "grid_barrier") == 0) {
    bench_grid_barrier(b, reps);
    return 0;
  }
  if (only != nullptr && std::strcmp(only, "boundary") == 0) {
    bench_boundary(b, reps);
    return 0;
  }

  // Ceilings.
  const double gemm_tflops = gemv_only || decode_fp8_only ? 0.0 : gemm_ceiling(b, reps);
  if (only != nullptr && std::strcmp(only, "fp8_rows") == 0) {
    std::printf("%-22s %-34s %13s %17s\n", "kernel", "shape", "time", "achieved");
    bench_fp8_rows(b, gemm_tflops, reps);
    return 0;
  }
  if (gemm_only) {  // --gemm: only the GEMM rows
    std::printf("%-22s %-34s %13s %17s\n", "kernel", "shape", "time", "achieved");
    bench_gemm(b, gemm_tflops, reps);
    bench_fp8_gemm(b, gemm_tflops, reps);
    return 0;
  }
  const size_t copy_bytes = size_t{1} << 30;
  void* src = b.random(copy_bytes, 1);
  b.keep.push_back(gpu.allocate(copy_bytes));
  void* dst = b.keep.back()->data();
  // cudaMemcpy between device buffers returns before the copy ends (no host synchronisation for
  // device-to-device), and the backend's stream is another stream: both ceilings run on the default stream
  // and are timed over a whole-device synchronisation.
  const auto time_on_device = [&](const std::function<void()>& f) {
    for (int i = 0; i < 3; ++i) f();
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    CUDA_CHECK(cudaDeviceSynchronize());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  const double t_copy = time_on_device(
      [&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, nullptr)); });
  const double copy_gbs = 2.0 * copy_bytes / t_copy / 1e9;
  // The read-only ceiling (kernels_read_stream.cu): what a kernel that only streams its operands in
  // (decode attention) can reach.
  const double t_read = time_on_device([&] {
    CUDA_CHECK(
        cuda::launch_read_stream(src, copy_bytes, static_cast<uint32_t*>(dst), gpu.sm_count(), nullptr));
  });
  const double read_gbs = copy_bytes / t_read / 1e9;
  // =read_sms: the read-only stream on a part of the SMs (one CTA per SM) against the whole GPU's ceiling:
  // how much of the bandwidth a kernel confined to those SMs could reach.
  if (only != nullptr && std::strcmp(only, "read_sms") == 0) {
    std::printf("ceiling: read-only stream %.0f GB/s\n", read_gbs);
    for (int sms : {8, 16, 33, 44, 66, 88, 99, 110, 132}) {
      if (sms > gpu.sm_count()) continue;
      const double t = time_on_device([&] {
        CUDA_CHECK(
            cuda::launch_read_stream_on_sms(src, copy_bytes, static_cast<uint32_t*>(dst), sms, nullptr));
      });
      row("read-only on SMs", fmt_shape("%lld SMs of %lld, 1 GiB", sms, gpu.sm_count()), t,
          double(copy_bytes), false, read_gbs);
    }
    return 0;
  }
  b.keep.pop_back();
  b.keep.erase(b.keep.begin());
  std::printf("ceiling: device copy %.0f GB/s (read + write), read-only stream %.0f GB/s\n", copy_gbs,
              read_gbs);

  std::printf("%-22s %-34s %13s %17s\n", "kernel", "shape", "time", "achieved");
  if (gemv_only) {
    bench_gemv(b, copy_gbs, quick);
    return 0;
  }
  if (only != nullptr && std::strcmp(only, "overlap") == 0) {
    bench_overlap(reps);
    return 0;
  }
  if (only != nullptr && std::strcmp(only, "decode_splits") == 0) {
    bench_decode_splits(copy_gbs, reps);
    return 0;
  }
  if (only != nullptr && std::strcmp(only, "decode_context") == 0) {
    bench_decode_context(copy_gbs, reps);
    return 0;
  }
  if (only != nullptr && std::strcmp(only, "sampling") == 0) {  // =sampling: the argmax / sampler rows only
    bench_sampling(b, gpu, copy_gbs, reps);
    return 0;
  }
  // =rope: RoPE + KV write of Llama-3-8B's heads (32 q / 8 kv, head dim 128, NeoX) into an FP8 cache at
  // decode steps of 512 and 2048 rows (1k-key contexts): the token kernel, scalar and with four pairs per
  // thread (cuda::set_rope_vector). Bytes = q and k read and written, v read (F32), k and v codes written.
  if (only != nullptr && std::strcmp(only, "rope") == 0) {
    CudaBackendOptions o;
    o.kv_cache_dtype = DType::F8_E4M3;
    auto fp8_backend = make_cuda_backend(0, o);
    auto& g8 = static_cast<CudaBackend&>(*fp8_backend);
    Bench b8{g8, {}};
    const int64_t hq = 32, hkv = 8, hd = 128, bs = 16;
    const RopeParams rope{hd, 500000.0f, RopeLayout::NeoX, {}};
    for (int64_t rows : {int64_t{512}, int64_t{2048}}) {
      const Bench::DecodeBatch batch = b8.decode_batch(rows, 1024, bs);
      KvCacheLayer cache = b8.kv_layer(DType::F8_E4M3, batch.num_blocks, bs, hkv, hd, 40);
      Tensor q = b8.f32(rows, hq * hd, 41), k = b8.f32(rows, hkv * hd, 42), v = b8.f32(rows, hkv * hd, 43);
      const double bytes = double(rows) * hd * (8.0 * hq + 8.0 * hkv + 4.0 * hkv + 2.0 * hkv);
      cuda::set_rope_token_blocks(1);
      for (int vec : {0, 1}) {
        cuda::set_rope_vector(vec);
        const double s = b8.time([&] { g8.rope_and_write_kv(q, k, v, batch.view, rope, cache); }, reps);
        row(vec ? "rope+kv (vector)" : "rope+kv (token)", fmt_shape("b%lld 32/8x128 fp8", rows), s, bytes,
            false, copy_gbs);
      }
      cuda::set_rope_vector(-1);
      cuda::set_rope_token_blocks(-1);
    }
    return 0;
  }
  // =silu: the FP8 SiLU * up pass as the FP8 MLP runs it (BF16 sums, per-channel scales) at a decode and a
  // prefill step's rows; bytes = the BF16 sums read + the codes written.
  if (only != nullptr && std::strcmp(only, "silu") == 0) {
    const int64_t F = 14336;
    cudaStream_t st = nullptr;
    CUDA_CHECK(cudaStreamCreate(&st));
    for (int64_t T : {int64_t{300}, int64_t{512}, int64_t{8192}}) {
      const size_t mark = b.keep.size();
      Tensor xs = b.f32(1, T, 31), ws = b.f32(1, 2 * F, 32);
      void* acc = b.random(static_cast<size_t>(T * 2 * F) * 2, 33);  // random BF16 bits: finite mostly
      b.keep.push_back(gpu.allocate(static_cast<size_t>(T * F) + static_cast<size_t>(T) * 4));
      auto* codes = static_cast<uint8_t*>(b.keep.back()->data());
      cuda::Fp8Epilogue e;
      e.acc = acc;
      e.acc_bf16 = true;
      e.t = T;
      e.n = 2 * F;
      e.x_scale = xs.ptr<float>();
      e.w_scale = ws.ptr<float>();
      e.per_channel = true;
      e.silu = true;
      const cuda::SiluPass was = cuda::fp8_silu_pass();
      for (cuda::SiluPass pass : {cuda::SiluPass::Registers, cuda::SiluPass::SharedMemory}) {
        cuda::set_fp8_silu_pass(pass);
        const double s = b.time(
            [&] {
              CUDA_CHECK(
                  cuda::launch_fp8_silu_quantize(e, codes, reinterpret_cast<float*>(codes + T * F), st));
            },
            reps, st);
        row(pass == cuda::SiluPass::Registers ? "silu->fp8 (bf16 sums, registers)"
                                              : "silu->fp8 (bf16 sums, shared memory)",
            fmt_shape("%lldx14336", T), s, double(T) * F * (2 * 2 + 1), false, copy_gbs);
      }
      cuda::set_fp8_silu_pass(was);
      b.keep.resize(mark);
    }
    CUDA_CHECK(cudaStreamDestroy(st));
    return 0;
  }

  // Decode attention, Llama-3-8B heads: bytes = K and V of every visible key, BF16.
  const int64_t hq = 32, hkv = 8, hd = 128, bs = 16;
  struct DecodeShape {
    int64_t batch, context;
  };
  const DecodeShape all_decode_shapes[] = {{1, 1024},  {1, 8192},   {1, 32768},
                                           {32, 1024}, {256, 1024}, {64, 4096}};
  const DecodeShape offline_decode_shapes[] = {{256, 1024}, {512, 1536}};
  const std::span<const DecodeShape> decode_shapes = decode_fp8_only
                                                         ? std::span<const DecodeShape>(offline_decode_shapes)
                                                         : std::span<const DecodeShape>(all_decode_shapes);
  for (const DecodeShape& ds : decode_shapes) {
    if (prefill_only) break;
    if (quick && ds.context > 8192) continue;
    const size_t mark = b.keep.size();
    const Bench::DecodeBatch batch = b.decode_batch(ds.batch, ds.context, bs);
    const BatchView& view = batch.view;
    const KvCacheLayer cache = b.kv_layer(DType::BF16, batch.num_blocks, bs, hkv, hd, 6);
    Tensor q = b.f32(ds.batch, hq * hd, 8), out = b.f32(ds.batch, hq * hd, 9);
    const AttentionParams p{hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0};
    gpu.set_attention_kernel(CudaAttentionKernel::Decode);
    const double bytes = 2.0 * ds.batch * ds.context * hkv * hd * 2;
    if (!decode_fp8_only) {
      const double s = b.time([&] { gpu.attention(q, cache, view, p, out); }, reps);
      row("decode attention", fmt_shape("b%lld ctx%lld 32/8x128", ds.batch, ds.context), s, bytes, false,
          copy_gbs);
    }
    if (decode_fp8_only || (ds.context == 1024 && (ds.batch == 1 || ds.batch == 256))) {
      // The same bytes read as an FP8 cache (half the bytes; a few random codes are NaN, which costs the
      // same time as any other value).
      KvCacheLayer fp8 = cache;  // same shape, 1-byte elements: the first half of each buffer
      fp8.k.dtype = fp8.v.dtype = DType::F8_E4M3;
      auto fp8_backend = make_cuda_backend(0, [] {
        CudaBackendOptions o;
        o.kv_cache_dtype = DType::F8_E4M3;
        return o;
      }());
      auto& g8 = static_cast<CudaBackend&>(*fp8_backend);
      g8.set_attention_kernel(CudaAttentionKernel::Decode);
      Bench b8{g8, {}};
      const double s8 = b8.time([&] { g8.attention(q, fp8, view, p, out); }, reps);
      row("decode attention fp8", fmt_shape("b%lld ctx%lld 32/8x128", ds.batch, ds.context), s8, bytes / 2,
          false, copy_gbs);
      if (decode_fp8_only)
        std::printf("%-22s %-34s %13s %10.1f%% of the read-only %.0f\n", "", "", "",
                    100.0 * bytes / 2 / s8 / 1e9 / read_gbs, read_gbs);
    }
    b.keep.resize(mark);
  }
  if (decode_fp8_only) return 0;

  // Batch-1 decode attention of a whole 8B step: 32 layers (32 distinct caches, 128 MB, more than the L2)
  // at 1k context, captured once in a CUDA graph as the engine runs it; time per step.
  if (!prefill_only) {
    const int64_t ctx = 1024, layers = 32;
    const Bench::DecodeBatch batch = b.decode_batch(1, ctx, bs);
    const BatchView& view = batch.view;
    const size_t mark = b.keep.size();
    std::vector<KvCacheLayer> caches;
    for (int64_t l = 0; l < layers; ++l)
      caches.push_back(
          b.kv_layer(DType::BF16, batch.num_blocks, bs, hkv, hd, 40 + 2 * static_cast<uint64_t>(l)));
    Tensor q = b.f32(1, hq * hd, 8), out = b.f32(1, hq * hd, 9);
    const AttentionParams p{hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0};
    gpu.set_attention_kernel(CudaAttentionKernel::Decode);
    const auto step = [&] {
      for (const KvCacheLayer& c : caches) gpu.attention(q, c, view, p, out);
    };
    step();  // scratch allocated outside the capture
    gpu.synchronize();
    constexpr uint64_t kKey = 0xa77e;
    if (gpu.begin_graph_capture()) {
      step();
      gpu.end_graph_capture(kKey);
      const double s = b.time([&] { gpu.replay_graph(kKey); }, 50);
      row("decode attn 32 layers", "b1 ctx1024 graph, per step", s, 2.0 * layers * ctx * hkv * hd * 2, false,
          copy_gbs);
      gpu.drop_graph(kKey);
    }
    b.keep.resize(mark);
  }

  // Prefill attention: causal FLOPs 4 * hd * hq * T^2 / 2.
  std::vector<const char*> prefill_variants;
  if (const char* e = std::getenv("INFERX_BENCH_PREFILL_VARIANTS"); e != nullptr && std::strcmp(e, "0") != 0)
    prefill_variants = {"g3", "g2", "g3p"};
  for (int64_t T : {int64_t{2048}, int64_t{8192}}) {
    const size_t mark = b.keep.size();
    const int64_t blocks = (T + bs - 1) / bs;
    const BatchView view = b.prefill_batch(1, T, bs);
    const size_t cache_bytes = static_cast<size_t>(blocks * bs * hkv * hd) * 2;
    KvCacheLayer cache{Tensor(DType::BF16, {blocks, bs, hkv, hd}, b.random(cache_bytes, 10), Device::CUDA),
                       Tensor(DType::BF16, {blocks, bs, hkv, hd}, b.random(cache_bytes, 11), Device::CUDA)};
    Tensor q = b.f32(T, hq * hd, 12), out = b.f32(T, hq * hd, 13);
    const AttentionParams p{hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0};
    gpu.set_attention_kernel(CudaAttentionKernel::Prefill);
    const double s = b.time([&] { gpu.attention(q, cache, view, p, out); }, quick ? 2 : 5);
    row("prefill attention", fmt_shape("T%lld causal 32/8x128", T), s, 4.0 * hd * hq * T * T / 2, true,
        gemm_tflops);
    // INFERX_BENCH_PREFILL_VARIANTS=1: each kernel configuration too (kernels.h), one row each.
    for (const char* v : prefill_variants) {
      cuda::set_prefill_attention_variant(v);
      const double sv = b.time([&] { gpu.attention(q, cache, view, p, out); }, quick ? 2 : 5);
      row((std::string("prefill attention ") + v).c_str(), fmt_shape("T%lld causal 32/8x128", T), sv,
          4.0 * hd * hq * T * T / 2, true, gemm_tflops);
    }
    cuda::set_prefill_attention_variant(nullptr);
    if (T == 8192) {
      // FP8 cache (the BF16 bytes reinterpreted: the kernel's speed does not depend on the values).
      auto fp8_backend = make_cuda_backend(0, [] {
        CudaBackendOptions o;
        o.kv_cache_dtype = DType::F8_E4M3;
        return o;
      }());
      auto& g8 = static_cast<CudaBackend&>(*fp8_backend);
      g8.set_attention_kernel(CudaAttentionKernel::Prefill);
      KvCacheLayer fp8 = cache;  // same shape, 1-byte elements: the first half of each buffer
      fp8.k.dtype = fp8.v.dtype = DType::F8_E4M3;
      Bench b8{g8, {}};
      const double s8 = b8.time([&] { g8.attention(q, fp8, view, p, out); }, quick ? 2 : 5);
      row("prefill attention fp8", fmt_shape("T%lld causal 32/8x128", T), s8, 4.0 * hd * hq * T * T / 2, true,
          gemm_tflops);
      for (const char* v : prefill_variants) {
        cuda::set_prefill_attention_variant(v);
        const double sv = b8.time([&] { g8.attention(q, fp8, view, p, out); }, quick ? 2 : 5);
        row((std::string("prefill attn fp8 ") + v).c_str(), fmt_shape("T%lld causal 32/8x128", T), sv,
            4.0 * hd * hq * T * T / 2, true, gemm_tflops);
      }
      cuda::set_prefill_attention_variant(nullptr);
      // Chunked prefill: the last 2048 queries after 6144 cached keys (the shape of a later chunk).
      const int64_t C = 2048, start = T - C;
      std::vector<int32_t> cpos(static_cast<size_t>(C)), cqs = {0, static_cast<int32_t>(C)};
      std::iota(cpos.begin(), cpos.end(), static_cast<int32_t>(start));
      BatchView chunk = view;
      chunk.num_tokens = static_cast<int32_t>(C);
      chunk.positions = b.ints(cpos);
      chunk.query_start = b.ints(cqs);
      chunk.max_query_len = static_cast<int32_t>(C);
      Tensor qc(DType::F32, {C, hq * hd}, q.data, Device::CUDA),
          oc(DType::F32, {C, hq * hd}, out.data, Device::CUDA);
      const double sc = b.time([&] { gpu.attention(qc, cache, chunk, p, oc); }, quick ? 2 : 5);
      row("prefill attn chunk", "2048 after 6144 cached", sc, 4.0 * hd * hq * C * (start + C / 2.0), true,
          gemm_tflops);
      for (const char* v : prefill_variants) {
        cuda::set_prefill_attention_variant(v);
        const double sv = b.time([&] { gpu.attention(qc, cache, chunk, p, oc); }, quick ? 2 : 5);
        row((std::string("prefill attn chunk ") + v).c_str(), "2048 after 6144 cached", sv,
            4.0 * hd * hq * C * (start + C / 2.0), true, gemm_tflops);
      }
      cuda::set_prefill_attention_variant(nullptr);
    }
    b.keep.resize(mark);
  }

  // The prefill chunks of a 1000 x 1000/1000 run's mixed steps: 8 prompts of 1000 tokens each (varlen),
  // BF16 and FP8 caches, every configuration (short causal prompts are where GQA packing, "g3p", saves
  // the most key tiles). FLOPs 8 x 4 * hd * hq * 1000^2 / 2.
  {
    const size_t mark = b.keep.size();
    const int64_t seqs = 8, len = 1000, per = (len + bs - 1) / bs, T = seqs * len;
    const BatchView view = b.prefill_batch(seqs, len, bs);
    Tensor q = b.f32(T, hq * hd, 21), out = b.f32(T, hq * hd, 22);
    const AttentionParams p{hq, hkv, hd, 1.0f / std::sqrt(128.0f), 0};
    const double flops = static_cast<double>(seqs) * 4.0 * hd * hq * len * len / 2;
    for (DType dt : {DType::BF16, DType::F8_E4M3}) {
      auto be = make_cuda_backend(0, [dt] {
        CudaBackendOptions o;
        o.kv_cache_dtype = dt;
        return o;
      }());
      auto& g = static_cast<CudaBackend&>(*be);
      g.set_attention_kernel(CudaAttentionKernel::Prefill);
      Bench bb{g, {}};
      const KvCacheLayer cache = bb.kv_layer(dt, seqs * per, bs, hkv, hd, 23);
      const std::string name = dt == DType::BF16 ? "prefill 8x1000" : "prefill 8x1000 fp8";
      for (const char* v : {"g3", "g2", "g3p"}) {
        cuda::set_prefill_attention_variant(v);
        const double sv = bb.time([&] { g.attention(q, cache, view, p, out); }, quick ? 2 : 5);
        row((name + " " + v).c_str(), "8 prompts x 1000, 32/8x128", sv, flops, true, gemm_tflops);
      }
      cuda::set_prefill_attention_variant(nullptr);
    }
    b.keep.resize(mark);
  }

  if (prefill_only) return 0;
  bench_gemm(b, gemm_tflops, reps);
  bench_fp8_gemm(b, gemm_tflops, reps);
  gpu.set_attention_kernel(CudaAttentionKernel::Auto);

  bench_gemv(b, copy_gbs, quick);

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

    // The FP8 prefill passes (kernels_quant_fused.cu) against the separate passes they replace, launched
    // directly on a stream of their own. Bytes: what each variant moves.
    b.keep.push_back(gpu.allocate(static_cast<size_t>(T * F)));
    auto* codes = static_cast<uint8_t*>(b.keep.back()->data());
    Tensor row_scales = b.f32(1, T, 24), w_scales = b.f32(1, 2 * F, 25), acc = b.f32(T, 2 * F, 26);
    cudaStream_t st = nullptr;
    CUDA_CHECK(cudaStreamCreate(&st));
    gpu.synchronize();
    float* sc = row_scales.ptr<float>();  // the SiLU pass's input row scales
    Tensor q_scales = b.f32(1, T, 27);
    float* qs = q_scales.ptr<float>();  // the quantizers' output row scales
    s = b.time(
        [&] {
          CUDA_CHECK(cuda::launch_norm_quantize_fp8_rows(res.ptr<float>(), x.ptr<float>(), w.ptr<float>(),
                                                         1e-5f, T, D, codes, qs, st));
        },
        reps, st);
    row("norm->fp8 fused", "8192x4096", s, double(T) * D * (3 * 4 + 1), false, copy_gbs);
    s = b.time(
        [&] {
          CUDA_CHECK(cuda::launch_add_rmsnorm(res.ptr<float>(), x.ptr<float>(), w.ptr<float>(), 1e-5f, T, D,
                                              h.ptr<float>(), nullptr, st));
          CUDA_CHECK(cuda::launch_quantize_fp8_rows(h.ptr<float>(), T, D, codes, qs, nullptr, st));
        },
        reps, st);
    row("norm, fp8 quant", "8192x4096 (separate)", s, double(T) * D * (4 * 4 + 4 + 1), false, copy_gbs);
    cuda::Fp8Epilogue e;
    e.acc = acc.data;
    e.t = T;
    e.n = 2 * F;
    e.x_scale = sc;
    e.w_scale = w_scales.ptr<float>();
    e.per_channel = true;
    e.silu = true;
    e.out[0] = act.ptr<float>();
    s = b.time([&] { CUDA_CHECK(cuda::launch_fp8_silu_quantize(e, codes, qs, st)); }, reps, st);
    row("silu->fp8 fused", "8192x14336", s, double(T) * F * (2 * 4 + 1), false, copy_gbs);
    s = b.time(
        [&] {
          CUDA_CHECK(cuda::launch_fp8_epilogue(e, st));
          CUDA_CHECK(cuda::launch_quantize_fp8_rows(act.ptr<float>(), T, F, codes, qs, nullptr, st));
        },
        reps, st);
    row("silu, fp8 quant", "8192x14336 (separate)", s, double(T) * F * (2 * 4 + 4 + 4 + 1), false, copy_gbs);
    CUDA_CHECK(cudaStreamDestroy(st));
  }

  bench_sampling(b, gpu, copy_gbs, reps);
  return 0;
}

// Sampling over the Llama 3 vocabulary: bytes = the logits read once (argmax) per row. The argmax and the
// sampler on one CTA per row and on a cluster per row (select_cluster_rows; few rows), the sampler for plain
// temperature (OpenAI's default request), top-p, top-k and all three with min-p.
void bench_sampling(Bench& b, CudaBackend& gpu, double copy_gbs, int reps) {
  struct Kind {
    const char* name;
    cuda::SampleParams p;
  };
  const Kind kinds[] = {{"temperature", {1.0f, 0, 1.0f, 0.0f, 0.5f}},
                        {"top-p 0.9", {1.0f, 0, 0.9f, 0.0f, 0.5f}},
                        {"top-k 50", {0.8f, 50, 1.0f, 0.0f, 0.5f}},
                        {"k/p/min-p", {0.8f, 50, 0.95f, 0.05f, 0.5f}}};
  for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{256}, int64_t{512}}) {
    const int64_t vocab = 128256;
    Tensor logits = b.f32(rows, vocab, 23);
    std::vector<int32_t> ids(rows);
    for (const int64_t cluster : {int64_t{0}, int64_t{16}}) {
      if (cluster > 0 && rows > cluster) continue;
      gpu.set_select_cluster_rows(cluster);
      const char* how = cluster > 0 ? " cluster" : "";
      const double s = b.time([&] { gpu.argmax(logits, ids.data()); }, reps);
      char name[64];
      std::snprintf(name, sizeof name, "argmax (+D2H)%s", how);
      row(name, fmt_shape("%lldx128256", rows), s, double(rows) * vocab * 4, false, copy_gbs);
      for (const Kind& k : kinds) {
        if (rows > 256 && std::strcmp(k.name, "k/p/min-p") != 0) continue;
        std::vector<cuda::SampleParams> params(rows, k.p);
        const double t = b.time([&] { gpu.sample(logits, params.data(), ids.data()); }, reps);
        std::snprintf(name, sizeof name, "sample %s%s", k.name, how);
        row(name, fmt_shape("%lldx128256", rows), t, double(rows) * vocab * 4, false, copy_gbs);
      }
    }
  }
  gpu.set_select_cluster_rows(CudaBackendOptions{}.select_cluster_rows);
}

}  // namespace
}  // namespace inferx

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows printed before a crash survive a redirected stdout
  try {
    if (inferx::cuda_device_count() == 0) {
      std::fprintf(stderr, "bench_cuda_kernels: no CUDA device\n");
      return 2;
    }
    const bool gemm_only = argc > 1 && std::strcmp(argv[argc - 1], "--gemm") == 0;
    return inferx::run(quick, gemm_only);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
}
