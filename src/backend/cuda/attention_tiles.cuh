#pragma once
// Device pieces shared by the tensor-core attention kernels (kernels_prefill_attention.cu,
// kernels_decode_attention.cu): mma.sync m16n8k16 with BF16 operands, ldmatrix, cp.async, FP8 E4M3
// decoding, and the double-buffered gather of a tile of keys/values from the paged cache into shared
// memory as BF16.
//
// Fragment layouts are those of the PTX ISA, "Matrix Fragments for mma.m16n8k16" (A row-major 16x16,
// B column-major 16x8, C 16x8): groupID = lane / 4, threadID_in_group = lane % 4.
//
// FP8 caches hold E4M3 values of k / k_scale and v / v_scale (per-tensor scales); the tile loader turns
// them into exact BF16 (every E4M3 value is a BF16 value) and the kernels fold k_scale into the query
// scale and v_scale into the output, so the inner loops are the BF16 ones.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace inferx::cuda::attn {

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

// The same with F16 operands (the decode kernel's FP8 path: E4M3 -> F16 is one cvt per two values).
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Transposes an 8x8 matrix of 16-bit values held one word per lane (lane / 4 the row, lane % 4 the pair of
// columns: a C fragment's half) into the same layout of the transpose (a B fragment's half).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);  // .x (lo) at the lower address
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The E4M3 bytes 0 and 1 of `two` -> two F16 in one word (exact; one cvt.rn.f16x2.e4m3x2).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// cp.async (bulk_copy.cuh), under the names these kernels use.
using ::inferx::cuda::cp_async16;
using ::inferx::cuda::cp_async_commit;
using ::inferx::cuda::cp_async_wait;

// Four 8x8 BF16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. Not transposed: with rows =
// keys and columns = head dims, matrix i's register is a B fragment half of S = Q K^T.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Transposed: with rows = keys and columns = head dims, B fragments of O += P V from the row-major V tile.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two E4M3 bytes (low byte first) -> two BF16 in one word (exact: E4M3 values fit F16 and BF16).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16(f.x, f.y);
}
// Eight E4M3 bytes -> eight BF16 (16 bytes), element order preserved.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 v) {
  return make_uint4(e4m3x2_to_bf16x2(static_cast<uint16_t>(v.x & 0xffffu)),
                    e4m3x2_to_bf16x2(static_cast<uint16_t>(v.x >> 16)),
                    e4m3x2_to_bf16x2(static_cast<uint16_t>(v.y & 0xffffu)),
                    e4m3x2_to_bf16x2(static_cast<uint16_t>(v.y >> 16)));
}

// A tile of kKeys keys x HD dims of K and of V in shared memory as BF16, row stride HD + 8 elements (16
// bytes of padding shift each row by 4 banks: ldmatrix rows hit distinct banks). Two stages for double
// buffering; ok[stage][key] says whether the key's block was valid (a key outside the requested range or
// in an invalid block reads as zeros and must be masked by the caller).
template <int HD, int kKeys>
struct KvTileSmem {
  static constexpr int kLd = HD + 8;
  __nv_bfloat16 k[2][kKeys * kLd];
  __nv_bfloat16 v[2][kKeys * kLd];
  bool ok[2][kKeys];
};

// Gathers keys [j0, j0 + kKeys) of kv head `kvh` (those < end) through the block table. BF16 caches use
// cp.async straight into the stage (the caller commits and waits); FP8 caches load into registers with
// fetch() and convert + store with store(), so that the loads of the next tile are in flight while the
// current one is computed. kThreads threads call every member together.
template <class CacheT, int HD, int kKeys, int kThreads>
struct KvTileLoader {
  static constexpr int kChunks = HD / 8;  // 8 elements per chunk: 16 bytes of BF16, 8 bytes of FP8
  static constexpr int kPerThread = (kKeys * kChunks + kThreads - 1) / kThreads;
  static_assert(kKeys * kChunks % kThreads == 0, "tile chunks must divide evenly among the threads");
  static_assert(kPerThread <= 32, "okbits holds one bit per staged chunk");

  const CacheT* k_cache;
  const CacheT* v_cache;
  const int32_t* table;  // this sequence's block table row
  int max_blocks;
  int64_t num_blocks;
  int block_size;
  int64_t kv_row;                            // hkv * HD elements per token slot
  int64_t head_off;                          // kvh * HD
  uint2 kreg[kPerThread], vreg[kPerThread];  // FP8 staging
  uint32_t okbits = 0;                       // bit i: chunk i of this thread came from a valid block

  __device__ __forceinline__ int64_t offset_of(int64_t j, int64_t end, int c) const {
    if (j >= end || j / block_size >= max_blocks) return -1;
    const int32_t block = table[j / block_size];
    if (block < 0 || block >= num_blocks) return -1;  // never from the engine: read zeros, mask the key
    return (block * static_cast<int64_t>(block_size) + j % block_size) * kv_row + head_off + c * 8;
  }

