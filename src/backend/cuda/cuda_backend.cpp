#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_cublaslt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_decode_stack.h"
#include "backend/cuda/quantized_gemm.h"
#include "backend/forwarding_backend.h"
#include "backend/rope.h"
#include "core/error.h"

namespace inferx {

namespace {

// Memory from cudaMalloc (kFree = cudaFree) or page-locked host memory from cudaHostAlloc (cudaFreeHost).
// `frees` (device memory): counted up when the memory is freed, which retires the backend's recorded graphs
// (CudaBackend::generation: a recording may point at it, and a later allocation may reuse the address).
template <cudaError_t (*kFree)(void*)>
class CudaMemory final : public DeviceBuffer {
 public:
  CudaMemory(void* p, size_t bytes, std::shared_ptr<std::atomic<uint64_t>> frees = nullptr)
      : ptr_(p), size_(bytes), frees_(std::move(frees)) {}
  ~CudaMemory() override {
    // Freeing waits for work using the memory; destructors cannot throw, so a failure is only reported.
    if (ptr_ && kFree(ptr_) != cudaSuccess) std::fprintf(stderr, "inferx cuda: freeing memory failed\n");
    if (ptr_ && frees_) frees_->fetch_add(1);
  }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  void* data() const override { return ptr_; }
  size_t size() const override { return size_; }

 private:
  void* ptr_;
  size_t size_;
  std::shared_ptr<std::atomic<uint64_t>> frees_;
};
using CudaDeviceBuffer = CudaMemory<cudaFree>;
using CudaPinnedBuffer = CudaMemory<cudaFreeHost>;

void check_device(const Tensor& t, const char* what) {
  INFERX_CHECK(t.device == Device::CUDA && (!t.empty() || t.numel() == 0),
               "cuda backend: {} must be a CUDA tensor (got {} {})", what,
               t.device == Device::CUDA ? "a null" : "a host", t.shape_string());
}

void check_f32(const Tensor& t, const char* what) {
  check_device(t, what);
  INFERX_CHECK(t.dtype == DType::F32, "cuda backend: {} must be F32, got {} {}", what, dtype_name(t.dtype),
               t.shape_string());
}

bool is_plain_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

void check_cache(const KvCacheLayer& cache, int64_t kv_heads, int64_t head_dim) {
  check_device(cache.k, "kv cache k");
  check_device(cache.v, "kv cache v");
  INFERX_CHECK(cache.k.ndim == 4 && cache.v.ndim == 4,
               "cuda backend: kv cache must be [blocks, block_size, heads, "
               "head_dim], got k {} v {}",
               cache.k.shape_string(), cache.v.shape_string());
  INFERX_CHECK(cache.k.shape == cache.v.shape && cache.k.dtype == cache.v.dtype,
               "cuda backend: kv cache k {} {} and v {} {} differ", dtype_name(cache.k.dtype),
               cache.k.shape_string(), dtype_name(cache.v.dtype), cache.v.shape_string());
  INFERX_CHECK(cache.k.dtype == DType::F32 || cache.k.dtype == DType::BF16 || cache.k.dtype == DType::F8_E4M3,
               "cuda backend: kv cache dtype {} is not supported (F32, BF16 or F8_E4M3)",
               dtype_name(cache.k.dtype));
  INFERX_CHECK(cache.k.dim(2) == kv_heads && cache.k.dim(3) == head_dim,
               "cuda backend: kv cache layer {} does not match {} kv heads of {}", cache.k.shape_string(),
               kv_heads, head_dim);
}

void check_batch(const BatchView& batch, int64_t rows) {
  if (batch.num_tokens == 0) return;
  INFERX_CHECK(
      batch.num_tokens >= 0 && batch.num_tokens <= rows && batch.num_seqs > 0 && batch.max_blocks_per_seq > 0,
      "cuda backend: batch of {} tokens in {} sequences ({} blocks per sequence) does not fit {} rows",
      batch.num_tokens, batch.num_seqs, batch.max_blocks_per_seq, rows);
  INFERX_CHECK(batch.positions && batch.query_start && batch.seq_lens && batch.block_tables,
               "cuda backend: batch metadata pointers must be set (device memory)");
}

cuda::PagedKv paged(const KvCacheLayer& cache, const CudaBackendOptions& o) {
  return {cache.k.data,   cache.v.data, cache.k.dtype, cache.k.dim(0),
          cache.k.dim(1), o.kv_k_scale, o.kv_v_scale};
}

cuda::BatchArgs batch_args(const BatchView& b) {
  return {b.num_tokens, b.num_seqs,     b.positions,         b.query_start,
          b.seq_lens,   b.block_tables, b.max_blocks_per_seq};
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls start clean
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device, cuda_options_from_environment());
}
std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(device, options);
}

