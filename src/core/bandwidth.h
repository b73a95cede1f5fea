#pragma once
// Host memory bandwidth probes: the denominators of the CPU kernels' roofline figures.
//
// Roofline definition used throughout InferX: the *read* bandwidth, i.e. bytes read per second by a
// multi-threaded streaming sum-reduction over a buffer much larger than the last-level cache
// (measure_read_bandwidth_gbs). Batch-1 decode matmuls stream each weight byte exactly once and write
// almost nothing, so a streaming read is the access pattern they can at best match. memcpy is reported
// for comparison only: it is one thread, and its traffic mixes reads, writes and write-allocate reads,
// so it neither bounds nor predicts a read-only kernel.
#include <cstddef>

#include "core/buffer.h"

namespace inferx {

class ThreadPool;

// Best of `passes` memcpy passes over a 256 MB buffer on the calling thread. Returns (read + write)
// bytes per second in GB/s (1 GB = 1e9 bytes): 2 x 256 MB per pass. Write-allocate traffic (the cache
// line read before it is overwritten) is not counted, so the true bus traffic is up to 1.5x higher.
double measure_memcpy_bandwidth_gbs(int passes = 3);

// Best of `passes` streaming sum-reductions over a `bytes`-sized buffer (default 512 MB, far above any
// L3), split over all of `pool`'s threads. Returns bytes read per second in GB/s. The roofline
// denominator for memory-bound kernels (see the file comment).
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes = size_t{512} << 20, int passes = 3);

// The same probe on a buffer allocated (and filled) once, for benchmarks that interleave bandwidth
// samples with the measurements they normalise (a shared machine's bandwidth drifts over seconds).
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(size_t bytes = size_t{512} << 20);
  // Best of `passes` reductions over the whole buffer with all of pool's threads, in GB/s.
  double measure(ThreadPool& pool, int passes = 1);

 private:
  HostBuffer buffer_;
  size_t words_;
};

}  // namespace inferx
