// CudaBackend beyond the per-op kernels: scratch buffers, the BF16 activation copies, CUDA graphs, GPU
// sampling, device-side random fill, and options from the environment.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "backend/cuda/graph_rewrite.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_quant.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/quantized_gemm.h"
#include "core/error.h"

namespace inferx {

CudaBackendOptions cuda_options_from_environment(const std::string& gemm_cache_default) {
  CudaBackendOptions o;
  o.gemm_tuning_cache = gemm_cache_default;
  if (const char* kv = std::getenv("INFERX_CUDA_KV_DTYPE")) {
    const std::string v = kv;
    if (v == "f32" || v == "F32")
      o.kv_cache_dtype = DType::F32;
    else if (v == "bf16" || v == "BF16")
      o.kv_cache_dtype = DType::BF16;
    else if (v == "fp8" || v == "FP8" || v == "fp8_e4m3")
      o.kv_cache_dtype = DType::F8_E4M3;
    else
      fail("INFERX_CUDA_KV_DTYPE={}: expected f32, bf16 or fp8", v);
  }
  if (const char* act = std::getenv("INFERX_CUDA_BF16_ACT")) o.bf16_activations = std::strcmp(act, "0") != 0;
  if (const char* gemv = std::getenv("INFERX_CUDA_GEMV")) o.gemv = std::strcmp(gemv, "0") != 0;
  if (const char* ds = std::getenv("INFERX_DECODE_SPLITS")) o.decode_splits = std::max(0, std::atoi(ds));
  if (const char* st = std::getenv("INFERX_DECODE_STACK"))
    o.decode_stack = std::strcmp(st, "0") == 0      ? DecodeStackMode::Off
                     : std::strcmp(st, "bf16") == 0 ? DecodeStackMode::Bf16
                                                    : DecodeStackMode::All;
  if (const char* kb = std::getenv("INFERX_DECODE_STACK_STAGE_KB")) {
    const int v = std::atoi(kb);
    if (v >= 8 && v <= 64) o.decode_stack_stage_kb = v;
  }
  if (const char* fl = std::getenv("INFERX_DECODE_STACK_INFLIGHT"))
    o.decode_stack_inflight = std::clamp(std::atoi(fl), 0, 12);
  if (const char* bo = std::getenv("INFERX_DECODE_STACK_BACKOFF_NS"))
    o.decode_stack_backoff_ns = std::clamp(std::atoi(bo), 0, 10000);
  if (const char* ge = std::getenv("INFERX_DECODE_STACK_GENERIC"))
    o.decode_stack_generic = std::strcmp(ge, "0") != 0;
  if (const char* sk = std::getenv("INFERX_DECODE_STACK_SKIP"))
    o.decode_stack_skip = static_cast<unsigned>(std::atoi(sk)) & 7u;
  if (const char* ms = std::getenv("INFERX_DECODE_STACK_MLP_SPLIT"))
    o.decode_stack_mlp_split = std::strcmp(ms, "0") != 0;
  if (const char* kt = std::getenv("INFERX_DECODE_STACK_KV_TILES"))
    o.decode_stack_kv_tiles = std::strcmp(kt, "0") != 0;
  if (const char* mc = std::getenv("INFERX_DECODE_STACK_MAX_CONTEXT"))
    o.decode_stack_max_context = std::max(0, std::atoi(mc));
  if (const char* pr = std::getenv("INFERX_DECODE_STACK_PROFILE"))
    o.decode_stack_profiles = std::max(0, std::atoi(pr));
  if (const char* lk = std::getenv("INFERX_GEMV_LONG_K")) o.gemv_long_rows = std::strcmp(lk, "gemv") == 0;
  if (const char* hm = std::getenv("INFERX_HOIST_GEMM_MEMSETS"))
    o.gemm_memset_rewrite = std::clamp(std::atoi(hm), 0, 2);
  if (const char* sc = std::getenv("INFERX_SAMPLE_COPY_STREAM"))
    o.sample_copy_stream = std::strcmp(sc, "0") != 0;
  if (const char* us = std::getenv("INFERX_UPLOAD_SIDE_STREAM"))
    o.upload_side_stream = std::strcmp(us, "0") != 0;
  if (const char* ac = std::getenv("INFERX_SELECT_CLUSTER_ROWS"))
    o.select_cluster_rows = std::max<int64_t>(0, std::atoll(ac));
  if (const char* ds = std::getenv("INFERX_DEFER_SPLIT_ROWS"))
    o.defer_split_rows = std::max<int64_t>(1, std::atoll(ds));
  // INFERX_GEMM_CACHE: the GEMM tuning cache's folder, or off (also 0 or empty).
  if (const char* gc = std::getenv("INFERX_GEMM_CACHE")) {
    const std::string v = gc;
    o.gemm_tuning_cache = v == "off" || v == "0" ? "" : v;
  }
  if (const char* nm = std::getenv("INFERX_LAST_LAYER_NARROW_MIXED"))
    o.narrow_mixed_steps = std::strcmp(nm, "0") != 0;
  if (const char* skip = std::getenv("INFERX_TIMING_SKIP")) {
    const std::string v = skip;
    size_t begin = 0;
    while (begin <= v.size()) {
      const size_t end = std::min(v.find(',', begin), v.size());
      const std::string name = v.substr(begin, end - begin);
      if (name == "norm")
        o.timing_skip |= kTimingSkipNorm;
      else if (name == "rope")
        o.timing_skip |= kTimingSkipRope;
      else if (name == "attention")
        o.timing_skip |= kTimingSkipAttention;
      else if (!name.empty())
        fail("INFERX_TIMING_SKIP={}: expected a comma-separated list of norm, rope, attention", v);
      begin = end + 1;
    }
    if (o.timing_skip != 0)
      std::fprintf(stderr, "inferx: INFERX_TIMING_SKIP=%s - kernels skipped for timing, results are wrong\n",
                   skip);
  }
  return o;
}

// Scratch ----------------------------------------------------------------------------------------------

void* CudaBackend::scratch(Scratch& s, size_t bytes) {
  if (bytes <= s.bytes) return s.data;
  INFERX_CHECK(
      !capturing_,
      "cuda backend: a scratch buffer must grow to {} bytes while a CUDA graph is captured; run the same "
      "step once without capture first",
      bytes);
  use_device();
  // As for allocate()'s buffers, freeing retires the recordings, allocating does not (the persistent
  // kernel's scratch, first made at the warm-up's batch-1 step after the larger decode buckets were
  // recorded, retired all of them until 12-06).
  if (s.data) {
    ++generation_;
    CUDA_CHECK(cudaFreeAsync(s.data, stream_));
  }
  s.data = nullptr;
  s.bytes = 0;
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  CUDA_CHECK(cudaMallocAsync(&s.data, rounded, stream_));
  s.bytes = rounded;
  return s.data;
}

void* CudaBackend::eager_scratch(Scratch& s, size_t bytes) {
  if (bytes <= s.bytes) return s.data;
  use_device();
  if (s.data) CUDA_CHECK(cudaFreeAsync(s.data, stream_));
  s.data = nullptr;
  s.bytes = 0;
  const size_t rounded = (2 * bytes + 4095) / 4096 * 4096;  // doubled: sizes that creep grow rarely
  CUDA_CHECK(cudaMallocAsync(&s.data, rounded, stream_));
  s.bytes = rounded;
  return s.data;
}

void CudaBackend::release(Scratch& s) {
  if (s.data && cudaFreeAsync(s.data, stream_) != cudaSuccess)
    std::fprintf(stderr, "inferx cuda: releasing a scratch buffer failed\n");
  s = {};
}

void* CudaBackend::pinned(Scratch& s, size_t bytes) {
  if (bytes <= s.bytes) return s.data;
  // At least doubled: sizes that creep (a repetition penalty's edits grow by a token a step) grow rarely,
  // and each growth waits for the device (cudaFreeHost).
  const size_t want = std::max(bytes, 2 * s.bytes);
  release_pinned(s);
  CUDA_CHECK(cudaHostAlloc(&s.data, want, cudaHostAllocDefault));
  s.bytes = want;
  return s.data;
}

void CudaBackend::release_pinned(Scratch& s) {
  // cudaFreeHost waits for the device; pinned buffers are only released at destruction.
  if (s.data && cudaFreeHost(s.data) != cudaSuccess)
    std::fprintf(stderr, "inferx cuda: releasing a pinned buffer failed\n");
  s = {};
}

uint64_t CudaBackend::generation() const {
  return generation_ + device_frees_->load() + (gemm_ ? gemm_->buffer_generation() : 0);
}

void* CudaBackend::bf16_copy_for(const Tensor& out) {
  shadow_src_ = nullptr;
  if (!options_.bf16_activations || !last_matmul_bf16_ || out.numel() == 0) return nullptr;
  void* p = scratch(shadow_, static_cast<size_t>(out.numel()) * 2);
  shadow_src_ = out.data;
  shadow_rows_ = out.rows();
  shadow_cols_ = out.cols();
  return p;
}

void CudaBackend::adopt_bf16_copy(const Tensor& out) {
  std::swap(shadow_, gemv_out_);
  shadow_src_ = out.data;
  shadow_rows_ = out.rows();
  shadow_cols_ = out.cols();
}

void CudaBackend::drop_bf16_copy_if_overlaps(const Tensor& out) {
  const auto* o = static_cast<const char*>(out.data);
  const auto* src = static_cast<const char*>(shadow_src_);
  if (src && o < src + shadow_rows_ * shadow_cols_ * 4 && src < o + out.nbytes()) drop_bf16_copy();
}

// Random fill -------------------------------------------------------------------------------------------

bool CudaBackend::fill_random(Tensor& t, const RandomFill& fill) {
  if (t.device != Device::CUDA) return false;
  // Dummy quantized weights: random codes (kernels_quant.h).
  if (t.dtype == DType::F8_E4M3 || t.dtype == DType::INT4 || t.dtype == DType::U8) {
    use_device();
    CUDA_CHECK(cuda::launch_fill_random_codes(t.dtype, t.data, t.numel(), t.cols(), fill, stream_));
    return true;
  }
  if (!(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16)) return false;
  use_device();
  drop_bf16_copy();
  CUDA_CHECK(cuda::launch_fill_random(t.dtype, t.data, t.numel(), t.cols(), fill, stream_));
  return true;
}

// CUDA graphs -------------------------------------------------------------------------------------------

bool CudaBackend::begin_graph_capture() {
  INFERX_CHECK(!capturing_, "cuda backend: a graph capture is already in progress");
  use_device();
  // Thread-local mode: a forbidden call (allocation, synchronisation) from this thread fails loudly
  // instead of silently breaking the recording.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  gemm_->set_capturing(true);
  qgemm_->lt().set_capturing(true);
  capture_generation_ = generation();
  return true;
}

void CudaBackend::end_graph_capture(uint64_t key, bool keep) {
  if (!capturing_) return;
  use_device();  // a tensor-parallel group ends every rank's capture from one thread
  // Recorded in the graph (none is pending at the end of a model step); after an error: dropped.
  if (keep) {
    finish_deferred();
  } else {
    qgemm_->drop_pending();
  }
  capturing_ = false;
  gemm_->set_capturing(false);
  qgemm_->lt().set_capturing(false);
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(stream_, &graph);
  if (!keep || status != cudaSuccess) {
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // an invalidated capture leaves a sticky-free error: clear it
    if (keep) CUDA_CHECK(status);
    return;
  }
  cudaGraphExec_t exec = nullptr;
  cudaError_t inst = cudaSuccess;
  if (options_.gemm_memset_rewrite != 0) {
    const auto dedicated = [this](const void* p) {
      return gemm_->lt().in_dedicated_workspace(p) || qgemm_->lt().in_dedicated_workspace(p);
    };
    const int mode = options_.gemm_memset_rewrite;
    int moved = -1;
    inst = cuda::instantiate_rewritten(
        graph,
        [&](cudaGraph_t g) {
          return mode == 1 ? cuda::hoist_workspace_memsets(g, dedicated)
                           : cuda::replace_workspace_memsets(g, dedicated, cuda::workspace_zero_kernel(),
                                                             cuda::pdl_enabled());
        },
        &exec, &moved);
    if (moved >= 0) {
      rewritten_memsets_ += static_cast<uint64_t>(moved);
    } else if (!rewrite_warned_) {
      rewrite_warned_ = true;
      std::fprintf(stderr,
                   "inferx cuda: rewriting a recorded step's graph failed; recorded steps keep cuBLASLt's "
                   "workspace memsets (INFERX_HOIST_GEMM_MEMSETS=0 silences this)\n");
    }
  } else {
    inst = cudaGraphInstantiate(&exec, graph, 0);
  }
  (void)cudaGraphDestroy(graph);
  CUDA_CHECK(inst);
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    CUDA_CHECK(cudaGraphExecDestroy(it->second.exec));
    graphs_.erase(it);
  }
  graphs_[key] = Graph{exec, capture_generation_};
  // A recording made while a buffer grew would point at freed memory; generation() changed then.
  if (generation() != capture_generation_) {
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    graphs_.erase(key);
  }
}

