// RoPE (RoFormer, Su et al. 2021, eq. 34) on q and k, fused with the paged KV-cache write.
// Pair i of a head is rotated by angle = position * inv_freq[i]; the inverse frequencies (with Linear or
// Llama3 scaling folded in) come from backend/rope.h on the host, exactly the CPU backend's values, and
// the angle is formed in float as the CPU backend and transformers do. Layouts: interleaved rotates
// (x[2i], x[2i+1]); NeoX rotates (x[i], x[i + d/2]) (transformers' rotate_half).
// FP8 caches store E4M3 of k / k_scale and v / v_scale, rounded to nearest even and saturated to +-448
// (the per-tensor scheme of vLLM's fp8 KV cache; scale 1.0 by default).
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int64_t kRopeBlockThreads = 512;  // threads per block: several heads of hd / 2 pairs

template <class CacheT>
__device__ __forceinline__ void store_kv(CacheT* dst, float v, float /*inv_scale*/) {
  *dst = from_float<CacheT>(v);
}
template <>
__device__ __forceinline__ void store_kv<uint8_t>(uint8_t* dst, float v, float inv_scale) {
  *dst = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * inv_scale, __NV_SATFINITE, __NV_E4M3));
}

// Grid (token, group of heads); block (hd / 2, heads per block): q heads first, then k heads; one thread per
// rotated pair, each forming its own angle. A k head's threads also write the rotated key and its v head
// into the token's cache slot (each thread the two elements of its pair). One block per token (the first
// version) ran one long dependent loop over all heads: 15.6 us per decode layer at batch 1 on the H200
// (ncu, 2026-12-03); one 64-thread block per (token, head) took 4.3 us there but 102 us for a 2048-token
// chunk (82k tiny blocks: block launch rate), hence several heads per block.
template <class CacheT>
__global__ void __launch_bounds__(kRopeBlockThreads)
    rope_write_kv_kernel(float* q, float* k, const float* v, int hq, int hkv, int hd, bool interleaved,
                         const __grid_constant__ RopeFrequencies freqs,
                         const __grid_constant__ BatchArgs batch, CacheT* k_cache, CacheT* v_cache,
                         int64_t num_blocks, int64_t block_size, float inv_k_scale, float inv_v_scale) {
  const int t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y, i = threadIdx.x;
  const int half = hd / 2;
  if (h >= hq + hkv) {  // past the last head: nothing to rotate, but the PDL calls stay uniform
    pdl_wait();
    pdl_launch_dependents();
    return;
  }
  const bool is_k = h >= hq;
  // positions and block tables were copied before the step's first kernel: read before the wait; q, k, v
  // and the cache slots come from the kernels before this one (cuda_common.cuh, programmatic dependent
  // launch).
  const int32_t pos = batch.positions[t];
  float sn, cs;
  sincosf(static_cast<float>(pos) * freqs.inv_freq[i], &sn, &cs);
  // Cache slot of this token: block_tables[seq][pos / bs], offset pos % bs. Invalid entries (which the
  // engine never produces) skip the write rather than corrupt other blocks.
  const int64_t kv_row = static_cast<int64_t>(hkv) * hd;
  int64_t slot = -1;
  if (is_k && pos >= 0 && pos / block_size < batch.max_blocks_per_seq) {
    const int s = find_sequence(batch.query_start, batch.num_seqs, t);
    const int32_t block =
        batch.block_tables[static_cast<int64_t>(s) * batch.max_blocks_per_seq + pos / block_size];
    if (block >= 0 && block < num_blocks) slot = (block * block_size + pos % block_size) * kv_row;
  }
  pdl_wait();
  pdl_launch_dependents();

  const int a = interleaved ? 2 * i : i;
  const int b = interleaved ? 2 * i + 1 : i + half;
  float* head = is_k ? k + static_cast<int64_t>(t) * kv_row + static_cast<int64_t>(h - hq) * hd
                     : q + (static_cast<int64_t>(t) * hq + h) * hd;
  const float x0 = head[a], x1 = head[b];
  const float y0 = x0 * cs - x1 * sn;
  const float y1 = x1 * cs + x0 * sn;
  head[a] = y0;
  head[b] = y1;
  if (slot >= 0) {
    const int64_t off = slot + static_cast<int64_t>(h - hq) * hd;
    store_kv(k_cache + off + a, y0, inv_k_scale);
    store_kv(k_cache + off + b, y1, inv_k_scale);
    const float* v_head = v + static_cast<int64_t>(t) * kv_row + static_cast<int64_t>(h - hq) * hd;
    store_kv(v_cache + off + a, v_head[a], inv_v_scale);
    store_kv(v_cache + off + b, v_head[b], inv_v_scale);
  }
}

