// NCCL collectives for the tensor-parallel ranks of one process (see nccl_communicator.h).
#include "parallel/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/error.h"
#include "parallel/nccl/bf16_convert.h"
#include "parallel/nccl/p2p_all_reduce.h"

namespace inferx {
namespace {

void check_nccl(ncclResult_t status, const char* call, const char* file, int line) {
  if (status != ncclSuccess)
    fail("NCCL error {} ({}) in {} at {}:{}", static_cast<int>(status), ncclGetErrorString(status), call,
         file, line);
}

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(status), cudaGetErrorString(status), call,
         file, line);
}

// Destructors cannot throw: report and go on.
void warn_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    std::fprintf(stderr, "warning: %s failed: %s\n", call, cudaGetErrorString(status));
}

}  // namespace
}  // namespace inferx

#define NCCL_CHECK(call) ::inferx::check_nccl((call), #call, __FILE__, __LINE__)
#define NCCL_CUDA_CHECK(call) ::inferx::check_cuda((call), #call, __FILE__, __LINE__)

namespace inferx {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    default:
      fail("nccl all_reduce_sum: unsupported dtype {} (F32, F16, BF16)", dtype_name(t));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size, cudaStream_t stream,
                   std::shared_ptr<P2pAllReduce> p2p, size_t bf16_bytes)
      : comm_(comm), device_(device), rank_(rank), size_(size), stream_(stream), p2p_(std::move(p2p)) {
    NCCL_CUDA_CHECK(cudaSetDevice(device_));
    NCCL_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    if (bf16_bytes > 0) {  // allocated once: a recorded graph may hold it
      NCCL_CUDA_CHECK(cudaMalloc(&bf16_, bf16_bytes));
      bf16_elems_ = static_cast<int64_t>(bf16_bytes / 2);
    }
  }

  ~NcclCommunicator() override {
    warn_cuda(cudaSetDevice(device_), "cudaSetDevice");
    if (comm_ != nullptr) {
      const ncclResult_t r = ncclCommDestroy(comm_);
      if (r != ncclSuccess)
        std::fprintf(stderr, "warning: NCCL communicator teardown: %s\n", ncclGetErrorString(r));
    }
    if (scratch_ != nullptr) warn_cuda(cudaFree(scratch_), "cudaFree");
    if (bf16_ != nullptr) warn_cuda(cudaFree(bf16_), "cudaFree");
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CUDA; }

  // Enqueued on the rank backend's stream; no wait (communicator.h, "Ordering").
  void all_reduce_sum(Tensor& x) override {
    check_usable();
    INFERX_CHECK(x.device == Device::CUDA, "nccl all_reduce_sum: the tensor is not in GPU memory");
    if (p2p_ && x.dtype == DType::F32 && p2p_->takes(x.numel())) {  // small sums: one kernel, no NCCL
      p2p_->all_reduce(rank_, static_cast<float*>(x.data), x.numel(), stream_);
      return;
    }
    NCCL_CUDA_CHECK(cudaSetDevice(device_));
    if (bf16_ != nullptr && x.dtype == DType::F32 && x.numel() >= kBf16MinElems && x.numel() <= bf16_elems_) {
      // Half the bytes over the links: the partial sums rounded to BF16 (as a BF16 model's activations
      // are), summed by NCCL in BF16, widened back.
      const auto n = static_cast<int64_t>(x.numel());
      NCCL_CUDA_CHECK(launch_f32_to_bf16(static_cast<const float*>(x.data), n, bf16_, stream_));
      NCCL_CHECK(ncclAllReduce(bf16_, bf16_, static_cast<size_t>(n), ncclBfloat16, ncclSum, comm_, stream_));
      NCCL_CUDA_CHECK(launch_bf16_to_f32(bf16_, n, static_cast<float*>(x.data), stream_));
      return;
    }
    NCCL_CHECK(ncclAllReduce(x.data, x.data, static_cast<size_t>(x.numel()), nccl_type(x.dtype), ncclSum,
                             comm_, stream_));
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_usable();
    INFERX_CHECK(in.device == Device::CUDA && out.device == Device::CUDA,
                 "nccl all_gather: the tensors are not in GPU memory");
    const int64_t bytes = in.nbytes();
    INFERX_CHECK(out.nbytes() == bytes * size_,
                 "nccl all_gather: out has {} bytes, expected {} ranks x {} bytes", out.nbytes(), size_,
                 bytes);
    NCCL_CUDA_CHECK(cudaSetDevice(device_));
    NCCL_CHECK(ncclAllGather(in.data, out.data, static_cast<size_t>(bytes), ncclChar, comm_, stream_));
  }

  void broadcast(Tensor& x, int root) override {
    check_usable();
    INFERX_CHECK(x.device == Device::CUDA, "nccl broadcast: the tensor is not in GPU memory");
    INFERX_CHECK(root >= 0 && root < size_, "nccl broadcast: root {} is not a rank of a group of {}", root,
                 size_);
    NCCL_CUDA_CHECK(cudaSetDevice(device_));
    NCCL_CHECK(
        ncclBroadcast(x.data, x.data, static_cast<size_t>(x.nbytes()), ncclChar, root, comm_, stream_));
  }

  void barrier() override {
    check_usable();
    NCCL_CUDA_CHECK(cudaSetDevice(device_));
    NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    NCCL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // ncclCommAbort ends what this rank's stream still waits for in a collective (NCCL's kernels watch the
  // communicator's abort flag), so a peer's failure leaves an error, not a hung stream, once every rank's
  // communicator is aborted (TensorParallel does so after a failed step). Idempotent.
  bool abort_waits_for_graphs() const override { return true; }  // ncclCommAbort: commDestroySync
  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    if (comm_ == nullptr) return;
    warn_cuda(cudaSetDevice(device_), "cudaSetDevice");
    const ncclResult_t r = ncclCommAbort(comm_);
    if (r != ncclSuccess) std::fprintf(stderr, "warning: ncclCommAbort: %s\n", ncclGetErrorString(r));
    comm_ = nullptr;
  }

 private:
  void check_usable() const {
    INFERX_CHECK(!aborted_, "tensor parallel: NCCL rank {} was aborted after an earlier error", rank_);
  }

  ncclComm_t comm_ = nullptr;
  int device_, rank_, size_;
  cudaStream_t stream_ = nullptr;      // the rank backend's (not owned)
  std::shared_ptr<P2pAllReduce> p2p_;  // the group's one-shot all-reduce for small sums (null: NCCL only)
  void* scratch_ = nullptr;
  // INFERX_TP_ALLREDUCE_BF16: F32 sums of at least kBf16MinElems values (prefill chunks, large decode
  // batches) and at most bf16_elems_ go through BF16 (null: never).
  static constexpr int64_t kBf16MinElems = int64_t{1} << 18;  // 1 MB of F32
  void* bf16_ = nullptr;
  int64_t bf16_elems_ = 0;
  bool aborted_ = false;
};

}  // namespace

