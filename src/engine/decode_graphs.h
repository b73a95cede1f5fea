#pragma once
// Decode-only engine steps replayed from CUDA graphs (Backend::begin_graph_capture / replay_graph).
//
// A step where every scheduled sequence feeds one token and samples one is padded to a bucket size
// (decode_buckets: 1, 2, 4, 8, 16, 24, 32, 48, 64, 80, ... up to max_batch_size), its metadata written in
// place into one fixed device buffer laid out per bucket with a fixed max_blocks_per_seq (from
// max_model_len), so every pointer a recording holds stays the same from step to step. Padding rows are
// one-token sequences at position 0 whose block table points only at a scratch KV block that the block
// pool never hands out, so their K/V writes land nowhere that matters and their attention reads only
// that block; their logits rows are computed and ignored. Real rows see exactly the metadata an unpadded
// batch gives them (tokens, positions, lengths, blocks), and every kernel computes a row from its own
// metadata only, so their logits equal the eager path's.
//
// Batch 1 may keep two recordings (DecodeGraphConfig::short_context, from the backend's
// decode_stack_context_bound): steps whose sequence holds at most short_context tokens replay one made with
// that as BatchView::max_seq_len (the CUDA backend's persistent kernel takes it), longer ones the one made
// for the full capacity (per-op kernels, faster there). The recording's hint bounds every replay of it.
//
// The first step of a bucket runs eagerly (sizing every workspace) and is then recorded; later ones
// replay the recording. A backend without graphs (CPU) runs the padded batch eagerly: tests use that to
// check the padded metadata. A buffer the backend frees (a larger prefill growing a workspace) makes it
// refuse the old recordings, which are then captured again.
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/scheduler.h"
#include "model/model.h"

namespace inferx {

// The padded batch sizes, ascending, the last one max_batch_size.
std::vector<int32_t> decode_buckets(int32_t max_batch_size);

// An overlapped decode step's input tokens (engine.cpp): real row i feeds the id the previous step sampled
// in its row prev_rows[i], still in the backend's sampling slot `slot` (Backend::gather_sampled_tokens),
// not a token of seq->tokens.
struct SampledTokenSource {
  int slot = 0;
  const std::vector<int32_t>* prev_rows = nullptr;
};

struct DecodeGraphConfig {
  int32_t max_batch_size = 256;
  int32_t max_blocks_per_seq = 1;  // ceil(max_model_len / block_size)
  int32_t scratch_block = 0;       // a KV block id the block pool never hands out
  bool capture = true;             // false: pad and run eagerly (tests; backends without graphs)
  // Batch-1 steps whose sequence holds at most this many tokens get their own recording, made with this as
  // the length hint (Backend::decode_stack_context_bound); 0, or not below the capacity: one recording.
  int32_t short_context = 0;
};

class DecodeGraphs {
 public:
  DecodeGraphs(Model& model, KvCache& kv, const DecodeGraphConfig& config);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Whether `out` is a step this runs: decode-only (one token and a sample per sequence), at most
  // max_batch_size sequences, each within max_blocks_per_seq blocks.
  bool accepts(const SchedulerOutput& out) const;
  // Runs the step padded to its bucket; returns the logits of the real rows ([num_seqs, vocab] F32 in
  // backend memory, valid until the next forward).
  // With `tokens`, the real rows' input ids come from the previous step's sampling slot.
  Tensor run(const SchedulerOutput& out, const SampledTokenSource* tokens = nullptr);
  // Startup warm-up (Engine, EngineConfig::warm_up): runs every bucket once with padding rows only and
  // records it, largest bucket first, so that no served step pays for a bucket's first eager run, the GEMM
  // algorithm timing its row count triggers (gemm_cublaslt.h: the first row count seen in a power-of-two
  // row bucket decides for the whole bucket, so largest first makes that the bucket's top, where most
  // decode steps of a full batch are) or its recording. Padding rows touch only the scratch block.
  // Returns the buckets run.
  int32_t warm_up();
  // Writes the padded metadata of `out` into the fixed buffer (tests inspect it through the view); its
  // max_seq_len is the bound of the recording the step replays (short_context or the capacity).
  BatchView build(const SchedulerOutput& out, int32_t bucket, const SampledTokenSource* tokens = nullptr);
  int32_t bucket_for(int32_t num_seqs) const;
  // 0 nothing recorded, 1 recorded, -1 stays eager; for batch 1, `short_context` picks that recording.
  int32_t bucket_state(int32_t bucket, bool short_context = false) const;
  // Whether a step of `out` in `bucket` replays the short-context recording.
  bool short_class(const SchedulerOutput& out, int32_t bucket) const;

  // The bound of batch 1's short-context recording; 0 when there is none.
  int32_t short_context() const { return short_context_; }
  int64_t replays() const { return replays_; }
  int64_t captures() const { return captures_; }

 private:
  // run()'s work for bucket B: the full padded logits [B, vocab]; `short_len` selects batch 1's
  // short-context recording.
  Tensor run_bucket(const SchedulerOutput& out, int32_t bucket, const SampledTokenSource* tokens,
                    bool short_len);
  BatchView build_for(const SchedulerOutput& out, int32_t bucket, const SampledTokenSource* tokens,
                      bool short_len);
  // A recording's slot: the bucket's index, or one past the last for batch 1's short-context recording.
  size_t slot(int32_t bucket, bool short_len) const;
  uint64_t key(size_t slot) const { return reinterpret_cast<uintptr_t>(this) + static_cast<uint64_t>(slot); }

  Model& model_;
  KvCache& kv_;
  DecodeGraphConfig config_;
  int32_t short_context_ = 0;  // config_.short_context where it is below the capacity, else 0
  std::vector<int32_t> buckets_;
  // The metadata is written into one of two host copies in turn (page-locked on GPUs: the upload is queued
  // behind the previous work, not waited for) and uploaded whole.
  std::unique_ptr<DeviceBuffer> host_[2];
  int next_host_ = 0;
  std::unique_ptr<DeviceBuffer> device_;
  // Per slot: 0 nothing recorded, 1 recorded, -1 recording failed (stay eager).
  std::vector<int8_t> state_;
  std::vector<Tensor> graph_logits_;
  int64_t replays_ = 0, captures_ = 0;
};

}  // namespace inferx