// Steps of many tokens (prefill chunks, serving batches): one 256-thread block per token. A thread keeps one
// rotated pair i (sincos formed once) across the token's heads, 256 / (hd / 2) heads at a time, and the
// token's cache slot is looked up once per block. The kernel above runs each (token, group of heads) as
// its own short block: at mixed serving steps (~1000 tokens, 512 sequences) that is ~9 waves of blocks
// each waiting on its own position / sequence / block-table loads, and the RoPE launches measured 7.8% of
// the 8B FP8 1000/1000 offline run (H200 2026-12-04, INFERX_TIMING_SKIP=rope: 73.2 -> 67.6 s).
constexpr int kTokenThreads = 256;
constexpr int kTokenBatch = 4;  // passes whose loads are issued before any is rotated and stored

template <class CacheT>
__global__ void __launch_bounds__(kTokenThreads)
    rope_write_kv_token_kernel(float* q, float* k, const float* v, int hq, int hkv, int hd, bool interleaved,
                               const __grid_constant__ RopeFrequencies freqs,
                               const __grid_constant__ BatchArgs batch, CacheT* k_cache, CacheT* v_cache,
                               int64_t num_blocks, int64_t block_size, float inv_k_scale, float inv_v_scale) {
  __shared__ int64_t s_slot;
  const int t = blockIdx.x, half = hd / 2, per_pass = kTokenThreads / half;
  const int i = threadIdx.x % half, h0 = threadIdx.x / half;
  const int64_t kv_row = static_cast<int64_t>(hkv) * hd;
  // Step metadata: read before the wait (as above).
  const int32_t pos = batch.positions[t];
  if (threadIdx.x == 0) {
    int64_t slot = -1;
    if (pos >= 0 && pos / block_size < batch.max_blocks_per_seq) {
      const int s = find_sequence(batch.query_start, batch.num_seqs, t);
      const int32_t block =
          batch.block_tables[static_cast<int64_t>(s) * batch.max_blocks_per_seq + pos / block_size];
      if (block >= 0 && block < num_blocks) slot = (block * block_size + pos % block_size) * kv_row;
    }
    s_slot = slot;
  }
  float sn, cs;
  sincosf(static_cast<float>(pos) * freqs.inv_freq[i], &sn, &cs);
  __syncthreads();
  const int64_t slot = s_slot;
  pdl_wait();
  pdl_launch_dependents();
  if (h0 >= per_pass) return;  // threads past the last whole head of a pass (256 not a multiple of hd / 2)
  const int a = interleaved ? 2 * i : i;
  const int b = interleaved ? 2 * i + 1 : i + half;
  const int heads = hq + hkv;
  for (int base = h0; base < heads; base += kTokenBatch * per_pass) {
    float x0[kTokenBatch] = {}, x1[kTokenBatch] = {}, v0[kTokenBatch] = {}, v1[kTokenBatch] = {};
    float* ptr[kTokenBatch];
#pragma unroll
    for (int j = 0; j < kTokenBatch; ++j) {
      const int h = base + j * per_pass;
      ptr[j] = nullptr;
      if (h >= heads) continue;
      const bool is_k = h >= hq;
      ptr[j] = is_k ? k + static_cast<int64_t>(t) * kv_row + static_cast<int64_t>(h - hq) * hd
                    : q + (static_cast<int64_t>(t) * hq + h) * hd;
      x0[j] = ptr[j][a];
      x1[j] = ptr[j][b];
      if (is_k && slot >= 0) {
        const float* v_head = v + static_cast<int64_t>(t) * kv_row + static_cast<int64_t>(h - hq) * hd;
        v0[j] = v_head[a];
        v1[j] = v_head[b];
      }
    }
#pragma unroll
    for (int j = 0; j < kTokenBatch; ++j) {
      const int h = base + j * per_pass;
      if (h >= heads) continue;
      const float y0 = x0[j] * cs - x1[j] * sn;
      const float y1 = x1[j] * cs + x0[j] * sn;
      ptr[j][a] = y0;
      ptr[j][b] = y1;
      if (h >= hq && slot >= 0) {
        const int64_t off = slot + static_cast<int64_t>(h - hq) * hd;
        store_kv(k_cache + off + a, y0, inv_k_scale);
        store_kv(k_cache + off + b, y1, inv_k_scale);
        store_kv(v_cache + off + a, v0[j], inv_v_scale);
        store_kv(v_cache + off + b, v1[j], inv_v_scale);
      }
    }
  }
}