void* cuda_stream_of(Backend& backend) {
  Backend* b = &backend;
  while (auto* f = dynamic_cast<ForwardingBackend*>(b)) b = &f->inner();  // wrappers run on the inner one
  auto* cuda = dynamic_cast<CudaBackend*>(b);
  INFERX_CHECK(cuda != nullptr, "{} is not a CUDA backend (no stream for collectives)", backend.name());
  return cuda->stream();
}

CudaBackend::CudaBackend(int device, const CudaBackendOptions& options) : device_(device), options_(options) {
  INFERX_CHECK(options.kv_cache_dtype == DType::F32 || options.kv_cache_dtype == DType::BF16 ||
                   options.kv_cache_dtype == DType::F8_E4M3,
               "cuda backend: kv cache dtype {} is not supported (F32, BF16 or F8_E4M3)",
               dtype_name(options.kv_cache_dtype));
  const int count = cuda_device_count();
  INFERX_CHECK(device >= 0 && device < count,
               "cuda backend: device {} does not exist ({} CUDA devices visible)", device, count);
  CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  // sm_90a machine code runs on compute capability 9.0 only (arch-specific features do not carry forward).
  INFERX_CHECK(prop.major == 9 && prop.minor == 0,
               "cuda backend: device {} ({}) is sm_{}{}; this build has sm_90a (Hopper) code only", device_,
               prop.name, prop.major, prop.minor);
  name_ = std::string("cuda:") + std::to_string(device_) + " (" + prop.name + ")";
  sm_count_ = prop.multiProcessorCount;
  decode_stack_profiles_left_ = options_.decode_stack_profiles;
  cudaStream_t stream = static_cast<cudaStream_t>(options_.external_stream);
  if (stream == nullptr)
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, options_.stream_priority));
  stream_ = stream;
  gemm_ = std::make_unique<cuda::CublasLtGemm>(stream_);
  qgemm_ = std::make_unique<cuda::QuantizedGemm>(stream_);
  gemm_->lt().use_tuning_cache(options_.gemm_tuning_cache);
  qgemm_->lt().use_tuning_cache(options_.gemm_tuning_cache);
  if (options_.gemm_memset_rewrite != 0) {
    gemm_->lt().set_dedicated_workspaces(true);
    qgemm_->lt().set_dedicated_workspaces(true);
  }
  cuda::setup_decode_attention_stamps();
}

CudaBackend::~CudaBackend() {
  clear_graphs();
  cuda::report_decode_attention_stamps();
  // INFERX_GEMM_STATS=1: how many cuBLASLt plans, heuristic queries and bucket tunings a run took, and their
  // host time - a workload of many row counts (serving steps) shows here.
  if (const char* v = std::getenv("INFERX_GEMM_STATS"); v && std::strcmp(v, "1") == 0) {
    const auto print = [](const char* what, const cuda::LtMatmul::Stats& st) {
      std::fprintf(
          stderr,
          "inferx cuda: %s cuBLASLt plans %llu (heuristic queries %llu, host %.3f s), bucket tunings %llu "
          "(changed %llu, host %.3f s), reused %llu, restored from the tuning cache %llu\n",
          what, static_cast<unsigned long long>(st.plans), static_cast<unsigned long long>(st.queries),
          st.build_seconds, static_cast<unsigned long long>(st.tunings),
          static_cast<unsigned long long>(st.changed), st.tune_seconds,
          static_cast<unsigned long long>(st.reused), static_cast<unsigned long long>(st.loaded));
    };
    if (gemm_) print("16-bit", gemm_->tuning_stats());
    if (qgemm_) print("quantized", qgemm_->tuning_stats());
    if (options_.gemm_memset_rewrite != 0)
      std::fprintf(stderr, "inferx cuda: workspace memsets moved or replaced in recorded graphs: %llu\n",
                   static_cast<unsigned long long>(rewritten_memsets_));
  }
  for (Scratch* s : {&decode_partials_, &decode_counters_, &shadow_, &sample_params_, &sample_ids_})
    release(*s);
  for (Scratch* s :
       {&gemv_x_, &gemv_out_, &norm_row_, &norm_partials_, &decode_stack_scratch_, &decode_stack_profile_})
    release(*s);
  for (Scratch* s : {&qgemm_ws_, &deferred_hold_[0], &deferred_hold_[1]}) release(*s);
  qgemm_.reset();
  release_upload_staging();
  for (Scratch* s : {&pinned_params_, &pinned_ids_, &pinned_edits_}) release_pinned(*s);
  release(edits_dev_);
  if (upload_stream_) {  // its copies read pinned host buffers the caller frees after the backend
    if (cudaStreamSynchronize(upload_stream_) != cudaSuccess ||
        cudaStreamDestroy(upload_stream_) != cudaSuccess)
      std::fprintf(stderr, "inferx cuda: releasing the upload stream failed\n");
    upload_stream_ = nullptr;
  }
  for (CUevent_st* e : {upload_mark_, upload_done_})
    if (e && cudaEventDestroy(e) != cudaSuccess)
      std::fprintf(stderr, "inferx cuda: releasing an upload event failed\n");
  if (copy_stream_) {  // its copies write the slots' pinned ids: finish them before those are freed
    if (cudaStreamSynchronize(copy_stream_) != cudaSuccess || cudaStreamDestroy(copy_stream_) != cudaSuccess)
      std::fprintf(stderr, "inferx cuda: releasing the sampling copy stream failed\n");
    copy_stream_ = nullptr;
  }
  for (AsyncSlot& a : async_) {
    if (a.sampled && cudaEventDestroy(a.sampled) != cudaSuccess)
      std::fprintf(stderr, "inferx cuda: releasing a sampling event failed\n");
    release(a.ids_dev);
    release(a.params_dev);
    release_pinned(a.ids_host);
    release_pinned(a.params_host);
    if (a.done && cudaEventDestroy(a.done) != cudaSuccess)
      std::fprintf(stderr, "inferx cuda: releasing a sampling event failed\n");
  }
  gemm_.reset();
  if (stream_) {
    const bool owned = options_.external_stream == nullptr;
    if (cudaStreamSynchronize(stream_) != cudaSuccess || (owned && cudaStreamDestroy(stream_) != cudaSuccess))
      std::fprintf(stderr, "inferx cuda: releasing the stream failed\n");
  }
}

