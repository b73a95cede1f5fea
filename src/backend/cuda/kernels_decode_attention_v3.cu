// Split-KV decode attention v3: the keys on the M side of the tensor-core products ("swap AB").
//
// v2 (kernels_decode_attention.cu) puts a GQA group's query heads on the M side of mma.m16n8k16: Llama-3's
// groups of 4 heads fill 4 of the 16 rows, Q and O take 128 registers per thread (226 in all, two CTAs of
// 4 warps per SM), and at 256 decode rows the FP8-cache kernel was bound by its own latency chain (H200
// ncu, 2026-12-03: 372 us per layer, 1.5 TB/s, 2 warps per scheduler issuing 0.47 of the cycles). v3
// computes the transposed products instead:
//   S^T [16 keys x 8 heads] = K [16 keys x HD] . Q^T [HD x 8 heads]   (A = K from the tile, B = Q^T)
//   O^T [HD x 8 heads]     += V^T [HD x 16 keys] . P^T [16 keys x 8 heads]
// so a group of up to 8 heads is one n8 column tile (16 heads: two), half the MMAs of v2 per key, and
// Q^T's B fragments plus O^T's accumulators take 64 registers, not 128: four CTAs per SM (FP8 cache).
//   - S^T's reduction order over the head dims is free, so lane (g, t) takes dims 32c + 8t .. 32c + 8t + 7
//     of its key rows g and g + 8 for k-steps 2c and 2c + 1: one 16-byte (BF16) or 8-byte (FP8) shared
//     load per row and chunk, and Q^T's fragments come from 8 consecutive floats of q per lane and chunk.
//   - P^T's C fragment becomes the B fragment of the second product by movmatrix (an in-register 8x8
//     transpose), so P never goes through shared memory.
//   - V^T's A fragments: BF16 by ldmatrix.trans; FP8 with the output dims permuted so that a lane's rows
//     are HD/8 consecutive dims of a key row (8-byte loads per key), bytes paired by PRMT and turned
//     into F16 by cvt.rn.f16x2.e4m3x2 (exact). The FP8 path therefore multiplies in F16 (Q and P as one
//     F16 term each by default, two with INFERX_DECODE_ATTN_TERMS=2: decode_attention_terms in kernels.h),
//     the BF16 path in BF16 (two BF16 terms: 16 bits), F32 sums.
//   - tiles: each warp gathers its own 16 keys of every 64-key tile by cp.async into unpadded rows with
//     XOR-swizzled 16-byte chunks (conflict-free for the reads above), stages in flight per warp, warp
//     barriers only; raw E4M3 in shared memory for FP8 (16 KiB a tile, three stages), BF16 two stages.
// Splits, partials, the PDL protocol and the early tile issue are those of v2; the last CTA's merge is
// spread over all its threads. Measured (H200 ncu, 256 decode rows at ~1.05k context, per layer): FP8 KV
// 372 -> 211 us, BF16 398 -> 334 us; batch 1 inside the graph 16.5 -> 8.5 us (docs/benchmarks.md).
#include <math_constants.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/decode_attention_epilogue.cuh"
#include "backend/cuda/decode_attention_stamps.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_quant.h"
#include "backend/cuda/quant_codes.cuh"
#include "backend/cuda/rope_math.cuh"
#include "backend/cuda/tensor_map.h"

namespace inferx::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTile = kWarps * 16;  // keys per tile: 16 per warp (the MMA's M)
constexpr int kGroupChunk = 16;     // query heads per CTA at most (two n8 tiles)
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxClusterSplits = 16;  // the cluster form's largest cluster (non-portable above 8)
EnvSwitch g_cluster_mode("INFERX_DECODE_CLUSTER", true);
std::atomic<uint64_t> g_cluster_launches{0};
std::atomic<uint64_t> g_rope_launches{0};

// Phase time stamps of every CTA (decode_attention_stamps.h; null records: off).
__constant__ StampSink c_stamps;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Stamp i into the CTA's record (null: not stamping), stored at once so that no stamp stays in registers.
__device__ __forceinline__ void stamp(StampRecord* r, int i) {
  if (r == nullptr) return;
  r->ns[i] = global_ns();
  r->cycles[i] = clock64();
}

// kTma: FP8 tiles copied by the tensor-memory accelerator with its 128-byte swizzle (TmaLoader), which puts
// 16-byte chunk c of row r at c ^ (r & 7) for K and V alike (128-byte rows from a 1024-byte aligned base).
template <class CacheT, int HD, bool kTma = false>
struct Layout {
  static constexpr bool kFp8 = sizeof(CacheT) == 1;
  static constexpr int kRowBytes = HD * static_cast<int>(sizeof(CacheT));
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per key row
  static constexpr int kStages = kFp8 ? 3 : 2;
  static constexpr int kTileBytes = kTile * kRowBytes;
  // Physical chunk of logical chunk c of key row `key`. K: a read instruction's lanes take rows g (and
  // g + 8) at chunks {2c, 2c + 1} (FP8, 8 bytes a lane: rows 0..3 per 16-lane phase) or {4c .. 4c + 3}
  // (BF16, 16 bytes: rows 0..1 per 8-lane phase). V: one chunk per lane of rows 2t (+1, +8, +9): FP8 rows
  // 0, 2, 4, 6 per phase; BF16 ldmatrix rows 0..7 of one chunk.
  __device__ __forceinline__ static int k_chunk(int key, int c) {
    if constexpr (kTma) return c ^ (key & 7);
    return c ^ ((kFp8 ? (key & 3) << 1 : (key & 1) << 2) & (kChunks - 1));
  }
  __device__ __forceinline__ static int v_chunk(int key, int c) { return c ^ (key & 7 & (kChunks - 1)); }
};

template <class CacheT, int HD>
struct Smem {
  using L = Layout<CacheT, HD>;
  alignas(1024) uint8_t k[L::kStages][L::kTileBytes];  // 1024: the TMA's 128-byte swizzle pattern
  alignas(16) uint8_t v[L::kStages][L::kTileBytes];
  bool ok[L::kStages][kTile];
  uint64_t bar[kWarps][L::kStages];  // TmaLoader: a warp's K and V rows of a stage
};

template <class CacheT, int HD, int NT>
constexpr int smem_bytes() {
  constexpr int tiles = static_cast<int>(sizeof(Smem<CacheT, HD>));
  constexpr int merge = (kWarps * 8 * NT * HD + 2 * kWarps * 8 * NT) * 4;
  return ((tiles > merge ? tiles : merge) + 15) / 16 * 16;
}

