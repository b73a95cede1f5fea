#include "model/tensor_parallel_backend.h"

#include <exception>

#include "core/error.h"

namespace inferx {

TensorParallelBackend::TensorParallelBackend(std::vector<Backend*> ranks)
    : ForwardingBackend(*ranks.at(0)), ranks_(std::move(ranks)) {}

std::string TensorParallelBackend::name() const {
  return fmt::format("{} (rank 0 of {} tensor-parallel ranks)", inner().name(), ranks_.size());
}

void TensorParallelBackend::synchronize() {
  for (Backend* b : ranks_) b->synchronize();
}

bool TensorParallelBackend::begin_graph_capture() {
  size_t begun = 0;
  auto discard_begun = [&] {
    for (size_t r = 0; r < begun; ++r) {
      try {
        ranks_[r]->end_graph_capture(0, false);
      } catch (const std::exception&) {  // already failing: the first error is the one reported
      }
    }
  };
  try {
    while (begun < ranks_.size() && ranks_[begun]->begin_graph_capture()) ++begun;
  } catch (...) {
    discard_begun();
    throw;
  }
  if (begun == ranks_.size()) {
    ever_captured_.store(true, std::memory_order_release);  // before the step records any collective
    return true;
  }
  discard_begun();
  return false;
}

void TensorParallelBackend::end_graph_capture(uint64_t key, bool keep) {
  std::exception_ptr first;
  for (Backend* b : ranks_) {
    try {
      b->end_graph_capture(key, keep);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first || !has_graph(key)) drop_graph(key);
  if (first) std::rethrow_exception(first);
}

bool TensorParallelBackend::has_graph(uint64_t key) const {
  for (const Backend* b : ranks_)
    if (!b->has_graph(key)) return false;
  return true;
}

bool TensorParallelBackend::replay_graph(uint64_t key) {
  if (!has_graph(key)) {
    drop_graph(key);
    return false;
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    // has_graph said every rank replays: a refusal or an error now leaves the ranks before it waiting in
    // their first collective, so the whole group fails (not just this step).
    std::string why;
    try {
      if (!ranks_[r]->replay_graph(key))
        why = fmt::format(
            "tensor parallel: rank {} refused a graph it reported valid (the ranks are out of step)", r);
    } catch (const std::exception& e) {
      why = fmt::format("tensor parallel: rank {}'s graph replay failed: {}", r, e.what());
    }
    if (!why.empty()) {
      if (r > 0 && on_partial_replay_) on_partial_replay_(why);
      fail("{}", why);
    }
  }
  return true;
}

void TensorParallelBackend::drop_graph(uint64_t key) {
  for (Backend* b : ranks_) b->drop_graph(key);
}

void TensorParallelBackend::clear_graphs() {
  for (Backend* b : ranks_) b->clear_graphs();
}

}  // namespace inferx
