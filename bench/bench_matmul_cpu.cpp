// Decode-shaped CPU matmul throughput per weight type, as a fraction of the memory roofline.
//
// For each type and each Llama-3.2-1B projection shape ([1 x K] @ [N x K]^T), reports the weight bytes
// read per second (GB/s) and its ratio to the streaming read bandwidth of the same thread pool
// (core/bandwidth.h explains why read bandwidth is the roofline denominator; memcpy is printed for
// reference). Each shape cycles through enough copies of its weight matrix (>= 256 MB in all, 8x the
// L3 of the test machine) that every call reads from DRAM, as decode does with a whole model.
// The "model" line is the per-token mix: 16 layers of q,k,v,o,gate,up,down plus the lm_head.
// A benchmark, not a test: it asserts nothing.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/matmul_cpu.h"
#include "core/bandwidth.h"
#include "core/buffer.h"
#include "core/error.h"
#include "quant/gguf_blocks.h"

using namespace inferx;

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
  int per_token;  // occurrences per decoded token in Llama-3.2-1B (16 layers)
};

// Llama-3.2-1B: hidden 2048, 32 query / 8 KV heads of 64, FFN 8192, vocab 128256.
const Shape kShapes[] = {
    {"q/o  2048x2048", 2048, 2048, 32},       {"k/v   512x2048", 512, 2048, 32},
    {"gate/up 8192x2048", 8192, 2048, 32},    {"down 2048x8192", 2048, 8192, 16},
    {"lm_head 128256x2048", 128256, 2048, 1},
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Weight matrices of one shape: `copies` distinct buffers of random blocks. Every byte is distinct
// random data: byte-identical copies (or repeated rows) get merged into shared physical pages by the
// hypervisor's page deduplication, and then "DRAM" reads are served from L3 (that inflated an earlier
// version of this benchmark to 130% of the roofline).
struct Weights {
  std::vector<HostBuffer> copies;
  int64_t bytes = 0;
};

struct XorShift {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// Random payload with sane scales: f16 scale fields are set to small normal values, float weights
// get small finite values (no NaN/inf/denormals, which could change the timing).
void fill_random(DType t, uint8_t* p, int64_t bytes, XorShift& rng) {
  for (int64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(p + i, &v, 8);
  }
  auto set_f16 = [&](int64_t off, uint16_t h) { std::memcpy(p + off, &h, 2); };
  const uint16_t small = 0x2000 | static_cast<uint16_t>(rng.next() & 0x3FF);  // ~0.008-0.016
  switch (t) {
    case DType::F32:
      for (int64_t i = 0; i + 4 <= bytes; i += 4) {
        uint32_t u;
        std::memcpy(&u, p + i, 4);
        u = (u & 0x807FFFFFu) | 0x3C000000u;  // |x| in [2^-7, 2^-6)
        std::memcpy(p + i, &u, 4);
      }
      break;
    case DType::F16:
      for (int64_t i = 0; i + 2 <= bytes; i += 2) p[i + 1] = static_cast<uint8_t>((p[i + 1] & 0x83) | 0x20);
      break;
    case DType::BF16:
      for (int64_t i = 0; i + 2 <= bytes; i += 2) p[i + 1] = static_cast<uint8_t>((p[i + 1] & 0x80) | 0x3C);
      break;
    case DType::Q8_0:
      for (int64_t b = 0; b < bytes; b += 34) set_f16(b, small);
      break;
    case DType::Q4_0:
      for (int64_t b = 0; b < bytes; b += 18) set_f16(b, small);
      break;
    case DType::Q4_K:
      for (int64_t b = 0; b < bytes; b += 144) {
        set_f16(b, small);
        set_f16(b + 2, small);
      }
      break;
    case DType::Q6_K:
      for (int64_t b = 0; b < bytes; b += 210) set_f16(b + 208, small);
      break;
    default:
      fail("no random fill for {}", dtype_name(t));
  }
}

Weights make_weights(DType t, const Shape& s, size_t min_total_bytes) {
  Weights w;
  w.bytes = row_bytes(t, s.k) * s.n;
  const size_t n_copies = std::max<size_t>(
      1, (min_total_bytes + static_cast<size_t>(w.bytes) - 1) / static_cast<size_t>(w.bytes));
  XorShift rng{0x9E3779B97F4A7C15ull};
  for (size_t c = 0; c < n_copies; ++c) {
    HostBuffer b(static_cast<size_t>(w.bytes));
    fill_random(t, b.as<uint8_t>(), w.bytes, rng);
    w.copies.push_back(std::move(b));
  }
  return w;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double sec_per_call;  // median over rounds
  double read_gbs;      // median of the read-bandwidth samples taken between rounds
  double ratio;         // median over rounds of (this round's GB/s) / (the sample just before it)
};

// Rounds of matmul calls (cycling the copies) interleaved with read-bandwidth samples: this machine's
// bandwidth drifts by 2x over seconds with the load of other tenants, so each round is normalised by a
// sample taken right before it, and medians are reported.
Timing time_matmul(DType t, const Shape& s, Weights& w, int64_t m, ThreadPool& pool,
                   ReadBandwidthProbe& probe, double min_time, int rounds) {
  std::vector<float> x(static_cast<size_t>(m * s.k)), out(static_cast<size_t>(m * s.n));
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  std::vector<Linear> lins(w.copies.size());
  for (size_t c = 0; c < lins.size(); ++c) lins[c].weight = Tensor(t, {s.n, s.k}, w.copies[c].data());
  for (auto& l : lins) matmul_cpu(x.data(), m, l, out.data(), pool);  // warm-up: pages, workspace
  std::vector<double> secs, bws, ratios;
  for (int round = 0; round < rounds; ++round) {
    const double bw = probe.measure(pool);
    int64_t calls = 0;
    const double t0 = now_s();
    double el = 0;
    do {
      matmul_cpu(x.data(), m, lins[static_cast<size_t>(calls) % lins.size()], out.data(), pool);
      ++calls;
      el = now_s() - t0;
    } while (el < min_time / rounds || calls < static_cast<int64_t>(lins.size()));
    const double sec = el / static_cast<double>(calls);
    secs.push_back(sec);
    bws.push_back(bw);
    ratios.push_back(static_cast<double>(w.bytes) / sec / 1e9 / bw);
  }
  return {median(secs), median(bws), median(ratios)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU matmul bandwidth benchmark (decode shapes of Llama-3.2-1B)"};
  std::vector<std::string> types = {"q8_0", "q4_k", "q6_k", "q4_0", "bf16", "f16", "f32"};
  int threads = 2, rounds = 7;
  double min_time = 0.6;
  int64_t prefill_m = 16;
  bool skip_lm_head_float = true;
  bool in_cache = false;
  app.add_option("--types", types, "Weight types")->delimiter(',');
  app.add_option("--threads", threads, "Threads in the pool");
  app.add_option("--min-time", min_time, "Seconds of matmul calls timed per shape");
  app.add_option("--rounds", rounds, "Timed rounds per shape, each after a read-bandwidth sample");
  app.add_option("--prefill-m", prefill_m, "Rows for the prefill-shaped line (0: skip)");
  app.add_flag("!--float-lm-head", skip_lm_head_float, "Also time the (1 GB in F32) lm_head for float types");
  app.add_flag("--in-cache", in_cache,
               "One copy per shape: small shapes then run from L2/L3, showing the kernels' compute ceiling");
  CLI11_PARSE(app, argc, argv);
  try {
    ThreadPool pool(threads);
    ReadBandwidthProbe probe(size_t{256} << 20);
    const double read_bw = probe.measure(pool, 3);
    const double memcpy_bw = measure_memcpy_bandwidth_gbs();
    std::printf("kernels: %s, threads: %d\n", cpu::kernel_isa(), pool.size());
    std::printf(
        "read bandwidth (roofline, %d threads): %.1f GB/s   memcpy (read+write, 1 thread): %.1f GB/s\n",
        pool.size(), read_bw, memcpy_bw);
    std::printf(
        "roof%% = median over rounds of matmul GB/s / read bandwidth sampled just before the round\n\n");
    std::printf("%-6s %-22s %8s %9s %8s %8s %6s\n", "type", "shape [N x K]", "MB", "us/call", "GB/s", "read",
                "roof%");
    for (const std::string& name : types) {
      const auto t = dtype_from_name(name);
      INFERX_CHECK(t.has_value(), "unknown type '{}'", name);
      double token_bytes = 0, token_time = 0, token_roof_time = 0;
      bool complete = true;
      for (const Shape& s : kShapes) {
        if (!is_quantized(*t) && skip_lm_head_float && s.n > 100000) {
          complete = false;
          continue;
        }
        Weights w = make_weights(*t, s, in_cache ? 0 : size_t{256} << 20);
        const Timing tm = time_matmul(*t, s, w, 1, pool, probe, min_time, rounds);
        const double gbs = static_cast<double>(w.bytes) / tm.sec_per_call / 1e9;
        std::printf("%-6s %-22s %8.1f %9.1f %8.1f %8.1f %5.0f%%\n", dtype_name(*t).data(), s.name,
                    static_cast<double>(w.bytes) / 1e6, tm.sec_per_call * 1e6, gbs, tm.read_gbs,
                    100 * tm.ratio);
        token_bytes += static_cast<double>(w.bytes) * s.per_token;
        token_time += tm.sec_per_call * s.per_token;
        // Time this shape would take at exactly the roofline, with the bandwidth seen by its rounds.
        token_roof_time += tm.sec_per_call * tm.ratio * s.per_token;
        if (prefill_m > 0 && s.n == 2048 && s.k == 2048) {
          const Timing pt = time_matmul(*t, s, w, prefill_m, pool, probe, min_time, 3);
          std::printf("%-6s %-22s %8s %9.1f %8s %8s %6s  (M=%lld: %.1f GFLOP/s)\n", dtype_name(*t).data(),
                      "  prefill-shaped", "", pt.sec_per_call * 1e6, "", "", "",
                      static_cast<long long>(prefill_m),
                      2.0 * static_cast<double>(prefill_m * s.n * s.k) / pt.sec_per_call / 1e9);
        }
      }
      const double gbs = token_bytes / token_time / 1e9;
      std::printf("%-6s %-22s %8.1f %9.1f %8.1f %8s %5.0f%%  (%.1f tok/s matmul-only%s)\n\n",
                  dtype_name(*t).data(), "model (per token)", token_bytes / 1e6, token_time * 1e6, gbs, "",
                  100 * token_roof_time / token_time, 1.0 / token_time, complete ? "" : ", without lm_head");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
