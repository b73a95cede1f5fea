#pragma once
// Host-side launchers of the CUDA kernels (kernels_*.cu). Each enqueues its kernel on `stream` and
// returns cudaGetLastError(), which the caller wraps in CUDA_CHECK; shapes are validated by the caller
// (cuda_backend.cpp) before launch. Pointers are device pointers; matrices are row-major and contiguous.
// This header stays free of fmt and project headers beyond dtype.h so the .cu files compile quickly.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/sampling_params.h"
#include "core/dtype.h"
#include "core/random_fill.h"

namespace inferx::cuda {

// kernels_norm.cu -------------------------------------------------------------------------------------
// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w for each of `rows` rows of `cols` floats.
// When out_bf16 is not null the same values are also written there rounded to BF16 (the input of the
// next BF16 GEMM, so no separate conversion pass reads the F32 copy again).
cudaError_t launch_rmsnorm(const float* x, const float* w, float eps, int64_t rows, int64_t cols, float* out,
                           void* out_bf16, cudaStream_t stream);
// residual += x; out = rmsnorm(residual) row-wise (and the BF16 copy as above).
cudaError_t launch_add_rmsnorm(float* residual, const float* x, const float* w, float eps, int64_t rows,
                               int64_t cols, float* out, void* out_bf16, cudaStream_t stream);
// In place RMSNorm of each of `heads` contiguous vectors of head_dim floats (weight [head_dim]).
cudaError_t launch_head_rmsnorm(float* x, int64_t heads, int64_t head_dim, const float* w, float eps,
                                cudaStream_t stream);

// kernels_elementwise.cu ------------------------------------------------------------------------------
// out[t, :] = float(table[ids[t] - first_id, :]); table dtype F32, F16 or BF16, `rows` rows. Ids without a
// row give zero rows: a vocabulary shard's other tokens (first_id > 0), or bad ids (the host cannot see
// device ids without a sync; the engine validates ids before they reach here).
cudaError_t launch_embedding(DType table_dtype, const void* table, int64_t rows, int64_t dim,
                             const int32_t* ids, int64_t n, int64_t first_id, float* out,
                             cudaStream_t stream);
// out = silu(gate) * up over n floats (16-byte accesses when n and the pointers allow); out_bf16, when
// not null, receives the same values rounded to BF16.
cudaError_t launch_silu_mul(const float* gate, const float* up, int64_t n, float* out, void* out_bf16,
                            cudaStream_t stream);
// gate_up [t, 2f] BF16 (gate columns, then up columns, per row) -> out [t, f] F32 = silu(gate) * up, and
// its BF16 copy out_bf16 [t, f].
cudaError_t launch_silu_mul_stacked_bf16(const void* gate_up, int64_t t, int64_t f, float* out,
                                         void* out_bf16, cudaStream_t stream);
// t[i] = offset + uniform(-amp, amp) for n elements of dtype F32/F16/BF16 in rows of `cols`, a
// counter-based hash of (seed, the element's index in the tensor `fill` describes: core/random_fill.h):
// deterministic, and no host buffer.
cudaError_t launch_fill_random(DType dtype, void* t, int64_t n, int64_t cols, const RandomFill& fill,
                               cudaStream_t stream);
// The kernel replace_workspace_memsets (graph_rewrite.h) puts in a recorded graph instead of a small memset:
// (unsigned char* dst, unsigned bytes), one block of 32 threads; it waits for its predecessor
// (griddepcontrol.wait) and then zeroes dst[0, bytes).
const void* workspace_zero_kernel();
// out[i, :] = x[rows[i], :] with rows of row_bytes bytes (any dtype); out-of-range rows give zeros.
cudaError_t launch_gather_rows(const void* x, int64_t num_rows, int64_t row_bytes, const int32_t* rows,
                               int64_t n, void* out, cudaStream_t stream);
// F32 -> BF16 or F16 (round to nearest even), the activation conversion before a 16-bit GEMM.
cudaError_t launch_convert_f32(const float* x, int64_t n, DType to, void* out, cudaStream_t stream);
// out[r, :] += bias for rows x cols.
cudaError_t launch_add_bias(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);

// kernels_rope_kv.cu ----------------------------------------------------------------------------------
constexpr int kMaxRopePairs = 256;  // head_dim <= 512
struct RopeFrequencies {
  float inv_freq[kMaxRopePairs];  // backend/rope.h values, passed by value (kernel parameter space)
};
struct PagedKv {
  void* k = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] of `dtype`
  void* v = nullptr;
  DType dtype = DType::F32;  // F32, BF16 or F8_E4M3
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  // F8_E4M3 only: the cache holds k / k_scale and v / v_scale (saturated to +-448), per tensor.
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};
struct BatchArgs {  // device pointers of a BatchView
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  const int32_t* positions = nullptr;
  const int32_t* query_start = nullptr;
  const int32_t* seq_lens = nullptr;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
};
// Rotates q [T, hq*hd] and k [T, hkv*hd] in place (interleaved pairs (2i, 2i+1) or NeoX pairs (i, i+hd/2))
// and writes the rotated k and v [T, hkv*hd] into the paged cache (F32, BF16, or FP8 E4M3 of k / k_scale
// and v / v_scale, rounded to nearest and saturated to +-448).
// product (not null): the deferred q/k/v product of a fused projection (QuantizedGemm::pending(), the
// split epilogue's Fp8Epilogue: BF16 sums [T, (hq + 2 hkv) hd], q / k / v columns in that order) is read
// instead of q, k and v, its W8A8 values exactly as the epilogue would have written them; q is written
// (rotated), k and v are not (rope_takes_product says which products it takes; else cudaErrorInvalidValue).
struct Fp8Epilogue;
bool rope_takes_product(const Fp8Epilogue& e, int64_t hq, int64_t hkv, int64_t hd, int64_t tokens);
cudaError_t launch_rope_write_kv(float* q, float* k, const float* v, int64_t hq, int64_t hkv, int64_t hd,
                                 bool interleaved, const RopeFrequencies& freqs, const BatchArgs& batch,
                                 const PagedKv& cache, cudaStream_t stream,
                                 const Fp8Epilogue* product = nullptr);