// CTAs per SM the register budget is sized for (FP8, one n-tile: four; BF16 tiles take 64 KiB: three).
template <class CacheT, int NT>
constexpr int min_blocks() {
  return NT > 1 ? 2 : (sizeof(CacheT) == 1 ? 4 : 3);
}

// Each warp gathers the 16 keys of every tile it computes (tile keys warp * 16 ..), lane (key0, c) the
// 16-byte chunk c of keys key0, key0 + kKeyStep, ...; the block-table entries of a tile are loaded one tile
// ahead (prefetch), so a tile's copies never wait on a dependent table load.
template <class CacheT, int HD>
struct Loader {
  using L = Layout<CacheT, HD>;
  static constexpr int kElems = 16 / static_cast<int>(sizeof(CacheT));
  static constexpr int kKeyStep = kWarp / L::kChunks;
  static constexpr int kPerThread = 16 / kKeyStep;
  static_assert(kWarp % L::kChunks == 0 && 16 % kKeyStep == 0, "a warp loads its 16 keys in whole passes");

  const CacheT* k_base;  // the cache + this CTA's kv head + this lane's chunk
  const CacheT* v_base;
  const int32_t* table;
  int max_blocks;
  int num_blocks;
  int block_size;
  int bs_shift;  // log2(block_size): v3 takes power-of-two block sizes only (launch_decode_attention),
                 // so a key's block and slot cost a shift and a mask, not a division by a runtime value
  int kv_row;    // elements per token slot (hkv * HD)
  int key0, c;
  int32_t blk[kPerThread];

  __device__ __forceinline__ void prefetch(int j0, int end) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int j = j0 + key0 % 16 + i * kKeyStep;
      const int b = j >> bs_shift;
      blk[i] = j < end && b < max_blocks ? __ldg(&table[b]) : -1;
    }
  }
  // j0: the first key of this warp's 16 in the tile.
  __device__ __forceinline__ void begin(Smem<CacheT, HD>& s, int stage, int j0) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int32_t b = blk[i];
      const int j = j0 + key0 % 16 + i * kKeyStep;
      const bool valid = b >= 0 && b < num_blocks;
      const int slot = j & (block_size - 1);
      const int64_t off = valid ? (static_cast<int64_t>(b) * block_size + slot) * kv_row : 0;
      const int key = key0 + i * kKeyStep;
      if (c == 0) s.ok[stage][key] = valid;
      attn::cp_async16(&s.k[stage][key * L::kRowBytes + L::k_chunk(key, c) * 16], k_base + off,
                       valid ? 16 : 0);
      attn::cp_async16(&s.v[stage][key * L::kRowBytes + L::v_chunk(key, c) * 16], v_base + off,
                       valid ? 16 : 0);
    }
    attn::cp_async_commit();
  }
};

// FP8 caches, head_dim 128, block sizes that are multiples of 16, no window (launch_decode_attention_v3 picks
// it; INFERX_DECODE_ATTN_TMA): a warp's 16 keys of a tile are 16 consecutive slots of one block (tiles start
// at multiples of 64 keys), so lane 0 copies them with two 2-D tensor copies (K and V: 16 rows of 128 bytes
// at the block's row stride), completing on the warp's mbarrier for the stage, instead of eight 16-byte
// cp.async per lane. Why: on some H200 nodes the L2 saw two sector lookups per DRAM sector with the 16-byte
// copies (88% busy, the kernel at 76% of copy), and one bulk copy per row halved them but cost 20% in copy
// issue; two copies per warp and tile keep the bulk path's requests without that cost. Measured on a node
// without the doubling (docs/benchmarks.md, 2026-12-04): level at the kernel, 11% fewer instructions, +1.4%
// end to end. Rows past the split's keys or in an invalid block get zero V rows after the copy lands (V must
// be finite where P is 0; their K rows are masked by ok).
template <int HD>
struct TmaLoader {
  using L = Layout<uint8_t, HD, true>;
  static_assert(L::kRowBytes == 128 && L::kTileBytes == kTile * 128,
                "the 128-byte swizzle takes rows of 128 bytes");
  const CUtensorMap* k_map;  // [rows = num_blocks * block_size, hkv * HD bytes]
  const CUtensorMap* v_map;
  const int32_t* table;
  int max_blocks, num_blocks, bs_shift, block_size;
  int col;  // the CTA's kv head * HD
  int warp, lane, end;
  int32_t blk;  // the block of the warp's 16 keys of the next tile (every lane holds it)

  __device__ __forceinline__ void prefetch(int j0, int /*end*/) {
    const int b = j0 >> bs_shift;
    blk = j0 < end && b < max_blocks ? __ldg(&table[b]) : -1;
  }
  template <class SmemT>
  __device__ __forceinline__ void begin(SmemT& s, int stage, int j0) {
    const bool valid = blk >= 0 && blk < num_blocks;
    if (lane < 16) s.ok[stage][warp * 16 + lane] = valid && j0 + lane < end;
    // The lanes' generic accesses to this stage (the reads of its last tile, the zeroed rows) before the
    // async proxy's writes.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    if (lane != 0) return;
    uint64_t* bar = &s.bar[warp][stage];
    if (!valid) {
      mbar_arrive(bar);  // no copy: the phase completes with the arrival
      return;
    }
    mbar_expect_tx(bar, 2 * 16 * L::kRowBytes);
    const int row = blk * block_size + (j0 & (block_size - 1));
    tensor_copy(s.k[stage] + warp * 16 * L::kRowBytes, k_map, row, bar);
    tensor_copy(s.v[stage] + warp * 16 * L::kRowBytes, v_map, row, bar);
  }
  __device__ __forceinline__ void tensor_copy(uint8_t* dst, const CUtensorMap* map, int row, uint64_t* bar) {
    tensor_copy_2d(dst, map, col, row, bar);
  }
  // After the wait for a stage: zero V rows of keys that are not valid (lanes 0..15, one row each).
  template <class SmemT>
  __device__ __forceinline__ void clear_invalid(SmemT& s, int stage) {
    if (lane < 16 && !s.ok[stage][warp * 16 + lane]) {
      uint4* row = reinterpret_cast<uint4*>(s.v[stage] + (warp * 16 + lane) * L::kRowBytes);
#pragma unroll
      for (int i = 0; i < L::kChunks; ++i) row[i] = make_uint4(0, 0, 0, 0);
    }
    __syncwarp();
  }
};