  // BF16: cp.async of the whole tile into `stage` (no commit). Returns whether every chunk this thread
  // copied came from a valid key.
  __device__ __forceinline__ bool issue_bf16(KvTileSmem<HD, kKeys>& s, int stage, int64_t j0, int64_t end) {
    bool all = true;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int key = idx / kChunks, c = idx % kChunks;
      const int64_t off = offset_of(j0 + key, end, c);
      all = all && off >= 0;
      if (c == 0) s.ok[stage][key] = off >= 0;
      const auto* kc = reinterpret_cast<const __nv_bfloat16*>(k_cache);
      const auto* vc = reinterpret_cast<const __nv_bfloat16*>(v_cache);
      cp_async16(&s.k[stage][key * (HD + 8) + c * 8], off >= 0 ? kc + off : kc, off >= 0 ? 16 : 0);
      cp_async16(&s.v[stage][key * (HD + 8) + c * 8], off >= 0 ? vc + off : vc, off >= 0 ? 16 : 0);
    }
    return all;
  }
  // FP8: loads into registers.
  __device__ __forceinline__ void fetch_fp8(int64_t j0, int64_t end) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int key = idx / kChunks, c = idx % kChunks;
      const int64_t off = offset_of(j0 + key, end, c);
      kreg[i] = make_uint2(0, 0);
      vreg[i] = make_uint2(0, 0);
      if (i == 0) okbits = 0;
      if (off >= 0) {
        okbits |= 1u << i;
        kreg[i] = *reinterpret_cast<const uint2*>(reinterpret_cast<const uint8_t*>(k_cache) + off);
        vreg[i] = *reinterpret_cast<const uint2*>(reinterpret_cast<const uint8_t*>(v_cache) + off);
      }
    }
  }
  __device__ __forceinline__ void store_fp8(KvTileSmem<HD, kKeys>& s, int stage) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int key = idx / kChunks, c = idx % kChunks;
      if (c == 0) s.ok[stage][key] = (okbits >> i) & 1u;
      *reinterpret_cast<uint4*>(&s.k[stage][key * (HD + 8) + c * 8]) = e4m3x8_to_bf16x8(kreg[i]);
      *reinterpret_cast<uint4*>(&s.v[stage][key * (HD + 8) + c * 8]) = e4m3x8_to_bf16x8(vreg[i]);
    }
  }

  // Starts the tile's loads: BF16 issues and commits one cp.async group (complete after cp_async_wait
  // and a barrier); FP8 loads into registers (complete after store_fp8 and a barrier). Returns whether
  // every key this thread loads is valid (a CTA-wide AND of it says the tile needs no validity mask).
  static constexpr bool kFp8 = sizeof(CacheT) == 1;
  __device__ __forceinline__ bool begin(KvTileSmem<HD, kKeys>& s, int stage, int64_t j0, int64_t end) {
    if constexpr (kFp8) {
      fetch_fp8(j0, end);
      return okbits == (kPerThread == 32 ? ~0u : (1u << kPerThread) - 1u);
    } else {
      const bool all = issue_bf16(s, stage, j0, end);
      cp_async_commit();
      return all;
    }
  }
};

// Maximum over the 4 lanes that share a row of a C fragment.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The keys a decode CTA (v2, v3) attends: its token's visible keys end at `last` (its position, within the
// sequence) and start `window` keys earlier (0: at 0); split `split` of the launch's `splits` takes whole
// tiles of them, [k_begin, k_end), n_tiles tiles. The token's own split count `used` counts only the splits
// that get keys (at least one: a token without keys still writes its zero output): every split takes
// ceil(tiles / splits) tiles but at least `min_tiles` (v3: CudaBackend's split plan for contexts shorter
// than the capacity it was chosen for; 1 keeps the launch's split length), so the splits from `used` on are
// empty - v3 returns from them at once and merges `used` partials; v2 ignores `used` (min_tiles 1).
struct SplitKeys {
  int last, k_begin, k_end, n_tiles, used;
};
template <int kTile>
__device__ __forceinline__ SplitKeys split_keys(int pos, int seq_len, int64_t window, int split, int splits,
                                                int min_tiles = 1) {
  const int last = min(pos, seq_len - 1);
  const int first = window > 0 ? static_cast<int>(max(static_cast<int64_t>(0), pos - window + 1)) : 0;
  const int n_keys = last >= first ? last - first + 1 : 0;
  const int tiles = (n_keys + kTile - 1) / kTile;
  const int per_split = max((tiles + splits - 1) / splits, max(min_tiles, 1));  // tiles
  const int used = max(1, (tiles + per_split - 1) / per_split);
  const int k_begin = first + split * per_split * kTile;
  const int k_end = min(last + 1, k_begin + per_split * kTile);
  return {last, k_begin, k_end, k_end > k_begin ? (k_end - k_begin + kTile - 1) / kTile : 0, used};
}

// The first kAhead tiles of a decode split (v2, v3), around the wait for the previous kernel. The step's
// metadata was copied before its first kernel and the keys before `last` were written by earlier steps,
// so tiles that end before `last` start loading before pdl_wait (the RoPE kernel before this one writes
// the newest key); the rest after it, with q, the partials and the tickets (cuda_common.cuh,
// programmatic dependent launch). The early tiles are a prefix, so the cp.async groups stay in tile order.
// Then the block-table prefetch of tile kAhead. key0: the key of tile 0 that this thread's loader starts
// at (k_begin, or k_begin plus the warp's offset).
template <int kAhead, int kTile, class Loader, class Smem>
__device__ __forceinline__ void start_decode_tiles(Loader& loader, Smem& sm, int n_tiles, int k_begin,
                                                   int key0, int last, int k_end) {
  int issued = 0;
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i < n_tiles && k_begin + (i + 1) * kTile <= last) {
      loader.prefetch(key0 + i * kTile, k_end);
      loader.begin(sm, i, key0 + i * kTile);
      issued = i + 1;
    }
  }
  pdl_wait();
  pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i >= issued && i < n_tiles) {
      loader.prefetch(key0 + i * kTile, k_end);
      loader.begin(sm, i, key0 + i * kTile);
    }
  }
  if (kAhead < n_tiles) loader.prefetch(key0 + kAhead * kTile, k_end);
}

}  // namespace inferx::cuda::attn