// Tests and benchmarks: the per-token-block RoPE kernel for launches of many tokens (1: always, 0: never,
// -1: INFERX_ROPE_TOKEN_BLOCKS, else from 64 tokens; kernels_rope_kv.cu).
void set_rope_token_blocks(int mode);
// Tests and benchmarks: the token kernel with four pairs per thread (NeoX, F32 q / k / v; 1: where it
// applies, 0: never, -1: INFERX_ROPE_VEC, on unless 0; kernels_rope_kv.cu).
void set_rope_vector(int mode);

// kernels_attention.cu --------------------------------------------------------------------------------
constexpr int kMaxAttentionHeadDim = 256;
// Causal paged attention of q [T, hq*hd] -> out [T, hq*hd] (see Backend::attention). The v0 kernel: any
// head_dim up to 256, F32, BF16 or FP8 cache; the fallback of the two fast kernels below.
cudaError_t launch_paged_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                   int64_t hkv, int64_t hd, float scale, int64_t sliding_window, float* out,
                                   cudaStream_t stream);

// kernels_decode_attention.cu -------------------------------------------------------------------------
// Split-KV ("flash decoding") attention on tensor cores for BF16 or FP8 caches and head_dim 64 or 128:
// one CTA per (token, kv head, group of up to 16 query heads, split) reads its slice of the keys once
// for all the query heads of the group; the last CTA of a (token, group) merges the splits' partials.
// Any token works (a prefill token too), but it pays for one-token queries.
constexpr int kDecodeMaxSplits = 64;
// How a decode launch cuts each token's keys: `splits` CTAs per (token, group) in the grid, each taking
// ceil(tiles / splits) 64-key tiles of its token but at least `min_tiles` (v3; v1/v2 take 1), so a token
// whose context is shorter than the one the plan was made for uses fewer splits (the rest return at once).
struct DecodeSplitPlan {
  int splits = 1;
  int min_tiles = 1;
};
// The plan for `tokens` queries of `kv_heads` groups with block tables of `max_keys` keys (a captured
// graph's capacity: the actual contexts may be shorter) on `sms` SMs over a `cache` (F8_E4M3 or BF16) cache.
// v3: the split count with the least estimated time (waves of CTAs x (tiles per split + a fixed cost per
// CTA + a merge cost per split), calibrated on the H200), and min_tiles so that contexts shorter than
// max_keys split only when the launch cannot fill the GPU anyway; v2 and v1: their older models, min_tiles 1.
DecodeSplitPlan decode_attention_plan(int64_t tokens, int64_t kv_heads, int64_t hq, int64_t max_keys, int sms,
                                      DType cache);