// The K and V tensor maps of a TmaLoader launch (unused by the cp.async instances).
struct TmaMaps {
  CUtensorMap k, v;
};

// A launch's DecodeRope (kernels.h; r.k null: q is rotated and the keys written already) with what the
// launcher adds: the cache's inverse scales (FP8: the codes launch_rope_write_kv stores) and where the
// angles' cosines and sines go in dynamic shared memory (after the tiles and the cluster form's merge area).
struct RopeIn {
  DecodeRope r;         // r.product: host pointer, not read on the device
  Fp8Epilogue product;  // *r.product (acc null: none)
  float inv_k_scale, inv_v_scale;
  int table_smem;  // byte offset (a multiple of 16) of cos[HD / 2], sin[HD / 2], then the newest key[HD],
                   // value[HD]
};

// Element e of key row `key` of a K (kV false) or V tile stage: where the loaders put it (Layout's chunks).
template <class L, class CacheT>
__device__ __forceinline__ CacheT* tile_element(uint8_t* stage, int key, int e, bool kV) {
  const int byte = e * static_cast<int>(sizeof(CacheT));
  const int chunk = kV ? L::v_chunk(key, byte / 16) : L::k_chunk(key, byte / 16);
  return reinterpret_cast<CacheT*>(stage + key * L::kRowBytes + chunk * 16 + byte % 16);
}

// (x0, x1) as the high term (rounded) and the low term (the rounding's remainder, rounded) of F16 (kF16) or
// BF16 pairs, the first value at the lower address.
template <bool kF16>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if constexpr (kF16) {
    const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
    hi = static_cast<uint32_t>(__half_as_ushort(h0)) | (static_cast<uint32_t>(__half_as_ushort(h1)) << 16);
    lo = attn::pack_f16(x0 - __half2float(h0), x1 - __half2float(h1));
  } else {
    const __nv_bfloat16 h0 = __float2bfloat16_rn(x0), h1 = __float2bfloat16_rn(x1);
    hi = static_cast<uint32_t>(__bfloat16_as_ushort(h0)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(h1)) << 16);
    lo = attn::pack_bf16(x0 - __bfloat162float(h0), x1 - __bfloat162float(h1));
  }
}

template <bool kF16>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kF16)
    attn::mma_f16(c, a, b0, b1);
  else
    attn::mma_bf16(c, a, b0, b1);
}

// Max / sum over the 8 lanes that share a column of a C fragment (lanes t, t + 4, ..., t + 28).
__device__ __forceinline__ float column_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
}
__device__ __forceinline__ float column_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}

// The head dim of row `row` (0..15) of O^T's m-tile mt: BF16 in order (ldmatrix.trans), FP8 permuted so
// that lane g's rows are the HD/8 dims from (HD/8) g.
template <bool kFp8, int HD>
__device__ __forceinline__ int out_dim(int mt, int row) {
  if constexpr (kFp8)
    return (HD / 8) * (row & 7) + 2 * mt + (row >> 3);
  else
    return 16 * mt + row;
}

