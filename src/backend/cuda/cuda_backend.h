#pragma once
// The CUDA backend (NVIDIA Hopper, sm_90a): device memory, one stream, kernels in kernels_*.cu and
// matrix products through cuBLASLt. This header includes no CUDA header, so code above backend/ (the
// CLI, tests) can create the backend without the CUDA toolkit's headers on its include path.
// All work is enqueued on the backend's stream in call order; copy_to_host and synchronize wait for it.
//
// Beyond the Backend interface (cuda_backend.cpp, cuda_backend_extras.cpp):
//   - the KV cache is BF16 by default (kv_cache_dtype); attention reads it with the split-KV decode
//     kernel (one-token queries) or the tensor-core prefill kernel, head_dim 64/128; other shapes and
//     F32 caches use the v0 kernel;
//   - BF16 activations: when the last matmul had BF16 weights, rmsnorm/add_rmsnorm/silu_mul also write
//     their output as BF16 into a backend buffer, and the next matmul whose input is that same tensor
//     reads the BF16 copy (no conversion pass). Any other op, or a write over the tensor, drops the copy;
//   - CUDA graphs (begin/end_graph_capture, replay_graph), GPU sampling (argmax, sample), fill_random.
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/sampling_params.h"

struct CUstream_st;     // = cudaStream_t's pointee (cuda_runtime_api.h)
struct CUgraphExec_st;  // = cudaGraphExec_t's pointee
struct CUevent_st;      // = cudaEvent_t's pointee