// Bytes of scratch the split partials need (0 when splits == 1).
size_t decode_attention_scratch_bytes(int64_t tokens, int64_t hq, int64_t hd, int splits);
// int32 tickets the merge needs when splits > 1: zero before the first launch; each launch leaves them
// zero again.
int64_t decode_attention_counters(int64_t tokens, int64_t hq, int64_t hkv);
bool decode_attention_supported(const PagedKv& cache, int64_t hd);
// The RoPE + KV write of a decode step done by the v3 decode kernel itself (launch_decode_attention's
// rope), so that a decode layer has one kernel boundary fewer (RoPE kernel -> attention). q then holds the
// query before RoPE (it stays so: each lane rotates its own values in registers), k and v the new token's
// key and value before RoPE; the CTA whose split holds a token's newest key rotates it, writes it and its
// value into the token's cache slot (the values launch_rope_write_kv writes: rope_math.cuh) and over the
// stale row its last tile's copy brought. Only where decode_attention_takes_rope says
// so. Why: at batch 1 the RoPE kernel adds 1.6-2.0 us per layer on an H100 (timelines, 2026-12-07) and each
// boundary ~3.75 us on an H200 (docs/architecture.md, batch-1 decode). Measured (H100, 2026-12-07, 8B at 1k
// context): fp8:lm_head -0.4%, bf16 -0.55%, int4:lm_head -1.1%, -0.95 us per layer.
constexpr int kDecodeRopeMaxPairs = 64;  // head_dim <= 128
struct DecodeRope {
  const float* k = nullptr;                  // [T, hkv * hd] F32
  const float* v = nullptr;                  // [T, hkv * hd] F32
  int interleaved = 0;                       // pairs (2i, 2i + 1); else NeoX (i, i + hd / 2)
  float inv_freq[kDecodeRopeMaxPairs] = {};  // backend/rope.h values (the RoPE kernels' RopeFrequencies)
  // The deferred q/k/v product (launch_rope_write_kv's product, which rope_takes_product accepts; copied at
  // the launch): its W8A8 values are read instead of q, k and v, which then were never written.
  const Fp8Epilogue* product = nullptr;
};
// Whether launch_decode_attention takes a DecodeRope for this launch: the v3 kernel (power-of-two blocks,
// aligned buffers), groups of at most 16 query heads (one CTA per kv head and split writes its key), and the
// switch (decode_rope_fused) on.
bool decode_attention_takes_rope(const PagedKv& cache, int64_t hq, int64_t hkv, int64_t hd, const float* q,
                                 const float* out, const void* out_bf16);
// INFERX_DECODE_ROPE=0|1 (read once; default 1); set_decode_rope_fused for tests (1 on, 0 off, -1 the
// environment); the count of launches that took a DecodeRope, for tests.
bool decode_rope_fused();
void set_decode_rope_fused(int mode);
// Whether the backend hands the decode kernel a deferred q/k/v product (DecodeRope::product; FP8 decode
// steps from 64 rows): INFERX_DECODE_ROPE_PRODUCT=0|1 (read once; default 1), set_... for tests (1 on, 0 off,
// -1 the environment). Off: those steps keep the RoPE kernel reading the product. Measured (H100, 2026-12-07,
// 1000 x 1000/1000 FP8 + FP8 KV offline): 15,121 / 15,098 output tok/s on against 15,071 off (+0.2..+0.3%).
bool decode_rope_product();
void set_decode_rope_product(int mode);
uint64_t decode_rope_launches();
// out [tokens, hq * hd] F32; out_bf16 (may be null) receives the same values rounded to BF16. rope (may be
// null): DecodeRope above (cudaErrorInvalidValue where decode_attention_takes_rope is false).
cudaError_t launch_decode_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                    int64_t hkv, int64_t hd, float scale, int64_t sliding_window,
                                    DecodeSplitPlan plan, void* scratch, int* counters, float* out,
                                    void* out_bf16, cudaStream_t stream, const DecodeRope* rope = nullptr);
