#pragma once
// out[T, N] = x[T, K] @ W[N, K]^T (+ bias) for quantized weights when T is more than a few rows (the
// decode GEMV, kernels_gemv.h, takes batch-1 decode; see the thresholds below):
//   F8_E4M3 (per-tensor or per-channel F32 scale): W8A8. The activations are quantized per token on the
//     fly (kernels_quant.h: E4M3 + one F32 scale per row, the CPU backend's codes), the FP8 x FP8 GEMM
//     runs on Hopper's FP8 tensor cores through cuBLASLt with F32 accumulation and F32 output in the TN
//     layout cuBLASLt requires for FP8 (A = W transposed, B = x not transposed, K a multiple of 16), and
//     one epilogue pass applies the row scale, the weight scale(s) and the bias. When cuBLASLt offers no
//     FP8 algorithm for a shape, the same W8A8 values run as BF16 through the dequantizing path below.
//   INT4 (F16 group scales, optional zero points, optional act-order permutation), GGUF Q8_0 and Q4_K:
//     the weight is dequantized tile by tile (rows of at most kTileBytes of BF16) into a reused scratch
//     buffer and each tile runs through a BF16 cuBLASLt GEMM writing its columns of the F32 output. The
//     dequantization costs about 2 bytes written + 2 read per weight per call, independent of T, so it
//     is amortised over the rows (prefill: a few % of the GEMM); a fused dequantizing GEMM would remove it.
// Row thresholds: matmul hands a product over from kMinRows rows (one GEMV launch takes 16); the fused
// projections (matmul_split / matmul_silu_mul) from kFusedMinRows, so that decode-sized batches keep
// the GEMV's one-launch split (its tests pin that up to 20 rows). Lower may be faster: the GEMV is bound
// by its x loads beyond a few rows (H200, 4096 x 4096 BF16: 12.6 us at M=1, 31.5 at M=4, 73 at M=16,
// cuBLASLt about 14 throughout; cuda_backend_gemv.cpp) - to be measured for FP8 / INT4.
// Scratch comes from the caller (CudaBackend's stream-ordered scratch, which also guards graph capture).
// The cuBLASLt descriptors, the algorithm choice (autotuned per row bucket, INFERX_GEMM_TUNE=0: off) and
// the workspace are LtMatmul's (gemm_cublaslt.h), shared with the BF16 GEMM.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "backend/cuda/gemm_cublaslt.h"
#include "backend/cuda/kernels_quant.h"
#include "backend/linear.h"

namespace inferx::cuda {

class QuantizedGemm {
 public:
  // Rows from which products leave the decode GEMV (see the thresholds above).
  static constexpr int64_t kMinRows = 17;
  static constexpr int64_t kFusedMinRows = 64;
  // Largest BF16 weight tile (bytes) dequantized at once.
  static constexpr size_t kTileBytes = size_t{64} << 20;

  // Fp8: FP8 GEMM + scaling epilogue kernel; Fp8OuterScale: FP8 GEMM with cuBLASLt's outer-vector scales
  // (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: per-row A scale x per-column B scale, applied in the
  // GEMM; no epilogue pass), taken when the heuristic offers it; Fp8ViaBf16: the BF16 fallback.
  // Fp8Fused: a fused projection (matmul_split / matmul_silu_mul below) as one FP8 GEMM + one epilogue;
  // Fp8NormFused: the same with the norm writing the FP8 input (norm_matmul_split / norm_mlp).
  enum class Path { None, Fp8, Fp8OuterScale, Fp8ViaBf16, Dequant, Fp8Fused, Fp8NormFused };

  explicit QuantizedGemm(cudaStream_t stream);
  ~QuantizedGemm();
  QuantizedGemm(const QuantizedGemm&) = delete;
  QuantizedGemm& operator=(const QuantizedGemm&) = delete;

  // Whether this class can run the weight's format at all (scales of the right shape and type, shapes
  // the kernels take). Device pointers are not read.
  static bool supports(const Linear& w);
  // Whether it should take a product of `rows` activation rows, given that supports(w): a plain matmul
  // from kMinRows rows, a part of a fused projection from kFusedMinRows.
  static bool prefers(const Linear& w, int64_t rows) { return rows >= kMinRows; }
  static bool prefers_fused(const Linear& w, int64_t rows) { return rows >= kFusedMinRows; }