// Grid: (token * kv heads * head chunks, split), as v2. kTerms: F16 / BF16 terms of Q and P in the products
// (2: F32-equivalent; 1: their rounded values alone, FP8 caches only - see decode_attention_terms).
template <class CacheT, int HD, int NT, bool kTma, int kTerms>
__global__ void __launch_bounds__(kThreads, min_blocks<CacheT, NT>())
    decode_attention_kernel_v3(const __grid_constant__ TmaMaps maps, const __grid_constant__ RopeIn rope,
                               const float* __restrict__ q, const CacheT* k_cache, const CacheT* v_cache,
                               int64_t num_blocks, int block_size, const __grid_constant__ BatchArgs batch,
                               int hq, int hkv, float q_mult, float s_scale, float out_scale, int64_t window,
                               int min_split_tiles, float* __restrict__ part_acc, float* __restrict__ part_ml,
                               int* __restrict__ counters, float* __restrict__ out,
                               __nv_bfloat16* __restrict__ out_bf16, bool lazy_rescale, bool cluster) {
  static_assert(!kTma || sizeof(CacheT) == 1, "tensor copies: FP8 caches");
  static_assert(kTerms == 2 || (kTerms == 1 && sizeof(CacheT) == 1), "single terms: FP8 caches");
  using L = Layout<CacheT, HD, kTma>;
  constexpr bool kFp8 = L::kFp8;
  constexpr int kH = 8 * NT;  // query heads a CTA holds
  constexpr int kStages = L::kStages, kAhead = kStages - 1;
  static_assert(kAhead >= 1 && kAhead <= 2, "the cp.async waits below handle one or two tiles ahead");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<Smem<CacheT, HD>*>(smem_raw);

  const int group = hq / hkv;
  const int chunks = (group + kGroupChunk - 1) / kGroupChunk;
  const int heads_x = hkv * chunks;
  const int t = blockIdx.x / heads_x, head_x = blockIdx.x % heads_x, split = blockIdx.y, splits = gridDim.y;
  const int kvh = head_x / chunks, chunk = head_x % chunks;
  const int h0 = kvh * group + chunk * kGroupChunk;
  const int nh = min(kGroupChunk, group - chunk * kGroupChunk);  // <= kH (the launcher's choice of NT)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane / 4, tq = lane % 4;

  const bool stamping = c_stamps.records != nullptr && threadIdx.x == 0;
  const uint64_t start_ns = stamping ? global_ns() : 0, start_cycles = stamping ? clock64() : 0;
  const int s = find_sequence(batch.query_start, batch.num_seqs, t);
  const attn::SplitKeys keys =
      attn::split_keys<kTile>(batch.positions[t], batch.seq_lens[s], window, split, splits, min_split_tiles);
  // A split past the token's keys: nothing to read, no partial to write (the merge takes keys.used). Whole
  // CTA (split and used are uniform), before any barrier; its exit counts as its PDL trigger.
  if (split >= keys.used) return;
  // Cluster launches (decode_attention_cluster): the barrier's first phase, waited on before the first
  // store into rank 0's shared memory (finish_decode_cluster).
  if (cluster) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  StampRecord* rec = nullptr;  // thread 0's stamps (c_stamps)
  if (stamping) {
    const unsigned at = atomicAdd(c_stamps.count, 1u);
    if (at < c_stamps.capacity) {
      rec = c_stamps.records + at;
      rec->block_x = blockIdx.x;
      rec->block_y = blockIdx.y;
      rec->ns[0] = start_ns;
      rec->cycles[0] = start_cycles;
    }
  }
  const int last = keys.last, k_begin = keys.k_begin, k_end = keys.k_end, n_tiles = keys.n_tiles;
  const int w0 = k_begin + warp * 16;  // this warp's first key of tile 0

  // RoPE in the kernel (RopeIn). Before the wait (step metadata only): the token's angles as a table in
  // shared memory, and in the split holding the newest key that key's cache slot (launch_rope_write_kv's:
  // -1 where the engine never writes it) and its row in the last tile. After the wait every lane rotates its
  // own query values in registers, and the warp whose rows hold the newest key rotates it, writes it and its
  // value into the cache and into shared memory, from where they go into the landed tile in place of the
  // stale row the copy brought (so that no copy waits on the write; shared memory rather than registers
  // through the tiles: held in registers the new key took the BF16-cache kernel from 155 to 165 registers).
  // Measured (H100, 2026-12-07): -0.95 us per decode layer at batch 1 (docs/architecture.md).
  const bool roped = rope.r.k != nullptr;
  // Value c of the token's q/k/v row as the product's split epilogue would have written it (RopeIn::product).
  const auto product_value = [&](int64_t c) {
    const Fp8Epilogue& d = rope.product;
    return w8a8_value(d, to_float(static_cast<const __nv_bfloat16*>(d.acc)[t * d.n + c]), d.x_scale[t], c);
  };
  const bool from_product = roped && rope.product.acc != nullptr;
  int64_t key_slot = -1;
  int key_row = -1;  // the newest key's row in the last tile, where this warp holds it (-1: not this warp)
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  float* new_kv = nullptr;  // the newest key (rotated) and value, [2][HD]
  if (roped) {
    float* table = reinterpret_cast<float*>(smem_raw + rope.table_smem);
    new_kv = table + HD;
    const int32_t pos = batch.positions[t];
    if (threadIdx.x < HD / 2)
      sincosf(static_cast<float>(pos) * rope.r.inv_freq[threadIdx.x], &table[HD / 2 + threadIdx.x],
              &table[threadIdx.x]);
    rope_cos = table;
    rope_sin = table + HD / 2;
    const int row = pos - (k_begin + (n_tiles - 1) * kTile);  // in the split's last tile
    if (split == keys.used - 1 && row >= 0 && row < kTile) {
      key_slot = kv_cache_slot(batch, s, pos, block_size, num_blocks, static_cast<int64_t>(hkv) * HD);
      if (key_slot >= 0 && row / 16 == warp) key_row = row;
    }
    __syncthreads();  // the table
  }

  std::conditional_t<kTma, TmaLoader<HD>, Loader<CacheT, HD>> loader;
  if constexpr (kTma) {
    // The swizzle is a function of the shared address: the tiles must start on 1024 bytes.
    if ((smem_addr(smem_raw) & 1023u) != 0) __trap();
    loader.k_map = &maps.k;
    loader.v_map = &maps.v;
    loader.col = kvh * HD;
    loader.warp = warp;
    loader.lane = lane;
    loader.end = k_end;
    if (lane == 0) {
#pragma unroll
      for (int st = 0; st < kStages; ++st) mbar_init(&sm.bar[warp][st], 1);
      mbar_init_fence();
    }
    __syncwarp();
  } else {
    loader.key0 = warp * 16 + lane / L::kChunks;
    loader.c = lane % L::kChunks;
    loader.k_base = k_cache + static_cast<int64_t>(kvh) * HD + loader.c * Loader<CacheT, HD>::kElems;
    loader.v_base = v_cache + static_cast<int64_t>(kvh) * HD + loader.c * Loader<CacheT, HD>::kElems;
  }
  loader.table = batch.block_tables + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
  loader.max_blocks = batch.max_blocks_per_seq;
  loader.num_blocks = static_cast<int>(num_blocks);
  loader.block_size = block_size;
  loader.bs_shift = __ffs(block_size) - 1;
  if constexpr (!kTma) loader.kv_row = hkv * HD;
  attn::start_decode_tiles<kAhead, kTile>(loader, sm, n_tiles, k_begin, w0, last, k_end);
  stamp(rec, 1);

  // The newest key's warp (the q/k/v product's key and value, after the wait; its tiles are in flight):
  // pairs i = lane + 32 m rotated, into the cache and into new_kv.
  if (key_row >= 0) {
    const int64_t src = (static_cast<int64_t>(t) * hkv + kvh) * HD;
    CacheT* kc = const_cast<CacheT*>(k_cache) + key_slot + kvh * HD;
    CacheT* vc = const_cast<CacheT*>(v_cache) + key_slot + kvh * HD;
    const int64_t kc0 = static_cast<int64_t>(hq + kvh) * HD, vc0 = static_cast<int64_t>(hq + hkv + kvh) * HD;
    for (int i = lane; i < HD / 2; i += kWarp) {
      const int a = rope_pair_a(rope.r.interleaved, i), b = rope_pair_b(rope.r.interleaved, i, HD);
      float y0, y1;
      const float k0 = from_product ? product_value(kc0 + a) : rope.r.k[src + a];
      const float k1 = from_product ? product_value(kc0 + b) : rope.r.k[src + b];
      rope_rotate(k0, k1, rope_cos[i], rope_sin[i], y0, y1);
      const float v0 = from_product ? product_value(vc0 + a) : rope.r.v[src + a];
      const float v1 = from_product ? product_value(vc0 + b) : rope.r.v[src + b];
      store_kv(kc + a, y0, rope.inv_k_scale);
      store_kv(kc + b, y1, rope.inv_k_scale);
      store_kv(vc + a, v0, rope.inv_v_scale);
      store_kv(vc + b, v1, rope.inv_v_scale);
      new_kv[a] = y0, new_kv[b] = y1, new_kv[HD + a] = v0, new_kv[HD + b] = v1;
    }
    __syncwarp();
  }

  // Q^T's B fragments, q * q_mult (the scores in the log2 domain are s_scale times the products), two
  // terms: for k-step 2c + kk, b0 holds dims
  // 32c + 8tq + 4kk + {0, 1} and b1 dims + {2, 3} of head nt * 8 + g (zeros past the group).
  // With RoPE in the kernel each lane rotates its own values: NeoX pairs (i, i + HD / 2) are chunks c and
  // c + HD / 64 of the same lane, interleaved pairs neighbours within a chunk.
  uint32_t qb[2][NT][HD / 16][2];
  const float* qh = q + (static_cast<int64_t>(t) * hq + h0) * HD;  // head r at qh + r * HD
  const auto load_chunk = [&](int r, int c, float(&x)[8]) {
    if (from_product) {
      const int64_t c0 = static_cast<int64_t>(h0 + r) * HD + 32 * c + 8 * tq;
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = product_value(c0 + j);
      return;
    }
    const float4* qp = reinterpret_cast<const float4*>(qh + r * HD + 32 * c + 8 * tq);
    const float4 a = __ldg(qp), b = __ldg(qp + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  };
  const auto split_chunk = [&](int nt, int c, const float(&x)[8]) {
#pragma unroll
    for (int p = 0; p < 4; ++p)
      split_pair<kFp8>(x[2 * p] * q_mult, x[2 * p + 1] * q_mult, qb[0][nt][2 * c + p / 2][p % 2],
                       qb[1][nt][2 * c + p / 2][p % 2]);
  };
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int r = nt * 8 + g;
    if (roped && !rope.r.interleaved) {
#pragma unroll
      for (int c = 0; c < HD / 64; ++c) {
        float lo[8] = {}, hi[8] = {};
        if (r < nh) {
          load_chunk(r, c, lo);
          load_chunk(r, c + HD / 64, hi);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int i = 32 * c + 8 * tq + j;
            float y0, y1;
            rope_rotate(lo[j], hi[j], rope_cos[i], rope_sin[i], y0, y1);
            lo[j] = y0, hi[j] = y1;
          }
        }
        split_chunk(nt, c, lo);
        split_chunk(nt, c + HD / 64, hi);
      }
    } else {
#pragma unroll
      for (int c = 0; c < HD / 32; ++c) {
        float x[8] = {};
        if (r < nh) {
          load_chunk(r, c, x);
          if (roped) {
#pragma unroll
            for (int p = 0; p < 4; ++p) {
              const int i = 16 * c + 4 * tq + p;
              float y0, y1;
              rope_rotate(x[2 * p], x[2 * p + 1], rope_cos[i], rope_sin[i], y0, y1);
              x[2 * p] = y0, x[2 * p + 1] = y1;
            }
          }
        }
        split_chunk(nt, c, x);
      }
    }
  }

  float o[NT][HD / 16][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int mt = 0; mt < HD / 16; ++mt) o[nt][mt][0] = o[nt][mt][1] = o[nt][mt][2] = o[nt][mt][3] = 0.0f;
  float m[NT][2], l[NT][2];  // heads nt * 8 + 2tq + {0, 1}; l over this lane's keys only
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) m[nt][0] = m[nt][1] = -CUDART_INF_F, l[nt][0] = l[nt][1] = 0.0f;

  const int kr0 = warp * 16 + g, kr1 = kr0 + 8;  // this lane's S^T rows
  for (int it = 0; it < n_tiles; ++it) {
    const int st = it % kStages;
    if (it + kAhead < n_tiles) {
      loader.begin(sm, (it + kAhead) % kStages, w0 + (it + kAhead) * kTile);
      if (it + kAhead + 1 < n_tiles) loader.prefetch(w0 + (it + kAhead + 1) * kTile, k_end);
    }
    if constexpr (kTma) {
      mbar_wait(&sm.bar[warp][st], static_cast<uint32_t>((it / kStages) & 1));
      loader.clear_invalid(sm, st);
    } else {
      const int after = min(kAhead, n_tiles - 1 - it);  // groups committed after tile it's
      if (after >= 2)
        attn::cp_async_wait<(kAhead >= 2 ? 2 : 0)>();
      else if (after == 1)
        attn::cp_async_wait<1>();
      else
        attn::cp_async_wait<0>();
    }
    if (key_row >= 0 && it == n_tiles - 1) {  // the newest key (RopeIn) over the row the copy brought
      // A lane's cp.async wait covers its own copies only, and other lanes copied parts of this row: the
      // warp synchronises before overwriting it (racecheck, 12-07: write-after-write hazards between the
      // row's LDGSTS and these stores without it). The TMA form's barrier wait covers the whole tile.
      if constexpr (!kTma) __syncwarp();
      for (int e = lane; e < HD; e += kWarp) {
        store_kv(tile_element<L, CacheT>(sm.k[st], key_row, e, false), new_kv[e], rope.inv_k_scale);
        store_kv(tile_element<L, CacheT>(sm.v[st], key_row, e, true), new_kv[HD + e], rope.inv_v_scale);
      }
    }
    __syncwarp();  // the warp's 16 keys of tile it, copied by its own lanes (or its TMA copies)
    const uint8_t* ks = sm.k[st];
    const uint8_t* vs = sm.v[st];

    // S^T = K Q^T: per 32-dim chunk, rows kr0 / kr1 dims 32c + 8tq .. + 7 are k-steps 2c (pairs 0, 1) and
    // 2c + 1 (pairs 2, 3); the terms accumulate separately (independent chains).
    float sc[2][NT][4] = {};
#pragma unroll
    for (int c = 0; c < HD / 32; ++c) {
      uint32_t r0[4], r1[4];  // dim pairs 0..3 of rows kr0, kr1
      if constexpr (kFp8) {
        const int lc = 2 * c + tq / 2, within = 8 * (tq % 2);
        const uint2 w0v =
            *reinterpret_cast<const uint2*>(ks + kr0 * L::kRowBytes + L::k_chunk(kr0, lc) * 16 + within);
        const uint2 w1v =
            *reinterpret_cast<const uint2*>(ks + kr1 * L::kRowBytes + L::k_chunk(kr1, lc) * 16 + within);
        r0[0] = attn::e4m3x2_to_f16x2(w0v.x), r0[1] = attn::e4m3x2_to_f16x2(w0v.x >> 16);
        r0[2] = attn::e4m3x2_to_f16x2(w0v.y), r0[3] = attn::e4m3x2_to_f16x2(w0v.y >> 16);
        r1[0] = attn::e4m3x2_to_f16x2(w1v.x), r1[1] = attn::e4m3x2_to_f16x2(w1v.x >> 16);
        r1[2] = attn::e4m3x2_to_f16x2(w1v.y), r1[3] = attn::e4m3x2_to_f16x2(w1v.y >> 16);
      } else {
        const int lc = 4 * c + tq;
        const uint4 w0v = *reinterpret_cast<const uint4*>(ks + kr0 * L::kRowBytes + L::k_chunk(kr0, lc) * 16);
        const uint4 w1v = *reinterpret_cast<const uint4*>(ks + kr1 * L::kRowBytes + L::k_chunk(kr1, lc) * 16);
        r0[0] = w0v.x, r0[1] = w0v.y, r0[2] = w0v.z, r0[3] = w0v.w;
        r1[0] = w1v.x, r1[1] = w1v.y, r1[2] = w1v.z, r1[3] = w1v.w;
      }
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const uint32_t a[4] = {r0[2 * kk], r1[2 * kk], r0[2 * kk + 1], r1[2 * kk + 1]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int term = 0; term < kTerms; ++term)
            mma<kFp8>(sc[term][nt], a, qb[term][nt][2 * c + kk][0], qb[term][nt][2 * c + kk][1]);
      }
    }
    const bool ok0 = sm.ok[st][kr0], ok1 = sm.ok[st][kr1];
    float corr[NT][2];
    uint32_t pb[2][NT][2];  // P^T's B fragments: [term][nt][keys 0-7 / 8-15]
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float p[4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float d0 = kTerms == 2 ? sc[0][nt][j] + sc[1][nt][j] : sc[0][nt][j];
        const float d1 = kTerms == 2 ? sc[0][nt][2 + j] + sc[1][nt][2 + j] : sc[0][nt][2 + j];
        const float s0 = ok0 ? d0 * s_scale : -CUDART_INF_F;  // key kr0, head 2tq+j
        const float s1 = ok1 ? d1 * s_scale : -CUDART_INF_F;  // key kr1
        const float mn = fmaxf(m[nt][j], column_max(fmaxf(s0, s1)));
        const float base = mn == -CUDART_INF_F ? 0.0f : mn;
        corr[nt][j] = exp2f(m[nt][j] - base);
        m[nt][j] = mn;
        p[j] = exp2f(s0 - base);
        p[2 + j] = exp2f(s1 - base);
        l[nt][j] = l[nt][j] * corr[nt][j] + p[j] + p[2 + j];
      }
      uint32_t hi01, lo01, hi23, lo23;
      split_pair<kFp8>(p[0], p[1], hi01, lo01);  // key kr0 (row g of keys 0-7), heads 2tq, 2tq + 1
      split_pair<kFp8>(p[2], p[3], hi23, lo23);  // key kr1 (row g of keys 8-15)
      pb[0][nt][0] = attn::movmatrix_trans(hi01);
      pb[1][nt][0] = attn::movmatrix_trans(lo01);
      pb[0][nt][1] = attn::movmatrix_trans(hi23);
      pb[1][nt][1] = attn::movmatrix_trans(lo23);
    }
    bool rescale = true;
    if (lazy_rescale) {  // attention_lazy_rescale: skip when every factor of the warp is exactly 1
      bool moved = false;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) moved = moved || corr[nt][0] != 1.0f || corr[nt][1] != 1.0f;
      rescale = __any_sync(0xffffffffu, moved);
    }
    if (rescale) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int mt = 0; mt < HD / 16; ++mt) {
          o[nt][mt][0] *= corr[nt][0];
          o[nt][mt][1] *= corr[nt][1];
          o[nt][mt][2] *= corr[nt][0];
          o[nt][mt][3] *= corr[nt][1];
        }
    }

    // O^T += V^T P^T, one k-step (the warp's 16 keys) per m-tile of 16 dims.
    if constexpr (kFp8) {
      // Keys 2tq, 2tq + 1, 2tq + 8, 2tq + 9 of the warp, dims (HD/8) g .. + HD/8 - 1, 8 bytes (4 m-tiles) at
      // a time (fewer live registers: the kernel is sized for 128).
      constexpr int kBytes = HD / 8;
#pragma unroll
      for (int half = 0; half < kBytes / 8; ++half) {
        uint2 w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = warp * 16 + 2 * tq + (i & 1) + (i >> 1) * 8;
          const int byte = kBytes * g + 8 * half;
          w[i] = *reinterpret_cast<const uint2*>(vs + key * L::kRowBytes + L::v_chunk(key, byte / 16) * 16 +
                                                 byte % 16);
        }
#pragma unroll
        for (int m4 = 0; m4 < 4; ++m4) {
          // Bytes 2mt (row g) and 2mt + 1 (row g + 8) of keys (2tq, 2tq + 1) and (2tq + 8, 2tq + 9).
          const int mt = 4 * half + m4;
          const uint32_t sel = (m4 % 2) ? 0x7362u : 0x5140u;
          const uint32_t x01 = __byte_perm(m4 < 2 ? w[0].x : w[0].y, m4 < 2 ? w[1].x : w[1].y, sel);
          const uint32_t x89 = __byte_perm(m4 < 2 ? w[2].x : w[2].y, m4 < 2 ? w[3].x : w[3].y, sel);
          const uint32_t a[4] = {attn::e4m3x2_to_f16x2(x01), attn::e4m3x2_to_f16x2(x01 >> 16),
                                 attn::e4m3x2_to_f16x2(x89), attn::e4m3x2_to_f16x2(x89 >> 16)};
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int term = kTerms - 1; term >= 0; --term)
              mma<true>(o[nt][mt], a, pb[term][nt][0], pb[term][nt][1]);
        }
      }
    } else {
      const int i = lane >> 3, key = warp * 16 + (i >> 1) * 8 + (lane & 7);
#pragma unroll
      for (int mt = 0; mt < HD / 16; ++mt) {
        uint32_t a[4];
        attn::ldmatrix_x4_trans(a, vs + key * L::kRowBytes + L::v_chunk(key, 2 * mt + (i & 1)) * 16);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int term = kTerms - 1; term >= 0; --term)
            mma<false>(o[nt][mt], a, pb[term][nt][0], pb[term][nt][1]);
      }
    }
    __syncwarp();  // the warp's next copies overwrite its rows of this stage
  }
  stamp(rec, 2);
  __syncthreads();  // every warp is done with the tiles: the merge below reuses them

  // Merge the 4 warps' states through shared memory.
  float* s_o = reinterpret_cast<float*>(smem_raw);  // [warp][head][HD]
  float* s_m = s_o + kWarps * kH * HD;              // [warp][head]
  float* s_l = s_m + kWarps * kH;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int h = nt * 8 + 2 * tq;