bool CudaBackend::replay_graph(uint64_t key) {
  auto it = graphs_.find(key);
  if (it == graphs_.end()) return false;
  use_device();
  if (it->second.generation != generation()) {
    CUDA_CHECK(cudaGraphExecDestroy(it->second.exec));
    graphs_.erase(it);
    return false;
  }
  drop_bf16_copy();  // the replayed ops wrote over the tensors the host-side state describes
  CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
  return true;
}

bool CudaBackend::has_graph(uint64_t key) const {
  auto it = graphs_.find(key);
  return it != graphs_.end() && it->second.generation == generation();
}

void CudaBackend::drop_graph(uint64_t key) {
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    use_device();
    CUDA_CHECK(cudaGraphExecDestroy(it->second.exec));
    graphs_.erase(it);
  }
}

void CudaBackend::clear_graphs() {
  if (!graphs_.empty() && cudaSetDevice(device_) != cudaSuccess)  // no throw: the destructor calls it
    std::fprintf(stderr, "inferx cuda: cudaSetDevice(%d) failed before destroying graphs\n", device_);
  for (auto& [key, g] : graphs_)
    if (cudaGraphExecDestroy(g.exec) != cudaSuccess)
      std::fprintf(stderr, "inferx cuda: destroying a graph failed\n");
  graphs_.clear();
}

