#pragma once
// --tensor-parallel-size N: one model split over N ranks (one backend each), Megatron-LM's partitioning
// (Shoeybi et al. 2019, "Megatron-LM", section 3):
//   - column-parallel q/k/v/gate/up: rank r holds rows [r * out/N, (r + 1) * out/N) of each weight (and
//     bias), i.e. its own attention heads and its slice of the MLP; K/V heads are split across the ranks,
//     or replicated when N > num_kv_heads (each KV head then serves N / num_kv_heads ranks);
//   - row-parallel o/down: rank r holds input columns [r * in/N, (r + 1) * in/N), producing a partial sum
//     that one all-reduce per layer and block completes (two per layer);
//   - vocabulary-parallel embedding and lm_head: rank r holds vocabulary rows [r * V/N, (r + 1) * V/N);
//     a token's embedding comes from the rank that holds its row (zeros elsewhere, then an all-reduce,
//     which adds exact zeros) and the logits are all-gathered. When N does not divide the vocabulary the
//     two are replicated on every rank instead (Model::load prints a note saying so).
// Everything else (norms, q/k norms, RoPE) is replicated. Each rank keeps the KV cache of its own KV
// heads (KvCache(model, ...) builds one cache per rank).
//
// The weights are sliced before anything else sees them: each rank's Model is loaded by the ordinary
// loader from a TensorSource that presents the rank's slices under the original names and shapes scaled
// to the rank's config (row slices are zero-copy views of the file; column slices of o/down are copied).
// So anything the loader does per layer (quantization at load, fused weights) applies per rank.
//
// One scheduler drives all ranks in lock step: the Model returned by Model::load owns the N replicas and
// its forward runs every rank's forward on its own thread (rank 0 on the caller's), so the engine above
// is unchanged. No step waits on the host: the step's metadata (rank 0's, as the engine wrote it) reaches
// the other ranks by a broadcast on the streams, the vocabulary shard's embedding is a device op, and the
// collectives are ordered on each rank backend's stream (communicator.h). That model's backend() is rank
// 0's seen through a proxy whose graph capture records every rank's stream (one graph per rank, its
// collectives inside) and whose replay launches them all, so decode steps replay from CUDA graphs and
// the engine may overlap them (the sampled ids it gathers into rank 0's metadata travel with the
// broadcast).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/arch_registry.h"
#include "model/model.h"
#include "model/quantized_linear.h"
#include "parallel/communicator.h"

namespace inferx {

// How a config splits over `size` ranks.
struct TensorParallelPlan {
  int size = 1;
  int64_t heads_per_rank = 0;
  int64_t kv_heads_per_rank = 0;  // 1 when the KV heads are replicated
  bool kv_replicated = false;     // size > num_kv_heads
  int64_t ranks_per_kv_head = 1;  // size / num_kv_heads when replicated
  int64_t intermediate_per_rank = 0;
  bool vocab_parallel = true;  // false: size does not divide the vocabulary; embedding/lm_head replicated
  int64_t vocab_per_rank = 0;  // the rows of the embedding / lm_head a rank holds

  int64_t first_head(int rank) const { return rank * heads_per_rank; }
  int64_t first_kv_head(int rank) const;
  int64_t first_vocab_row(int rank) const { return vocab_parallel ? rank * vocab_per_rank : 0; }
  // The config a rank's replica runs with (its heads, KV heads, MLP slice and vocabulary rows).
  ModelConfig rank_config(const ModelConfig& full) const;
};

// Throws inferx::Error naming the dimension that `size` does not divide (heads, KV heads,
// intermediate size); the vocabulary is replicated instead of split when it does not divide.
TensorParallelPlan plan_tensor_parallel(const ModelConfig& config, int size);

// Rank `rank`'s view of `base`: the tensors of one rank under their original names, pre-quantized
// checkpoints' companions (FP8 / InferX INT4 scales and zero points, AWQ / GPTQ qweight, qzeros, scales,
// g_idx) sliced with their weights. Throws naming the tensor when a column slice would cut a quantization
// block or group (e.g. Q4_K's 256 columns, an AWQ group of 32), and for GPTQ act-order (desc_act) weights
// split by their input rows.
std::unique_ptr<TensorSource> make_rank_source(const TensorSource& base, const ModelConfig& full,
                                               WeightNaming naming, const TensorParallelPlan& plan, int rank);

// What a replica's forward calls at the points where the ranks meet (transformer.cpp).
class TensorParallelRank {
 public:
  TensorParallelRank(Backend& backend, Communicator& comm, const TensorParallelPlan& plan);
  ~TensorParallelRank();
  // x = the sum over ranks of x (row-parallel outputs), ordered on the rank backend's stream.
  void all_reduce_sum(Tensor& x);
  // x [T, hidden] = the embedding rows of batch.token_ids (vocabulary-parallel: each rank's own rows,
  // zeros for the others' tokens, all-reduced).
  void embedding(const Tensor& table, const BatchView& batch, Tensor& x);

 private:
  Backend& backend_;
  Communicator& comm_;
  TensorParallelPlan plan_;
  int rank_;
};

// The N replicas of a tensor-parallel model and the threads that run them (owned by the top Model).
class TensorParallel {
 public:
  // Loads `spec` split over options.tensor_parallel_size ranks (or one rank with
  // options.tensor_parallel_path); rank 0 runs on `backend`.
  static std::unique_ptr<Model> load(const std::string& spec, Backend& backend, const LoadOptions& options);
  ~TensorParallel();

  int size() const { return plan_.size; }
  const TensorParallelPlan& plan() const { return plan_; }
  Backend& rank_backend(int rank) const;
  Model& rank_model(int rank) const;

  // One step of every rank; the logits [num_logits, vocab] F32 in rank 0's memory.
  Tensor forward(const BatchView& batch, KvCache& cache);
  int64_t weight_bytes_per_token() const;
  void set_sliding_window(int64_t window);

 private:
  TensorParallel();
  struct State;
  std::unique_ptr<State> s_;
  TensorParallelPlan plan_;
};

// model_loader.cpp: the two halves of Model::load (open the file and read the config; place the
// weights), which TensorParallel::load runs once and once per rank.
struct OpenedModel {
  std::unique_ptr<Model> model;  // config and source set, no weights yet
  WeightNaming naming = WeightNaming::HuggingFace;
  HfQuantConfig hf_quant;
};
OpenedModel open_model(const std::string& spec, Backend& backend, const LoadOptions& options);
void load_weights(Model& model, WeightNaming naming, const LoadOptions& options, HfQuantConfig hf_quant);

}  // namespace inferx
