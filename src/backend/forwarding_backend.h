#pragma once
// A Backend that passes every call to another one, for wrappers that change one or two behaviours (record
// matmul inputs for calibration, decline graph capture for a tensor-parallel rank, fake device sampling in
// tests): derive and override only those. Graph capture is deliberately not forwarded (a wrapper sits
// outside what the inner backend can record); a wrapper that wants it overrides the hooks.
#include <memory>
#include <string>

#include "backend/backend.h"

namespace inferx {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  Backend& inner() const { return inner_; }

  Device device() const override { return inner_.device(); }
  std::string name() const override { return inner_.name(); }
  std::unique_ptr<DeviceBuffer> allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    inner_.copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    inner_.copy_to_host(dst, src, bytes);
  }
  void synchronize() override { inner_.synchronize(); }
  void flush() override { inner_.flush(); }
  std::unique_ptr<DeviceBuffer> allocate_upload(size_t bytes) override {
    return inner_.allocate_upload(bytes);
  }
  void upload_async(void* dst, const void* src, size_t bytes) override {
    inner_.upload_async(dst, src, bytes);
  }
  void mark_upload_point() override { inner_.mark_upload_point(); }
  void upload_async_after_mark(void* dst, const void* src, size_t bytes) override {
    inner_.upload_async_after_mark(dst, src, bytes);
  }
  void embedding(const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) override {
    inner_.embedding(table, ids, n, out);
  }
  void embedding_shard(const Tensor& table, const int32_t* ids, int64_t n, int64_t first_id,
                       Tensor& out) override {
    inner_.embedding_shard(table, ids, n, first_id, out);
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    inner_.rmsnorm(x, w, eps, out);
  }
  void add_rmsnorm(Tensor& residual, const Tensor& x, const Tensor& w, float eps, Tensor& out) override {
    inner_.add_rmsnorm(residual, x, w, eps, out);
  }
  void head_rmsnorm(Tensor& x, int64_t head_dim, const Tensor& w, float eps) override {
    inner_.head_rmsnorm(x, head_dim, w, eps);
  }
  void matmul(const Tensor& x, const Linear& w, Tensor& out) override { inner_.matmul(x, w, out); }
  void rope_and_write_kv(Tensor& q, Tensor& k, const Tensor& v, const BatchView& batch,
                         const RopeParams& rope, KvCacheLayer& cache) override {
    inner_.rope_and_write_kv(q, k, v, batch, rope, cache);
  }
  void attention(const Tensor& q, const KvCacheLayer& cache, const BatchView& batch, const AttentionParams& p,
                 Tensor& out) override {
    inner_.attention(q, cache, batch, p, out);
  }
  // rope_attention is deliberately not forwarded: Backend's default calls rope_and_write_kv and attention
  // on this wrapper, so that a wrapper overriding either sees every call (the inner backend's fusion of
  // the two is then not used under a wrapper).
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    inner_.silu_mul(gate, up, out);
  }
  void gather_rows(const Tensor& x, const int32_t* rows, int64_t n, Tensor& out) override {
    inner_.gather_rows(x, rows, n, out);
  }
  void interleave_row_blocks(const Tensor& x, int64_t blocks, Tensor& out) override {
    inner_.interleave_row_blocks(x, blocks, out);
  }
  DType kv_cache_dtype() const override { return inner_.kv_cache_dtype(); }
  bool fill_random(Tensor& t, const RandomFill& fill) override { return inner_.fill_random(t, fill); }
  bool sample_tokens(const Tensor& logits, const TokenSampleParams* params, int32_t* host_ids) override {
    return inner_.sample_tokens(logits, params, host_ids);
  }
  bool edit_logits(Tensor& logits, const LogitEdit* edits, int64_t n) override {
    return inner_.edit_logits(logits, edits, n);
  }
  bool async_sampling() const override { return inner_.async_sampling(); }
  void sample_tokens_async(const Tensor& logits, const TokenSampleParams* params, int slot) override {
    inner_.sample_tokens_async(logits, params, slot);
  }
  void wait_sampled_tokens(int slot, int32_t* host_ids, int64_t rows) override {
    inner_.wait_sampled_tokens(slot, host_ids, rows);
  }
  void gather_sampled_tokens(int slot, const int32_t* rows, int64_t n, int32_t* out) override {
    inner_.gather_sampled_tokens(slot, rows, n, out);
  }
  bool memory_info(size_t& free_bytes, size_t& total_bytes) override {
    return inner_.memory_info(free_bytes, total_bytes);
  }
  bool prefers_fused_projections() const override { return inner_.prefers_fused_projections(); }
  int64_t product_row_tile() const override { return inner_.product_row_tile(); }
  bool narrows_mixed_steps() const override { return inner_.narrows_mixed_steps(); }
  void matmul_split(const Tensor& x, const Linear& w, std::span<Tensor* const> outs) override {
    inner_.matmul_split(x, w, outs);
  }
  void matmul_silu_mul(const Tensor& x, const Linear& w, Tensor& gate, Tensor& up, Tensor& out) override {
    inner_.matmul_silu_mul(x, w, gate, up, out);
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    inner_.copy_on_device(dst, src, bytes);
  }

 private:
  Backend& inner_;
};

}  // namespace inferx