// Sampling ----------------------------------------------------------------------------------------------

void CudaBackend::argmax(const Tensor& logits, int32_t* host_ids) { run_sampler(logits, nullptr, host_ids); }

void CudaBackend::sample(const Tensor& logits, const cuda::SampleParams* host_params, int32_t* host_ids) {
  INFERX_CHECK(host_params != nullptr, "cuda backend: sample() needs one SampleParams per row");
  run_sampler(logits, host_params, host_ids);
}

bool CudaBackend::sample_tokens(const Tensor& logits, const TokenSampleParams* params, int32_t* host_ids) {
  run_sampler(logits, params, host_ids);  // null params: greedy on every row
  return true;
}

bool CudaBackend::edit_logits(Tensor& logits, const LogitEdit* edits, int64_t n) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  INFERX_CHECK(logits.device == Device::CUDA && logits.dtype == DType::F32 && logits.ndim == 2,
               "cuda backend: logit edits need F32 [rows, vocab] logits on the GPU, got {} {}",
               dtype_name(logits.dtype), logits.shape_string());
  INFERX_CHECK(!capturing_, "cuda backend: logit edits are staged from the host and cannot be captured");
  if (n == 0) return true;
  const int64_t rows = logits.rows(), vocab = logits.cols();
  for (int64_t i = 0; i < n; ++i)
    INFERX_CHECK(edits[i].row >= 0 && edits[i].row < rows && edits[i].token >= 0 && edits[i].token < vocab,
                 "cuda backend: logit edit {} at row {} token {} outside [{}, {}]", i, edits[i].row,
                 edits[i].token, rows, vocab);
  use_device();
  // The staging buffer is rewritten only by a later step, whose sampling waited for this one's copy.
  const size_t bytes = static_cast<size_t>(n) * sizeof(LogitEdit);
  auto* staged = static_cast<LogitEdit*>(pinned(pinned_edits_, bytes));
  std::memcpy(staged, edits, bytes);
  auto* dev = static_cast<LogitEdit*>(eager_scratch(edits_dev_, bytes));
  CUDA_CHECK(cudaMemcpyAsync(dev, staged, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cuda::launch_logit_edits(logits.ptr<float>(), vocab, dev, n, stream_));
  return true;
}

