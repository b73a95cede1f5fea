#pragma once
// NCCL communicators for the GPUs of one host, one process, one thread per GPU (ncclCommInitAll). Built
// only with the cuda preset (library inferx_parallel_nccl); this header includes no CUDA or NCCL header.
//
// Each rank's collectives run on a stream of their own and return when done (cudaStreamSynchronize), so
// the caller must have finished writing the input on its own streams first (Backend::synchronize()).
// NVLink SHARP multicast stays off: NCCL_NVLS_ENABLE=0 is set in the environment before the first init.
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace inferx {

// One communicator per CUDA device in `devices` (rank r is devices[r]); throws inferx::Error naming the
// NCCL or CUDA call that failed.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices);

// The NCCL library's version code (e.g. 22809 for 2.28.9); 0 when it cannot be queried.
int nccl_version();

}  // namespace inferx