void CudaBackend::use_device() const { CUDA_CHECK(cudaSetDevice(device_)); }

// Memory -----------------------------------------------------------------------------------------------

// A new buffer retires no recorded graph (none can point at it); freeing one does (CudaMemory), so a buffer
// that replaces another (a grown workspace) retires them when the old one goes.
std::unique_ptr<DeviceBuffer> CudaBackend::allocate(size_t bytes) {
  // As at a step's start (embedding): nothing allocates between a deferred product and its consumer.
  if (qgemm_) qgemm_->drop_pending();
  use_device();
  if (bytes == 0) return std::make_unique<CudaDeviceBuffer>(nullptr, 0);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    fail(
        "cuda backend: out of device memory on {}: wanted {} bytes ({} MiB), {} bytes ({} MiB) free of {} "
        "MiB",
        name_, bytes, bytes >> 20, free_bytes, free_bytes >> 20, total_bytes >> 20);
  }
  CUDA_CHECK(status);
  auto buffer = std::make_unique<CudaDeviceBuffer>(p, bytes, device_frees_);
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  return buffer;
}

std::unique_ptr<DeviceBuffer> CudaBackend::allocate_upload(size_t bytes) {
  use_device();
  void* p = nullptr;
  if (bytes > 0) CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return std::make_unique<CudaPinnedBuffer>(p, bytes);
}

// On the stream, not waited for: a decode graph's step metadata (~0.5 MB at 512 rows and a 4k-token
// max-model-len) went through copy_to_device's pageable copy and stream synchronisation before every replay,
// with the GPU idle (part of the step profile's launch phase, 0.65 ms of a 23.9 ms step on the H200,
// 2026-12-04; how much of it the copy was is not measured).
void CudaBackend::upload_async(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  drop_bf16_copy();  // the destination may be the tensor the BF16 copy mirrors
  use_device();
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::mark_upload_point() {
  if (!options_.upload_side_stream || capturing_) return;
  finish_deferred();  // a held-back epilogue belongs before the mark: it may read the metadata
  use_device();
  if (!upload_stream_) {  // made once, on this backend's device
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    upload_stream_ = stream;
    for (CUevent_st** e : {&upload_mark_, &upload_done_}) {
      cudaEvent_t created = nullptr;
      CUDA_CHECK(cudaEventCreateWithFlags(&created, cudaEventDisableTiming));
      *e = created;
    }
  }
  CUDA_CHECK(cudaEventRecord(upload_mark_, stream_));
  upload_marked_ = true;
}

void CudaBackend::upload_async_after_mark(void* dst, const void* host_src, size_t bytes) {
  if (!upload_marked_ || capturing_) {
    upload_async(dst, host_src, bytes);
    return;
  }
  upload_marked_ = false;
  if (bytes == 0) return;
  drop_bf16_copy();  // the destination may be the tensor the BF16 copy mirrors
  use_device();
  CUDA_CHECK(cudaStreamWaitEvent(upload_stream_, upload_mark_, 0));
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, upload_stream_));
  CUDA_CHECK(cudaEventRecord(upload_done_, upload_stream_));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, upload_done_, 0));
  ++side_uploads_;
}

