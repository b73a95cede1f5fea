#pragma once
// The batch-1 decode step as one persistent kernel (kernels_decode_stack.cu): every layer's
// norm -> qkv -> RoPE + KV write -> attention -> o (+ residual) -> norm -> gate/up + SiLU -> down
// (+ residual), then the final norm and the vocabulary projection, for one token of one sequence.
//
// Why: at batch 1 each kernel boundary costs its ramp-up and drain (~3-5 us with PDL, ~260 boundaries per
// 8B step: 77% of the memory roofline with separate kernels, docs/benchmarks.md). Status: off by default
// (CudaBackendOptions::decode_stack). On H100s, 8B bf16 at 1k context, it is within -1.1..+1.8% of the per-op
// kernels (2026-12-06). On an H200 it lost to them at every setting (2026-12-06 10:05: 4.91 ms with one stage
// in flight, 4.59 with two, per-op 4.55; FP8 3.23 against 3.00). On the H100 the weight stream alone reaches
// the copy rate (93.9% of the roofline without grid barriers); the 5 grid barriers per layer (~22 us: their
// atomics and polls wait behind the SM's streamed bytes, not for late CTAs) and the attention (~10.5 us at 1k
// context, ~18 at 4k: its key walk's arithmetic since the keys come by tensor maps) are what lose
// (benchmarks.md). On the H200 one stage in flight per SM does not keep the copy rate (81.7% of the roofline
// even without barriers), and more in flight slows the barriers. Here one CTA per SM stays resident for the
// whole step; one producer warp per CTA streams the CTA's share of every weight matrix, in the order they are
// used, through a ring of shared-memory stages (cp.async.bulk + mbarriers), never waiting for the data
// dependencies; the consumer warps wait at grid-wide barriers between the phases. The weight stream therefore
// keeps running across the barriers, the attention and the norms.
//
// Weights: BF16, F8_E4M3 with a per-tensor or per-channel scale, or INT4 with F16 group scales (groups of
// 32 / 64 / 128, symmetric or with zero points) - weight-only; x in BF16, fp32 accumulation, as the GEMVs of
// kernels_gemv.h. KV cache: BF16 or F8_E4M3 (k / k_scale, v / v_scale).
// Head dims 64 and 128, up to 8 query heads per KV head; sliding windows; q/k/v biases.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/decode_stack_layout.h"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {

// StackMatrix: decode_stack_layout.h (shared with the host test of the stage layout).
struct StackLayer {
  StackMatrix qkv, o, gate_up, down;
  const float* attn_norm = nullptr;  // F32 [hidden]
  const float* ffn_norm = nullptr;
  void* k_cache = nullptr;  // [num_blocks, block_size, hkv, hd]
  void* v_cache = nullptr;
  // DecodeStackParams::mlp_split: BF16 down weights transposed, [intermediate, hidden] (row j: the weights
  // that activation j multiplies), so a CTA's down product reads rows of the activations it computed.
  const void* down_t = nullptr;
};

// A CUtensorMap's size (and alignment: 64).
constexpr size_t kTensorMapBytes = 128;

// mlp_split's exact sums hold up to this many CTAs' partials (kernels_decode_stack.cu).
constexpr int kMaxSplitCtas = 256;
// The stride of mlp_split's sums (floats): hidden rounded up to 256 bytes, so every sum is 16-byte aligned.
INFERX_STACK_HD int32_t mlp_sums_stride(int32_t hidden) { return (hidden + 63) / 64 * 64; }

// mlp_split's view of a layer's down matrix: BF16 [intermediate, hidden], row j the weights of activation j
// (the host checks that down is BF16; its bias is added with the residual). The kernel streams it, the host
// checks it fits the stages.
INFERX_STACK_HD StackMatrix down_transposed(const StackLayer& L) {
  StackMatrix t;
  t.data = L.down_t;
  t.rows = L.down.k;
  t.k = L.down.rows;
  return t;
}