#pragma unroll
    for (int mt = 0; mt < HD / 16; ++mt) {
      const int d0 = out_dim<kFp8, HD>(mt, g), d1 = out_dim<kFp8, HD>(mt, g + 8);
      s_o[(warp * kH + h) * HD + d0] = o[nt][mt][0];
      s_o[(warp * kH + h + 1) * HD + d0] = o[nt][mt][1];
      s_o[(warp * kH + h) * HD + d1] = o[nt][mt][2];
      s_o[(warp * kH + h + 1) * HD + d1] = o[nt][mt][3];
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float lj = column_sum(l[nt][j]);
      if (g == 0) {
        s_m[warp * kH + h + j] = m[nt][j];
        s_l[warp * kH + h + j] = lj;
      }
    }
  }
  __syncthreads();
  stamp(rec, 3);
  const int64_t row0 = static_cast<int64_t>(t) * hq + h0;
  const attn::DecodeResult res{out,
                               out_bf16,
                               part_acc,
                               part_ml,
                               counters ? counters + static_cast<int64_t>(t) * heads_x + head_x : nullptr,
                               row0,
                               nh,
                               keys.used,
                               split,
                               splits,
                               out_scale};
  if (cluster)
    attn::finish_decode_cluster<kWarps, kH, HD, kThreads>(
        s_o, s_m, s_l, res, reinterpret_cast<float*>(smem_raw + smem_bytes<CacheT, HD, NT>()));
  else
    attn::finish_decode<kWarps, kH, HD, kThreads, true>(s_o, s_m, s_l, res);
  stamp(rec, 4);
}