  // x F32 [t, k], out F32 [t, n] contiguous, device memory; workspace(bytes) returns device scratch of at
  // least that many bytes (256-byte aligned), valid until the next call.
  void matmul(const float* x, int64_t t, const Linear& w, float* out,
              const std::function<void*(size_t)>& workspace);

  // Fused projections of FP8 weights (W8A8 on cuBLASLt's FP8 GEMM), the activations quantized once:
  //   matmul_split: w = [W0; W1; ...] stacked, outs[j] F32 [t, cols[j]] = x @ Wj^T (+ bias part j);
  //   matmul_silu_mul: w = [G; U] stacked (2f rows), out F32 [t, f] = silu(x @ G^T + bg) * (x @ U^T + bu).
  // One GEMM over the whole stacked weight into scratch, then one epilogue pass that applies the scales,
  // splits the columns (or applies SiLU * up) - instead of a quantization, a GEMM and an epilogue per part
  // (plus the SiLU pass). Same values as the per-part matmuls (the same codes and scales; only the GEMM's
  // summation order may differ). False (nothing written) when the weight or shape does not take the FP8
  // GEMM (other formats, K or the stacked N not a multiple of 16, forced dequantization), or when cuBLASLt
  // offers or accepts no FP8 algorithm: the caller then runs the parts one by one. They always take the
  // plain FP8 GEMM + epilogue (the outer-vector scaling above is tried only by matmul).
  bool matmul_split(const float* x, int64_t t, const Linear& w, float* const* outs, const int64_t* cols,
                    int num_outs, const std::function<void*(size_t)>& workspace);
  bool matmul_silu_mul(const float* x, int64_t t, const Linear& w, float* out,
                       const std::function<void*(size_t)>& workspace);

  // The FP8 products of prefill-sized steps with the passes around them fused (kernels_quant_fused.cu):
  // the input is the pre-norm residual stream, normed and quantized in one pass (residual += add when add
  // is not null; h = RMSNorm(residual) * norm is not written), and in mlp the SiLU * up epilogue of the
  // gate/up GEMM writes the down projection's codes (act is not written). Same codes and scales as the
  // unfused passes, so the same values as add_rmsnorm + matmul_split / matmul_silu_mul + matmul.
  //   No: nothing ran (a weight or shape these paths do not take, no FP8 algorithm offered, or the fusion
  //     switched off): the caller runs the unfused ops.
  //   InputOnly: the norm ran (residual updated) but a GEMM was then refused; h [t, k] now holds the normed
  //     rows and the caller runs the products on h.
  //   Done: outs / out hold the products.
  enum class Fused { No, InputOnly, Done };
  struct NormInput {
    float* residual = nullptr;    // [t, k]
    const float* add = nullptr;   // [t, k] or null
    const float* norm = nullptr;  // [k]
    float eps = 0.0f;
    float* h = nullptr;  // [t, k]: written only for InputOnly
    // The add is the pending deferred product (below; add then null): the norm adds its values as it reads
    // them, and the product is no longer pending. With No nothing ran and it is still pending.
    bool add_pending = false;
  };
  // defer_split: the split epilogue is left pending (not launched) for a consumer that reads the BF16 sums
  // itself (RoPE + KV write: kernels.h, launch_rope_write_kv's product); the sums and the row scales stay in
  // the workspace, which the next call reuses, so the consumer must come first (any other call finishes it).
  Fused norm_matmul_split(const NormInput& in, int64_t t, const Linear& w, float* const* outs,
                          const int64_t* cols, int num_outs, const std::function<void*(size_t)>& workspace,
                          bool defer_split = false);
  // Deferred products: an FP8 product whose only reader is the next norm (o and down before the residual
  // add, in prefill- and batch-sized steps) leaves its W8A8 scaling epilogue to that norm, which adds the
  // values to the residual stream as it reads the BF16 sums (kernels_quant.h, add_product) - the same values
  // to the bit, without the epilogue kernel and the F32 output's write and read (per layer of the 8B shape
  // 2 x t x 4096 x 6 bytes; H200 8B FP8 1000 x 1000/1000 offline +1.3%, 2026-12-04). Hold: memory of the
  // caller's that outlives the workspace (the next call's quantization reuses the workspace while the norm
  // reads the sums): acc BF16 [t, n] and scales [t] (hold_bytes). Taken with the BF16 accumulator and the
  // fused passes only (defers()).
  struct Hold {
    void* acc = nullptr;
    float* scales = nullptr;
  };
  static size_t hold_acc_bytes(int64_t t, int64_t n) {
    return (static_cast<size_t>(t * n) * 2 + 255) / 256 * 256;
  }
  static size_t hold_bytes(int64_t t, int64_t n) { return hold_acc_bytes(t, n) + static_cast<size_t>(t) * 4; }
  static Hold hold_at(void* p, int64_t t, int64_t n) {
    return {p, reinterpret_cast<float*>(static_cast<char*>(p) + hold_acc_bytes(t, n))};
  }
  bool defers() const { return deferred_ && bf16_acc_ && fused_passes_; }
  // Whether products are deferred at all (default on; INFERX_CUDA_FP8_DEFER=0: off).
  void set_deferred_epilogues(bool on) { deferred_ = on; }
  // out [t, n] = x @ w^T as a deferred product: the input quantized, the FP8 GEMM into hold, the epilogue
  // that would write out pending (not launched). False: nothing that matters ran (not an FP8 weight or shape
  // the GEMM takes, no algorithm, !defers(), a product already pending): the caller runs matmul.
  bool matmul_deferred(const float* x, int64_t t, const Linear& w, float* out, const Hold& hold,
                       const std::function<void*(size_t)>& workspace);
  // The pending deferred product's epilogue (null: none); finish_pending launches it (for a next call that
  // does not take it as its add) and clears it.
  const Fp8Epilogue* pending() const { return pending_.acc ? &pending_ : nullptr; }
  void finish_pending();
  void drop_pending() { pending_ = {}; }
  // out [t, down.out_features] = down(silu(h @ G^T) * (h @ U^T)) for gate_up = [G; U]; act [t, f] is
  // written only when the down GEMM is refused after the gate/up one ran (it then runs unfused from act).
  // defer_down asks for the down product deferred into that hold: pending() afterwards tells whether it was
  // (else out is written).
  Fused norm_mlp(const NormInput& in, int64_t t, const Linear& gate_up, const Linear& down, float* act,
                 float* out, const std::function<void*(size_t)>& workspace, const Hold* defer_down = nullptr);
  // Whether the fused passes above are tried (default on; INFERX_CUDA_FP8_FUSE=0: off).
  void set_fused_passes(bool on) { fused_passes_ = on; }
  bool fused_passes() const { return fused_passes_; }

