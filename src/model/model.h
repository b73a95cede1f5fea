#pragma once
// A loaded decoder-only transformer: config + weights on one backend + the forward pass.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "formats/model_config.h"
#include "formats/tensor_source.h"
#include "parallel/communicator.h"
#include "quant/plan.h"

namespace inferx {

struct LoadOptions {
  // Dummy models only: the weight type to generate (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K).
  DType dummy_dtype = DType::BF16;
  uint64_t dummy_seed = 0;
  // Weight quantization at load (quant/plan.h): `plan` when given (from calibration, model/calibration.h),
  // else the fixed rule in `quantize` (fp8, int4, fp8-int4; auto needs a plan). Layers a checkpoint
  // stores pre-quantized keep their stored format.
  QuantOptions quantize;
  std::shared_ptr<const QuantPlan> plan;
  // --tensor-parallel-size N (model/tensor_parallel.h): the weights split over N ranks. Rank 0 runs on
  // the backend given to Model::load, ranks 1..N-1 on make_rank_backend(rank), the collectives on
  // make_communicators(backends of ranks 0..N-1); both default to the CPU (CPU backends, the in-process
  // CPU group). tensor_parallel_path: a size of 1 still goes through the tensor-parallel model (tests:
  // one GPU runs the collectives, graphs and metadata broadcast of the multi-GPU path).
  int tensor_parallel_size = 1;
  bool tensor_parallel_path = false;
  std::function<std::unique_ptr<Backend>(int rank)> make_rank_backend;
  std::function<std::vector<std::unique_ptr<Communicator>>(const std::vector<Backend*>& backends)>
      make_communicators;
};

// The model's weights, resolved to backend tensors. Per-layer fields are empty when the architecture
// does not use them (biases, q/k norms).
struct LayerWeights {
  Tensor attn_norm, ffn_norm;
  Linear q, k, v, o;
  Tensor q_norm, k_norm;
  Linear gate, up, down;
  // Fused projections (model/fused_projections.h), empty unless the backend asks for them: q/k/v
  // stacked, gate over up; q/k/v/gate/up are then row views of these.
  Linear qkv, gate_up;
};
struct ModelWeights {
  Tensor token_embedding;  // [vocab, hidden]
  Tensor final_norm;
  Linear lm_head;  // shares token_embedding's memory when tied
  std::vector<LayerWeights> layers;
};

class KvCache;
class TensorParallel;
class TensorParallelRank;

class Model {
 public:
  // `spec` is a .gguf file, a Hugging Face folder (config.json + *.safetensors) or dummy:NAME.
  // Throws inferx::Error naming the file and the problem.
  static std::unique_ptr<Model> load(const std::string& spec, Backend& backend,
                                     const LoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  // The serving engine's --kv-cache-strategy sliding-window-N: attention then reads only the last N
  // positions, so the engine may free KV blocks that fall out of the window (0: the model's own).
  void set_sliding_window(int64_t window);
  // Whether a step's last layer finishes (o projection, MLP) on the rows that need logits only, when
  // fewer rows need them than the step has (a prefill chunk: its last token), in steps with decode rows
  // only where the backend says so (Backend::narrows_mixed_steps). Default on; INFERX_LAST_LAYER_ALL_ROWS=1
  // turns it off (the A/B of the saving). Tensor-parallel replicas run every row.
  void set_last_layer_logit_rows_only(bool on) { last_layer_logit_rows_only_ = on; }
  const std::string& description() const { return description_; }
  Backend& backend() const { return backend_; }
  // The source the weights came from (GGUF metadata holds the tokenizer); nullptr for dummy models.
  const TensorSource* source() const { return source_.get(); }

  // Bytes of weights one decode step reads (every linear layer, the norms and the vocabulary
  // projection; one embedding row is negligible): the numerator of the decode roofline.
  int64_t weight_bytes_per_token() const;

  // The resolved weights (for `inferx quantize`, calibration and tests).
  const ModelWeights& weights() const { return weights_; }
  // The quantization plan the weights were loaded with (kind "none" and no layers when none applied;
  // pre-quantized checkpoints report the formats they hold).
  const QuantPlan& quant_plan() const { return quant_plan_; }

  // The ranks of a --tensor-parallel-size model (nullptr when the model is not split).
  TensorParallel* tensor_parallel() const { return tp_.get(); }

  // Runs one flattened step. Writes K/V of the batch's tokens into `cache` and returns the logits of
  // batch.logits_rows as F32 [num_logits, vocab] in backend memory (valid until the next forward).
  Tensor forward(const BatchView& batch, KvCache& cache);

  Model(Backend& backend, ModelConfig config, std::unique_ptr<TensorSource> source, std::string description);

 private:
  struct Workspace;
  void ensure_workspace(int64_t num_tokens, int64_t num_logits);
  // Backend::decode_stack over this model's layers (false: not taken, nothing done).
  bool decode_stack(const BatchView& batch, KvCache& cache, const RopeParams& rope, const AttentionParams& ap,
                    Tensor& x, Tensor& logits);

  Backend& backend_;
  ModelConfig config_;
  std::unique_ptr<TensorSource> source_;
  std::string description_;
  ModelWeights weights_;
  std::vector<std::unique_ptr<DeviceBuffer>> owned_;  // uploaded / converted weights
  std::unique_ptr<Workspace> workspace_;
  QuantPlan quant_plan_;
  std::unique_ptr<TensorParallel> tp_;  // the top model of a split model: its replicas run forward
  TensorParallelRank* rank_ = nullptr;  // a replica: where forward meets the other ranks
  bool last_layer_logit_rows_only_;     // INFERX_LAST_LAYER_ALL_ROWS=1: false
  friend class WeightLoader;
  friend class TensorParallel;
};

// The paged KV cache memory of every layer: num_blocks blocks of block_size tokens.
class KvCache {
 public:
  KvCache(Backend& backend, const ModelConfig& config, int64_t num_blocks, int64_t block_size);
  // The cache `model` runs with: one KvCache per rank (its KV heads, on its backend) for a
  // tensor-parallel model, else the constructor above.
  KvCache(const Model& model, int64_t num_blocks, int64_t block_size);
  KvCacheLayer& layer(int64_t i) { return layers_[static_cast<size_t>(i)]; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  KvCache& shard(int rank) { return *shards_[static_cast<size_t>(rank)]; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // Bytes one block takes across all layers (K and V), for sizing the pool from a memory budget; pass
  // the backend's kv_cache_dtype().
  static int64_t bytes_per_block(const ModelConfig& config, int64_t block_size, DType dtype = DType::F32);
  // The same for the caches KvCache(model, ...) allocates, per unit of the memory budget that sizes the
  // pool: the model's own backend type; with tensor parallelism the ranks' caches (their own KV heads,
  // replicated heads included), summed on the CPU (one host memory) and the largest rank on devices (each
  // rank's GPU has its own budget).
  static int64_t bytes_per_block(const Model& model, int64_t block_size);

 private:
  int64_t num_blocks_, block_size_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::vector<KvCacheLayer> layers_;
  std::vector<std::unique_ptr<KvCache>> shards_;  // tensor parallel: rank r's cache
};

// Feeds one sequence through a model, block table and all, for `inferx generate`, golden tests and
// benchmarks (the serving engine schedules many sequences instead).
class SequenceRunner {
 public:
  SequenceRunner(Model& model, int64_t max_tokens, int64_t block_size = 16);
  ~SequenceRunner();
  SequenceRunner(const SequenceRunner&) = delete;
  SequenceRunner& operator=(const SequenceRunner&) = delete;
  // Appends tokens to the sequence and returns the logits after the last one (host copy, [vocab]).
  const std::vector<float>& step(const std::vector<int32_t>& tokens);
  // Same, but returns logits for every appended token ([tokens.size() * vocab]).
  std::vector<float> step_all_logits(const std::vector<int32_t>& tokens);
  int64_t length() const { return length_; }

 private:
  std::vector<float> run(const std::vector<int32_t>& tokens, bool all_logits);
  Tensor forward(const BatchView& batch, bool decode);
  uint64_t graph_key() const { return reinterpret_cast<uintptr_t>(this); }
  Model& model_;
  KvCache cache_;
  int64_t max_tokens_;
  int64_t length_ = 0;
  std::vector<int32_t> block_table_;
  std::vector<float> last_logits_;
  std::vector<int32_t> meta_host_;
  std::unique_ptr<DeviceBuffer> meta_device_;  // grown, never shrunk: no allocation per decode step
  // One-token steps replay a recorded graph where the backend has them (CUDA); see sequence_runner.cpp.
  bool use_graphs_ = true;
  bool decode_graph_ = false;
  Tensor graph_logits_;
};

}  // namespace inferx