// The weight format of every matrix of a stack (the kernel has an instance per format; kStackAnyFormat
// takes mixed stacks, e.g. FP8 layers with a BF16 vocabulary projection).
constexpr int kStackAnyFormat = 0, kStackBf16 = 1, kStackFp8 = 2, kStackInt4 = 3;

// Layers travel in the kernel's parameters (CUDA 12.1+ takes up to 32 KB there): no device descriptor to
// upload, so the first decode step can be captured into a CUDA graph directly.
constexpr int kMaxStackLayers = 128;
constexpr int kMaxStackSplits = 64;  // attention splits per KV head

// Passed by value to the kernel (one launch per step); the buffers it points to are device memory.
struct DecodeStackParams {
  StackLayer layers[kMaxStackLayers];
  int32_t num_layers = 0;
  const float* final_norm = nullptr;
  StackMatrix lm_head;
  int32_t hidden = 0, hq = 0, hkv = 0, hd = 0;
  float eps = 1e-5f;
  float attn_scale = 1.0f;
  int32_t window = 0;  // 0: full causal
  uint8_t interleaved = 0;
  float inv_freq[64] = {};  // [hd / 2] (backend/rope.h), in the parameters like the layers
  uint8_t kv_fp8 = 0;       // 0: BF16 cache, 1: F8_E4M3
  float k_scale = 1.0f, v_scale = 1.0f;
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  BatchArgs batch;     // one token of one sequence
  int32_t splits = 1;  // attention splits per KV head (partials sized for it)
  // Device buffers: x is the residual stream [hidden] (in: the embedded token; the kernel adds every
  // block's output to it), logits [lm_head.rows]; scratch of decode_stack_scratch_bytes.
  float* x = nullptr;
  float* logits = nullptr;
  float* qkv = nullptr;         // [(hq + 2 hkv) * hd]
  float* attn = nullptr;        // [hq * hd]
  float* act = nullptr;         // [intermediate]
  float* partials = nullptr;    // [hq * splits * (hd + 2)]
  uint32_t* control = nullptr;  // [1 + hkv]: the grid barrier's counter, then one ticket per KV head
  int32_t stage_bytes = 32768;  // ring stage size
  int32_t stages = 4;           // ring depth
  int32_t x_bytes = 0;          // shared-memory bytes of the BF16 input vector (and attention scratch)
  int32_t inflight = 1;         // stages the producer keeps requested and not landed (0: up to the depth)
  uint32_t backoff_ns = 256;    // the producer's sleep between polls of a stage it waits for (0: spin)
  // kStackBf16 / kStackFp8 when every matrix has that format (the host sets it; the instance for it runs),
  // else kStackAnyFormat.
  int32_t format = kStackAnyFormat;
  // Timing ablation only (INFERX_DECODE_STACK_SKIP, wrong results): 1 skips the dot products, 2 the grid
  // barriers, 4 the attention.
  uint32_t skip = 0;
  // 1: the MLP as one phase (BF16 down only, layers[].down_t set): each CTA multiplies the activations it
  // computed (its gate/up rows, kept in shared memory) by the same rows of the transposed down matrix and
  // adds the partial output vector into the layer's sums with float atomics, so the grid barrier between
  // gate/up and down (the costliest of the five, ~6.9 us per layer on an H100) and the activation's round
  // trip through L2 go. The sums are exact (each partial cut into two parts on fixed grids: no addition
  // rounds, kernels_decode_stack.cu), so their arrival order changes no bit. The next layer's qkv phase adds
  // them to the residual as it reads it, each CTA keeping its share in the other residual buffer (x and
  // x_alt in turn).
  uint8_t mlp_split = 0;
  // The layers' caches as 2-D tensor maps (tensor_map.h; decode_stack_encode_kv_maps), [num_layers][K, V] in
  // device memory, kTensorMapBytes each. Set: the producer copies a split's keys and values a block at a
  // time (two tensor copies per block of one KV head instead of two bulk copies per key); null: per key.
  const void* kv_maps = nullptr;
  float* x_alt = nullptr;     // [hidden], mlp_split's second residual buffer (scratch)
  float* mlp_sums = nullptr;  // [2 layer parities][hi, lo][mlp_sums_stride(hidden)] (scratch)
  // Profiling (INFERX_DECODE_STACK_PROFILE, eager steps): when set, thread 0 of each CTA writes the GPU
  // clock (ns) at every phase boundary: [gridDim.x][num_layers * kStackLayerEvents + 2].
  uint64_t* profile = nullptr;
};
// CUDA 12.1+ takes up to 32764 bytes of kernel parameters (the layers travel there).
static_assert(sizeof(DecodeStackParams) <= 32764, "the persistent kernel's parameters");