int nccl_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices,
                                                                   const std::vector<void*>& streams) {
  const int n = static_cast<int>(devices.size());
  INFERX_CHECK(n >= 1, "nccl: no devices given");
  INFERX_CHECK(streams.size() == devices.size(), "nccl: {} streams for {} devices", streams.size(), n);
  int count = 0;
  NCCL_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int d : devices)
    INFERX_CHECK(d >= 0 && d < count, "nccl: CUDA device {} does not exist ({} visible)", d, count);
  // NVLink SHARP (NVLS) multicast stays off on the machines we are lent; overwrite any other value.
  INFERX_CHECK(::setenv("NCCL_NVLS_ENABLE", "0", 1) == 0, "nccl: cannot set NCCL_NVLS_ENABLE=0");
  // INFERX_CUSTOM_ALLREDUCE=1: small F32 sums through the one-shot peer-to-peer kernel (p2p_all_reduce.h)
  // where every pair of GPUs has peer access; up to INFERX_CUSTOM_ALLREDUCE_MAX_KB (default 1024 KB for 2
  // ranks, 512 for 3-4, 256 beyond: each rank reads every rank's tensor, so the one-shot form's bytes grow
  // with the ranks).
  std::shared_ptr<P2pAllReduce> p2p;
  const char* custom = std::getenv("INFERX_CUSTOM_ALLREDUCE");
  if (custom != nullptr && std::strcmp(custom, "0") != 0 && n > 1) {
    size_t kb = n <= 2 ? 1024 : n <= 4 ? 512 : 256;
    if (const char* m = std::getenv("INFERX_CUSTOM_ALLREDUCE_MAX_KB")) kb = std::strtoul(m, nullptr, 10);
    const bool peers = P2pAllReduce::available(devices);
    if (kb > 0 && peers) p2p = std::make_shared<P2pAllReduce>(devices, kb << 10);
    if (!peers)
      std::fprintf(stderr,
                   "note: INFERX_CUSTOM_ALLREDUCE: the GPUs have no peer access to each other: NCCL only\n");
  }
  // INFERX_TP_ALLREDUCE_BF16=MB (off: 0 or unset): large F32 sums reduced in BF16 through a staging buffer
  // of that many MB per rank (allocated once, so graphs may hold it; larger sums stay F32).
  size_t bf16_bytes = 0;
  if (const char* b = std::getenv("INFERX_TP_ALLREDUCE_BF16"); b != nullptr)
    bf16_bytes = static_cast<size_t>(std::strtoul(b, nullptr, 10)) << 20;
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  try {
    for (int r = 0; r < n; ++r) {
      out.push_back(std::make_unique<NcclCommunicator>(
          comms[static_cast<size_t>(r)], devices[static_cast<size_t>(r)], r, n,
          static_cast<cudaStream_t>(streams[static_cast<size_t>(r)]), p2p, bf16_bytes));
      comms[static_cast<size_t>(r)] = nullptr;  // owned by the communicator now
    }
  } catch (...) {
    for (ncclComm_t c : comms)
      if (c != nullptr && ncclCommDestroy(c) != ncclSuccess)
        std::fprintf(stderr, "warning: ncclCommDestroy failed while unwinding\n");
    throw;
  }
  return out;
}

}  // namespace inferx