// INFERX_DECODE_ATTN_TMA=0|1 (read once; default 1): TmaLoader where it applies. Measured (H200, 2026-12-04,
// one call): kernel level with the cp.async loader at 512 rows x 1.5k context (412.9 vs 411.4 us, 92% of
// copy; 11% fewer instructions), 3% slower at 256 x 1k, offline 1000 x 1000/1000 FP8 14,940 vs 14,728
// output tok/s (+1.4%).
bool tma_enabled() {
  static const bool on = env_int("INFERX_DECODE_ATTN_TMA", 0, 1, 1) == 1;
  return on;
}

// The 2-D view TmaLoader copies from: rows = cache slots, hkv * HD bytes each; boxes of 16 rows x HD bytes
// with the 128-byte swizzle. False if the driver refuses it (the caller then takes the cp.async loader).
bool encode_kv_map(CUtensorMap& map, const void* base, const PagedKv& cache, int hkv, int hd) {
  const auto bytes_per_slot = static_cast<uint64_t>(hkv) * hd;
  return encode_rows_map(map, base, CU_TENSOR_MAP_DATA_TYPE_UINT8, bytes_per_slot,
                         static_cast<uint64_t>(cache.num_blocks * cache.block_size), bytes_per_slot,
                         static_cast<uint32_t>(hd), 16, CU_TENSOR_MAP_SWIZZLE_128B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
}

// Whether TmaLoader takes this launch (its conditions: the comment above it).
bool tma_applies(const PagedKv& cache, int hd, int64_t window) {
  return tma_enabled() && cache.dtype == DType::F8_E4M3 && hd == 128 && window <= 0 &&
         cache.block_size % 16 == 0 && is_aligned(cache.k, 16) && is_aligned(cache.v, 16) &&
         cache.num_blocks * cache.block_size < (1ll << 31);
}

// Bytes of rank 0's merge area in a cluster launch of `splits` CTAs over groups of `rows` query heads
// (finish_decode_cluster). Llama-3's groups of 4 at 16 splits: 33 KB, so that two CTAs of the BF16 kernel
// (66.5 KB of tiles) fit an SM.
template <int HD>
constexpr int cluster_area_bytes(int splits, int rows) {
  return splits * rows * (HD + 2) * static_cast<int>(sizeof(float));
}

template <class CacheT, int HD, int NT, bool kTma, int kTerms>
cudaError_t launch_typed(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                         float scale, int64_t window, DecodeSplitPlan plan, void* scratch, int* counters,
                         float* out, void* out_bf16, cudaStream_t stream, const TmaMaps& maps,
                         const DecodeRope* rope) {
  auto* const kernel = decode_attention_kernel_v3<CacheT, HD, NT, kTma, kTerms>;
  static unsigned smem_set = 0;
  constexpr int kSmem = smem_bytes<CacheT, HD, NT>();
  constexpr int kClusterSmem = kSmem + cluster_area_bytes<HD>(kMaxClusterSplits, 8);
  // RopeIn's table of cosines and sines and the newest key and value, after the rest on 16 bytes.
  constexpr int kRopeTableBytes = 16 + 3 * HD * static_cast<int>(sizeof(float));
  // The attribute is the largest any launch of this instance takes (the cluster form's, for one n-tile,
  // with the table).
  const cudaError_t st =
      allow_dynamic_smem(kernel, (NT == 1 ? kClusterSmem : kSmem) + kRopeTableBytes, smem_set);
  if (st != cudaSuccess) return st;
  const int chunks = (hq / hkv + kGroupChunk - 1) / kGroupChunk;
  const int table_bytes = rope ? kRopeTableBytes : 0;
  int splits = plan.splits, smem = kSmem;
  const auto groups = static_cast<unsigned>(batch.num_tokens * hkv * chunks);
  bool cluster = false;  // whether the launch takes the cluster form, decode_attention_cluster
  if constexpr (NT == 1) {
    // Where it runs in one wave: batch 1 and the like. Rank 0's merge area follows its tiles.
    if (decode_attention_cluster() && splits > 1) {
      const int cs = std::min(splits, kMaxClusterSplits);
      const int total = kSmem + cluster_area_bytes<HD>(cs, std::min(hq / hkv, 8));
      if (cluster_launch_fits(reinterpret_cast<const void*>(kernel), dim3(1, static_cast<unsigned>(cs)),
                              kThreads, total + table_bytes, groups)) {
        cluster = true;
        splits = cs;
        smem = total;
        g_cluster_launches.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  float* part_acc = static_cast<float*>(scratch);
  float* part_ml = part_acc ? part_acc + static_cast<int64_t>(batch.num_tokens) * hq * splits * HD : nullptr;
  const bool fp8 = cache.dtype == DType::F8_E4M3;
  const DecodeQueryScaling qs = decode_query_scaling(scale, cache.dtype, cache.k_scale);
  const float out_scale = fp8 ? cache.v_scale : 1.0f;
  RopeIn rope_in{};
  if (rope) {
    g_rope_launches.fetch_add(1, std::memory_order_relaxed);
    rope_in.r = *rope;
    if (rope->product) rope_in.product = *rope->product;
    rope_in.inv_k_scale = fp8 ? 1.0f / cache.k_scale : 1.0f;
    rope_in.inv_v_scale = fp8 ? 1.0f / cache.v_scale : 1.0f;
    rope_in.table_smem = (smem + 15) / 16 * 16;  // the cluster form's merge area may end off 16 bytes
    smem += table_bytes;
  }
  return launch_pdl_clusters(kernel, dim3(groups, static_cast<unsigned>(splits)),
                             dim3(1, cluster ? static_cast<unsigned>(splits) : 1u), dim3(kThreads),
                             static_cast<size_t>(smem), stream, maps, rope_in, q,
                             static_cast<const CacheT*>(cache.k), static_cast<const CacheT*>(cache.v),
                             cache.num_blocks, static_cast<int>(cache.block_size), batch, hq, hkv, qs.q_mult,
                             qs.s_scale, out_scale, window, plan.min_tiles, part_acc, part_ml, counters, out,
                             static_cast<__nv_bfloat16*>(out_bf16), attention_lazy_rescale(), cluster);
}

template <class CacheT, int HD, int kTerms>
cudaError_t launch_terms(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                         float scale, int64_t window, DecodeSplitPlan plan, void* scratch, int* counters,
                         float* out, void* out_bf16, cudaStream_t stream, const DecodeRope* rope) {
  TmaMaps maps{};
  if constexpr (sizeof(CacheT) == 1 && HD == 128) {
    if (tma_applies(cache, HD, window) && encode_kv_map(maps.k, cache.k, cache, hkv, HD) &&
        encode_kv_map(maps.v, cache.v, cache, hkv, HD)) {
      if (hq / hkv <= 8)
        return launch_typed<CacheT, HD, 1, true, kTerms>(q, cache, batch, hq, hkv, scale, window, plan,
                                                         scratch, counters, out, out_bf16, stream, maps,
                                                         rope);
      return launch_typed<CacheT, HD, 2, true, kTerms>(q, cache, batch, hq, hkv, scale, window, plan, scratch,
                                                       counters, out, out_bf16, stream, maps, rope);
    }
  }
  if (hq / hkv <= 8)
    return launch_typed<CacheT, HD, 1, false, kTerms>(q, cache, batch, hq, hkv, scale, window, plan, scratch,
                                                      counters, out, out_bf16, stream, maps, rope);
  return launch_typed<CacheT, HD, 2, false, kTerms>(q, cache, batch, hq, hkv, scale, window, plan, scratch,
                                                    counters, out, out_bf16, stream, maps, rope);
}

template <class CacheT, int HD>
cudaError_t launch_heads(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq, int hkv,
                         float scale, int64_t window, DecodeSplitPlan plan, void* scratch, int* counters,
                         float* out, void* out_bf16, cudaStream_t stream, const DecodeRope* rope) {
  if constexpr (sizeof(CacheT) == 1) {
    if (decode_attention_terms() == 1)
      return launch_terms<CacheT, HD, 1>(q, cache, batch, hq, hkv, scale, window, plan, scratch, counters,
                                         out, out_bf16, stream, rope);
  }
  return launch_terms<CacheT, HD, 2>(q, cache, batch, hq, hkv, scale, window, plan, scratch, counters, out,
                                     out_bf16, stream, rope);
}

}  // namespace

DecodeQueryScaling decode_query_scaling(float scale, DType dtype, float k_scale) {
  const bool fp8 = dtype == DType::F8_E4M3;
  DecodeQueryScaling s{scale * kLog2e * (fp8 ? k_scale : 1.0f), 1.0f};
  if (fp8 && s.q_mult > 0.0f && std::isfinite(s.q_mult)) {
    int e = 0;
    s.q_mult = std::frexp(s.q_mult, &e) / 16.0f;  // mantissa in [1/2, 1) -> [1/32, 1/16)
    s.s_scale = std::ldexp(1.0f, e + 4);
  }
  return s;
}

int decode_attention_terms() {
  static const int terms = env_int("INFERX_DECODE_ATTN_TERMS", 1, 2, 1);
  return terms;
}

namespace {
EnvSwitch g_lazy_rescale("INFERX_ATTN_LAZY_RESCALE", false);
}  // namespace

bool attention_lazy_rescale() { return g_lazy_rescale.on(); }
void set_attention_lazy_rescale(int mode) { g_lazy_rescale.set(mode); }
bool decode_attention_cluster() { return g_cluster_mode.on(); }
void set_decode_attention_cluster(int mode) { g_cluster_mode.set(mode); }
uint64_t decode_attention_cluster_launches() { return g_cluster_launches.load(std::memory_order_relaxed); }
uint64_t decode_rope_launches() { return g_rope_launches.load(std::memory_order_relaxed); }

cudaError_t launch_decode_attention_v3(const float* q, const PagedKv& cache, const BatchArgs& batch, int hq,
                                       int hkv, int hd, float scale, int64_t window, DecodeSplitPlan plan,
                                       void* scratch, int* counters, float* out, void* out_bf16,
                                       cudaStream_t stream, const DecodeRope* rope) {
  if (cache.dtype == DType::F8_E4M3) {
    if (hd == 64)
      return launch_heads<uint8_t, 64>(q, cache, batch, hq, hkv, scale, window, plan, scratch, counters, out,
                                       out_bf16, stream, rope);
    return launch_heads<uint8_t, 128>(q, cache, batch, hq, hkv, scale, window, plan, scratch, counters, out,
                                      out_bf16, stream, rope);
  }
  if (hd == 64)
    return launch_heads<__nv_bfloat16, 64>(q, cache, batch, hq, hkv, scale, window, plan, scratch, counters,
                                           out, out_bf16, stream, rope);
  return launch_heads<__nv_bfloat16, 128>(q, cache, batch, hq, hkv, scale, window, plan, scratch, counters,
                                          out, out_bf16, stream, rope);
}

cudaError_t set_decode_attention_stamp_sink(const StampSink& sink) {
  return cudaMemcpyToSymbol(c_stamps, &sink, sizeof(sink));
}

}  // namespace inferx::cuda
