#pragma once
// The memory roofline of a loaded model for `inferx bench offline --roofline`: the bytes one decode step
// reads (every weight once: Model::weight_bytes_per_token) over a bandwidth probe of the backend's own
// memory taken in the same process, so that a figure and its roofline come from one run.
//   CUDA: a device-to-device copy between two buffers (up to 2 GiB each; best of 10; read + write bytes
//         per second, as ../shared/tools/gpu_ceilings.py counts its copy ceiling);
//   CPU:  the streaming read probe of core/bandwidth.h on the engine's thread count (the CPU kernels'
//         roofline definition).
// A tensor-parallel model on GPUs reads its ranks' weights in parallel: the step's bytes are the largest
// rank's (each GPU at the probed bandwidth of rank 0's), and the line says how many GPUs share them. On
// the CPU the ranks share one memory: every rank's bytes count.
#include <cstdint>
#include <string>

#include "cli/bench_stats.h"

namespace inferx {
class Backend;
class Model;
}  // namespace inferx

namespace inferx::cli {

struct Roofline {
  double bandwidth_gbs = 0;  // 1 GB = 1e9 bytes; 0: not measured (probe says why)
  std::string probe;
  int64_t weight_bytes = 0;  // read per decode step (by the busiest device)
  int devices = 1;           // GPUs reading their share at once (tensor-parallel ranks)
};

Roofline measure_roofline(Backend& backend, const Model& model, int threads);

// Adds "roofline" to the summary's JSON and a line to its text: the batch-1 roofline in tokens/s
// (bandwidth / weight bytes) and TPOT p50 against the time one pass over the weights takes (at batch 1 the
// fraction of the roofline reached; at larger batches how far a step is from streaming the weights once).
void add_roofline(BenchSummary& summary, const Roofline& r);

}  // namespace inferx::cli
