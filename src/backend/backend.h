#pragma once
// The device interface the transformer is written against. The CPU backend (backend/cpu) and the CUDA
// backend (backend/cuda) implement it; fusion lives behind these calls, not in model code.
// Activations are F32 on the CPU backend. All tensors passed to a backend live in its memory.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/batch.h"
#include "backend/decode_stack.h"
#include "backend/fused_linear.h"
#include "backend/linear.h"
#include "backend/token_sampling.h"
#include "core/error.h"
#include "core/random_fill.h"
#include "core/tensor.h"
#include "formats/model_config.h"

namespace inferx {

// One layer's paged KV cache: K and V of shape [num_blocks, block_size, num_kv_heads, head_dim].
struct KvCacheLayer {
  Tensor k;
  Tensor v;
  int64_t block_size() const { return k.dim(1); }
};

struct RopeParams {
  int64_t head_dim = 0;
  float theta = 10000.0f;
  RopeLayout layout = RopeLayout::NeoX;
  RopeScaling scaling;

  bool operator==(const RopeParams&) const = default;
};

struct AttentionParams {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;          // usually 1/sqrt(head_dim)
  int64_t sliding_window = 0;  // 0: full causal; else a query at p sees keys in (p - window, p]
};

// Memory owned by a backend: device memory (allocate), or host memory the device copies from without
// staging (allocate_upload).
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
};