// Copies wait for completion: the host source may be pageable and reused by the caller at once.
void CudaBackend::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  drop_bf16_copy();  // the destination may be the tensor the BF16 copy mirrors
  use_device();
  if (bytes >= kUploadChunk && !capturing_) {  // weights at load: pinned, double-buffered
    upload_staged(dst, host_src, bytes);
    return;
  }
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  finish_deferred();  // a deferred product's output may be what is read
  if (bytes == 0) return;
  use_device();
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() {
  finish_deferred();
  use_device();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::flush() {
  finish_deferred();
  drop_bf16_copy();  // the tensor it copies may change outside the backend (an all-reduce in place)
}

// Ops --------------------------------------------------------------------------------------------------

void CudaBackend::embedding(const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) {
  embedding_shard(table, ids, n, 0, out);
}

void CudaBackend::embedding_shard(const Tensor& table, const int32_t* ids, int64_t n, int64_t first_id,
                                  Tensor& out) {
  // A step starts here: a product still pending is left from a step that stopped early (an error between it
  // and its consumer); its output may be freed memory by now, so it is dropped, not launched.
  if (qgemm_) qgemm_->drop_pending();
  check_device(table, "embedding table");
  check_f32(out, "embedding output");
  INFERX_CHECK(is_plain_float(table.dtype),
               "cuda backend: embedding tables of type {} are not supported on CUDA yet: dequantize at load",
               dtype_name(table.dtype));
  const int64_t dim = table.cols();
  INFERX_CHECK(table.ndim == 2 && out.cols() == dim && out.rows() >= n && n >= 0,
               "cuda backend: embedding output {} does not fit {} rows of table {}", out.shape_string(), n,
               table.shape_string());
  use_device();
  drop_bf16_copy();
  CUDA_CHECK(cuda::launch_embedding(table.dtype, table.data, table.dim(0), dim, ids, n, first_id,
                                    out.ptr<float>(), stream_));
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  check_f32(x, "rmsnorm input");
  check_f32(weight, "rmsnorm weight");
  check_f32(out, "rmsnorm output");
  INFERX_CHECK(weight.numel() == x.cols() && out.numel() == x.numel() && out.cols() == x.cols(),
               "cuda backend: rmsnorm of {} with weight {} into {}", x.shape_string(), weight.shape_string(),
               out.shape_string());
  use_device();
  drop_bf16_copy();
  void* bf16 = bf16_copy_for(out);
  if (options_.timing_skip & kTimingSkipNorm) return;
  CUDA_CHECK(cuda::launch_rmsnorm(x.ptr<float>(), weight.ptr<float>(), eps, x.rows(), x.cols(),
                                  out.ptr<float>(), bf16, stream_));
}

void CudaBackend::add_rmsnorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                              Tensor& out) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  check_f32(residual, "residual");
  check_f32(x, "add_rmsnorm input");
  check_f32(weight, "add_rmsnorm weight");
  check_f32(out, "add_rmsnorm output");
  INFERX_CHECK(x.numel() == residual.numel() && x.cols() == residual.cols() &&
                   out.numel() == residual.numel() && weight.numel() == residual.cols(),
               "cuda backend: add_rmsnorm of residual {} + {} with weight {} into {}",
               residual.shape_string(), x.shape_string(), weight.shape_string(), out.shape_string());
  use_device();
  drop_bf16_copy();
  void* bf16 = bf16_copy_for(out);
  if (options_.timing_skip & kTimingSkipNorm) return;
  CUDA_CHECK(cuda::launch_add_rmsnorm(residual.ptr<float>(), x.ptr<float>(), weight.ptr<float>(), eps,
                                      residual.rows(), residual.cols(), out.ptr<float>(), bf16, stream_));
}

void CudaBackend::head_rmsnorm(Tensor& x, int64_t head_dim, const Tensor& weight, float eps) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  check_f32(x, "head_rmsnorm input");
  check_f32(weight, "head_rmsnorm weight");
  INFERX_CHECK(head_dim > 0 && x.cols() % head_dim == 0 && weight.numel() == head_dim,
               "cuda backend: head_rmsnorm of {} in heads of {} with weight {}", x.shape_string(), head_dim,
               weight.shape_string());
  use_device();
  drop_bf16_copy();
  CUDA_CHECK(cuda::launch_head_rmsnorm(x.ptr<float>(), x.numel() / head_dim, head_dim, weight.ptr<float>(),
                                       eps, stream_));
}

