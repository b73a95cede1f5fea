#pragma once
// Phase time stamps of every v3 decode-attention CTA (INFERX_DECODE_ATTN_STAMPS=1: a diagnosis switch; the
// backend sets it up at start and reports at its end, kernels.h): where the batch-1 attention's ~8.5 us per
// layer go. Each CTA with keys appends one record: the global timer (ns, comparable across SMs) and the SM's
// cycle counter at its start, after the PDL wait and the early tiles, after its tiles, after the warps'
// merge, and after the split's partial and ticket (or, for the CTA that merges, the merge). The kernel's
// side is in kernels_decode_attention_v3.cu; setup and report in decode_attention_stamps.cpp.
#include <cuda_runtime.h>

#include <cstdint>

namespace inferx::cuda {

struct StampRecord {
  uint32_t block_x, block_y;
  uint64_t ns[5], cycles[5];
};

struct StampSink {
  StampRecord* records;  // null: off
  unsigned* count;
  unsigned capacity;
};

// Points the kernel at `sink` (its __constant__ copy; a sink of null records turns stamping off).
cudaError_t set_decode_attention_stamp_sink(const StampSink& sink);

}  // namespace inferx::cuda