  // The path the last matmul took (tests and benchmarks).
  Path last_path() const { return last_path_; }
  // Tests: force the dequantizing path for FP8 weights too.
  void set_force_dequant(bool force) { force_dequant_ = force; }
  // Whether FP8 tries cuBLASLt's outer-vector scaling first (default on; INFERX_CUDA_FP8_OUTER_SCALE=0: off).
  // It applies the scales inside the GEMM, so only the F32 accumulator (set_bf16_accumulator(false)) takes
  // it.
  void set_outer_scale(bool on) { outer_scale_ = on; }
  // Whether the plain FP8 GEMM writes its unscaled product as BF16 instead of F32 for the epilogue to read
  // (INFERX_CUDA_FP8_ACC=bf16|f32; default bf16, as the BF16 outputs of vLLM's and TensorRT-LLM's FP8
  // GEMMs). BF16 halves the bytes the GEMM writes and the epilogue reads (at a 16k-token prefill step of the
  // 8B shape ~2.8 GB per layer); each product is then rounded to BF16 (2^-9 relative) before its scales are
  // applied, and every FP8 GEMM rounds so (cuBLASLt's outer-vector scaling, which applies the scales inside
  // the GEMM, is then not used), as does the CPU backend with cpu::set_fp8_bf16_accumulator. H200 8B FP8 +
  // FP8 KV offline, 1000 x 1000/1000: 14,024 -> 14,284 output tok/s (2026-12-04; 2026-12-03 13.01k ->
  // 13.38k; 512 x 1000/200 38.1k -> 40.4k total). Accuracy on the trained stories260K on the GPU: mean KL
  // to the unquantized model 0.01134 nats against 0.01119 with F32 sums, top-1 95.9% vs 94.0%
  // (docs/benchmarks.md). Random-weight models move by a few % of the largest logit under it (as under any
  // 2^-9 perturbation: TinyModelQuantizedAtLoadMatchesTheCpuBackend).
  void set_bf16_accumulator(bool on) { bf16_acc_ = on; }
  // Tests: a smaller dequantization tile (bytes of BF16), so that small weights span several tiles.
  void set_tile_bytes(size_t bytes) { tile_bytes_ = bytes > 0 ? bytes : kTileBytes; }