// Per layer: start, qkv done, barrier, the attention's rope, first key stage landed, keys, partials
// published and merge done, barrier, o done, barrier, gate/up done, barrier, down done, barrier; then the
// lm_head's start and end.
constexpr int kStackLayerEvents = 15;
constexpr int64_t decode_stack_profile_events(int32_t num_layers) {
  return static_cast<int64_t>(num_layers) * kStackLayerEvents + 2;
}

// mlp_split's shared memory beyond the gate/up input: the CTA's activations, ceil(inter / grid) floats after
// the BF16 input in the x buffer. Whether they fit p.x_bytes (decode_stack_prepare first).
bool decode_stack_mlp_split_fits(const DecodeStackParams& p, int32_t inter, int grid);
// DecodeStackParams::kv_maps for p's layers (their k_cache / v_cache, block_size, hkv, hd, kv_fp8 set) into
// `out` (host memory, 2 x num_layers x kTensorMapBytes, 64-byte aligned): one map per cache, rows = slots
// (num_blocks x block_size), boxes of block_size rows x hd elements. False where the stage holds no whole
// block or the driver refuses a map: the producer then copies per key.
bool decode_stack_encode_kv_maps(const DecodeStackParams& p, void* out);
// dst [cols, rows] = src [rows, cols] transposed (BF16), for DecodeStackLayer's down_t.
cudaError_t transpose_bf16(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t stream);

// Whether the stack's shapes fit the kernel (the host also checks formats and alignment): every k a
// multiple of 16, hd 64 or 128, hq a multiple of hkv with at most 8 query heads per KV head, a hidden size
// the normed-input load holds in registers (<= 15360).
bool decode_stack_supported(int32_t hidden, int32_t inter, int32_t hq, int32_t hkv, int32_t hd);
// Whether one matrix streams through stages of `stage_bytes`: k a multiple of 16, 16-byte aligned data,
// at least one row (gate and up rows together when paired) per stage.
bool decode_stack_matrix_fits(const StackMatrix& m, bool paired, int32_t stage_bytes);
// Shared memory the kernel needs for p's shapes (sets p.stages, p.x_bytes); 0 when it does not fit.
size_t decode_stack_prepare(DecodeStackParams& p, int32_t max_k);
// Device scratch of p's shapes (hq, hkv, hd, splits set) for an MLP of `inter`: its bytes, and, when base is
// not null, p.qkv / attn / act / partials / control pointed into it.
size_t decode_stack_scratch(DecodeStackParams& p, int32_t inter, void* base);
// CTAs per SM the kernel can keep resident with `smem` bytes (the grid must be one per SM, all resident).
int decode_stack_ctas_per_sm(size_t smem);
// The kernel instance launch_decode_stack runs for p ("generic", "bf16_hd128", "fp8_hd64", ...).
const char* decode_stack_instance_name(const DecodeStackParams& p);
// Zeroes p.control and launches `grid` cooperative CTAs (one per SM).
cudaError_t launch_decode_stack(const DecodeStackParams& p, int grid, size_t smem, cudaStream_t stream);

}  // namespace inferx::cuda
