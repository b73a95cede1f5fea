#pragma once
// GEMMs through cuBLASLt. Two layers:
//   LtMatmul: the one place that builds cuBLASLt descriptors and chooses algorithms. A product
//     D (F32 or BF16, n x t, ld ldd) = op(A) B (+ bias) with A = a row-major weight [n, k] (seen as k x n,
//     transposed) and B = row-major activations [t, k] (k x t): the "TN" layout, the only one cuBLASLt's
//     FP8 kernels take. A and B are F32, F16, BF16 or FP8 E4M3 (optionally with cuBLASLt's scalar or
//     outer-vector scales); F32 accumulation and output; the bias (F32) goes in the epilogue when the
//     heuristic offers a fused kernel. One plan (descriptors + algorithm) is cached per exact shape.
//     Autotuning: the first time a shape's power-of-two bucket of t (rows) is seen outside CUDA graph
//     capture, the heuristic's top candidates() algorithms (16 by default) are each timed on the real
//     operands and the fastest is kept for the whole bucket (later row counts of the bucket reuse it after
//     cublasLtMatmulAlgoCheck, also during graph capture), so a decode batch size or prefill chunk length
//     tunes at most once per bucket. During capture (set_capturing, or cudaStreamIsCapturing on the
//     stream) nothing is timed: a bucket not tuned yet runs the heuristic's first choice, and the plan is
//     tuned on its next uncaptured call.
//     INFERX_GEMM_TUNE=0 (or set_tuning(false)) keeps the heuristic's first choice everywhere (A/B).
//     One 32 MiB workspace (NVIDIA's recommendation on Hopper) is reused by every call.
//   CublasLtGemm: out[T, N] = x[T, K] @ W[N, K]^T (+ bias) for F32, F16 and BF16 weights. Activations come
//     as F32 (rounded to a 16-bit weight's type by one small kernel first, since cuBLAS needs A and B of
//     one type) or already as BF16 (the fused norm and SiLU kernels write them). Quantized GGUF weight
//     types are rejected with an error (quantized_gemm.h takes FP8 / INT4 / Q8_0 / Q4_K on top of
//     LtMatmul).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"

namespace inferx::cuda {

// How cuBLASLt scales an FP8 operand inside the GEMM (cublasLtMatmulMatrixScale_t), if at all.
enum class LtScale { None, Scalar, OuterVector };

// Everything that shapes a plan's descriptors and its algorithm.
struct LtShape {
  cudaDataType_t ab_type = CUDA_R_16BF;  // A and B
  cudaDataType_t d_type = CUDA_R_32F;    // D: F32, or BF16 where the next op reads BF16 anyway
  int64_t n = 0, t = 0, k = 0, ldd = 0;  // ldd: D's leading dimension (>= n; an output column tile)
  bool bias = false;
  LtScale a_scale = LtScale::None, b_scale = LtScale::None;
  int align_a = 256, align_b = 256, align_d = 256;  // pointer alignments in bytes (pointer_alignment)
};

// The device pointers of one call. The scale pointers are needed for the scales the shape names.
struct LtOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;  // of the shape's d_type
  const float* bias = nullptr;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
};

// The largest power of two (capped at 256) dividing the address: what cuBLASLt's alignment preferences take.
int pointer_alignment(const void* p);

// The shape of D = op(A) B for these operands: A [k, n] (weight rows), B [k, t] of type ab, D ld ldd of
// d_type, the bias when ops has one, the pointer alignments from ops; no FP8 scales (callers set them).
LtShape lt_shape(cudaDataType_t ab, int64_t n, int64_t t, int64_t k, int64_t ldd, const LtOperands& ops,
                 cudaDataType_t d_type = CUDA_R_32F);

class LtMatmul {
 public:
  struct Plan;
  // Plans built, row buckets tuned (their candidates timed when the heuristic offered several), tunings
  // that kept another algorithm than the heuristic's first choice, and plans that took their bucket's
  // algorithm without timing; heuristic queries made; the host time that building plans took (descriptors
  // and the heuristic query) and that timing candidates took.
  // loaded: bucket algorithms restored from the tuning cache (use_tuning_cache).
  struct Stats {
    uint64_t plans = 0, tunings = 0, changed = 0, reused = 0, queries = 0, loaded = 0;
    double build_seconds = 0.0, tune_seconds = 0.0;
  };
  static constexpr int kDefaultCandidates = 16;

