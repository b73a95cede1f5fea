#pragma once
// NCCL communicators for the GPUs of one host, one process, one thread per GPU (ncclCommInitAll). Built
// only with the cuda preset (library inferx_parallel_nccl); this header includes no CUDA or NCCL header.
//
// Each rank's collectives are enqueued on the stream of that rank's backend (cuda_stream_of) and return
// without waiting (communicator.h, "Ordering"): no host round trip per collective, and a CUDA graph
// captured on that stream records them. NVLink SHARP multicast stays off: NCCL_NVLS_ENABLE=0 is set in the
// environment before the first init. INFERX_CUSTOM_ALLREDUCE=1: small F32 all-reduces go through the
// one-shot peer-to-peer kernel instead (p2p_all_reduce.h); INFERX_TP_ALLREDUCE_BF16=MB: large F32 sums
// (>= 1 MB of F32, up to MB of BF16, i.e. 2 x MB of F32) are reduced in BF16 (half the bytes over the links;
// the partial sums rounded as a BF16 model's activations are). Both off by default until measured on a
// multi-GPU machine.
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace inferx {

// One communicator per CUDA device in `devices` (rank r is devices[r]), rank r's collectives on
// streams[r] (a cudaStream_t of that device; null: the device's legacy default stream); throws
// inferx::Error naming the NCCL or CUDA call that failed. One device is a group of one (its collectives
// are copies), which lets one GPU run the tensor-parallel path in tests.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices,
                                                                   const std::vector<void*>& streams);

// The NCCL library's version code (e.g. 22809 for 2.28.9); 0 when it cannot be queried.
int nccl_version();

}  // namespace inferx