void CudaBackend::matmul(const Tensor& x, const Linear& w, Tensor& out) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  check_f32(x, "matmul input");
  check_f32(out, "matmul output");
  check_device(w.weight, "matmul weight");
  INFERX_CHECK(w.weight.ndim == 2 && x.cols() == w.in_features() && out.cols() == w.out_features() &&
                   out.rows() == x.rows(),
               "cuda backend: matmul x {} @ W {}^T does not give out {}", x.shape_string(),
               w.weight.shape_string(), out.shape_string());
  if (!w.bias.empty()) {
    check_f32(w.bias, "matmul bias");
    INFERX_CHECK(w.bias.numel() == w.out_features(), "cuda backend: matmul bias {} for {} outputs",
                 w.bias.shape_string(), w.out_features());
  }
  use_device();
  // Quantized weights with more rows than the GEMV pays for, or that it cannot take (quantized_gemm.h).
  if (cuda::QuantizedGemm::supports(w) && (cuda::QuantizedGemm::prefers(w, x.rows()) || !gemv_takes(x, w))) {
    qgemm_->matmul(x.ptr<float>(), x.rows(), w, out.ptr<float>(),
                   [this](size_t bytes) { return scratch(qgemm_ws_, bytes); });
    last_matmul_bf16_ = false;  // it reads F32 activations: the norms need not write BF16 copies
    drop_bf16_copy_if_overlaps(out);
    return;
  }
  if (gemv_takes(x, w)) {  // decode-sized batches and formats cuBLASLt cannot take (cuda_backend_gemv.cpp)
    Tensor* outs[] = {&out};
    run_gemv(x, w, outs);
    return;
  }
  // The BF16 copy written by the norm / SiLU that produced x, when it is still current (class comment).
  const bool from_copy = has_bf16_copy(x) && w.weight.dtype == DType::BF16;
  gemm_->matmul(from_copy ? shadow_.data : x.data, from_copy ? DType::BF16 : DType::F32, x.rows(), x.cols(),
                w.weight.dtype, w.weight.data, w.out_features(),
                w.bias.empty() ? nullptr : w.bias.ptr<float>(), out.ptr<float>());
  last_matmul_bf16_ = w.weight.dtype == DType::BF16;
  drop_bf16_copy_if_overlaps(out);
}

void CudaBackend::copy_inverse_frequencies(const RopeParams& r, float* dst, size_t capacity) {
  const RopeParams& c = inv_freq_params_;
  if (inv_freq_.empty() || !(c == r)) {
    inv_freq_ = rope_inverse_frequencies(r.head_dim, r.theta, r.scaling);
    inv_freq_params_ = r;
  }
  INFERX_CHECK(inv_freq_.size() <= capacity, "cuda backend: {} rope frequencies for head_dim {} (at most {})",
               inv_freq_.size(), r.head_dim, capacity);
  std::memcpy(dst, inv_freq_.data(), inv_freq_.size() * sizeof(float));
}

const cuda::Fp8Epilogue* CudaBackend::pending_qkv_product(const Tensor& q, const Tensor& k, const Tensor& v,
                                                          int64_t hq, int64_t hkv, int64_t hd) const {
  const cuda::Fp8Epilogue* product = qgemm_->pending();
  return product && product->num_outs == 3 && product->out[0] == q.data && product->out[1] == k.data &&
                 product->out[2] == v.data && cuda::rope_takes_product(*product, hq, hkv, hd, q.rows())
             ? product
             : nullptr;
}

void CudaBackend::rope_and_write_kv(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch,
                                    const RopeParams& rope, KvCacheLayer& cache) {
  check_f32(q, "rope q");
  check_f32(k, "rope k");
  check_f32(v, "kv write v");
  const int64_t hd = rope.head_dim;
  INFERX_CHECK(hd > 0 && hd % 2 == 0 && hd / 2 <= cuda::kMaxRopePairs,
               "cuda backend: rope head_dim {} must be even and at most {}", hd, 2 * cuda::kMaxRopePairs);
  INFERX_CHECK(q.cols() % hd == 0 && k.cols() % hd == 0 && v.cols() == k.cols(),
               "cuda backend: rope q {} / k {} / v {} are not whole heads of {}", q.shape_string(),
               k.shape_string(), v.shape_string(), hd);
  INFERX_CHECK(k.rows() == q.rows() && v.rows() == q.rows(),
               "cuda backend: rope q {} k {} v {} differ in rows", q.shape_string(), k.shape_string(),
               v.shape_string());
  const int64_t hq = q.cols() / hd, hkv = k.cols() / hd;
  check_cache(cache, hkv, hd);
  check_batch(batch, q.rows());
  cuda::RopeFrequencies freqs{};
  copy_inverse_frequencies(rope, freqs.inv_freq, std::size(freqs.inv_freq));
  use_device();
  drop_bf16_copy();
  // The q/k/v product deferred for this call (QuantizedGemm::norm_matmul_split's defer_split): read from its
  // BF16 sums here, so its split epilogue never runs (k and v then stay unwritten); else launched first.
  const cuda::Fp8Epilogue* product = pending_qkv_product(q, k, v, hq, hkv, hd);
  if (!product) finish_deferred();
  if (options_.timing_skip & kTimingSkipRope) {
    finish_deferred();  // a matched product too: skipping RoPE must not skip q/k/v
    return;
  }
  CUDA_CHECK(cuda::launch_rope_write_kv(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), hq, hkv, hd,
                                        rope.layout == RopeLayout::Interleaved, freqs, batch_args(batch),
                                        paged(cache, options_), stream_, product));
  if (product) qgemm_->drop_pending();  // taken (the launch copied it)
}

