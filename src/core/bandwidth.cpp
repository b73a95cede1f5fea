#include "core/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/buffer.h"
#include "core/thread_pool.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace inferx {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sums 64-bit words with several independent accumulators so the loop is bound by loads, not by the
// add latency. Returns the sum so the compiler cannot drop the reads.
uint64_t sum_words(const uint64_t* p, size_t n) {
#if defined(__AVX512F__)
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 24));
  }
  // Stored and summed by hand: GCC 12's _mm512_reduce_add_epi64 trips -Wmaybe-uninitialized.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t s = 0;
  for (uint64_t v : lanes) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
#elif defined(__AVX2__)
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i) s += p[i];
  return s;
#else
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
#endif
}

}  // namespace

double measure_memcpy_bandwidth_gbs(int passes) {
  constexpr size_t kBytes = size_t{256} << 20;
  HostBuffer src(kBytes), dst(kBytes);  // zero-filled: every page is touched before timing
  std::memset(src.data(), 1, kBytes);
  double best = 0;
  for (int p = 0; p < std::max(passes, 1); ++p) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), kBytes);
    double s = seconds_since(t0);
    best = std::max(best, 2.0 * static_cast<double>(kBytes) / s / 1e9);
  }
  // Keep the copy observable.
  volatile unsigned char sink = dst.as<unsigned char>()[kBytes / 2];
  (void)sink;
  return best;
}

ReadBandwidthProbe::ReadBandwidthProbe(size_t bytes)
    : buffer_(std::max<size_t>(bytes / 512, 1) * 512), words_(buffer_.size() / 8) {
  uint64_t* p = buffer_.as<uint64_t>();
  // Distinct contents on every page: identical pages could be deduplicated by the hypervisor and then
  // served from cache.
  for (size_t i = 0; i < words_; ++i) p[i] = i;
}

double ReadBandwidthProbe::measure(ThreadPool& pool, int passes) {
  const uint64_t* p = buffer_.as<uint64_t>();
  const int threads = pool.size();
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  const size_t blocks = words_ / 64;  // 512-byte units keep every slice aligned
  double best = 0;
  for (int pass = 0; pass < std::max(passes, 1); ++pass) {
    auto t0 = std::chrono::steady_clock::now();
    // One contiguous slice per thread.
    pool.parallel_for(
        threads,
        [&](int64_t begin, int64_t end, int) {
          for (int64_t t = begin; t < end; ++t) {
            const size_t lo = blocks * static_cast<size_t>(t) / static_cast<size_t>(threads) * 64;
            const size_t hi = blocks * static_cast<size_t>(t + 1) / static_cast<size_t>(threads) * 64;
            sums[static_cast<size_t>(t)] = sum_words(p + lo, hi - lo);
          }
        },
        1);
    double s = seconds_since(t0);
    best = std::max(best, static_cast<double>(words_ * 8) / s / 1e9);
  }
  uint64_t total = 0;
  for (uint64_t v : sums) total += v;
  volatile uint64_t sink = total;
  (void)sink;
  return best;
}

double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes, int passes) {
  ReadBandwidthProbe probe(bytes);
  return probe.measure(pool, passes);
}

}  // namespace inferx
