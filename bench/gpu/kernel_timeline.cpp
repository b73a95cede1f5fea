// Kernel timeline by CUPTI injection: what each kernel of a CUDA graph replay really costs on the GPU's
// clock, with the overlaps PDL gives, for a process that knows nothing about it. Nsight Systems is not on
// the GPU machine and Nsight Compute times each kernel alone (serialised, no PDL overlap), so neither says
// where a batch-1 decode step's time goes between kernels; this does.
//
// Use: CUDA_INJECTION64_PATH=/path/libinferx_kernel_timeline.so INFERX_TIMELINE_OUT=kernels.csv <program>.
// The CUDA driver loads the library when the program initialises CUDA and calls InitializeInjection(), which
// turns on CUPTI's concurrent-kernel activity records; at exit (and whenever CUPTI fills a buffer) the
// records (and memset / memcpy records: write_transfer) are written as CSV lines:
// start_ns,end_ns,graph_id,graph_node_id,correlation_id,stream,grid,block,dynamic_smem,registers,name
// (mangled; bench/gpu/timeline_summary.py demangles and summarises, dropping warm-up replays itself).
// INFERX_TIMELINE_MAX=N stops writing after N records (default 2,000,000). atexit runs flush_at_exit once:
// CUPTI hands over the records still buffered, then the file closes.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace {

constexpr size_t kBufferBytes = 8u << 20;

std::mutex g_mutex;
FILE* g_out = nullptr;
uint64_t g_written = 0, g_max = 2000000;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_timeline: %s failed: %s\n", what, msg ? msg : "?");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI wants 8-byte aligned buffers.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

// A memset or memcpy node (cuBLASLt may add one ahead of a GEMM; a graph can hold copies): one CSV line with
// grid and block 0x0x0, its byte count in the dynamic_smem column and the name [memset] or [memcpy], so the
// summary counts the time it adds between kernels. Called with g_mutex held.
void write_transfer(const CUpti_Activity* record) {
  const bool memset = record->kind == CUPTI_ACTIVITY_KIND_MEMSET;
  uint64_t start = 0, end = 0, node = 0, bytes = 0;
  uint32_t graph = 0, corr = 0, stream = 0;
  if (memset) {
    const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
    start = m->start, end = m->end, node = m->graphNodeId, bytes = m->bytes;
    graph = m->graphId, corr = m->correlationId, stream = m->streamId;
  } else {
    const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
    start = m->start, end = m->end, node = m->graphNodeId, bytes = m->bytes;
    graph = m->graphId, corr = m->correlationId, stream = m->streamId;
  }
  std::fprintf(g_out, "%llu,%llu,%u,%llu,%u,%u,0x0x0,0x0x0,%llu,0,%s\n",
               static_cast<unsigned long long>(start), static_cast<unsigned long long>(end), graph,
               static_cast<unsigned long long>(node), corr, stream, static_cast<unsigned long long>(bytes),
               memset ? "[memset]" : "[memcpy]");
  ++g_written;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (g_written >= g_max || g_out == nullptr) continue;
      if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET || record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        write_transfer(record);
        continue;
      }
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
        continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      std::fprintf(g_out, "%llu,%llu,%u,%llu,%u,%u,%dx%dx%d,%dx%dx%d,%d,%u,%s\n",
                   static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end),
                   k->graphId, static_cast<unsigned long long>(k->graphNodeId), k->correlationId, k->streamId,
                   k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ, k->dynamicSharedMemory,
                   static_cast<unsigned>(k->registersPerThread), k->name ? k->name : "?");
      ++g_written;
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
      std::fprintf(stderr, "kernel_timeline: %zu records dropped\n", dropped);
  }
  std::free(buffer);
}

void flush_at_exit() {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out != nullptr) {
    std::fclose(g_out);
    g_out = nullptr;
    std::fprintf(stderr, "kernel_timeline: %llu kernel records written\n",
                 static_cast<unsigned long long>(g_written));
  }
}

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  const char* path = std::getenv("INFERX_TIMELINE_OUT");
  g_out = std::fopen(path && *path ? path : "kernel_timeline.csv", "w");
  if (g_out == nullptr) {
    std::fprintf(stderr, "kernel_timeline: cannot write %s\n", path ? path : "kernel_timeline.csv");
    return 0;
  }
  std::fprintf(g_out,
               "start_ns,end_ns,graph_id,graph_node_id,correlation_id,stream,grid,block,dynamic_smem,"
               "registers,name\n");
  g_max = env_u64("INFERX_TIMELINE_MAX", 2000000);
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable(MEMSET)");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(MEMCPY)");
  std::atexit(flush_at_exit);
  return 1;
}