// Which kernel a launch takes: set_rope_token_blocks (tests), else INFERX_ROPE_TOKEN_BLOCKS (0: never,
// 1: always), else from kRopeTokenBlocksFrom tokens.
constexpr int32_t kRopeTokenBlocksFrom = 64;
std::atomic<int> g_token_blocks{-1};
bool token_blocks(int32_t tokens) {
  static const int env = [] {
    const char* v = std::getenv("INFERX_ROPE_TOKEN_BLOCKS");
    return v && (v[0] == '0' || v[0] == '1') ? v[0] - '0' : -1;
  }();
  const int o = g_token_blocks.load(std::memory_order_relaxed);
  const int mode = o >= 0 ? o : env;
  return mode >= 0 ? mode == 1 : tokens >= kRopeTokenBlocksFrom;
}

template <class CacheT>
cudaError_t launch_typed(float* q, float* k, const float* v, int64_t hq, int64_t hkv, int64_t hd,
                         bool interleaved, const RopeFrequencies& freqs, const BatchArgs& batch,
                         const PagedKv& cache, cudaStream_t stream) {
  if (hd % 2 != 0 || hd / 2 > kMaxRopePairs) return cudaErrorInvalidValue;  // the caller checks
  if (hd / 2 <= kTokenThreads && token_blocks(batch.num_tokens))
    return launch_pdl(rope_write_kv_token_kernel<CacheT>, dim3(static_cast<unsigned>(batch.num_tokens)),
                      dim3(kTokenThreads), 0, stream, q, k, v, static_cast<int>(hq), static_cast<int>(hkv),
                      static_cast<int>(hd), interleaved, freqs, batch, static_cast<CacheT*>(cache.k),
                      static_cast<CacheT*>(cache.v), cache.num_blocks, cache.block_size, 1.0f / cache.k_scale,
                      1.0f / cache.v_scale);
  const int64_t heads_per_block = std::max<int64_t>(1, kRopeBlockThreads / (hd / 2));
  const int64_t groups = (hq + hkv + heads_per_block - 1) / heads_per_block;
  return launch_pdl(rope_write_kv_kernel<CacheT>,
                    dim3(static_cast<unsigned>(batch.num_tokens), static_cast<unsigned>(groups)),
                    dim3(static_cast<unsigned>(hd / 2), static_cast<unsigned>(heads_per_block)), 0, stream, q,
                    k, v, static_cast<int>(hq), static_cast<int>(hkv), static_cast<int>(hd), interleaved,
                    freqs, batch, static_cast<CacheT*>(cache.k), static_cast<CacheT*>(cache.v),
                    cache.num_blocks, cache.block_size, 1.0f / cache.k_scale, 1.0f / cache.v_scale);
}

}  // namespace

void set_rope_token_blocks(int mode) { g_token_blocks.store(mode, std::memory_order_relaxed); }

cudaError_t launch_rope_write_kv(float* q, float* k, const float* v, int64_t hq, int64_t hkv, int64_t hd,
                                 bool interleaved, const RopeFrequencies& freqs, const BatchArgs& batch,
                                 const PagedKv& cache, cudaStream_t stream) {
  if (batch.num_tokens == 0) return cudaSuccess;
  if (cache.dtype == DType::F32)
    return launch_typed<float>(q, k, v, hq, hkv, hd, interleaved, freqs, batch, cache, stream);
  if (cache.dtype == DType::BF16)
    return launch_typed<__nv_bfloat16>(q, k, v, hq, hkv, hd, interleaved, freqs, batch, cache, stream);
  if (cache.dtype == DType::F8_E4M3)
    return launch_typed<uint8_t>(q, k, v, hq, hkv, hd, interleaved, freqs, batch, cache, stream);
  return cudaErrorInvalidValue;  // the caller validates the cache dtype first
}

}  // namespace inferx::cuda