// interleave_row_blocks' shapes (both backends): x [blocks * L, C] and out [L, blocks * C] of one dtype, both
// contiguous; returns L.
inline int64_t check_row_blocks(const Tensor& x, int64_t blocks, const Tensor& out, const char* who) {
  INFERX_CHECK(blocks > 0 && x.ndim == 2 && out.ndim == 2 && x.dtype == out.dtype && x.rows() % blocks == 0 &&
                   out.rows() == x.rows() / blocks && out.cols() == x.cols() * blocks,
               "{}: interleave_row_blocks of {} blocks from {} {} into {} {}", who, blocks,
               dtype_name(x.dtype), x.shape_string(), dtype_name(out.dtype), out.shape_string());
  return x.rows() / blocks;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // Memory -------------------------------------------------------------------------------------------
  virtual std::unique_ptr<DeviceBuffer> allocate(size_t bytes) = 0;  // zero-filled
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;
  // Issues whatever the backend holds back (a deferred epilogue) and forgets what it derived from tensors
  // it may not see change (a cached BF16 copy of an input): the caller is about to read or write tensors
  // outside the backend, ordered after the work issued so far (a collective on the backend's stream:
  // communicator.h). Unlike synchronize(), it does not wait.
  virtual void flush() {}
  // Host memory for per-step uploads (upload_async); CUDA: page-locked, so that a copy from it needs no
  // staging and the call returns at once; CPU: allocate's (host) memory.
  virtual std::unique_ptr<DeviceBuffer> allocate_upload(size_t bytes) = 0;
  // Queues a copy from host memory to device memory behind the work already issued, without waiting for
  // it: the caller leaves host_src unchanged until the device has made the copy (after the next
  // synchronize() or copy_to_host()). The default copies at once (copy_to_device).
  virtual void upload_async(void* dst, const void* host_src, size_t bytes) {
    copy_to_device(dst, host_src, bytes);
  }
  // An upload that needs only the work queued up to the last mark_upload_point() done: the caller promises
  // that nothing queued since the mark reads or writes dst. Work queued after it sees the copy, as after
  // upload_async. CUDA may run it on a side stream beside the work queued since the mark (a decode step's
  // sampling), so the next step's metadata is on the device when that work ends. Without a mark since the
  // last such upload it is upload_async; the defaults keep stream order.
  virtual void mark_upload_point() {}
  virtual void upload_async_after_mark(void* dst, const void* host_src, size_t bytes) {
    upload_async(dst, host_src, bytes);
  }

  // Ops (shapes: T = batch.num_tokens, D = hidden size) ----------------------------------------------
  // out[t, :] = table[ids[t], :] converted to F32. table may be any weight dtype. Ids outside the table:
  // the CPU backend throws, CUDA writes zero rows (no host check per step; the engine validates prompt ids
  // at admission).
  virtual void embedding(const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) = 0;
  // One shard of a vocabulary split over ranks: out[t, :] = table[ids[t] - first_id, :] where that row
  // exists (first_id <= ids[t] < first_id + rows), else zeros.
  virtual void embedding_shard(const Tensor& table, const int32_t* ids, int64_t n, int64_t first_id,
                               Tensor& out) = 0;
  // out = x / rms(x) * weight, row-wise.
  virtual void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // residual += x; out = rmsnorm(residual) (the fused pre-norm of the next sub-layer).
  virtual void add_rmsnorm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                           Tensor& out) = 0;
  // In-place RMSNorm over each head of x [T, heads * head_dim] with weight [head_dim] (Qwen3 q/k norm).
  virtual void head_rmsnorm(Tensor& x, int64_t head_dim, const Tensor& weight, float eps) = 0;
  // out[T, N] = x[T, K] @ W[N, K]^T (+ bias).
  virtual void matmul(const Tensor& x, const Linear& w, Tensor& out) = 0;
  // Applies RoPE at batch.positions to q [T, Hq*hd] and k [T, Hkv*hd] in place, then writes k and v
  // into the paged cache at (block_tables[seq][pos / bs], pos % bs). When q / k / v are the outputs of the
  // norm_matmul_split just before, a backend may read them from that product directly: k and v then stay
  // unwritten (callers read q and the cache only).
  virtual void rope_and_write_kv(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch,
                                 const RopeParams& rope, KvCacheLayer& cache) = 0;
  // Causal attention of q [T, Hq*hd] over each sequence's cached keys/values (positions < seq_len,
  // and <= the query's own position) -> out [T, Hq*hd]. GQA: query head h reads kv head h / (Hq/Hkv).
  virtual void attention(const Tensor& q, const KvCacheLayer& cache, const BatchView& batch,
                         const AttentionParams& params, Tensor& out) = 0;
  // rope_and_write_kv then attention, one layer's: what the model calls, so that a backend may do both in
  // one kernel (CUDA: the decode attention kernel rotates the queries and writes the newest keys itself in
  // decode steps). Afterwards q and k hold unspecified values (rotated or not); the cache and out are those
  // of the two calls.
  virtual void rope_attention(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch,
                              const RopeParams& rope, KvCacheLayer& cache, const AttentionParams& params,
                              Tensor& out) {
    rope_and_write_kv(q, k, v, batch, rope, cache);
    attention(q, cache, batch, params, out);
  }
  // out = silu(gate) * up, element-wise; gate/up/out [T, F].
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // out[i, :] = x[rows[i], :]
  virtual void gather_rows(const Tensor& x, const int32_t* rows, int64_t n, Tensor& out) = 0;
  // x holds `blocks` blocks of L rows each ([blocks * L, C], any dtype, contiguous); out [L, blocks * C]:
  // out[l, b * C + c] = x[b * L + l, c]. The tensor-parallel logits, all-gathered rank after rank, as one
  // row per token (no row table: a recorded step stays right whatever other steps ran in between).
  virtual void interleave_row_blocks(const Tensor& x, int64_t blocks, Tensor& out) = 0;

  // Optional capabilities (defaults: what the CPU backend does) ---------------------------------------
  // The element type KvCache allocates (F32 everywhere today; the CUDA backend stores BF16).
  virtual DType kv_cache_dtype() const { return DType::F32; }
  // Fills a F32/F16/BF16 tensor with values generated in device memory as `fill` says
  // (core/random_fill.h: dummy weights without a host copy, a tensor-parallel rank's slice of them).
  // Returns false when the backend cannot (the CPU backend: its dummy models are generated on the host by
  // DummySource's own per-row streams, so `dummy:` weights differ between the CPU and a GPU; the loader
  // calls this only for sources that ask for device generation and refuses a backend that declines).
  // Quantized payloads (CUDA): F8_E4M3 codes of the same values, INT4 uniformly random codes, U8
  // clamp(round(value)).
  virtual bool fill_random(Tensor& t, const RandomFill& fill) { return false; }
  // Token selection where the logits are: one id per row of logits [rows, vocab] F32 (backend memory)
  // written to host_ids, with one small copy back. params: one per row (host memory), or null for greedy
  // on every row. Returns false when the backend cannot (the caller copies the logits and samples on the
  // host).
  virtual bool sample_tokens(const Tensor& logits, const TokenSampleParams* params, int32_t* host_ids) {
    return false;
  }
  // Applies `n` LogitEdits (host memory) to logits [rows, vocab] F32 in backend memory, queued before a
  // later sample_tokens: a request's logit_bias and penalties without copying its row to the host. Returns
  // false when the backend cannot (the caller samples those rows on the host; nothing was changed). A
  // backend that edits must also sample_tokens: the host path applies the edits itself (twice, otherwise).
  virtual bool edit_logits(Tensor& logits, const LogitEdit* edits, int64_t n) { return false; }
  // Asynchronous token selection, for the engine's overlapped decode steps (step N + 1 is launched before
  // step N's ids reach the host; engine.cpp). Two id slots alternate. async_sampling() says what a backend
  // can do. sample_tokens_async queues what sample_tokens does, into slot `slot`'s device ids and a copy of
  // them to the host, and returns at once; wait_sampled_tokens waits for that copy and returns the `rows`
  // ids; gather_sampled_tokens queues out[i] = ids[slot][rows[i]] (rows and out: int32 in backend memory,
  // e.g. the next step's token-id row), so the next step reads its input tokens where they were sampled.
  virtual bool async_sampling() const { return false; }
  virtual void sample_tokens_async(const Tensor& logits, const TokenSampleParams* params, int slot) {
    fail("backend {}: sample_tokens_async is not supported (async_sampling() is false)", name());
  }
  virtual void wait_sampled_tokens(int slot, int32_t* host_ids, int64_t rows) {
    fail("backend {}: wait_sampled_tokens is not supported (async_sampling() is false)", name());
  }
  virtual void gather_sampled_tokens(int slot, const int32_t* rows, int64_t n, int32_t* out) {
    fail("backend {}: gather_sampled_tokens is not supported (async_sampling() is false)", name());
  }
  // Free and total bytes of the backend's own device memory (cudaMemGetInfo); false when it has none of
  // its own (CPU: the engine then sizes the KV cache from --kv-cache-memory).
  virtual bool memory_info(size_t& free_bytes, size_t& total_bytes) { return false; }
  // Graph capture of a whole step (CUDA graphs). Between begin_graph_capture() returning true and
  // end_graph_capture, ops are recorded, not run: every pointer they use (weights, workspace, the batch
  // metadata buffers) must stay the same for later replays, and no call may copy or synchronize.
  // end_graph_capture(key, false) discards the recording (after an error); without a capture in progress
  // end_graph_capture does nothing (an error path may end "whatever is open"). replay_graph(key) runs a
  // recording and returns false when there is none (or the backend's own buffers moved since: capture
  // again; any allocate() counts as such a move). The caller rewrites the metadata buffers in place
  // before each replay.
  virtual bool begin_graph_capture() { return false; }
  virtual void end_graph_capture(uint64_t key, bool keep = true) {}
  virtual bool replay_graph(uint64_t key) { return false; }
  // Whether replay_graph(key) would replay (a recording exists and is still valid); runs nothing.
  virtual bool has_graph(uint64_t key) const { return false; }
  virtual void drop_graph(uint64_t key) {}
  virtual void clear_graphs() {}

  // Fused projections (model/fused_projections.h stacks q/k/v and gate/up at load when asked) --------
  virtual bool prefers_fused_projections() const { return false; }
  // The row granularity of the backend's matrix products: leaving out fewer rows than this saves no work
  // (a GPU GEMM's row tile), so the model narrows a step's last layer to its logits rows only when it
  // saves at least this many (Model::forward). 1: every row costs its own work (the CPU).
  virtual int64_t product_row_tile() const { return 1; }
  // Whether that narrowing may also take steps with decode rows (mixed steps). The CPU: yes (fewer rows,
  // less work). The CUDA backend: no (measured slower there, docs/benchmarks.md 2026-12-05).
  virtual bool narrows_mixed_steps() const { return true; }
  // outs[i] = x @ W_i^T (+ b_i), where W_i is the i-th row range of w (ranges in order, each as many rows
  // as outs[i] has columns). Default: one matmul per row slice.
  virtual void matmul_split(const Tensor& x, const Linear& w, std::span<Tensor* const> outs) {
    int64_t begin = 0;
    for (Tensor* o : outs) {
      matmul(x, linear_rows(w, begin, o->cols()), *o);
      begin += o->cols();
    }
  }
  // out = silu(x @ G^T + bg) * (x @ U^T + bu) for w = [G; U] stacked (2F rows); gate and up [T, F] are
  // workspace for the default (two matmuls, then silu_mul).
  virtual void matmul_silu_mul(const Tensor& x, const Linear& w, Tensor& gate, Tensor& up, Tensor& out) {
    const int64_t f = w.out_features() / 2;
    matmul(x, linear_rows(w, 0, f), gate);
    matmul(x, linear_rows(w, f, f), up);
    silu_mul(gate, up, out);
  }
  // The pre-norm transformer's residual stream around its norms. pre_norm: residual += add (add null:
  // residual as is), h = rmsnorm(residual) * norm. norm_matmul_split / norm_matmul_silu_mul: pre_norm, then
  // the product of h (one output: matmul; else matmul_split; matmul_silu_mul). matmul_before_norm: out =
  // x @ W^T where out is the `add` of the next pre_norm / norm_matmul_* on `residual` with `next_norm`,
  // which must be the next call on this backend. A backend may fuse across these calls: add out into the
  // residual in the product's epilogue and prepare the norm there (out then stays unwritten), fuse the norm
  // into the next product (h then stays unwritten): callers read only the products' outputs and residual.
  virtual void pre_norm(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h) {
    if (add) {
      add_rmsnorm(residual, *add, norm, eps, h);
    } else {
      rmsnorm(residual, norm, eps, h);
    }
  }
  virtual void norm_matmul_split(Tensor& residual, const Tensor* add, const Tensor& norm, float eps,
                                 Tensor& h, const Linear& w, std::span<Tensor* const> outs) {
    pre_norm(residual, add, norm, eps, h);
    if (outs.size() == 1) {
      matmul(h, w, *outs[0]);
    } else {
      matmul_split(h, w, outs);
    }
  }
  virtual void norm_matmul_silu_mul(Tensor& residual, const Tensor* add, const Tensor& norm, float eps,
                                    Tensor& h, const Linear& w, Tensor& gate, Tensor& up, Tensor& out) {
    pre_norm(residual, add, norm, eps, h);
    matmul_silu_mul(h, w, gate, up, out);
  }
  virtual void matmul_before_norm(const Tensor& x, const Linear& w, Tensor& out, Tensor& residual,
                                  const Tensor& next_norm, float eps) {
    matmul(x, w, out);
  }
  // The whole MLP block of a pre-norm layer: norm_matmul_silu_mul into act (w = [G; U] stacked), then
  // out = act @ down^T (matmul_before_norm with next_norm when given, else matmul). `add` and `out` may be
  // the same tensor (read before it is written). A backend may fuse across the products: act (and h) then
  // stay unwritten.
  virtual void norm_mlp(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h,
                        const Linear& gate_up, Tensor& gate, Tensor& up, Tensor& act, const Linear& down,
                        Tensor& out, const Tensor* next_norm) {
    norm_matmul_silu_mul(residual, add, norm, eps, h, gate_up, gate, up, act);
    if (next_norm) {
      matmul_before_norm(act, down, out, residual, *next_norm, eps);
    } else {
      matmul(act, down, out);
    }
  }
  // One whole decode step for a batch of exactly one token (embedding, every layer, final norm and the
  // logits into logits [1, vocab] F32; x [1, hidden] F32 is the residual-stream workspace), as
  // Model::forward would compute it, when the backend has a fused program for these weights, shapes and
  // cache; returns false, having done nothing, when it has not (the caller then runs the ops).
  virtual bool decode_stack(const DecodeStack& stack, const BatchView& batch, const RopeParams& rope,
                            const AttentionParams& attention, Tensor& x, Tensor& logits) {
    return false;
  }
  // The longest KV length (tokens) at which decode_stack takes a step (BatchView::max_seq_len at most this);
  // 0 when it has no such bound or takes none. Decode graphs record batch 1 once below it and once above, so
  // that an engine allowing long contexts still replays the fused program for its short ones.
  virtual int32_t decode_stack_context_bound() const { return 0; }
  // Copies between two places of this backend's memory (default: staged through the host).
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    copy_to_host(host.data(), src, bytes);
    copy_to_device(dst, host.data(), bytes);
  }
};

struct CpuBackendOptions {
  int num_threads = 0;  // 0: one per hardware thread
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options = {});

}  // namespace inferx
