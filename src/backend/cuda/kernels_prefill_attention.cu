// Prefill / chunked-prefill attention on tensor cores, FlashAttention-2 style (Dao 2023, Algorithm 1):
// a CTA keeps a 64-query tile of one sequence and one query head in registers and walks 64-key tiles,
// S = Q K^T and O += P V through mma.sync.m16n8k16 (BF16 operands, F32 accumulators), with the online
// softmax rescaling O between tiles. Each of the 4 warps owns 16 query rows.
//
// Varlen over the flattened batch: grid (query tile, sequence, query head); a tile past the sequence's
// query count exits at once. Keys are gathered from the paged cache through the block table with
// cp.async (16 bytes per copy, zero-filled outside the visible range so masked lanes never meet NaNs).
// Masking per (query position p, key j): j <= p, j < seq_len, and j > p - window when window > 0. The
// key range walked is [min over the tile of the window start, max position of the tile].
// Fragment layouts are those of the PTX ISA, "Matrix Fragments for mma.m16n8k16" (A row-major 16x16,
// B column-major 16x8, C 16x8): groupID = lane / 4, threadID_in_group = lane % 4.
#include <math_constants.h>

#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kBM = 64;  // query rows per CTA (16 per warp)
constexpr int kBN = 64;  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) at the lower address
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-byte global -> shared copy; src_bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::);
}

// Two 8x8 BF16 matrices (rows at the addresses of lanes 0-7 and 8-15) loaded transposed: with rows =
// keys and columns = head dims this is the B fragment of P V straight from the row-major V tile.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    prefill_attention_kernel(const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                             const __nv_bfloat16* __restrict__ v_cache, int64_t num_blocks, int block_size,
                             const __grid_constant__ BatchArgs batch, int hq, int hkv, float scale_log2,
                             int64_t window, float* __restrict__ out) {
  constexpr int kLd = HD + 8;  // smem row stride in elements: +16 bytes shifts each row by 4 banks
  constexpr int kChunks = HD / 8;
  __shared__ __align__(16) __nv_bfloat16 k_s[kBN * kLd];
  __shared__ __align__(16) __nv_bfloat16 v_s[kBN * kLd];
  __shared__ bool key_ok[kBN];
  __shared__ int s_min_pos, s_max_pos;

  const int tile = blockIdx.x, s = blockIdx.y, h = blockIdx.z;
  const int q0 = batch.query_start[s];
  const int q_len = batch.query_start[s + 1] - q0;
  if (tile * kBM >= q_len) return;
  const int64_t seq_len = batch.seq_lens[s];
  const int kvh = h / (hq / hkv);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int gid = lane / 4, tig = lane % 4;
  const int rows = min(kBM, q_len - tile * kBM);

  if (threadIdx.x == 0) {
    s_min_pos = INT_MAX;
    s_max_pos = INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int p = batch.positions[q0 + tile * kBM + threadIdx.x];
    atomicMin(&s_min_pos, p);
    atomicMax(&s_max_pos, p);
  }
  __syncthreads();
  const int64_t kv_begin = window > 0 ? max(static_cast<int64_t>(0), s_min_pos - window + 1) : 0;
  const int64_t kv_end = min(seq_len, static_cast<int64_t>(s_max_pos) + 1);

  // This thread's two query rows of the warp's 16.
  const int r0 = warp * 16 + gid, r1 = r0 + 8;
  const bool valid0 = r0 < rows, valid1 = r1 < rows;
  const int64_t tok0 = q0 + tile * kBM + r0, tok1 = q0 + tile * kBM + r1;
  const int64_t pos0 = valid0 ? batch.positions[tok0] : -1;
  const int64_t pos1 = valid1 ? batch.positions[tok1] : -1;

  // Q as A fragments, pre-scaled into the log2 domain and rounded to BF16.
  uint32_t qf[HD / 16][4];
  {
    const float* qa = q + (tok0 * hq + h) * HD;
    const float* qb = q + (tok1 * hq + h) * HD;
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
      const int c = kt * 16 + tig * 2;
      float2 a_lo = make_float2(0, 0), a_hi = a_lo, b_lo = a_lo, b_hi = a_lo;
      if (valid0) {
        a_lo = *reinterpret_cast<const float2*>(qa + c);
        a_hi = *reinterpret_cast<const float2*>(qa + c + 8);
      }
      if (valid1) {
        b_lo = *reinterpret_cast<const float2*>(qb + c);
        b_hi = *reinterpret_cast<const float2*>(qb + c + 8);
      }
      qf[kt][0] = pack_bf16(a_lo.x * scale_log2, a_lo.y * scale_log2);
      qf[kt][1] = pack_bf16(b_lo.x * scale_log2, b_lo.y * scale_log2);
      qf[kt][2] = pack_bf16(a_hi.x * scale_log2, a_hi.y * scale_log2);
      qf[kt][3] = pack_bf16(b_hi.x * scale_log2, b_hi.y * scale_log2);
    }
  }

  float o[HD / 8][4];
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.0f, l1 = 0.0f;

  const int32_t* table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
  const int64_t kv_row = static_cast<int64_t>(hkv) * HD;
  for (int64_t kt0 = kv_begin; kt0 < kv_end; kt0 += kBN) {
    // Gather the K and V tiles (zeros where a key is out of range or its block is invalid).
    for (int idx = threadIdx.x; idx < kBN * kChunks; idx += kThreads) {
      const int key = idx / kChunks, c = idx % kChunks;
      const int64_t j = kt0 + key;
      int64_t offset = -1;
      if (j < kv_end && j / block_size < batch.max_blocks_per_seq) {
        const int32_t block = table[j / block_size];
        if (block >= 0 && block < num_blocks)
          offset = (block * static_cast<int64_t>(block_size) + j % block_size) * kv_row +
                   static_cast<int64_t>(kvh) * HD + c * 8;
      }
      if (c == 0) key_ok[key] = offset >= 0;
      cp_async16(&k_s[key * kLd + c * 8], offset >= 0 ? k_cache + offset : k_cache, offset >= 0 ? 16 : 0);
      cp_async16(&v_s[key * kLd + c * 8], offset >= 0 ? v_cache + offset : v_cache, offset >= 0 ? 16 : 0);
    }
    cp_async_wait_all();
    __syncthreads();

    // S = Q K^T for the warp's 16 rows x 64 keys.
    float sc[kBN / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < HD / 16; ++kt) {
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) {
        const __nv_bfloat16* kr = &k_s[(nt * 8 + gid) * kLd + kt * 16 + tig * 2];
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 8);
        mma_bf16(sc[nt], qf[kt], b0, b1);
      }
    }

    // Mask, then the online softmax update (row maxima over the 4 lanes sharing a row).
    float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = nt * 8 + tig * 2 + (e & 1);
        const int64_t j = kt0 + key;
        const int64_t p = e < 2 ? pos0 : pos1;
        const bool visible = key_ok[key] && j <= p && (window <= 0 || j > p - window);
        if (!visible) sc[nt][e] = -CUDART_INF_F;
      }
      mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
    }