// One-token steps run RoPE and the cache write in the decode attention kernel (cuda::DecodeRope: one kernel
// boundary fewer per layer), reading q / k / v from their F32 tensors or from the deferred q/k/v product of
// the projection just before (from 64 rows: its BF16 sums, cuda_backend_gemv.cpp, as rope_and_write_kv
// does; where cuda::decode_rope_product says so); the rest as the two calls.
void CudaBackend::rope_attention(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch,
                                 const RopeParams& rope, KvCacheLayer& cache, const AttentionParams& p,
                                 Tensor& out) {
  const auto f32_here = [](const Tensor& t) { return t.device == Device::CUDA && t.dtype == DType::F32; };
  // A deferred product is taken only when it is this layer's q/k/v (as rope_and_write_kv takes it).
  const cuda::Fp8Epilogue* product =
      cuda::decode_rope_product() ? pending_qkv_product(q, k, v, p.num_heads, p.num_kv_heads, p.head_dim)
                                  : nullptr;
  const bool candidate =
      batch.num_tokens > 0 && batch.max_query_len == 1 && (qgemm_->pending() == nullptr || product) &&
      (attention_kernel_ == CudaAttentionKernel::Auto || attention_kernel_ == CudaAttentionKernel::Decode) &&
      !(options_.timing_skip & (kTimingSkipRope | kTimingSkipAttention)) && rope.head_dim == p.head_dim &&
      p.head_dim / 2 <= cuda::kDecodeRopeMaxPairs && f32_here(q) && f32_here(k) && f32_here(v) &&
      f32_here(out) && p.num_kv_heads > 0 && q.cols() == p.num_heads * p.head_dim &&
      k.cols() == p.num_kv_heads * p.head_dim && v.cols() == k.cols() && k.rows() == q.rows() &&
      v.rows() == q.rows() && out.rows() == q.rows() && out.cols() == q.cols() && cache.k.ndim == 4;
  if (!candidate ||
      !cuda::decode_attention_takes_rope(paged(cache, options_), p.num_heads, p.num_kv_heads, p.head_dim,
                                         q.ptr<float>(), out.ptr<float>(), nullptr)) {
    Backend::rope_attention(q, k, v, batch, rope, cache, p, out);  // the two calls
    return;
  }
  // The checks the two calls make (shapes are whole heads already).
  check_cache(cache, p.num_kv_heads, p.head_dim);
  check_batch(batch, q.rows());
  INFERX_CHECK(p.num_heads % p.num_kv_heads == 0 && p.num_heads <= 65535,
               "cuda backend: attention with {} query heads and {} kv heads", p.num_heads, p.num_kv_heads);
  use_device();
  drop_bf16_copy();
  cuda::DecodeRope r;
  r.k = k.ptr<float>();
  r.v = v.ptr<float>();
  r.interleaved = rope.layout == RopeLayout::Interleaved ? 1 : 0;
  copy_inverse_frequencies(rope, r.inv_freq, std::size(r.inv_freq));
  r.product = product;
  // The kernel also writes out's BF16 copy, which the o projection's GEMV / GEMM then reads directly.
  void* out_bf16 = bf16_copy_for(out);
  run_decode_attention(q, paged(cache, options_), batch_args(batch), p, out, out_bf16, &r);
  if (product) qgemm_->drop_pending();  // taken (the launch copied it)
}

