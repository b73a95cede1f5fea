#pragma once
// Collectives between the ranks of one tensor-parallel group (model/tensor_parallel.h). Each rank owns one
// Communicator and calls it from its own thread; every rank must call the same collectives in the same
// order with tensors of the same shape (the usual MPI/NCCL contract). Tensors are contiguous and live in
// the memory of the rank's device.
//
// Two implementations: an in-process CPU group (cpu_communicator.cpp: N ranks = N threads of one process,
// shared memory, a fixed summation order so every run and every rank gets bit-identical sums) and NCCL
// (nccl/nccl_communicator.h, only with the cuda preset).
//
// Ordering: a collective is ordered like an op of the rank's backend. The CPU group runs it at once; NCCL
// enqueues it on the rank backend's stream and returns without waiting, so it runs after the work issued
// there before it, work issued after it runs after it, and a CUDA graph captured on that stream records it
// (the backend must hold no work back: Backend::flush() before the call).
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace inferx {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the collectives' tensors must live.
  virtual Device device() const = 0;

  // x (F32) = the element-wise sum of every rank's x, in place.
  virtual void all_reduce_sum(Tensor& x) = 0;
  // out = every rank's `in` concatenated in rank order (any dtype; `in` has the same number of bytes on
  // every rank, out holds size() times that).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // x (any dtype, the same bytes on every rank) = rank `root`'s x.
  virtual void broadcast(Tensor& x, int root) = 0;
  // Returns when every rank has called it and (NCCL) the work issued before it on the stream is done.
  virtual void barrier() = 0;
  // A rank that fails between collectives will never arrive at the next one: abort() wakes the ranks
  // blocked in (or later entering) a collective of this group with inferx::Error instead of a hang (NCCL:
  // this rank's communicator is aborted, which ends the collectives its stream still waits in; the caller
  // aborts every rank's, as TensorParallel does after a failed step). The group stays unusable afterwards.
  virtual void abort() = 0;
  // Whether abort() waits for the CUDA graphs that recorded this group's collectives to be destroyed
  // (NCCL: a recorded collective holds a reference on its communicator until its graph goes), so that the
  // graphs must be dropped first, by the thread that recorded them. The CPU group records nothing.
  virtual bool abort_waits_for_graphs() const { return false; }
};

// The N ranks of one in-process CPU group; element r is rank r's. Collectives block until all N ranks
// have arrived (use one thread per rank).
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int size);

}  // namespace inferx