#pragma unroll
    for (int off = 1; off < 4; off *= 2) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with nothing visible yet keeps m = -inf; subtract 0 then so that exp2 gives 0, not NaN.
    const float base0 = mn0 == -CUDART_INF_F ? 0.0f : mn0, base1 = mn1 == -CUDART_INF_F ? 0.0f : mn1;
    const float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
      sc[nt][0] = exp2f(sc[nt][0] - base0);
      sc[nt][1] = exp2f(sc[nt][1] - base0);
      sc[nt][2] = exp2f(sc[nt][2] - base1);
      sc[nt][3] = exp2f(sc[nt][3] - base1);
      sum0 += sc[nt][0] + sc[nt][1];
      sum1 += sc[nt][2] + sc[nt][3];
    }
    // Per-lane partial sums: the 4 lanes of a row share m, so they are summed once at the end.
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      o[nt][0] *= corr0;
      o[nt][1] *= corr0;
      o[nt][2] *= corr1;
      o[nt][3] *= corr1;
    }

    // O += P V: two adjacent C tiles of P are the A fragment of one 16-key step.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                             pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                             pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt) {
        uint32_t b0, b1;
        ldmatrix_x2_trans(b0, b1, &v_s[(kk * 16 + (lane % 16)) * kLd + nt * 8]);
        mma_bf16(o[nt], a, b0, b1);
      }
    }
    __syncthreads();  // the next tile overwrites k_s / v_s
  }

#pragma unroll
  for (int off = 1; off < 4; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) {
    const int c = nt * 8 + tig * 2;
    if (valid0)
      *reinterpret_cast<float2*>(out + (tok0 * hq + h) * HD + c) =
          make_float2(o[nt][0] * inv0, o[nt][1] * inv0);
    if (valid1)
      *reinterpret_cast<float2*>(out + (tok1 * hq + h) * HD + c) =
          make_float2(o[nt][2] * inv1, o[nt][3] * inv1);
  }
}

template <int HD>
cudaError_t launch_typed(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                         float scale, int64_t window, int64_t max_query_len, float* out,
                         cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((max_query_len + kBM - 1) / kBM),
                  static_cast<unsigned>(batch.num_seqs), static_cast<unsigned>(hq));
  prefill_attention_kernel<HD><<<grid, kThreads, 0, stream>>>(
      q, static_cast<const __nv_bfloat16*>(cache.k), static_cast<const __nv_bfloat16*>(cache.v),
      cache.num_blocks, static_cast<int>(cache.block_size), batch, hq, hkv, scale * kLog2e, window, out);
  return cudaGetLastError();
}

}  // namespace

bool prefill_attention_supported(const PagedKv& cache, int64_t hd) {
  return cache.dtype == DType::BF16 && (hd == 64 || hd == 128);
}

cudaError_t launch_prefill_attention(const float* q, const PagedKv& cache, const BatchArgs& batch, int64_t hq,
                                     int64_t hkv, int64_t hd, float scale, int64_t sliding_window,
                                     int64_t max_query_len, float* out, cudaStream_t stream) {
  if (batch.num_tokens == 0 || hq == 0 || max_query_len <= 0) return cudaSuccess;
  if (!prefill_attention_supported(cache, hd)) return cudaErrorInvalidValue;  // the caller checks first
  if (hd == 64)
    return launch_typed<64>(q, cache, batch, static_cast<int>(hq), static_cast<int>(hkv), scale,
                            sliding_window, max_query_len, out, stream);
  return launch_typed<128>(q, cache, batch, static_cast<int>(hq), static_cast<int>(hkv), scale,
                           sliding_window, max_query_len, out, stream);
}

}  // namespace inferx::cuda