// The split-KV decode kernel over args' tokens (one query each); out_bf16 may be null; rope: the RoPE and
// cache write it does itself (rope_attention).
void CudaBackend::run_decode_attention(const Tensor& q, const cuda::PagedKv& kv, const cuda::BatchArgs& args,
                                       const AttentionParams& p, Tensor& out, void* out_bf16,
                                       const cuda::DecodeRope* rope) {
  // The split count depends on the batch's block-table capacity, not its current lengths, so that a
  // captured graph stays valid as the sequences grow (the kernel cuts the actual keys on the device).
  const int64_t capacity = static_cast<int64_t>(args.max_blocks_per_seq) * kv.block_size;
  const int forced = options_.decode_splits;
  const cuda::DecodeSplitPlan plan =
      forced > 0 ? cuda::DecodeSplitPlan{std::min(forced, cuda::kDecodeMaxSplits),
                                         std::max(options_.decode_min_tiles, 1)}
                 : cuda::decode_attention_plan(args.num_tokens, p.num_kv_heads, p.num_heads, capacity,
                                               sm_count_, kv.dtype);
  const int splits = plan.splits;
  const size_t bytes = cuda::decode_attention_scratch_bytes(args.num_tokens, p.num_heads, p.head_dim, splits);
  void* partials = bytes > 0 ? scratch(decode_partials_, bytes) : nullptr;
  // The merge tickets: zeroed when (re)allocated; every launch leaves them zero.
  int* counters = nullptr;
  if (splits > 1) {
    const void* old_data = decode_counters_.data;
    const size_t old_bytes = decode_counters_.bytes;
    const size_t n =
        static_cast<size_t>(cuda::decode_attention_counters(args.num_tokens, p.num_heads, p.num_kv_heads));
    counters = static_cast<int*>(scratch(decode_counters_, n * sizeof(int)));
    if (decode_counters_.data != old_data || decode_counters_.bytes != old_bytes)
      CUDA_CHECK(cudaMemsetAsync(counters, 0, decode_counters_.bytes, stream_));
  }
  CUDA_CHECK(cuda::launch_decode_attention(q.ptr<float>(), kv, args, p.num_heads, p.num_kv_heads, p.head_dim,
                                           p.scale, p.sliding_window, plan, partials, counters,
                                           out.ptr<float>(), out_bf16, stream_, rope));
}