  // Tests and benchmarks: the algorithm autotuning of the FP8 and BF16 GEMMs (gemm_cublaslt.h).
  void set_tuning(bool on) { lt_.set_tuning(on); }
  const LtMatmul::Stats& tuning_stats() const { return lt_.stats(); }
  LtMatmul& lt() { return lt_; }

 private:
  // An FP8 run: false (and the plan disabled) when cuBLASLt refuses the call itself (NOT_SUPPORTED /
  // INVALID_VALUE), so that the caller falls back; other failures throw.
  bool try_run(LtMatmul::Plan& plan, const LtOperands& ops);
  // x quantized per row into the workspace: E4M3 codes [t, k], row scales [t], then `extra` bytes for the
  // caller (256-byte aligned).
  struct Fp8Input {
    uint8_t* codes;
    float* scales;
    void* extra;
  };
  Fp8Input quantize_input(const float* x, int64_t t, int64_t k, size_t extra_bytes,
                          const std::function<void*(size_t)>& workspace);
  // The same layout without the quantization (the caller quantizes).
  Fp8Input reserve_input(int64_t t, int64_t k, size_t extra_bytes,
                         const std::function<void*(size_t)>& workspace);
  // Whether w runs on the FP8 GEMM at all (format, shape, not forced through the BF16 path).
  bool fp8_takes(const Linear& w) const;
  // The plan of D [t, n] (F32, or BF16 with d_bf16) = codes x W^T unscaled; null when none is offered.
  LtMatmul::Plan* fp8_plan(const Linear& w, const Fp8Input& in, int64_t t, void* d, bool d_bf16,
                           LtOperands& ops);
  // D [t, n] (F32, or BF16 with d_bf16) = codes x W^T unscaled on cuBLASLt's FP8 kernels; false when none
  // is offered or accepted.
  bool plain_fp8_gemm(const Linear& w, const Fp8Input& in, int64_t t, void* d, bool d_bf16);
  // Launches the W8A8 epilogue `e` (outputs set by the caller) over acc with w's scales and bias.
  void scale_epilogue(Fp8Epilogue e, const void* acc, bool acc_bf16, int64_t t, const Linear& w,
                      const float* x_scales);
  // The input of the fused paths: F32 rows x, or (norm set) the residual stream normed in the same pass
  // as its quantization.
  struct Fp8Source {
    const float* x = nullptr;
    const NormInput* norm = nullptr;
  };
  // What the fused paths share: workspace (x's codes and scales, then w's unscaled product into
  // in.extra, then `after_acc` bytes for the caller at in.extra + acc_bytes), the plan (looked up first, so
  // that without one nothing has run), the quantization of the source, the GEMM. Done: in set; No: nothing
  // ran; InputOnly: the norm ran, cuBLASLt then refused the GEMM, and the norm's h holds the normed rows.
  Fused fp8_first_gemm(const Fp8Source& src, int64_t t, const Linear& w, size_t after_acc,
                       const std::function<void*(size_t)>& workspace, Fp8Input& in, size_t& acc_bytes);
  // Both fused projections (plain or normed input): the first GEMM over all of w, then the epilogue `e`.
  Fused fp8_fused(const Fp8Source& src, int64_t t, const Linear& w, Fp8Epilogue e,
                  const std::function<void*(size_t)>& workspace, bool defer = false);
  // The split projection's epilogue: outs[j] take cols[j] columns in order; false for other than 1..3
  // outputs (their columns must add up to w's rows).
  static bool split_epilogue(const Linear& w, float* const* outs, const int64_t* cols, int num_outs,
                             Fp8Epilogue& e);
  void fp8_matmul(const float* x, int64_t t, const Linear& w, float* out,
                  const std::function<void*(size_t)>& workspace);
  void dequant_matmul(const float* x, int64_t t, const Linear& w, float* out,
                      const std::function<void*(size_t)>& workspace);

  cudaStream_t stream_ = nullptr;
  LtMatmul lt_;
  Path last_path_ = Path::None;
  bool force_dequant_ = false;
  bool outer_scale_ = true;
  bool bf16_acc_ = true;
  bool fused_passes_ = true;
  bool deferred_ = true;
  Fp8Epilogue pending_;  // the deferred product (acc null: none)
  size_t tile_bytes_ = kTileBytes;
};

}  // namespace inferx::cuda