bool CudaBackend::memory_info(size_t& free_bytes, size_t& total_bytes) {
  use_device();
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return true;
}

void CudaBackend::run_sampler(const Tensor& logits, const cuda::SampleParams* host_params,
                              int32_t* host_ids) {
  const SamplerBuffers b{sample_ids_, pinned_ids_, sample_params_, pinned_params_};
  const int64_t rows = queue_sampler(logits, host_params, b);
  if (rows == 0) return;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(host_ids, pinned_ids_.data, static_cast<size_t>(rows) * sizeof(int32_t));
}

int64_t CudaBackend::queue_sampler(const Tensor& logits, const cuda::SampleParams* host_params,
                                   const SamplerBuffers& b, CUevent_st* fork) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  INFERX_CHECK(logits.device == Device::CUDA && logits.dtype == DType::F32 && logits.ndim == 2,
               "cuda backend: sampling needs F32 [rows, vocab] logits on the GPU, got {} {}",
               dtype_name(logits.dtype), logits.shape_string());
  INFERX_CHECK(!capturing_, "cuda backend: sampling copies to the host and cannot be captured");
  const int64_t rows = logits.rows(), vocab = logits.cols();
  if (rows == 0) return 0;
  INFERX_CHECK(vocab > 0 && vocab < (int64_t{1} << 31), "cuda backend: sampling over a vocabulary of {}",
               vocab);
  use_device();
  const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  // Sampling is never recorded (it copies to the host): its buffers grow without voiding graphs.
  auto* ids_dev = static_cast<int32_t*>(eager_scratch(b.ids_dev, id_bytes));
  auto* ids_host = static_cast<int32_t*>(pinned(b.ids_host, id_bytes));
  if (host_params) {
    const size_t param_bytes = static_cast<size_t>(rows) * sizeof(cuda::SampleParams);
    auto* staged = static_cast<cuda::SampleParams*>(pinned(b.params_host, param_bytes));
    std::memcpy(staged, host_params, param_bytes);
    auto* params_dev = static_cast<cuda::SampleParams*>(eager_scratch(b.params_dev, param_bytes));
    CUDA_CHECK(cudaMemcpyAsync(params_dev, staged, param_bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cuda::launch_sample(logits.ptr<float>(), rows, vocab, params_dev, ids_dev, stream_,
                                   options_.select_cluster_rows));
  } else {
    CUDA_CHECK(cuda::launch_argmax(logits.ptr<float>(), rows, vocab, ids_dev, stream_,
                                   options_.select_cluster_rows));
  }
  if (rows <= options_.select_cluster_rows) ++cluster_select_launches_;
  cudaStream_t copy = stream_;
  if (fork) {
    CUDA_CHECK(cudaEventRecord(fork, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, fork, 0));
    copy = copy_stream_;
    ++side_copies_;
  }
  CUDA_CHECK(cudaMemcpyAsync(ids_host, ids_dev, id_bytes, cudaMemcpyDeviceToHost, copy));
  return rows;
}