namespace inferx {

namespace cuda {
class CublasLtGemm;
class QuantizedGemm;
struct PagedKv;
struct BatchArgs;
struct DecodeRope;
struct Fp8Epilogue;
struct DecodeStackParams;
}  // namespace cuda

// Which attention kernel runs (tests and benchmarks force one; Auto picks per batch).
enum class CudaAttentionKernel { Auto, Reference, Decode, Prefill };

// Where the batch-1 persistent decode kernel runs (CudaBackendOptions::decode_stack).
enum class DecodeStackMode : uint8_t { Off, Bf16, All };

struct CudaBackendOptions {
  DType kv_cache_dtype = DType::BF16;  // F32 for bit-for-bit comparisons with the CPU backend; F8_E4M3
  // FP8 caches store k / kv_k_scale and v / kv_v_scale as E4M3 (per tensor; 1.0 as vLLM's default).
  float kv_k_scale = 1.0f;
  float kv_v_scale = 1.0f;
  bool bf16_activations = true;  // the fused BF16 outputs of the norms / SiLU described above
  // Priority of the backend's stream (cudaStreamCreateWithPriority: lower is higher; 0 the default). Work
  // that shares the GPU with another backend's stream (bench_cuda_kernels INFERX_BENCH_ONLY=overlap) gets
  // the SMs first as they free up when its stream is the higher.
  int stream_priority = 0;
  // A stream of the caller's to run every op on instead of the backend's own (not destroyed with the
  // backend): e.g. a stream of a green context holding part of the SMs (bench_cuda_kernels
  // INFERX_BENCH_ONLY=overlap). Null: the backend creates its stream (stream_priority).
  void* external_stream = nullptr;
  // Folder of the GEMM tuning cache (LtMatmul::use_tuning_cache: the cuBLASLt algorithms earlier runs timed,
  // restored at start-up; formats/gemm_tuning_file.h). Empty: off (tests, benchmarks). The CLI sets it to
  // $XDG_CACHE_HOME/inferx or ~/.cache/inferx unless INFERX_GEMM_CACHE says otherwise (a folder, or off).
  std::string gemm_tuning_cache;
  bool gemv = true;  // false: every matmul through cuBLASLt and no fused projections (A/B measurements)
  // BF16 products with rows longer than 8192 (the 8B down projection) on the GEMV instead of cuBLASLt.
  // Off: measured on the H200 (2026-12-03 04:44, batch-1 decode at 1k context) 192.9 tok/s with cuBLASLt
  // against 188.6 on the GEMV (earlier single-kernel runs disagreed: 31.3 vs 34.3 us, then 31.4 vs 30.4).
  bool gemv_long_rows = false;
  // Split count of every decode-attention launch (A/B measurements; 0: decode_attention_plan's choice) and
  // the least tiles per split that forced count takes (DecodeSplitPlan::min_tiles).
  int decode_splits = 0;
  int decode_min_tiles = 1;
  // Steps of at least this many rows leave an FP8 q/k/v projection's split epilogue to RoPE + KV write
  // (quantized_gemm.h, deferred products); smaller ones launch it. 64 since 2026-12-06 16:10, with the vector
  // RoPE kernel (which reads the deferred sums: kernels_rope_kv.cu) and gemm_memset_rewrite 2: the 512-row
  // FP8 decode step's layer without its attention 225.0 -> 213.1 us (H100 CUPTI timeline: the split
  // epilogue's 6.6 us gone, RoPE 11.2 -> 9.6, the gate/up GEMM's memset 6.6 -> 1.2); 1000 x 1000/1000 FP8 +
  // FP8 KV offline, the three together against none, same call: 14,837 -> 15,051 and 14,867 -> 15,108 output
  // tok/s (+1.4%, +1.6%; H100, two calls). (At ~100 rows the scalar RoPE kernel reading the sums took 18 us
  // per layer, H200 ncu 12-04, which is why the threshold was 1024 before the vector kernel.)
  // INFERX_DEFER_SPLIT_ROWS=N.
  int64_t defer_split_rows = 64;
  // sample_tokens_async copies the sampled ids to the host on a second stream that waits for the sampling
  // kernel, so the main stream goes on to the next step's upload and replay without the copy engine's
  // hand-overs in between. A batch-1 decode step left 33 us between replays (the argmax 10.4, then 5.0 to
  // the copy and 9.0 from it to the next upload: H100 CUPTI timeline, 2026-12-06 19:30); with this switch
  // 19.5 us, with upload_side_stream too 17.5, with select_cluster_rows too 13.7 (H100, 2026-12-06 23:40, one
  // call: bench/gpu/pending.sh step 18). On since then; INFERX_SAMPLE_COPY_STREAM=0 for A/B. The in-order
  // sampler (run_sampler) keeps its copy on the main stream.
  bool sample_copy_stream = true;
  // Selection (greedy or sampled) over at most this many rows runs a cluster of eight CTAs per row
  // (kernels_sampling.cu), more rows one CTA each. A batch-1 step's argmax took 10.4 us on one SM (H100
  // CUPTI timeline, 2026-12-06 19:30); 27.2 -> 21.1 us with the copy back on the cluster (H100, 2026-12-06
  // 23:40, one row of 128k). INFERX_SELECT_CLUSTER_ROWS=N (0: never).
  int64_t select_cluster_rows = 16;
  // upload_async_after_mark on a side stream that waits for the mark (the decode graphs' metadata upload
  // after the previous replay), so it runs beside that step's sampling instead of behind it: in the 33 us
  // between batch-1 steps it started 9.0 us after the ids' copy to the host ended (H100 CUPTI timeline,
  // 2026-12-06 19:30); 19.5 -> 17.5 us (see sample_copy_stream). On since 2026-12-07;
  // INFERX_UPLOAD_SIDE_STREAM=0 for A/B.
  bool upload_side_stream = true;
  // cuBLASLt's workspace memsets in recorded steps (graph_rewrite.h), with every recorded product that needs
  // a small workspace on one of its own (LtMatmul::set_dedicated_workspaces): 0 left as cuBLASLt records
  // them, 1 run earlier beside the kernel before their GEMM (hoist_workspace_memsets), 2 (the default since
  // 2026-12-06 16:10) replaced by a zeroing kernel in the chain (replace_workspace_memsets). The 512-row FP8
  // gate/up GEMM lost ~6.6 us per layer to its memset (H100 timeline, 2026-12-06 13:45); hoisted 4.9 (the
  // join), replaced 1.2. With the two switches above, 1000 x 1000/1000 +1.6% replaced against +1.25%
  // hoisted (H100, same call). INFERX_HOIST_GEMM_MEMSETS=0|1|2.
  int gemm_memset_rewrite = 2;
  // Backend::narrows_mixed_steps: the last layer on the logits rows only also in steps with decode rows.
  // On since 2026-12-05 14:40: 1000 x 1000/1000 FP8 offline 17,306 narrowed vs 17,198 output tok/s not
  // (H200, same call, with the startup warm-up; mixed steps 124.1 vs 125.3 ms, decode steps level). Before
  // the warm-up it lost (H100: 13,264 vs 13,811): the narrowed rows (~264) were the first of the 257-512
  // GEMM row bucket, its algorithm was timed there and the 462-512-row decode steps ran 5.4% slower with
  // it; the warm-up tunes every bucket at its top first. So with --no-warmup the loss may come back.
  // INFERX_LAST_LAYER_NARROW_MIXED=0 turns it off.
  bool narrow_mixed_steps = true;
  // A batch-1 decode step as one persistent kernel (Backend::decode_stack, kernels_decode_stack.h) where
  // the weights (BF16, FP8, INT4), shapes and cache (BF16, FP8) allow: for every weight format (All), or
  // only where every matrix is BF16 (Bf16). Off by default since 12-06 10:10: on the H200 (the card the
  // targets name; same machine, one call each) it lost to the per-op kernels at every setting measured -
  // 8B bf16 at 1k context 4.913 ms against 4.553 with one stage in flight (the H100 setting), 4.593 with
  // two, 4.675 with three, 4.577 with two and the MLP split; +0.3% at 100 tokens with two; FP8 3.23-3.28
  // against 2.997 ms. On H100s it was -1.1..+1.8% against per-op at 1k (+0.4% on average over ten calls),
  // +3.0% at 100 tokens, -4.8% at 4k. Its test cases all pass; INFERX_DECODE_STACK=bf16|1 turns it on.
  DecodeStackMode decode_stack = DecodeStackMode::Off;
  // ... and only for sequences that can hold at most this many tokens: the step's BatchView::max_seq_len (an
  // upper bound for every replay of a recorded step; the engine's decode graphs record batch 1 once for
  // contexts up to this bound and once for longer ones), else its block-table capacity (max_blocks_per_seq x
  // block size). Its attention streams each split's keys through the ring one 256-byte bulk copy per key
  // and value (~29 ns each, the phase's cost with or without its arithmetic), which grows faster with the
  // context than the per-op attention: 8B bf16 on an H100 (2026-12-06, same call),
  // stack against per-op +3.0% at 100 tokens, +1.1% at 1k, -4.8% at 4k (+0.6% at 1.9k on 12-06 earlier).
  int decode_stack_max_context = 2048;
  // Its A/B and diagnosis switches: ring stage size in KB (8..64); timing ablation (1 no products, 2 no grid
  // barriers, 4 no attention arithmetic; wrong results, never for serving); how many eager steps print a
  // per-phase profile on stderr.
  int decode_stack_stage_kb = 32;
  // How many ring stages its producer keeps in flight (requested, not landed); 0: up to the ring's depth.
  // 1: a grid barrier's atomics and polls wait behind the SM's bytes in flight (the barrier probe under a
  // stream, H100 2026-12-06: 1.0 us with none, 2.9 us at 32 KB per SM, 29.7 us at 192 KB, while the stream
  // is already at 3.2 TB/s with 32 KB), and one 32 KB stage ahead beat the full depth on every node
  // (8B bf16 in one call, H100 2026-12-06: 5.710 / 5.723 against 5.866 ms; docs/benchmarks.md). On an H200
  // two are needed (12-06 10:05, one machine: 4.593 ms with two, 4.913 with one, 4.675 with three): set
  // INFERX_DECODE_STACK_INFLIGHT=2 there when the kernel is turned on.
  int decode_stack_inflight = 1;
  // How long (ns) its producer sleeps between polls of a stage it waits for; 0: it spins. Measured (H200,
  // 2026-12-03 20:52): no difference (8B bf16 4.583 ms at 256, 4.580 spinning); kept as the A/B switch.
  int decode_stack_backoff_ns = 256;
  // Run its generic instance (every weight format and head size in one kernel) instead of the one for the
  // model's format (A/B: 259 against 171-179 KB of code, kernels_decode_stack.cu).
  bool decode_stack_generic = false;
  unsigned decode_stack_skip = 0;
  // Only eager steps are profiled, and the engine's startup warm-up runs the batch-1 step eagerly (at a
  // context of one token) before recording it: profile real contexts with INFERX_WARMUP=0. (Profiles from
  // 12-05 14:30 to 12-06 07:30 in docs/benchmarks.md were of that warm-up step: their attention figures,
  // ~5 us per layer, were ~10.5 us at 1k context and ~29 us at 4k.)
  int decode_stack_profiles = 0;
  // The MLP as one phase of the persistent kernel where every down matrix is BF16 (DecodeStackParams::
  // mlp_split: a transposed copy of each down matrix, hidden x intermediate x 2 bytes per layer - 3.7 GB for
  // the 8B shape - made at the first batch-1 step if a margin stays free). Its sums are exact (float
  // atomics of values cut onto fixed grids, kernels_decode_stack.cu), so a step's bits do not depend on the
  // atomics' order (CudaDecodeStackMlpSplit.IsBitReproducible; graph replay = eager). Measured (8B bf16, 1k
  // context, H100, 2026-12-06 10:25): 5.749 / 5.751 ms against the stack's 5.806 / 5.797 and per-op's
  // 5.821 / 5.816 (+1.0% / +1.2%); the first version's plain float atomics (not reproducible) measured
  // +1.6-2.2% over the stack in seven earlier calls. Opt-in because of the copy's memory (taken from what the
  // KV cache could hold), for about 1%.
  bool decode_stack_mlp_split = false;
  // Its attention's cached keys and values copied a block of one KV head at a time through tensor maps
  // (DecodeStackParams::kv_maps) instead of one 256-byte bulk copy per key and per value. Measured (8B bf16,
  // H100, 2026-12-06 10:00, one call): at 1k context level (6.011 / 6.012 against 6.011 / 6.030 ms; the
  // profile's first stage lands in 0.4 us instead of 1.2, the key walk 5.4 against 5.0 us per layer), at 4k
  // 2.3% faster (6.401 against 6.553 ms; keys 17.6 us per layer, ~21 per key on other nodes earlier on
  // 12-06), still behind per-op there
  // (6.119). So the copies' count was not what the phase waits for. INFERX_DECODE_STACK_KV_TILES=0|1.
  bool decode_stack_kv_tiles = true;
  // Timing ablation only (INFERX_TIMING_SKIP=norm,rope,attention): the named kernels are not launched
  // (everything around them, buffers and copies, stays as it was), so the change in a step's time is what
  // they cost inside a replayed graph, overlap included, which Nsight Compute (it serialises kernels)
  // cannot show. The results are wrong; never for serving.
  unsigned timing_skip = 0;
};
inline constexpr unsigned kTimingSkipNorm = 1, kTimingSkipRope = 2, kTimingSkipAttention = 4;

// Options from the environment: INFERX_CUDA_KV_DTYPE=f32|bf16|fp8, INFERX_CUDA_BF16_ACT=0|1,
// INFERX_CUDA_GEMV=0|1, INFERX_GEMV_LONG_K=gemv|cublas, INFERX_DECODE_SPLITS=N,
// INFERX_DECODE_STACK=0|1|bf16 (off | on for every weight format | on for BF16 weights only),
// INFERX_DECODE_STACK_STAGE_KB=8..64, INFERX_DECODE_STACK_INFLIGHT=0..12,
// INFERX_DECODE_STACK_BACKOFF_NS=0..10000, INFERX_DECODE_STACK_GENERIC=0|1, INFERX_DECODE_STACK_SKIP=0..7,
// INFERX_DECODE_STACK_MLP_SPLIT=0|1, INFERX_DECODE_STACK_MAX_CONTEXT=N,
// INFERX_DECODE_STACK_PROFILE=N, INFERX_DEFER_SPLIT_ROWS=N, INFERX_TIMING_SKIP=norm,rope,attention,
// INFERX_GEMM_CACHE=DIR|off (the GEMM tuning cache's folder; `gemm_cache_default` when unset).
CudaBackendOptions cuda_options_from_environment(const std::string& gemm_cache_default = "");

// CUDA devices this process can use; 0 without a driver or a GPU. Never throws.
int cuda_device_count();

// A backend on CUDA device `device`; throws inferx::Error when the device cannot be used. The first form
// takes its options from the environment.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& options);

// The cudaStream_t a CUDA backend runs its ops on (for collectives enqueued behind them: NCCL);
// throws inferx::Error when `backend` is not a CudaBackend.
void* cuda_stream_of(Backend& backend);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device, const CudaBackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }

  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  std::unique_ptr<DeviceBuffer> allocate_upload(size_t bytes) override;
  void upload_async(void* dst, const void* host_src, size_t bytes) override;
  void mark_upload_point() override;
  void upload_async_after_mark(void* dst, const void* host_src, size_t bytes) override;
  void synchronize() override;
  void flush() override;

  void embedding(const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) override;
  void embedding_shard(const Tensor& table, const int32_t* ids, int64_t n, int64_t first_id,
                       Tensor& out) override;
  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rmsnorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void head_rmsnorm(Tensor& x, int64_t head_dim, const Tensor& weight, float eps) override;
  void matmul(const Tensor& x, const Linear& w, Tensor& out) override;
  void rope_and_write_kv(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch,
                         const RopeParams& rope, KvCacheLayer& cache) override;
  void attention(const Tensor& q, const KvCacheLayer& cache, const BatchView& batch,
                 const AttentionParams& params, Tensor& out) override;
  void rope_attention(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch, const RopeParams& rope,
                      KvCacheLayer& cache, const AttentionParams& params, Tensor& out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void gather_rows(const Tensor& x, const int32_t* rows, int64_t n, Tensor& out) override;
  void interleave_row_blocks(const Tensor& x, int64_t blocks, Tensor& out) override;
  // Decode GEMV and fused projections (cuda_backend_gemv.cpp, kernels_gemv.h).
  bool prefers_fused_projections() const override { return options_.gemv; }
  // cuBLASLt's row tiles at prefill sizes are 64-256 rows; the smallest is the safe bound (an estimate).
  int64_t product_row_tile() const override { return 64; }
  bool narrows_mixed_steps() const override { return options_.narrow_mixed_steps; }
  void matmul_split(const Tensor& x, const Linear& w, std::span<Tensor* const> outs) override;
  void matmul_silu_mul(const Tensor& x, const Linear& w, Tensor& gate, Tensor& up, Tensor& out) override;
  void pre_norm(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h) override;
  void norm_matmul_split(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h,
                         const Linear& w, std::span<Tensor* const> outs) override;
  void norm_matmul_silu_mul(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h,
                            const Linear& w, Tensor& gate, Tensor& up, Tensor& out) override;
  void matmul_before_norm(const Tensor& x, const Linear& w, Tensor& out, Tensor& residual,
                          const Tensor& next_norm, float eps) override;
  void norm_mlp(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h,
                const Linear& gate_up, Tensor& gate, Tensor& up, Tensor& act, const Linear& down, Tensor& out,
                const Tensor* next_norm) override;
  void copy_on_device(void* dst, const void* src, size_t bytes) override;
  // The batch-1 persistent decode kernel (cuda_backend_decode_stack.cpp).
  bool decode_stack(const DecodeStack& stack, const BatchView& batch, const RopeParams& rope,
                    const AttentionParams& attention, Tensor& x, Tensor& logits) override;
  int32_t decode_stack_context_bound() const override {
    return options_.decode_stack == DecodeStackMode::Off || options_.timing_skip != 0
               ? 0
               : options_.decode_stack_max_context;
  }
  // Tests and benchmarks: turn the persistent decode kernel on for every format, or off.
  void set_decode_stack(bool on, int inflight = 1, bool generic = false) {
    options_.decode_stack = on ? DecodeStackMode::All : DecodeStackMode::Off;
    options_.decode_stack_inflight = inflight;
    options_.decode_stack_generic = generic;
  }
  void set_decode_stack_mlp_split(bool on) { options_.decode_stack_mlp_split = on; }
  void set_decode_stack_max_context(int tokens) { options_.decode_stack_max_context = tokens; }
  void set_decode_stack_kv_tiles(bool on) { options_.decode_stack_kv_tiles = on; }
  void set_select_cluster_rows(int64_t rows) { options_.select_cluster_rows = rows; }
  // Selections (greedy or sampled) that ran a cluster kernel (select_cluster_rows; tests).
  int64_t cluster_select_launches() const { return cluster_select_launches_; }
  // Sampled-id copies sample_tokens_async queued on its side stream (sample_copy_stream; tests).
  int64_t sample_side_copies() const { return side_copies_; }
  // Uploads upload_async_after_mark queued on its side stream (upload_side_stream; tests).
  int64_t side_uploads() const { return side_uploads_; }
  int64_t decode_stack_launches() const { return decode_stack_launches_; }              // eager and captured
  int64_t decode_stack_split_launches() const { return decode_stack_split_launches_; }  // with mlp_split
  // The kernel instance the last launch ran (cuda::decode_stack_instance_name); "" before any.
  const char* decode_stack_instance() const { return decode_stack_instance_; }

  DType kv_cache_dtype() const override { return options_.kv_cache_dtype; }
  bool fill_random(Tensor& t, const RandomFill& fill) override;
  bool sample_tokens(const Tensor& logits, const TokenSampleParams* params, int32_t* host_ids) override;
  bool edit_logits(Tensor& logits, const LogitEdit* edits, int64_t n) override;
  bool async_sampling() const override { return true; }
  void sample_tokens_async(const Tensor& logits, const TokenSampleParams* params, int slot) override;
  void wait_sampled_tokens(int slot, int32_t* host_ids, int64_t rows) override;
  void gather_sampled_tokens(int slot, const int32_t* rows, int64_t n, int32_t* out) override;
  bool memory_info(size_t& free_bytes, size_t& total_bytes) override;
  bool begin_graph_capture() override;
  void end_graph_capture(uint64_t key, bool keep = true) override;
  bool replay_graph(uint64_t key) override;
  bool has_graph(uint64_t key) const override;
  void drop_graph(uint64_t key) override;
  void clear_graphs() override;

  // GPU sampling (engine-facing, not yet in Backend): token ids of each row of logits [rows, vocab] F32
  // in device memory, written to host memory; one small device-to-host copy. sample() takes one
  // SampleParams per row (host memory).
  void argmax(const Tensor& logits, int32_t* host_ids);
  void sample(const Tensor& logits, const cuda::SampleParams* host_params, int32_t* host_ids);

  // Tests and benchmarks: force an attention kernel and (0: automatic) the decode split count (this
  // replaces the options' decode_splits / decode_min_tiles).
  void set_attention_kernel(CudaAttentionKernel kernel, int decode_splits = 0, int decode_min_tiles = 1) {
    attention_kernel_ = kernel;
    options_.decode_splits = decode_splits;
    options_.decode_min_tiles = decode_min_tiles;
  }
  int sm_count() const { return sm_count_; }
  void* stream() const { return stream_; }  // the cudaStream_t every op runs on
  // The quantized GEMM of large row counts (quantized_gemm.h), for tests and benchmarks.
  cuda::QuantizedGemm& quantized_gemm() { return *qgemm_; }

 private:
  // mlp_split's transposed down matrices for p's layers (made once, at an eager step) and whether the
  // kernel can take the split for p's shapes on `grid` CTAs; false leaves the MLP in two phases.
  bool prepare_mlp_split(const DecodeStack& s, cuda::DecodeStackParams& p, int64_t inter, int grid);
  // The persistent kernel's tensor maps of p's layer caches (DecodeStackParams::kv_maps), encoded and
  // uploaded at an eager step and kept per set of caches; null where they cannot be made (per-key copies).
  const void* decode_stack_kv_maps(const cuda::DecodeStackParams& p);
  // Device scratch grown on demand (stream-ordered); growth bumps generation_ so that graphs captured
  // with the old pointer are not replayed.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };
  void* scratch(Scratch& s, size_t bytes);
  // The same for a buffer no recording ever holds (only eager ops use it): growing it (to twice the
  // request) voids no graph.
  void* eager_scratch(Scratch& s, size_t bytes);
  void release(Scratch& s);
  void* pinned(Scratch& s, size_t bytes);  // page-locked host staging
  void release_pinned(Scratch& s);
  // Host-to-device copies of at least kUploadChunk bytes go through two pinned staging buffers
  // (cuda_backend_upload.cpp); released with the backend.
  static constexpr size_t kUploadChunk = size_t{32} << 20;
  void upload_staged(void* dst, const void* host_src, size_t bytes);
  void release_upload_staging();
  uint64_t generation() const;
  // The BF16 copy of `out` that rmsnorm/add_rmsnorm/silu_mul should also write (null: none).
  void* bf16_copy_for(const Tensor& out);
  void drop_bf16_copy() { shadow_src_ = nullptr; }
  // Whether shadow_ holds x's BF16 copy (written by the norm / SiLU / attention that produced x).
  bool has_bf16_copy(const Tensor& x) const {
    return shadow_src_ != nullptr && shadow_src_ == x.data && shadow_rows_ == x.rows() &&
           shadow_cols_ == x.cols();
  }
  // gemv_out_ holds out's BF16 copy: it becomes shadow_, the old copy's buffer the next gemv_out_.
  void adopt_bf16_copy(const Tensor& out);
  // Writing out over the mirrored tensor makes the copy stale.
  void drop_bf16_copy_if_overlaps(const Tensor& out);
  void run_sampler(const Tensor& logits, const cuda::SampleParams* host_params, int32_t* host_ids);
  // Where a sampling pass puts its ids (device, pinned host copy) and stages its parameters.
  struct SamplerBuffers {
    Scratch &ids_dev, &ids_host, &params_dev, &params_host;
  };
  // Queues the selection of one id per row and the ids' copy to b.ids_host; returns the row count. The copy
  // runs on the main stream, or with `fork` (an event) on copy_stream_ after `fork` is recorded behind the
  // selection (sample_copy_stream), so the main stream does not wait for it.
  int64_t queue_sampler(const Tensor& logits, const cuda::SampleParams* host_params, const SamplerBuffers& b,
                        CUevent_st* fork = nullptr);
  // The GEMV path (cuda_backend_gemv.cpp): whether it takes this product (BF16 with one row, or a format
  // cuBLASLt cannot take), x as BF16 (the current copy, or converted / permuted into gemv_x_), and the
  // launch of a product split over `outs`.
  bool gemv_takes(const Tensor& x, const Linear& w) const;
  const void* gemv_input(const Tensor& x, const Linear& w);
  void run_gemv(const Tensor& x, const Linear& w, std::span<Tensor* const> outs);
  // The norm fusion of one-row products (kernels_gemv.h GemvResidual / GemvPrenorm): matmul_before_norm
  // records the norm its epilogue prepared; the next pre_norm / norm_matmul_* takes it (take_pending_norm:
  // true when the add is done and the normed row is ready; it must be the recorded norm's call).
  struct PendingNorm {
    const void* residual = nullptr;
    const void* add = nullptr;
    const void* norm = nullptr;
    int ctas = 0;
    float eps = 0.0f;
  };
  bool take_pending_norm(const Tensor& residual, const Tensor* add, const Tensor& norm, float eps);
  bool gemv_norm_takes(const Tensor& x, const Linear& w) const;  // x: one row

  // Makes device_ current on the calling thread (the engine loop may run on another thread than the one
  // that created the backend; the current device is per thread).
  void use_device() const;
  // The RoPE inverse frequencies of `rope` (backend/rope.h, cached for the last parameters) into dst, which
  // holds `capacity` floats.
  void copy_inverse_frequencies(const RopeParams& rope, float* dst, size_t capacity);
  // The deferred product (QuantizedGemm::pending) when it is the q/k/v projection whose outputs are q, k and
  // v and the RoPE kernels can read it (cuda::rope_takes_product); else null.
  const cuda::Fp8Epilogue* pending_qkv_product(const Tensor& q, const Tensor& k, const Tensor& v, int64_t hq,
                                               int64_t hkv, int64_t hd) const;

  int device_ = 0;
  CudaBackendOptions options_;
  int sm_count_ = 0;
  CUstream_st* stream_ = nullptr;
  std::string name_;
  std::unique_ptr<cuda::CublasLtGemm> gemm_;
  std::unique_ptr<cuda::QuantizedGemm> qgemm_;  // FP8 W8A8 / dequantizing GEMM (quantized_gemm.h)
  Scratch qgemm_ws_;
  // RoPE inverse frequencies (backend/rope.h), recomputed only when the parameters change.
  std::vector<float> inv_freq_;
  RopeParams inv_freq_params_;

  CudaAttentionKernel attention_kernel_ = CudaAttentionKernel::Auto;
  // The persistent decode kernel's scratch (q/k/v, attention output and partials, MLP activation, grid
  // barrier) and its parameter block (~25 KB, built per step; heap, not the stack).
  Scratch decode_stack_scratch_, decode_stack_profile_;
  // mlp_split's transposed down matrices, by the down weight's device address (weights never move).
  std::unordered_map<const void*, std::unique_ptr<DeviceBuffer>> decode_stack_down_t_;
  struct KvMaps {
    // What the maps were encoded from (every layer's key and value cache; the cache layout and stage size):
    // a step compares these instead of encoding again.
    std::vector<const void*> caches;
    std::array<int64_t, 6> layout{};
    std::unique_ptr<DeviceBuffer> device;  // null: no maps for this layout (the producer copies per key)
  };
  std::unordered_map<const void*, KvMaps> decode_stack_kv_maps_;  // by the first layer's key cache
  bool decode_stack_down_t_failed_ = false;  // an allocation failed once: mlp_split stays off
  std::unique_ptr<cuda::DecodeStackParams> decode_stack_params_;
  size_t decode_stack_smem_ = 0;  // the shared-memory size the kernel's attribute was set for
  int decode_stack_ctas_ = 0;
  int64_t decode_stack_launches_ = 0, decode_stack_split_launches_ = 0;
  const char* decode_stack_instance_ = "";
  int decode_stack_profiles_left_ = 0;  // from options_.decode_stack_profiles
  Scratch decode_partials_, decode_counters_, shadow_, sample_params_, sample_ids_, pinned_params_,
      pinned_ids_;
  // sample_tokens_async's two slots; `done` is recorded after the ids' copy to the host.
  // With options_.sample_copy_stream, `sampled` is recorded on the main stream after the sampling kernel and
  // the copy runs on copy_stream_ after it (`done` then recorded there).
  struct AsyncSlot {
    Scratch ids_dev, ids_host, params_dev, params_host;
    int64_t rows = 0;
    CUevent_st* done = nullptr;
    CUevent_st* sampled = nullptr;
  };
  CUstream_st* copy_stream_ = nullptr;   // sample_tokens_async's copies to the host (sample_copy_stream)
  int64_t side_copies_ = 0;              // copies queued on copy_stream_ (sample_side_copies)
  int64_t cluster_select_launches_ = 0;  // selections on a cluster kernel (select_cluster_rows)
  // upload_async_after_mark's side stream (upload_side_stream), the mark recorded on the main stream and the
  // copy's end recorded on the side stream (the main stream waits for it).
  CUstream_st* upload_stream_ = nullptr;
  CUevent_st* upload_mark_ = nullptr;
  CUevent_st* upload_done_ = nullptr;
  bool upload_marked_ = false;  // a mark not yet used by an upload
  int64_t side_uploads_ = 0;
  AsyncSlot async_[2];
  // edit_logits' staging (pinned; reused by the next step only after its sampling waited) and device copy.
  Scratch pinned_edits_, edits_dev_;
  // The tensor whose BF16 copy shadow_ holds (null: none), and its shape.
  const void* shadow_src_ = nullptr;
  int64_t shadow_rows_ = 0, shadow_cols_ = 0;
  bool last_matmul_bf16_ = false;  // produce BF16 copies only for models whose matmuls take them
  uint64_t generation_ = 0;        // scratch buffers replaced (scratch()); generation() adds the two below
  // Device buffers from allocate() freed (CudaMemory counts them; shared: a buffer may outlive the backend).
  std::shared_ptr<std::atomic<uint64_t>> device_frees_ = std::make_shared<std::atomic<uint64_t>>(0);
  bool capturing_ = false;
  uint64_t capture_generation_ = 0;
  uint64_t rewritten_memsets_ = 0;  // workspace memsets moved or replaced (gemm_memset_rewrite), every graph
  bool rewrite_warned_ = false;     // a rewrite failed once (instantiate_rewritten took the recorded graph)
  struct Graph {
    CUgraphExec_st* exec = nullptr;
    uint64_t generation = 0;
  };
  std::map<uint64_t, Graph> graphs_;
  // The GEMV's BF16 input; the fused SiLU product's BF16 copy (then swapped with shadow_).
  Scratch upload_[2];
  CUevent_st* upload_events_[2] = {nullptr, nullptr};
  Scratch gemv_x_, gemv_out_;
  // The norm fusion's BF16 normed row and per-CTA partial sums, and the norm they hold.
  Scratch norm_row_, norm_partials_;
  PendingNorm pending_norm_;
  // The prefill MLP's stacked [gate | up] GEMM output in BF16 (matmul_silu_mul with more than one row).
  Scratch gate_up_bf16_;
  // FP8 fused projections at prefill sizes as one FP8 GEMM + one epilogue (QuantizedGemm::matmul_split /
  // matmul_silu_mul); false when they do not apply (the caller takes the next path).
  bool fused_quantized_split(const Tensor& x, const Linear& w, std::span<Tensor* const> outs);
  bool fused_quantized_silu_mul(const Tensor& x, const Linear& w, Tensor& out);
  // The same products with the norm before them (and in norm_mlp the down product) fused into the FP8
  // activation quantization (QuantizedGemm::norm_matmul_split / norm_mlp). False: nothing ran; true with
  // h_only: the norm ran into h and the caller runs the products on h.
  // next_norm (norm_mlp): the norm after the down product, which may then be deferred (below).
  bool fused_quantized_norm(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h,
                            const Linear& w, std::span<Tensor* const> outs, const Linear* down, Tensor* act,
                            bool& h_only, const Tensor* next_norm = nullptr);
  // Deferred FP8 products (QuantizedGemm::matmul_deferred; the epilogue itself is QuantizedGemm's pending()):
  // o / down before the residual add leave their epilogue to the norm named with them, which takes the
  // product as its add (fused_quantized_norm); any other next call launches the epilogue first
  // (finish_deferred: pre_norm, the norm calls that do not fuse, matmul_before_norm, the other ops,
  // synchronize, copy_to_host, end_graph_capture); embedding (a step's start) and allocate drop a stale one.
  // The product's sums live in one of two holds, alternately: the norm that consumes one may defer the next
  // product into the other. What a pending product of one output (o / down) was deferred for: the norm's
  // residual, weight and eps; a q/k/v split (three outputs) is for RoPE + KV write on those outputs.
  struct DeferredFor {
    const void* residual = nullptr;
    const void* norm = nullptr;
    float eps = 0.0f;
  };
  bool defer_product(const Tensor& x, const Linear& w, Tensor& out, const Tensor& residual,
                     const Tensor& next_norm, float eps);
  // Whether the pending product is this norm's add (residual / add / norm / eps those it was deferred for).
  bool deferred_for(const Tensor& residual, const Tensor* add, const Tensor& norm, float eps) const;
  void* next_hold(size_t bytes) { return scratch(deferred_hold_[deferred_next_], bytes); }
  // After a product went into next_hold: what it is deferred for, and the other hold for the next one.
  void note_deferred(const Tensor& residual, const Tensor& norm, float eps) {
    deferred_ = {residual.data, norm.data, eps};
    deferred_next_ ^= 1;
  }
  void finish_deferred();
  DeferredFor deferred_;
  Scratch deferred_hold_[2];
  int deferred_next_ = 0;  // the hold the next deferred product takes
  // matmul_silu_mul for BF16 weights and more rows than the GEMV takes: one GEMM writing BF16.
  bool stacked_silu_mul(const Tensor& x, const Linear& w, Tensor& out);
  void run_decode_attention(const Tensor& q, const cuda::PagedKv& kv, const cuda::BatchArgs& args,
                            const AttentionParams& p, Tensor& out, void* out_bf16,
                            const cuda::DecodeRope* rope = nullptr);
};

}  // namespace inferx