  explicit LtMatmul(cudaStream_t stream);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // The plan for `shape`, built (and tuned, see above) on first use with `ops` as the real operands
  // (their outputs are overwritten; the caller's own run follows). Null when cuBLASLt offers no
  // algorithm. Pointers stay valid until evict_if_full().
  Plan* plan(const LtShape& shape, const LtOperands& ops);
  // Launches the product; cuBLASLt's status is returned (a refusal may be survivable for the caller).
  cublasStatus_t run(Plan& plan, const LtOperands& ops);
  // Whether the bias is added by the GEMM's epilogue (false: the caller adds it).
  static bool fused_bias(const Plan& plan);
  // Marks a plan that cuBLASLt refused to run: plan() returns null for its shape from now on.
  static void disable(Plan& plan);
  // Starts the plan cache over when it is full; call where no plan pointer is held (prefill sees many
  // row counts).
  void evict_if_full();

  void set_tuning(bool on) { tuning_ = on; }
  bool tuning() const { return tuning_; }
  // How many algorithms the heuristic is asked for (and a tuning times): kDefaultCandidates, or
  // INFERX_GEMM_CANDIDATES (1-256) for A/B runs. Plans built before a change keep their list.
  void set_candidates(int n) { candidates_ = n < 1 ? 1 : n > 256 ? 256 : n; }
  int candidates() const { return candidates_; }
  // The SM count cuBLASLt plans its kernels for (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET; 0: the whole GPU),
  // for a stream that shares the GPU with another's work (an overlap experiment: bench_cuda_kernels
  // INFERX_BENCH_ONLY=overlap); INFERX_GEMM_SM_TARGET. Plans built before a change keep theirs.
  void set_sm_target(int sms) { sm_target_ = sms < 0 ? 0 : sms; }
  // The tuning cache (formats/gemm_tuning_file.h) in folder `dir`: the bucket algorithms that earlier runs
  // tuned in this instance's context (device, cuBLASLt version, fast accumulation, SM target, candidate
  // count) are restored now - each still checked against its shape before use, and tuned again when it no
  // longer fits - and every bucket tuned from now on is written back. The file is shared by every LtMatmul
  // of the process (one file per context). Call before the first product; "" leaves the cache off.
  void use_tuning_cache(const std::string& dir);
  // While a CUDA graph is being captured nothing may synchronize: no algorithm timing.
  void set_capturing(bool capturing) { capturing_ = capturing; }
  // Dedicated workspaces: a plan launched during a graph capture (set_capturing) whose algorithm needs a
  // small workspace (at most kSlotBytes: the tile counter of a persistent kernel, which cuBLASLt zeroes with
  // a memset node ahead of every launch) gets a slot of its own in a small arena instead of the shared
  // workspace, so no other product reads or writes it and a graph rewrite may move or replace that memset
  // (graph_rewrite.h). Call outside capture (the arena is allocated on the first call); plans keep their
  // slots until they are evicted; a full arena leaves later plans on the shared workspace.
  void set_dedicated_workspaces(bool on);
  // Whether p lies in this instance's arena of dedicated workspaces.
  bool in_dedicated_workspace(const void* p) const;
  const Stats& stats() const { return stats_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  cudaStream_t stream() const { return stream_; }

 private:
  // ab_type, n, t (or its bucket), k, ldd, bias, a_scale, b_scale, align_a, align_b, align_d, d_type.
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, bool, int, int, int, int, int, int>;
  struct Tuned {
    cublasLtMatmulAlgo_t algo;
    bool fused_bias;
  };
  static Key key_of(const LtShape& s, int64_t t);
  static_assert(std::tuple_size_v<Key> == 12, "the tuning file stores 12 key fields");
  static std::array<int64_t, 12> key_record(const Key& k);
  static Key record_key(const std::array<int64_t, 12>& a);
  // bucket: the tuned algorithm of the shape's row bucket, tried before any heuristic query (or nullptr).
  std::unique_ptr<Plan> build(const LtShape& shape, const Tuned* bucket);
  // Whether the stream may synchronize now (not captured into a CUDA graph): candidates can be timed.
  bool may_time() const;
  void settle(Plan& plan, const LtShape& shape, const LtOperands& ops);
  // The workspace bytes `algo` needs for the plan's shape, or nothing when cuBLASLt does not take it there.
  std::optional<size_t> checked_workspace(const Plan& plan, const cublasLtMatmulAlgo_t& algo) const;
  bool fits(const Plan& plan, const cublasLtMatmulAlgo_t& algo) const;
  // On the shared workspace unless ws says otherwise (run: a plan's dedicated one).
  cublasStatus_t launch(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const LtOperands& ops,
                        void* ws = nullptr, size_t ws_bytes = 0);
  // The plan's dedicated workspace for its current algorithm (set_dedicated_workspaces), or null.
  void* dedicated_workspace(Plan& plan);
  // Index of the fastest candidate on the real operands (events on the stream); -1 when none ran.
  int fastest(const Plan& plan, const LtShape& shape, const LtOperands& ops);
  struct EventPair;
  // Records events around `batch` launches of one candidate; false when cuBLASLt refuses it.
  bool enqueue_sample(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const LtOperands& ops, int batch,
                      const EventPair& events);
  int pick(std::vector<std::vector<float>>& samples, const std::vector<bool>& usable);

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  static constexpr size_t kSlotBytes = 256, kSlotArenaBytes = size_t{256} << 10;
  void* slots_ = nullptr;  // the dedicated workspaces' arena (kSlotArenaBytes), null while they are off
  size_t slots_used_ = 0;
  bool dedicated_ = false;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, Tuned> tuned_;  // per row bucket
  std::set<Key> restored_;      // buckets of tuned_ restored from the tuning cache and not yet used
  std::string cache_path_;      // the tuning cache file (use_tuning_cache); empty: off
  std::string cache_context_;   // the context line its records belong to
  Stats stats_;
  bool tuning_ = true;
  bool capturing_ = false;
  int candidates_ = kDefaultCandidates;
  int sm_target_ = 0;
};

class CublasLtGemm {
 public:
  explicit CublasLtGemm(cudaStream_t stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // All pointers are device pointers; x [t, k] of x_dtype (F32, or BF16 with BF16 weights), w [n, k] of
  // w_dtype, bias [n] F32 or null, out [t, n] F32 (row-major).
  void matmul(const void* x, DType x_dtype, int64_t t, int64_t k, DType w_dtype, const void* w, int64_t n,
              const float* bias, float* out) {
    matmul(x, x_dtype, t, k, w_dtype, w, n, bias, out, DType::F32);
  }
  // The same with out of out_dtype: F32, or BF16 (then w_dtype must be BF16; written by the epilogue,
  // so a product that only feeds BF16 consumers never round-trips through F32 memory).
  void matmul(const void* x, DType x_dtype, int64_t t, int64_t k, DType w_dtype, const void* w, int64_t n,
              const float* bias, void* out, DType out_dtype);
  // While a CUDA graph is being captured nothing may synchronize: no algorithm timing, no buffer growth.
  void set_capturing(bool capturing) {
    capturing_ = capturing;
    lt_.set_capturing(capturing);
  }
  // Bumped whenever a buffer a captured graph may point at is reallocated.
  uint64_t buffer_generation() const { return generation_; }
  void set_tuning(bool on) { lt_.set_tuning(on); }
  const LtMatmul::Stats& tuning_stats() const { return lt_.stats(); }
  LtMatmul& lt() { return lt_; }

 private:
  const void* activations_as(const float* x, int64_t count, DType to);

  cudaStream_t stream_ = nullptr;
  LtMatmul lt_;
  cublasHandle_t blas_ = nullptr;  // fallback when cuBLASLt's heuristic offers no algorithm
  void* converted_ = nullptr;      // activations rounded to 16 bits; grown stream-ordered, never shrunk
  size_t converted_bytes_ = 0;
  bool capturing_ = false;
  uint64_t generation_ = 0;
};

}  // namespace inferx::cuda