// Each slot has its own device ids, pinned copy and staged parameters: while step N's copy is queued,
// step N + 1 stages into the other slot (one staging buffer would be overwritten before N's copy ran).
void CudaBackend::sample_tokens_async(const Tensor& logits, const TokenSampleParams* params, int slot) {
  INFERX_CHECK(slot == 0 || slot == 1, "cuda backend: sampling slot {} (0 or 1)", slot);
  AsyncSlot& a = async_[slot];
  const SamplerBuffers b{a.ids_dev, a.ids_host, a.params_dev, a.params_host};
  const bool side = options_.sample_copy_stream;
  const auto event = [this](CUevent_st*& e) {  // made once, on this backend's device
    if (e) return;
    use_device();
    cudaEvent_t created = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&created, cudaEventDisableTiming));
    e = created;
  };
  event(a.done);
  if (side) {
    // The slot's buffers are rewritten only by the step after next, which is queued after this slot was
    // collected (wait_sampled_tokens synchronised on `done`), so the side copy never races a later write.
    event(a.sampled);
    if (!copy_stream_) {
      use_device();
      cudaStream_t created = nullptr;
      CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
      copy_stream_ = created;
    }
  }
  a.rows = queue_sampler(logits, params, b, side ? a.sampled : nullptr);
  CUDA_CHECK(cudaEventRecord(a.done, side && a.rows > 0 ? copy_stream_ : stream_));
}

void CudaBackend::wait_sampled_tokens(int slot, int32_t* host_ids, int64_t rows) {
  INFERX_CHECK(slot == 0 || slot == 1, "cuda backend: sampling slot {} (0 or 1)", slot);
  AsyncSlot& a = async_[slot];
  INFERX_CHECK(rows == a.rows && (rows == 0 || a.done),
               "cuda backend: {} sampled ids wanted from slot {} of {}", rows, slot, a.rows);
  if (rows == 0) return;
  use_device();
  CUDA_CHECK(cudaEventSynchronize(a.done));
  std::memcpy(host_ids, a.ids_host.data, static_cast<size_t>(rows) * sizeof(int32_t));
}

void CudaBackend::gather_sampled_tokens(int slot, const int32_t* rows, int64_t n, int32_t* out) {
  INFERX_CHECK(slot == 0 || slot == 1, "cuda backend: sampling slot {} (0 or 1)", slot);
  const AsyncSlot& a = async_[slot];
  if (n == 0) return;
  INFERX_CHECK(a.rows > 0, "cuda backend: gathering from the empty sampling slot {}", slot);
  finish_deferred();
  use_device();
  drop_bf16_copy();
  CUDA_CHECK(cuda::launch_gather_rows(a.ids_dev.data, a.rows, sizeof(int32_t), rows, n, out, stream_));
}

}  // namespace inferx