void CudaBackend::attention(const Tensor& q, const KvCacheLayer& cache, const BatchView& batch,
                            const AttentionParams& p, Tensor& out) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  check_f32(q, "attention q");
  check_f32(out, "attention output");
  INFERX_CHECK(p.head_dim > 0 && p.head_dim <= cuda::kMaxAttentionHeadDim,
               "cuda backend: attention head_dim {} is not supported (at most {})", p.head_dim,
               cuda::kMaxAttentionHeadDim);
  INFERX_CHECK(p.num_heads > 0 && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0,
               "cuda backend: attention with {} query heads and {} kv heads (must divide)", p.num_heads,
               p.num_kv_heads);
  INFERX_CHECK(q.cols() == p.num_heads * p.head_dim && out.cols() == q.cols() && out.rows() == q.rows(),
               "cuda backend: attention q {} / out {} are not {} heads of {}", q.shape_string(),
               out.shape_string(), p.num_heads, p.head_dim);
  INFERX_CHECK(p.num_heads <= 65535, "cuda backend: {} attention heads exceed the grid limit", p.num_heads);
  check_cache(cache, p.num_kv_heads, p.head_dim);
  check_batch(batch, q.rows());
  use_device();
  drop_bf16_copy();
  const cuda::PagedKv kv = paged(cache, options_);
  const cuda::BatchArgs args = batch_args(batch);
  CudaAttentionKernel kernel = attention_kernel_;
  if (kernel == CudaAttentionKernel::Auto) {
    // One-token queries read K/V once per group with the split-KV kernel; anything with longer queries
    // goes to the tensor-core kernel; shapes neither handles to the v0 kernel.
    if (batch.max_query_len == 1 && cuda::decode_attention_supported(kv, p.head_dim))
      kernel = CudaAttentionKernel::Decode;
    else if (cuda::prefill_attention_supported(kv, p.head_dim))
      kernel = CudaAttentionKernel::Prefill;
    else
      kernel = CudaAttentionKernel::Reference;
  }
  // A mixed step (decodes first, then prefill chunks: the scheduler's order) runs its leading one-token
  // sequences through the decode kernel (K/V read once per GQA group) and only the rest through the
  // prefill kernel, which would otherwise give every decode row a whole query tile per query head (4x the
  // K/V reads for Llama-3's groups of 4, and 1 of 192 tile rows used).
  const int32_t nd = batch.num_decode_prefix;
  if (attention_kernel_ == CudaAttentionKernel::Auto && kernel == CudaAttentionKernel::Prefill && nd > 0 &&
      nd < batch.num_seqs && cuda::decode_attention_supported(kv, p.head_dim)) {
    cuda::BatchArgs dec = args;
    dec.num_tokens = nd;
    dec.num_seqs = nd;
    run_decode_attention(q, kv, dec, p, out, nullptr);
    cuda::BatchArgs pre = args;
    pre.num_seqs -= nd;
    pre.query_start += nd;  // token offsets stay absolute: q, out and positions are indexed by them
    pre.seq_lens += nd;
    pre.block_tables += static_cast<int64_t>(nd) * batch.max_blocks_per_seq;
    CUDA_CHECK(cuda::launch_prefill_attention(q.ptr<float>(), kv, pre, p.num_heads, p.num_kv_heads,
                                              p.head_dim, p.scale, p.sliding_window, batch.max_query_len,
                                              out.ptr<float>(), stream_));
    return;
  }
  if (kernel == CudaAttentionKernel::Decode) {
    INFERX_CHECK(
        cuda::decode_attention_supported(kv, p.head_dim),
        "cuda backend: the decode attention kernel needs a BF16 or FP8 cache and head_dim 64 or 128 (got {} "
        "and {})",
        dtype_name(kv.dtype), p.head_dim);
    // The kernel also writes out's BF16 copy, which the o projection's GEMV / GEMM then reads directly.
    void* out_bf16 = bf16_copy_for(out);
    if (options_.timing_skip & kTimingSkipAttention) return;
    run_decode_attention(q, kv, args, p, out, out_bf16);
    return;
  }
  if (kernel == CudaAttentionKernel::Prefill) {
    INFERX_CHECK(
        cuda::prefill_attention_supported(kv, p.head_dim),
        "cuda backend: the prefill attention kernel needs a BF16 or FP8 cache and head_dim 64 or 128 (got {} "
        "and {})",
        dtype_name(kv.dtype), p.head_dim);
    // max_query_len is a host hint; without it every sequence may hold all the tokens.
    const int64_t max_q = batch.max_query_len > 0 ? batch.max_query_len : batch.num_tokens;
    CUDA_CHECK(cuda::launch_prefill_attention(q.ptr<float>(), kv, args, p.num_heads, p.num_kv_heads,
                                              p.head_dim, p.scale, p.sliding_window, max_q, out.ptr<float>(),
                                              stream_));
    return;
  }
  CUDA_CHECK(cuda::launch_paged_attention(q.ptr<float>(), kv, args, p.num_heads, p.num_kv_heads, p.head_dim,
                                          p.scale, p.sliding_window, out.ptr<float>(), stream_));
}

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  check_f32(gate, "silu_mul gate");
  check_f32(up, "silu_mul up");
  check_f32(out, "silu_mul output");
  INFERX_CHECK(gate.numel() == up.numel() && out.numel() == gate.numel(),
               "cuda backend: silu_mul of gate {} and up {} into {}", gate.shape_string(), up.shape_string(),
               out.shape_string());
  use_device();
  drop_bf16_copy();
  void* bf16 = bf16_copy_for(out);
  CUDA_CHECK(cuda::launch_silu_mul(gate.ptr<float>(), up.ptr<float>(), gate.numel(), out.ptr<float>(), bf16,
                                   stream_));
}

void CudaBackend::interleave_row_blocks(const Tensor& x, int64_t blocks, Tensor& out) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  check_device(x, "interleave_row_blocks input");
  check_device(out, "interleave_row_blocks output");
  const int64_t L = check_row_blocks(x, blocks, out, "cuda backend");
  use_device();
  drop_bf16_copy();
  // One strided copy per block (memcpy nodes in a recorded step): block b's L rows into columns
  // [b * C, (b + 1) * C) of every out row.
  const auto rb = static_cast<size_t>(x.row_bytes());
  for (int64_t b = 0; b < blocks; ++b)
    CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(out.data) + b * rb, rb * static_cast<size_t>(blocks),
                                 static_cast<const char*>(x.data) + b * L * rb, rb, rb,
                                 static_cast<size_t>(L), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::gather_rows(const Tensor& x, const int32_t* rows, int64_t n, Tensor& out) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  check_device(x, "gather_rows input");
  check_device(out, "gather_rows output");
  INFERX_CHECK(x.dtype == out.dtype && x.cols() == out.cols() && out.rows() >= n && n >= 0,
               "cuda backend: gather_rows of {} rows from {} {} into {} {}", n, dtype_name(x.dtype),
               x.shape_string(), dtype_name(out.dtype), out.shape_string());
  use_device();
  drop_bf16_copy();
  CUDA_CHECK(cuda::launch_gather_rows(x.data, x.rows(), x.row_bytes(), rows, n, out.data, stream_));
}

}  // namespace inferx