// Terms of Q and P in the v3 kernel's products over an FP8 cache (INFERX_DECODE_ATTN_TERMS, read once):
// 1 (default) multiplies the F16-rounded Q and P (11 significant bits; the cache's E4M3 values convert to F16
// exactly), 2 adds each one's rounding error as a second F16 term (22 bits: F32-equivalent, twice the
// tensor-core work). One term, measured on the H200 (2026-12-05) against float64 attention over the same
// cache: up to 2.4e-4 rel norm / 2.6e-4 abs at unit-scale queries, where E4M3's own rounding of K and V is
// up to 2^-4 (6e-2); and the 1000 x 1000/1000 FP8 run is power-limited (700 W cap active in 595 of 599
// samples, SM clock 1730 MHz mean), so the halved tensor-core work is worth +3.1% there (17,276 vs 16,751
// output tok/s). BF16 caches always take two terms.
int decode_attention_terms();
// Whether the decode (v3) and prefill (wg) attention kernels skip the running output's rescale when no row's
// maximum moved (every correction factor exactly 1: a warp-uniform test, so the results are bit-identical to
// the unconditional rescale). INFERX_ATTN_LAZY_RESCALE=1 (read once; off by default until a GPU run measures
// it; set_attention_lazy_rescale for tests: 1 on, 0 off, -1 the environment). Why: the rescale is 32 (decode)
// / 64 (prefill) multiplies per lane and tile - about a tenth of the decode kernel's ~285 per-tile SASS
// instructions (cuobjdump count, not a timing) - and a row's running maximum is expected to move in ever
// fewer tiles as its keys accumulate. Measured (H100, 2026-12-06 18:20): decode attention level (it streams
// at 95-96% of copy there), prefill T8192 -1 to -2%, 1000-token prompts level, 1000/1000 level (-0.5%): off.
bool attention_lazy_rescale();
void set_attention_lazy_rescale(int mode);
// The v3 decode kernel's cluster form (finish_decode_cluster, decode_attention_epilogue.cuh): where a launch
// of one n-tile with splits runs in one wave (batch 1 and the like), the splits of a group become one
// thread-block cluster of up to 16 CTAs that merge through rank 0's shared memory instead of global partials
// and a ticket. INFERX_DECODE_CLUSTER=0|1 (read once; default 1); set_... for tests (1 on, 0 off, -1 the
// environment); the count of launches that took it, for tests. Measured (H100, 2026-12-07, 8B batch 1 at 1k
// context, two rounds in one call): fp8:lm_head 3.344 / 3.341 -> 3.313 / 3.314 ms (-0.9%), bf16 5.763 /
// 5.763 -> 5.742 / 5.743 (-0.35%). Rank 0's merge area in its own tiles instead (no extra shared memory, one
// CTA per SM again) measured 3.321 / 3.326 against 3.313 / 3.317 (H100, 12-07 11:00): its tiles phase did not
// shorten (3.56 us against 3.60 per CTA), so it was removed.
bool decode_attention_cluster();
void set_decode_attention_cluster(int mode);
uint64_t decode_attention_cluster_launches();
// INFERX_DECODE_ATTN_STAMPS=1 (a diagnosis switch, read by setup): the v3 decode kernel records per-CTA phase
// time stamps on the current device (setup: once, before any capture), and report prints their medians per
// launch to stderr (decode_attention_stamps.h / .cpp). Both do nothing when the switch is off.
void setup_decode_attention_stamps();
void report_decode_attention_stamps();
// Whether launch_decode_attention rounds Q and P to F16 once for a cache of `dtype` with `block_size`-key
// blocks (and the engine's aligned buffers): the v3 kernel over an FP8 cache with one term; the other
// kernels are F32-equivalent.
bool decode_attention_rounds_once(DType dtype, int64_t block_size);
// How the v3 kernel scales Q before rounding it: q * q_mult in F32, the scores in the log2 domain s_scale
// times the products. Over an FP8 cache q_mult = scale * log2(e) * k_scale brought into [1/32, 1/16) by a
// power of two that s_scale gives back (exact), so that Q's F16 values stay normal for small k_scale and
// finite up to |q| ~ 5e5; over BF16, q_mult = scale * log2(e) and s_scale 1.
struct DecodeQueryScaling {
  float q_mult, s_scale;
};
DecodeQueryScaling decode_query_scaling(float scale, DType dtype, float k_scale);
// The v3 kernel (kernels_decode_attention_v3.cu) behind launch_decode_attention, which checks the arguments
// (power-of-two block sizes and aligned buffers only; the others go to v2).
cudaError_t launch_decode_attention_v3(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq,
                                       int hkv, int hd, float scale, int64_t window, DecodeSplitPlan plan,
                                       void* scratch, int* counters, float* out, void* out_bf16,
                                       cudaStream_t stream, const DecodeRope* rope);

