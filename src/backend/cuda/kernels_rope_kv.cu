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
#include "backend/cuda/kernels_quant.h"
#include "backend/cuda/quant_codes.cuh"
#include "backend/cuda/rope_math.cuh"

namespace inferx::cuda {
namespace {

constexpr int64_t kRopeBlockThreads = 512;  // threads per block: several heads of hd / 2 pairs

// What both kernels take (one __grid_constant__ block).
template <class CacheT>
struct RopeKvArgs {
  float* q;
  float* k;
  const float* v;
  int hq, hkv, hd;
  bool interleaved;
  RopeFrequencies freqs;
  BatchArgs batch;
  CacheT* k_cache;
  CacheT* v_cache;
  int64_t num_blocks, block_size;
  float inv_k_scale, inv_v_scale;
  // The deferred q/k/v product (launch_rope_write_kv's product; acc null: none): its BF16 sums [T, n] with
  // their W8A8 scales and bias, read instead of q / k / v (q heads, then k heads, then v heads).
  Fp8Epilogue product;

  __device__ int64_t kv_row() const { return static_cast<int64_t>(hkv) * hd; }
  // Element e of head h of token t (q heads, then k heads, then v heads: h up to hq + 2 hkv) as the product
  // wrote it: the F32 tensors, or the deferred product's value (the split epilogue's, to the bit).
  __device__ float load(int t, int h, int e) const {
    if (const Fp8Epilogue& d = product; d.acc) {
      const int64_t c = static_cast<int64_t>(h) * hd + e;
      return w8a8_value(d, to_float(static_cast<const __nv_bfloat16*>(d.acc)[t * d.n + c]), d.x_scale[t], c);
    }
    if (h >= hq + hkv) return v[t * kv_row() + static_cast<int64_t>(h - hq - hkv) * hd + e];
    return head(t, h)[e];
  }
  // Writes the rotated element back: q always (attention reads it), k only when it was read from k.
  __device__ void store(int t, int h, int e, float y) const {
    if (h < hq || !product.acc) head(t, h)[e] = y;
  }
  // Elements e .. e + 3 of head h (load's numbering; e a multiple of 4) as load gives them, to the bit: one
  // 16-byte F32 load, or the deferred product's four BF16 sums (8 bytes) with their weight scales and bias
  // as float4s (per-tensor scale: broadcast). launch_typed checks the alignments first.
  __device__ float4 load4(int t, int h, int e) const {
    if (const Fp8Epilogue& d = product; d.acc) {
      const int64_t c = static_cast<int64_t>(h) * hd + e;
      float a[4];
      load_v<4>(static_cast<const __nv_bfloat16*>(d.acc) + t * d.n + c, a);  // one 8-byte load
      const float xs = d.x_scale[t];
      const float4 ws = d.per_channel ? *reinterpret_cast<const float4*>(d.w_scale + c)
                                      : make_float4(d.w_scale[0], d.w_scale[0], d.w_scale[0], d.w_scale[0]);
      const float4 bs =
          d.bias ? *reinterpret_cast<const float4*>(d.bias + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      return make_float4(w8a8_value(a[0], xs, ws.x, bs.x), w8a8_value(a[1], xs, ws.y, bs.y),
                         w8a8_value(a[2], xs, ws.z, bs.z), w8a8_value(a[3], xs, ws.w, bs.w));
    }
    const float* src =
        h >= hq + hkv ? v + t * kv_row() + static_cast<int64_t>(h - hq - hkv) * hd : head(t, h);
    return *reinterpret_cast<const float4*>(src + e);
  }
  // store's four-element form (16-byte store).
  __device__ void store4(int t, int h, int e, const float4& y) const {
    if (h < hq || !product.acc) *reinterpret_cast<float4*>(head(t, h) + e) = y;
  }
  // Head h of token t (q heads first, then k heads).
  __device__ float* head(int t, int h) const {
    return h >= hq ? k + t * kv_row() + static_cast<int64_t>(h - hq) * hd
                   : q + (static_cast<int64_t>(t) * hq + h) * hd;
  }
  // Element offset of token t's cache slot (kv_cache_slot, rope_math.cuh).
  __device__ int64_t cache_slot(int t, int32_t pos) const {
    return kv_cache_slot(batch, find_sequence(batch.query_start, batch.num_seqs, t), pos, block_size,
                         num_blocks, kv_row());
  }
  // The rotated pair (a, b) of k head h - hq and the same elements of its v head into the slot.
  __device__ void store_pair(int64_t slot, int h, int a, int b, float y0, float y1, float v0,
                             float v1) const {
    const int64_t off = slot + static_cast<int64_t>(h - hq) * hd;
    store_kv(k_cache + off + a, y0, inv_k_scale);
    store_kv(k_cache + off + b, y1, inv_k_scale);
    store_kv(v_cache + off + a, v0, inv_v_scale);
    store_kv(v_cache + off + b, v1, inv_v_scale);
  }
  // Pair i's elements (rope_math.cuh).
  __device__ int pair_a(int i) const { return rope_pair_a(interleaved, i); }
  __device__ int pair_b(int i) const { return rope_pair_b(interleaved, i, hd); }
};

// Grid (token, group of heads); block (hd / 2, heads per block): q heads first, then k heads; one thread per
// rotated pair, each forming its own angle. A k head's threads also write the rotated key and its v head
// into the token's cache slot (each thread the two elements of its pair). One block per token (the first
// version) ran one long dependent loop over all heads: 15.6 us per decode layer at batch 1 on the H200
// (ncu, 2026-12-03); one 64-thread block per (token, head) took 4.3 us there but 102 us for a 2048-token
// chunk (82k tiny blocks: block launch rate), hence several heads per block.
template <class CacheT>
__global__ void __launch_bounds__(kRopeBlockThreads)
    rope_write_kv_kernel(const __grid_constant__ RopeKvArgs<CacheT> p) {
  const int t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y, i = threadIdx.x;
  if (h >= p.hq + p.hkv) {  // past the last head: nothing to rotate, but the PDL calls stay uniform
    pdl_wait();
    pdl_launch_dependents();
    return;
  }
  const bool is_k = h >= p.hq;
  // positions and block tables were copied before the step's first kernel: read before the wait; q, k, v
  // and the cache slots come from the kernels before this one (cuda_common.cuh, programmatic dependent
  // launch).
  const int32_t pos = p.batch.positions[t];
  float sn, cs;
  sincosf(static_cast<float>(pos) * p.freqs.inv_freq[i], &sn, &cs);
  const int64_t slot = is_k ? p.cache_slot(t, pos) : -1;
  pdl_wait();
  pdl_launch_dependents();

  const int a = p.pair_a(i), b = p.pair_b(i);
  float y0, y1;
  rope_rotate(p.load(t, h, a), p.load(t, h, b), cs, sn, y0, y1);
  p.store(t, h, a, y0);
  p.store(t, h, b, y1);
  if (slot >= 0) p.store_pair(slot, h, a, b, y0, y1, p.load(t, h + p.hkv, a), p.load(t, h + p.hkv, b));
}

// Steps of many tokens (prefill chunks, serving batches): one 256-thread block per token. A thread keeps one
// rotated pair i (sincos formed once) across the token's heads, 256 / (hd / 2) heads at a time, and the
// token's cache slot is looked up once per block. The kernel above runs each (token, group of heads) as
// its own short block: at mixed serving steps (~1000 tokens, 512 sequences) that is ~9 waves of blocks each
// waiting on its own position / sequence / block-table loads. Measured (H200 2026-12-04): 8B FP8 1000/1000
// offline +1.7% against the kernel above in the same call; ncu, an 8192-token launch 114.6 us at 3.14 TB/s.
constexpr int kTokenThreads = 256;
constexpr int kTokenBatch = 4;  // passes whose loads are issued before any is rotated and stored

template <class CacheT>
__global__ void __launch_bounds__(kTokenThreads)
    rope_write_kv_token_kernel(const __grid_constant__ RopeKvArgs<CacheT> p) {
  __shared__ int64_t s_slot;
  const int t = blockIdx.x, half = p.hd / 2, per_pass = kTokenThreads / half;
  const int i = threadIdx.x % half, h0 = threadIdx.x / half;
  // Step metadata: read before the wait (as above).
  const int32_t pos = p.batch.positions[t];
  if (threadIdx.x == 0) s_slot = p.cache_slot(t, pos);
  float sn, cs;
  sincosf(static_cast<float>(pos) * p.freqs.inv_freq[i], &sn, &cs);
  __syncthreads();
  const int64_t slot = s_slot;
  pdl_wait();
  pdl_launch_dependents();
  if (h0 >= per_pass) return;  // threads past the last whole head of a pass (256 not a multiple of hd / 2)
  const int a = p.pair_a(i), b = p.pair_b(i);
  const int heads = p.hq + p.hkv;
  for (int base = h0; base < heads; base += kTokenBatch * per_pass) {
    float x0[kTokenBatch] = {}, x1[kTokenBatch] = {}, v0[kTokenBatch] = {}, v1[kTokenBatch] = {};
#pragma unroll
    for (int j = 0; j < kTokenBatch; ++j) {
      const int h = base + j * per_pass;
      if (h >= heads) continue;
      x0[j] = p.load(t, h, a);
      x1[j] = p.load(t, h, b);
      if (h >= p.hq && slot >= 0) {  // its v head: h + hkv in load's numbering
        v0[j] = p.load(t, h + p.hkv, a);
        v1[j] = p.load(t, h + p.hkv, b);
      }
    }
#pragma unroll
    for (int j = 0; j < kTokenBatch; ++j) {
      const int h = base + j * per_pass;
      if (h >= heads) continue;
      float y0, y1;
      rope_rotate(x0[j], x1[j], cs, sn, y0, y1);
      p.store(t, h, a, y0);
      p.store(t, h, b, y1);
      if (h >= p.hq && slot >= 0) p.store_pair(slot, h, a, b, y0, y1, v0[j], v1[j]);
    }
  }
}

// Four cache elements from one aligned vector store: E4M3 codes of v / scale (fp8_codes4: the codes
// store_kv writes), or the 16- / 32-bit values.
template <class CacheT>
__device__ __forceinline__ void store4_kv(CacheT* dst, const float4& v, float /*inv_scale*/) {
  struct alignas(4 * sizeof(CacheT)) Four {
    CacheT e[4];
  };
  *reinterpret_cast<Four*>(dst) = Four{
      {from_float<CacheT>(v.x), from_float<CacheT>(v.y), from_float<CacheT>(v.z), from_float<CacheT>(v.w)}};
}
template <>
__device__ __forceinline__ void store4_kv<uint8_t>(uint8_t* dst, const float4& v, float inv_scale) {
  *reinterpret_cast<uint32_t*>(dst) = fp8_codes4(v.x, v.y, v.z, v.w, inv_scale);
}

// The token kernel with four rotated pairs per thread, for the NeoX layout (pairs (i, i + hd / 2): four
// consecutive pairs are two float4s), reading q / k / v in F32 or the deferred q/k/v product's BF16 sums
// (RopeKvArgs::load4; then only q is written back and the split epilogue never runs): hd / 8 threads per
// head, 256 / (hd / 8) heads per pass (16 at hd 128), and kVecPasses passes' loads issued before any is
// rotated - Llama-3-8B's 40 heads in two round trips (32 q heads, then the 8 k heads with their v heads),
// where the scalar kernel above takes three (4-byte loads, 4 heads per pass, 4 passes per round). Its stores
// are 16-byte q / k stores and 4-byte E4M3 cache stores (one byte per store above). Same rotation and codes
// as the kernels above. At most 64 registers (4 CTAs per SM: 512 decode rows in one wave; three passes in
// flight took 90, two waves). Why: the token kernel took 11.2 us per layer for 7.3 us of bytes at 512
// decode rows (H100 timeline, 2026-12-06); the all-loads-at-once scalar form needed 80 registers and lost
// (29.3 us, two waves).
constexpr int kVecPasses = 2;
template <class CacheT>
__global__ void __launch_bounds__(kTokenThreads, 4)
    rope_write_kv_vec_kernel(const __grid_constant__ RopeKvArgs<CacheT> p) {
  __shared__ int64_t s_slot;
  const int t = blockIdx.x, threads_per_head = p.hd / 8, per_pass = kTokenThreads / threads_per_head;
  const int i0 = 4 * (threadIdx.x % threads_per_head), h0 = threadIdx.x / threads_per_head;
  const int half = p.hd / 2;
  const int32_t pos = p.batch.positions[t];  // step metadata: read before the wait (as above)
  if (threadIdx.x == 0) s_slot = p.cache_slot(t, pos);
  float sn[4], cs[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) sincosf(static_cast<float>(pos) * p.freqs.inv_freq[i0 + u], &sn[u], &cs[u]);
  __syncthreads();
  const int64_t slot = s_slot;
  pdl_wait();
  pdl_launch_dependents();
  if (h0 >= per_pass) return;
  const int heads = p.hq + p.hkv;
  for (int base = h0; base < heads; base += kVecPasses * per_pass) {
    float4 xa[kVecPasses], xb[kVecPasses], va[kVecPasses], vb[kVecPasses];
#pragma unroll
    for (int j = 0; j < kVecPasses; ++j) {
      const int h = base + j * per_pass;
      if (h >= heads) continue;
      xa[j] = p.load4(t, h, i0);
      xb[j] = p.load4(t, h, i0 + half);
      if (h >= p.hq && slot >= 0) {  // its v head: h + hkv in load4's numbering
        va[j] = p.load4(t, h + p.hkv, i0);
        vb[j] = p.load4(t, h + p.hkv, i0 + half);
      }
    }
#pragma unroll
    for (int j = 0; j < kVecPasses; ++j) {
      const int h = base + j * per_pass;
      if (h >= heads) continue;
      float4 ya, yb;
      rope_rotate(xa[j].x, xb[j].x, cs[0], sn[0], ya.x, yb.x);
      rope_rotate(xa[j].y, xb[j].y, cs[1], sn[1], ya.y, yb.y);
      rope_rotate(xa[j].z, xb[j].z, cs[2], sn[2], ya.z, yb.z);
      rope_rotate(xa[j].w, xb[j].w, cs[3], sn[3], ya.w, yb.w);
      p.store4(t, h, i0, ya);
      p.store4(t, h, i0 + half, yb);
      if (h >= p.hq && slot >= 0) {
        const int64_t off = slot + static_cast<int64_t>(h - p.hq) * p.hd;
        store4_kv(p.k_cache + off + i0, ya, p.inv_k_scale);
        store4_kv(p.k_cache + off + i0 + half, yb, p.inv_k_scale);
        store4_kv(p.v_cache + off + i0, va[j], p.inv_v_scale);
        store4_kv(p.v_cache + off + i0 + half, vb[j], p.inv_v_scale);
      }
    }
  }
}

// Whether a token-block launch takes the vector kernel: set_rope_vector (tests), else INFERX_ROPE_VEC (on
// unless 0). On since 2026-12-06 16:10 (H100): 512 rows x 32/8 heads, FP8 cache, 8.5 us against the scalar
// token kernel's 11.4 (94.7% of copy); in the 512-row decode step's graph 9.6 us per layer reading the
// deferred q/k/v sums, against 11.2 + 6.6 for the scalar kernel after the split epilogue; batch 1 level.
std::atomic<int> g_rope_vector{-1};
bool rope_vector() {
  static const bool env = [] {
    const char* v = std::getenv("INFERX_ROPE_VEC");
    return v == nullptr || v[0] != '0';
  }();
  const int o = g_rope_vector.load(std::memory_order_relaxed);
  return o >= 0 ? o == 1 : env;
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
                         const PagedKv& cache, const Fp8Epilogue* product, cudaStream_t stream) {
  if (hd % 2 != 0 || hd / 2 > kMaxRopePairs) return cudaErrorInvalidValue;  // the caller checks
  if (product && !rope_takes_product(*product, hq, hkv, hd, batch.num_tokens)) return cudaErrorInvalidValue;
  const RopeKvArgs<CacheT> args{q,
                                k,
                                v,
                                static_cast<int>(hq),
                                static_cast<int>(hkv),
                                static_cast<int>(hd),
                                interleaved,
                                freqs,
                                batch,
                                static_cast<CacheT*>(cache.k),
                                static_cast<CacheT*>(cache.v),
                                cache.num_blocks,
                                cache.block_size,
                                1.0f / cache.k_scale,
                                1.0f / cache.v_scale,
                                product ? *product : Fp8Epilogue{}};
  const bool token = hd / 2 <= kTokenThreads && token_blocks(batch.num_tokens);
  // The vector kernel: NeoX pairs, whole heads of 4-pair threads per pass, q (and k / v, or the product's
  // sums, scales and bias: RopeKvArgs::load4) aligned for its vector accesses.
  const bool product_vec = !product || (product->n % 4 == 0 && is_aligned(product->acc, 8) &&
                                        (!product->per_channel || is_aligned(product->w_scale, 16)) &&
                                        (!product->bias || is_aligned(product->bias, 16)));
  if (token && rope_vector() && !interleaved && product_vec && hd % 8 == 0 && kTokenThreads % (hd / 8) == 0 &&
      is_aligned(q, 16) && (product || (is_aligned(k, 16) && is_aligned(v, 16))))
    return launch_pdl(rope_write_kv_vec_kernel<CacheT>, dim3(static_cast<unsigned>(batch.num_tokens)),
                      dim3(kTokenThreads), 0, stream, args);
  if (token)
    return launch_pdl(rope_write_kv_token_kernel<CacheT>, dim3(static_cast<unsigned>(batch.num_tokens)),
                      dim3(kTokenThreads), 0, stream, args);
  const int64_t heads_per_block = std::max<int64_t>(1, kRopeBlockThreads / (hd / 2));
  const int64_t groups = (hq + hkv + heads_per_block - 1) / heads_per_block;
  return launch_pdl(rope_write_kv_kernel<CacheT>,
                    dim3(static_cast<unsigned>(batch.num_tokens), static_cast<unsigned>(groups)),
                    dim3(static_cast<unsigned>(hd / 2), static_cast<unsigned>(heads_per_block)), 0, stream,
                    args);
}

}  // namespace

void set_rope_token_blocks(int mode) { g_token_blocks.store(mode, std::memory_order_relaxed); }
void set_rope_vector(int mode) { g_rope_vector.store(mode, std::memory_order_relaxed); }

bool rope_takes_product(const Fp8Epilogue& e, int64_t hq, int64_t hkv, int64_t hd, int64_t tokens) {
  return e.acc != nullptr && e.acc_bf16 && !e.silu && e.t == tokens && e.n == (hq + 2 * hkv) * hd &&
         e.x_scale != nullptr && e.w_scale != nullptr;
}

cudaError_t launch_rope_write_kv(float* q, float* k, const float* v, int64_t hq, int64_t hkv, int64_t hd,
                                 bool interleaved, const RopeFrequencies& freqs, const BatchArgs& batch,
                                 const PagedKv& cache, cudaStream_t stream, const Fp8Epilogue* product) {
  if (batch.num_tokens == 0) return cudaSuccess;
  if (cache.dtype == DType::F32)
    return launch_typed<float>(q, k, v, hq, hkv, hd, interleaved, freqs, batch, cache, product, stream);
  if (cache.dtype == DType::BF16)
    return launch_typed<__nv_bfloat16>(q, k, v, hq, hkv, hd, interleaved, freqs, batch, cache, product,
                                       stream);
  if (cache.dtype == DType::F8_E4M3)
    return launch_typed<uint8_t>(q, k, v, hq, hkv, hd, interleaved, freqs, batch, cache, product, stream);
  return cudaErrorInvalidValue;  // the caller validates the cache dtype first
}

}  // namespace inferx::cuda