// kernels_read_stream.cu: the read-only bandwidth ceiling. Reads bytes (a multiple of 16, 16-byte aligned)
// at p once with sms * 8 blocks; sink: a device word it almost never writes.
cudaError_t launch_read_stream(const void* p, size_t bytes, uint32_t* sink, int sms, cudaStream_t stream);
// The same read on exactly `sms` SMs (one CTA of 1024 threads each, holding most of an SM's shared memory).
cudaError_t launch_read_stream_on_sms(const void* p, size_t bytes, uint32_t* sink, int sms,
                                      cudaStream_t stream);

// kernels_sync_probes.cu: `rounds` grid-wide barriers of `ctas` CTAs (at most one per SM; a cooperative
// launch) with nothing between them, so the time per round is the barrier's own. variant 0: the persistent
// decode kernel's (kernels_decode_stack.cu), 1: with a fence before the arrival, 2: a generation flag.
// words: two device words (zeroed here).
cudaError_t launch_barrier_probe(int variant, uint32_t* words, int rounds, int ctas, cudaStream_t stream);
// The persistent kernel's barrier while each CTA's producer warp keeps `depth` 16 KB bulk copies of its own
// slice of src (slice_bytes, a multiple of 16 KB, cycled) in flight; streamed[CTA] gets the bytes copied
// (kernels_sync_probes.cu). depth 0..12; 0: no stream. writes (null: none; else ctas x 64 floats): each CTA
// stores 64 floats before every round, as a phase stores its outputs before the barrier that publishes them.
cudaError_t launch_barrier_stream_probe(uint32_t* counter, int rounds, int ctas, const void* src,
                                        int64_t slice_bytes, int depth, unsigned long long* streamed,
                                        float* writes, cudaStream_t stream);
// One kernel of `ctas` CTAs of `threads` threads that does nothing but wait for its predecessor (with
// programmatic dependent launch when pdl, and pdl_enabled()) and add one to *word: chained in a CUDA graph,
// the cost of a kernel boundary alone.
cudaError_t launch_boundary_probe(uint32_t* word, int ctas, int threads, bool pdl, cudaStream_t stream);

// kernels_prefill_attention.cu ------------------------------------------------------------------------
// FlashAttention-2 style tiled attention on tensor cores (wgmma, BF16 operands, F32 accumulation) for
// BF16 or FP8 caches and head_dim 64 or 128: one CTA per (query tile of a sequence, query head), key
// tiles gathered from the paged cache into shared memory. `max_query_len` bounds the tiles per sequence
// (at most 65535 tiles of 64). Unsupported: other dtypes / head dims, and caches of 2^31 or more token
// slots (num_blocks * block_size).
bool prefill_attention_supported(const PagedKv& cache, int64_t hd);
// Which configuration runs: "g3" (the default), "g2" or "g3p" (g3 with the GQA heads of a KV head packed
// into a CTA's rows), see kernels_prefill_attention.cu;
// INFERX_PREFILL_ATTN sets it per process, this call overrides it (A/B benchmarks), nullptr returns to
// the environment's choice.
void set_prefill_attention_variant(const char* name);
cudaError_t launch_prefill_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                     int64_t hkv, int64_t hd, float scale, int64_t sliding_window,
                                     int64_t max_query_len, float* out, cudaStream_t stream);

// kernels_sampling.cu ---------------------------------------------------------------------------------
// Per-row parameters: SampleParams (sampling_params.h), an array in device memory.
// ids[r] = argmax of logits[r, :vocab] (the lowest index among equal maxima). Up to cluster_rows_max rows
// take a cluster of CTAs per row (CudaBackendOptions::select_cluster_rows), more one CTA per row.
cudaError_t launch_argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, cudaStream_t stream,
                          int64_t cluster_rows_max = 0);
// ids[r] = a token drawn from softmax(logits[r] / temperature) after top-k, then top-p over the
// renormalised top-k set, then min-p (relative to the most likely token): the first index, in vocabulary
// order, where the running sum of the kept weights exceeds uniform * their total.
// Up to cluster_rows_max rows take a cluster of CTAs per row, as launch_argmax.
cudaError_t launch_sample(const float* logits, int64_t rows, int64_t vocab, const SampleParams* params,
                          int32_t* ids, cudaStream_t stream, int64_t cluster_rows_max = 0);
// Applies n LogitEdits (device memory; distinct (row, token) pairs within [rows, vocab]) to logits in place
// with the host processors' rounding: one IEEE operation at a time (token_sampling.h).
cudaError_t launch_logit_edits(float* logits, int64_t vocab, const LogitEdit* edits, int64_t n,
                               cudaStream_t stream);

}  // namespace inferx::cuda
