// The batch-1 decode step as one persistent kernel; the design and its reasons are in
// kernels_decode_stack.h, the measurements in docs/benchmarks.md. Layout of a CTA (one per SM, all
// resident: a cooperative launch):
//   warps 0-14: consumers. They run the phases in order, meeting the other CTAs at a grid-wide barrier
//               after every phase whose output another CTA reads;
//   warp 15:    the producer. It walks the same phase list and copies this CTA's share of each weight
//               matrix, and after each layer's qkv rows the cached keys and values of the CTA's attention
//               item, into the next free ring stage (cp.async.bulk, completion on the stage's "full"
//               mbarrier), waiting only for a free stage ("empty" mbarrier), never for a barrier.
// A phase over a matrix of R output rows gives CTA i the rows [R i / G, R (i + 1) / G); its bytes are
// contiguous, so a stage is one bulk copy of up to 8 whole rows (two copies for gate/up: the gate rows
// and the up rows of the same outputs).
// Cross-CTA data (the residual stream, q/k/v, attention partials, the MLP activation) is read with
// __ldcg (L2): an SM's L1 is not coherent with the other SMs' writes.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels_decode_stack.h"

namespace inferx::cuda {
namespace {

// 15 consumer warps: with 8 the FP8 products ran at 1.8 TB/s (H200, 2026-12-03): one warp per row is
// latency-bound on its shared-memory loads and conversions, and needs company to fill the issue slots.
// With the producer that is 16 warps, four per SM sub-partition (each has a quarter of the registers).
constexpr int kConsumerWarps = 15;
constexpr int kConsumers = kConsumerWarps * kWarp;
constexpr int kAttnWarps = 8;  // the fewest warps walking the keys (their partials must fit the x buffer)
constexpr int kThreads = kConsumers + kWarp;  // + the producer warp
constexpr int kMaxUnits = 8;                  // rows of a stage (gate and up rows both count)
constexpr int kMaxGroup = 8;                  // query heads per KV head
constexpr int kMaxSplits = 64;
constexpr int kMaxKeysPerStage = 256;  // keys (with their values) of one ring stage; validity bits per key
constexpr int kKeyWords = kMaxKeysPerStage / 32;
constexpr int kMaxStages = 12;  // ring depth (16 KB stages fill shared memory better than 32 KB ones)
// Offsets (floats) in the misc area: scratch and flag, the 2 x kMaxStages mbarriers, key bits, partials.
constexpr int kMiscKeyBits = 32 + 2 * kMaxStages * 2;
constexpr int kMiscRed = kMiscKeyBits + kMaxStages * kKeyWords;
constexpr size_t kSmemLimit = 227 * 1024;  // opt-in shared memory per block on sm_90
constexpr size_t kMiscBytes = 2048;        // reduction scratch, flag, mbarriers, key bits, split partials
static_assert((kMiscRed + 2 * kMaxUnits * kConsumerWarps) * 4 <= kMiscBytes, "the misc area's layout");

// ---- stage geometry (host and device) -----------------------------------------------------------------
// A stage holds up to kMaxUnits whole rows (gate and up rows of the same outputs for the SiLU product); a
// row (or gate + up pair) longer than a stage is not taken (the host sizes stages for the longest row).
struct Geom {
  int32_t srcs;            // 1, or 2 for gate/up
  int32_t row_bytes;       // bytes of one source row
  int32_t rows_per_stage;  // power of two, rows_per_stage * srcs <= kMaxUnits; 0: a row does not fit
};

__host__ __device__ inline Geom stage_geometry(const StackMatrix& m, bool paired, int32_t stage_bytes) {
  Geom g;
  g.srcs = paired ? 2 : 1;
  g.row_bytes = m.k * (m.fp8 ? 1 : 2);
  const int64_t fit = stage_bytes / (static_cast<int64_t>(g.row_bytes) * g.srcs);
  int rs = 1;
  while (rs * 2 <= fit && rs * 2 * g.srcs <= kMaxUnits) rs *= 2;
  g.rows_per_stage = fit >= 1 ? rs : 0;
  return g;
}

// ---- async copies and mbarriers (PTX ISA: cp.async.bulk, mbarrier) ------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// A wait that never ends means a broken invariant (the producer's and the consumers' stage sequences
// disagree, or the grid is not co-resident): trap after kHangNs, so the launch fails with an error the
// host reports instead of hanging the process (and a GPU job's whole time budget). A decode step takes
// milliseconds; the first wait of a step can include the previous kernels' tail.
constexpr uint64_t kHangNs = 2'000'000'000ull;
__device__ __forceinline__ uint64_t gpu_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t start = gpu_ns();
  while (!mbar_try_wait(bar, parity))
    if (gpu_ns() - start > kHangNs) __trap();
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
}

// Sum over the consumer threads (scratch: kConsumerWarps floats); every consumer gets the result.
__device__ __forceinline__ float consumer_sum(float v, float* scratch) {
  v = warp_sum(v);
  if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
  consumer_sync();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) total += scratch[w];
  consumer_sync();
  return total;
}

// Grid-wide barrier of the consumers: CTA barrier, then one thread's release-add and acquire-spin at GPU
// scope (the CTA barrier orders the other threads' writes before the release, which is cumulative).
// `target` grows by gridDim.x per barrier. A __threadfence() before the add (the cooperative-groups
// pattern) waits for this SM's outstanding memory operations, microseconds behind a saturated stream.
__device__ __forceinline__ void grid_barrier(uint32_t* counter, uint32_t target) {
  consumer_sync();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    const uint64_t start = gpu_ns();
    for (;;) {
      uint32_t seen;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      if (seen >= target) break;
      if (gpu_ns() - start > kHangNs) __trap();
    }
  }
  consumer_sync();
}

__device__ __forceinline__ void cta_rows(int32_t rows, int32_t& r0, int32_t& r1) {
  r0 = static_cast<int32_t>(static_cast<int64_t>(rows) * blockIdx.x / gridDim.x);
  r1 = static_cast<int32_t>(static_cast<int64_t>(rows) * (blockIdx.x + 1) / gridDim.x);
}

// Stage k of the stream sits in slot k % stages.
struct Ring {
  uint8_t* data;
  uint64_t* full;
  uint64_t* empty;
  int32_t stages;
  int32_t stage_bytes;
};

// ---- the attention's keys and values as ring stages -------------------------------------------------------
// CTA i < hkv * splits owns item (kv head g = i / splits, split s = i % splits): the cached keys of its
// share of the context. They depend on nothing computed in the step (only on the block table), so the
// producer streams them through the ring right after the layer's qkv rows, and the attention phase finds
// them in shared memory instead of waiting on dependent loads. The new token's key and value (position
// pos, written to the cache by the owning split during the phase) are not streamed.
struct KvSpan {
  int g, s;
  int32_t k0, k1, pos;
  bool active, owner;
  int32_t ntok;       // cached keys streamed: [k0, k1) without pos
  int32_t row;        // bytes of one key (and of one value) row
  int32_t per_stage;  // keys per stage: keys first, then their values
  uint32_t nstages;
};

__device__ __forceinline__ KvSpan kv_span(const DecodeStackParams& p, int32_t stage_bytes) {
  KvSpan k{};
  const int splits = p.splits;
  k.active = static_cast<int>(blockIdx.x) < p.hkv * splits;
  k.g = blockIdx.x / splits;
  k.s = blockIdx.x % splits;
  k.pos = p.batch.positions[0];
  const int32_t len = p.batch.seq_lens[0];
  const int32_t lo = p.window > 0 ? max(0, k.pos + 1 - p.window) : 0;
  const int32_t per = (max(len - lo, 0) + splits - 1) / splits;
  k.k0 = lo + k.s * per;
  k.k1 = min(len, k.k0 + per);
  k.owner = k.active && k.pos >= k.k0 && k.pos < k.k1;
  k.ntok = k.active ? max(0, k.k1 - k.k0) - (k.owner ? 1 : 0) : 0;
  k.row = p.hd * (p.kv_fp8 ? 1 : 2);
  k.per_stage = min(stage_bytes / (2 * k.row), kMaxKeysPerStage);
  k.nstages = static_cast<uint32_t>((k.ntok + k.per_stage - 1) / k.per_stage);
  return k;
}

// Cache element offset of (token t, kv head g, dim 0); -1 when the block table has no valid entry.
__device__ __forceinline__ int64_t kv_offset(const DecodeStackParams& p, int32_t t, int32_t g, int hd) {
  const int32_t b = t / p.block_size;
  if (t < 0 || b >= p.batch.max_blocks_per_seq) return -1;
  const int32_t block = p.batch.block_tables[b];
  if (block < 0 || block >= p.num_blocks) return -1;
  return ((static_cast<int64_t>(block) * p.block_size + t % p.block_size) * p.hkv + g) * hd;
}

// Position of the i-th streamed key (the new position skipped).
__device__ __forceinline__ int32_t kv_token(const KvSpan& k, int32_t i) {
  const int32_t t = k.k0 + i;
  return k.owner && t >= k.pos ? t + 1 : t;
}

// ---- producer -------------------------------------------------------------------------------------------
__device__ void produce_matrix(const StackMatrix& m, bool paired, const Ring& ring, uint32_t& it) {
  const Geom g = stage_geometry(m, paired, ring.stage_bytes);
  int32_t r0, r1;
  cta_rows(m.rows, r0, r1);
  const auto* base = static_cast<const uint8_t*>(m.data);
  for (int32_t row = r0; row < r1; row += g.rows_per_stage, ++it) {
    const int32_t n = min(g.rows_per_stage, r1 - row);
    const uint32_t bytes = static_cast<uint32_t>(n) * g.row_bytes;
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    const uint32_t round = it / ring.stages;
    // Every lane of the producer warp waits (so none runs a ring round ahead); lane 0 issues.
    if (round > 0) mbar_wait(&ring.empty[slot], (round - 1) & 1);
    if (threadIdx.x % kWarp != 0) continue;
    mbar_expect_tx(&ring.full[slot], bytes * g.srcs);
    uint8_t* dst = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
    for (int32_t src = 0; src < g.srcs; ++src)
      bulk_copy(dst + static_cast<size_t>(src) * g.rows_per_stage * g.row_bytes,
                base + (static_cast<int64_t>(src) * m.rows + row) * g.row_bytes, bytes, &ring.full[slot]);
  }
}

// The CTA's cached keys and values of one layer, a stage at a time: each lane looks up and copies its keys'
// rows (two bulk copies per key), after lane 0 has set the stage's byte count and written which keys had a
// valid block-table entry (an invalid one, which the engine never produces, copies block 0's row and is
// skipped by the consumers).
__device__ void produce_kv(const DecodeStackParams& p, const StackLayer& L, const Ring& ring, uint32_t& it,
                           uint32_t* key_bits) {
  const KvSpan k = kv_span(p, ring.stage_bytes);
  const int lane = threadIdx.x % kWarp;
  for (uint32_t st = 0; st < k.nstages; ++st, ++it) {
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    const uint32_t round = it / ring.stages;
    if (round > 0) mbar_wait(&ring.empty[slot], (round - 1) & 1);
    const int32_t i0 = static_cast<int32_t>(st) * k.per_stage, n = min(k.per_stage, k.ntok - i0);
    int64_t off[kKeyWords];
#pragma unroll
    for (int q = 0; q < kKeyWords; ++q) {
      const int32_t j = lane + q * kWarp;
      off[q] = j < n ? kv_offset(p, kv_token(k, i0 + j), k.g, p.hd) : -1;
      const uint32_t bits = __ballot_sync(0xffffffffu, off[q] >= 0);
      if (lane == 0) key_bits[slot * kKeyWords + q] = bits;
    }
    __syncwarp();
    if (lane == 0)
      mbar_expect_tx(&ring.full[slot], static_cast<uint32_t>(2 * n * k.row));  // releases the bits
    __syncwarp();
    uint8_t* dst = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
    const int64_t esize = p.kv_fp8 ? 1 : 2;
#pragma unroll
    for (int q = 0; q < kKeyWords; ++q) {
      const int32_t j = lane + q * kWarp;
      if (j >= n) continue;
      const int64_t from = (off[q] >= 0 ? off[q] : 0) * esize;
      bulk_copy(dst + static_cast<size_t>(j) * k.row, static_cast<const uint8_t*>(L.k_cache) + from,
                static_cast<uint32_t>(k.row), &ring.full[slot]);
      bulk_copy(dst + static_cast<size_t>(k.per_stage + j) * k.row,
                static_cast<const uint8_t*>(L.v_cache) + from, static_cast<uint32_t>(k.row),
                &ring.full[slot]);
    }
  }
}

__device__ void producer(const DecodeStackParams& p, const Ring& ring, uint32_t* key_bits) {
  uint32_t it = 0;
  for (int l = 0; l < p.num_layers; ++l) {
    const StackLayer& L = p.layers[l];
    produce_matrix(L.qkv, false, ring, it);
    produce_kv(p, L, ring, it, key_bits);
    produce_matrix(L.o, false, ring, it);
    produce_matrix(L.gate_up, true, ring, it);
    produce_matrix(L.down, false, ring, it);
  }
  produce_matrix(p.lm_head, false, ring, it);
}

// ---- consumers: dot products over a stage ---------------------------------------------------------------
__device__ __forceinline__ float dot_bf16x2(uint32_t w, uint32_t x, float acc) {
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  return fmaf(a.y, b.y, fmaf(a.x, b.x, acc));
}
// Four E4M3 weights (one 32-bit word) against four BF16 activations (two words).
__device__ __forceinline__ float dot_fp8x4(uint32_t w, uint32_t x01, uint32_t x23, float acc) {
  const __half2_raw lo =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  const float2 xa = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x01));
  const float2 xb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x23));
  return fmaf(b.y, xb.y, fmaf(b.x, xb.x, fmaf(a.y, xa.y, fmaf(a.x, xa.x, acc))));
}

enum class Emit { Store, AddToResidual, SiluMul };

__device__ __forceinline__ float row_scale(const StackMatrix& m, int64_t stored_row) {
  if (!m.fp8) return 1.0f;
  return m.scale[m.per_channel ? stored_row : 0];
}
__device__ __forceinline__ float row_bias(const StackMatrix& m, int64_t stored_row) {
  return m.bias ? m.bias[stored_row] : 0.0f;
}

template <Emit kEmit>
__device__ __forceinline__ void emit(const StackMatrix& m, float* out, int64_t r, float a, float up,
                                     float resid) {
  (void)m;
  if constexpr (kEmit == Emit::Store) {
    __stcg(out + r, a);
  } else if constexpr (kEmit == Emit::AddToResidual) {
    __stcg(out + r, resid + a);
  } else {
    __stcg(out + r, silu(a) * up);
  }
}

// The dot product of a row's 16-byte weight vectors [0, nv) with x, by one warp (every lane gets it). Four
// vectors per lane are loaded before any is used: shared-memory latency, not issue, bounds a warp.
template <bool kFp8>
__device__ __forceinline__ float dot_row(const uint8_t* w, const __nv_bfloat16* x, int32_t nv) {
  constexpr int kUnroll = 4;
  const int lane = threadIdx.x % kWarp;
  const auto* w4 = reinterpret_cast<const uint4*>(w);
  const auto* x4 = reinterpret_cast<const uint4*>(x);
  float a0 = 0.0f, a1 = 0.0f;
  auto step = [&](const uint4& wv, int32_t v) {
    if constexpr (kFp8) {
      const uint4 xa = x4[2 * v], xb = x4[2 * v + 1];
      a0 = dot_fp8x4(wv.x, xa.x, xa.y, a0);
      a1 = dot_fp8x4(wv.y, xa.z, xa.w, a1);
      a0 = dot_fp8x4(wv.z, xb.x, xb.y, a0);
      a1 = dot_fp8x4(wv.w, xb.z, xb.w, a1);
    } else {
      const uint4 xv = x4[v];
      a0 = dot_bf16x2(wv.x, xv.x, a0);
      a1 = dot_bf16x2(wv.y, xv.y, a1);
      a0 = dot_bf16x2(wv.z, xv.z, a0);
      a1 = dot_bf16x2(wv.w, xv.w, a1);
    }
  };
  int32_t v = lane;
  for (; v + (kUnroll - 1) * kWarp < nv; v += kUnroll * kWarp) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = w4[v + u * kWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) step(wv[u], v + u * kWarp);
  }
  for (; v < nv; v += kWarp) step(w4[v], v);
  return warp_sum(a0 + a1);
}

// Dot products of a stage's `units` rows (kUnits of them at most; rows >= n_valid skipped, for the last
// stage of a CTA) with x, over weight vectors [v0, v1) (16 bytes each): each x vector is loaded once for all
// rows, and the rows' products are independent chains. acc[u] is this lane's share (not yet summed).
template <bool kFp8, int kUnits>
__device__ __forceinline__ void dot_rows(const uint8_t* stage, int32_t row_bytes, int valid, int rs,
                                         const __nv_bfloat16* x, int32_t v0, int32_t v1, float* acc) {
  const int lane = threadIdx.x % kWarp;
  const auto* x4 = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int u = 0; u < kUnits; ++u) acc[u] = 0.0f;
  for (int32_t v = v0 + lane; v < v1; v += kWarp) {
    uint4 xa, xb;
    if constexpr (kFp8) {
      xa = x4[2 * v];
      xb = x4[2 * v + 1];
    } else {
      xa = x4[v];
    }
    uint4 wv[kUnits];
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
      if (u % rs < valid)
        wv[u] = reinterpret_cast<const uint4*>(stage + static_cast<size_t>(u) * row_bytes)[v];
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (u % rs >= valid) continue;
      float a = acc[u];
      if constexpr (kFp8) {
        a = dot_fp8x4(wv[u].x, xa.x, xa.y, a);
        a = dot_fp8x4(wv[u].y, xa.z, xa.w, a);
        a = dot_fp8x4(wv[u].z, xb.x, xb.y, a);
        a = dot_fp8x4(wv[u].w, xb.z, xb.w, a);
      } else {
        a = dot_bf16x2(wv[u].x, xa.x, a);
        a = dot_bf16x2(wv[u].y, xa.y, a);
        a = dot_bf16x2(wv[u].z, xa.z, a);
        a = dot_bf16x2(wv[u].w, xa.w, a);
      }
      acc[u] = a;
    }
  }
}

// Not inlined: four row counts x two formats of the unrolled product inlined into every phase spilled
// kilobytes in the kernel; called once per stage, the call costs little.
template <bool kFp8, int kUnits>
__device__ __noinline__ void group_partials(const uint8_t* stage, int32_t row_bytes, int valid, int rs,
                                            const __nv_bfloat16* x, int32_t v0, int32_t v1, float* red,
                                            int sub, int gw) {
  float acc[kUnits];
  dot_rows<kFp8, kUnits>(stage, row_bytes, valid, rs, x, v0, v1, acc);
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const float t = warp_sum(acc[u]);
    if (threadIdx.x % kWarp == 0) red[u * gw + sub] = t;
  }
}

template <bool kFp8>
__device__ __forceinline__ void stage_partials(int units, const uint8_t* stage, int32_t row_bytes, int valid,
                                               int rs, const __nv_bfloat16* x, int32_t v0, int32_t v1,
                                               float* red, int sub, int gw) {
  switch (units) {
    case 1:
      group_partials<kFp8, 1>(stage, row_bytes, valid, rs, x, v0, v1, red, sub, gw);
      break;
    case 2:
      group_partials<kFp8, 2>(stage, row_bytes, valid, rs, x, v0, v1, red, sub, gw);
      break;
    case 4:
      group_partials<kFp8, 4>(stage, row_bytes, valid, rs, x, v0, v1, red, sub, gw);
      break;
    default:
      group_partials<kFp8, 8>(stage, row_bytes, valid, rs, x, v0, v1, red, sub, gw);
      break;
  }
}

// Consumes this CTA's stages of one matrix (the producer's order) and writes its output rows. Row j of the
// CTA's range belongs to warp j % kConsumerWarps, which computes it whole (gate and up together) and
// writes it: no CTA-wide barrier per stage. Every warp waits for every stage and releases it (the empty
// barrier counts the warps), so no warp runs more than a ring ahead of the slowest.
// (Measured against a variant where each slot had its own warp group: 2x slower, since a group then
// alternates between computing its one stage and waiting for that stage's refill.)
template <Emit kEmit>
__device__ void consume_matrix(const StackMatrix& m, const Ring& ring, uint32_t& it, const __nv_bfloat16* xs,
                               float* out, uint32_t skip) {
  constexpr bool kPaired = kEmit == Emit::SiluMul;
  const Geom g = stage_geometry(m, kPaired, ring.stage_bytes);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int rs = g.rows_per_stage;
  const int32_t nv = m.k / (m.fp8 ? 16 : 8);
  int32_t r0, r1;
  cta_rows(m.rows, r0, r1);
  for (int32_t row = r0; row < r1; row += rs, ++it) {
    const int32_t n = min(rs, r1 - row);
    // The owned row of this stage, if any: j = row - r0 + i with j % kConsumerWarps == warp.
    const int i = ((warp - (row - r0)) % kConsumerWarps + kConsumerWarps) % kConsumerWarps;
    const bool mine = i < n;
    const int64_t r = row + i;
    // The emit's operands, loaded before the wait and the products so their latency hides there.
    float scale0 = 1.0f, bias0 = 0.0f, scale1 = 1.0f, bias1 = 0.0f, resid = 0.0f;
    if (mine && lane == 0) {
      scale0 = row_scale(m, r);
      bias0 = row_bias(m, r);
      if constexpr (kPaired) {
        scale1 = row_scale(m, m.rows + r);
        bias1 = row_bias(m, m.rows + r);
      }
      if constexpr (kEmit == Emit::AddToResidual) resid = __ldcg(out + r);
    }
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    mbar_wait(&ring.full[slot], (it / ring.stages) & 1);
    float d0 = 0.0f, d1 = 0.0f;
    if (mine && !(skip & 1)) {
      const uint8_t* w0 =
          ring.data + static_cast<size_t>(slot) * ring.stage_bytes + static_cast<size_t>(i) * g.row_bytes;
      d0 = m.fp8 ? dot_row<true>(w0, xs, nv) : dot_row<false>(w0, xs, nv);
      if constexpr (kPaired) {
        const uint8_t* w1 = w0 + static_cast<size_t>(rs) * g.row_bytes;
        d1 = m.fp8 ? dot_row<true>(w1, xs, nv) : dot_row<false>(w1, xs, nv);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&ring.empty[slot]);
    if (mine && lane == 0) emit<kEmit>(m, out, r, d0 * scale0 + bias0, d1 * scale1 + bias1, resid);
  }
}

// The other way to consume a matrix (DecodeStackParams::split_stages): every consumer warp takes a slice
// [v0, v1) of the columns of every row in the stage (x loaded once for all of them), the consumers meet at
// a CTA barrier, and thread t adds the slices of row t and writes it. A stage is then finished by all warps
// together (a short time from landing to release, which a shallow ring rewards), at the price of a barrier
// per stage; the row-owner way gives each warp whole rows and no barrier.
template <Emit kEmit>
__device__ void consume_matrix_split(const StackMatrix& m, const Ring& ring, uint32_t& it,
                                     const __nv_bfloat16* xs, float* out, uint32_t skip, float* red) {
  constexpr bool kPaired = kEmit == Emit::SiluMul;
  const Geom g = stage_geometry(m, kPaired, ring.stage_bytes);
  const int warp = threadIdx.x / kWarp;
  const int rs = g.rows_per_stage, units = g.srcs * rs;
  const int32_t nv = m.k / (m.fp8 ? 16 : 8);
  const int32_t v0 = nv * warp / kConsumerWarps, v1 = nv * (warp + 1) / kConsumerWarps;
  int32_t r0, r1;
  cta_rows(m.rows, r0, r1);
  const int t = threadIdx.x;
  for (int32_t row = r0; row < r1; row += rs, ++it) {
    const int32_t n = min(rs, r1 - row);
    const int64_t r = row + t;
    float scale0 = 1.0f, bias0 = 0.0f, scale1 = 1.0f, bias1 = 0.0f, resid = 0.0f;
    if (t < n) {  // the emit's operands, loaded before the wait and the products
      scale0 = row_scale(m, r);
      bias0 = row_bias(m, r);
      if constexpr (kPaired) {
        scale1 = row_scale(m, m.rows + r);
        bias1 = row_bias(m, m.rows + r);
      }
      if constexpr (kEmit == Emit::AddToResidual) resid = __ldcg(out + r);
    }
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    mbar_wait(&ring.full[slot], (it / ring.stages) & 1);
    float* rb = red + (it & 1) * kMaxUnits * kConsumerWarps;
    if (!(skip & 1)) {
      const uint8_t* stage = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
      if (m.fp8)
        stage_partials<true>(units, stage, g.row_bytes, n, rs, xs, v0, v1, rb, warp, kConsumerWarps);
      else
        stage_partials<false>(units, stage, g.row_bytes, n, rs, xs, v0, v1, rb, warp, kConsumerWarps);
    }
    consumer_sync();  // the stage is read; the slices are in rb
    if (t == 0) mbar_arrive(&ring.empty[slot]);
    if (t < n) {
      float a = 0.0f, b = 0.0f;
      for (int w = 0; w < kConsumerWarps; ++w) {
        a += rb[t * kConsumerWarps + w];
        if constexpr (kPaired) b += rb[(rs + t) * kConsumerWarps + w];
      }
      emit<kEmit>(m, out, r, a * scale0 + bias0, b * scale1 + bias1, resid);
    }
  }
}

// A consumed stage's release: every warp's own (row-owner way), or one arrival after a CTA barrier.
template <bool kSplit>
__device__ __forceinline__ void release_stage(const Ring& ring, int32_t slot) {
  if constexpr (kSplit) {
    consumer_sync();
    if (threadIdx.x == 0) mbar_arrive(&ring.empty[slot]);
  } else {
    __syncwarp();
    if (threadIdx.x % kWarp == 0) mbar_arrive(&ring.empty[slot]);
  }
}

// xs = BF16(src * rsqrt(mean(src^2) + eps) * norm) over n floats, or BF16(src) without a norm. One read
// of src (L2 round trips are what the phase boundaries cost): a normed input (the hidden size, at most
// kNormVecs float4 per thread) is held in registers between the sum of squares and the scaling.
constexpr int kNormVecs = 8;
__device__ void load_input(const float* src, int32_t n, const float* norm, float eps, __nv_bfloat16* xs,
                           float* scratch) {
  if (norm != nullptr) {
    float4 v[kNormVecs];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormVecs; ++j) {
      const int32_t i = (threadIdx.x + j * kConsumers) * 4;
      v[j] = i < n ? __ldcg(reinterpret_cast<const float4*>(src + i)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    const float rs = rsqrtf(consumer_sum(ss, scratch) / static_cast<float>(n) + eps);
#pragma unroll
    for (int j = 0; j < kNormVecs; ++j) {
      const int32_t i = (threadIdx.x + j * kConsumers) * 4;
      if (i < n) {
        const float4 w = *reinterpret_cast<const float4*>(norm + i);
        store_bf16x4(xs + i, v[j].x * rs * w.x, v[j].y * rs * w.y, v[j].z * rs * w.z, v[j].w * rs * w.w);
      }
    }
  } else {
    for (int32_t i = threadIdx.x * 4; i < n; i += kConsumers * 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(src + i));
      store_bf16x4(xs + i, v.x, v.y, v.z, v.w);
    }
  }
  consumer_sync();
}

// ---- attention ------------------------------------------------------------------------------------------
template <int kDims>  // head dims per lane
__device__ __forceinline__ void load_kv(const void* cache, bool fp8, int64_t off, float scale, float* out) {
  if (fp8) {
    const auto* p = static_cast<const uint8_t*>(cache) + off;
    if constexpr (kDims == 4) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
      const __half2_raw lo =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3);
      const __half2_raw hi =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
      const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
      out[0] = a.x * scale, out[1] = a.y * scale, out[2] = b.x * scale, out[3] = b.y * scale;
    } else {
      const uint16_t w = *reinterpret_cast<const uint16_t*>(p);
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w), __NV_E4M3);
      const float2 a = __half22float2(__half2(h));
      out[0] = a.x * scale, out[1] = a.y * scale;
    }
  } else {
    const auto* p = static_cast<const __nv_bfloat16*>(cache) + off;
    if constexpr (kDims == 4) {
      const uint2 w = *reinterpret_cast<const uint2*>(p);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.y));
      out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
    } else {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
      out[0] = a.x, out[1] = a.y;
    }
  }
}

__device__ __forceinline__ void store_kv(void* cache, bool fp8, int64_t off, float v, float inv_scale) {
  if (fp8) {
    static_cast<uint8_t*>(cache)[off] =
        static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * inv_scale, __NV_SATFINITE, __NV_E4M3));
  } else {
    static_cast<__nv_bfloat16*>(cache)[off] = __float2bfloat16_rn(v);
  }
}

// Value of v as the cache stores it (BF16, or E4M3 of v / scale), read back as the kernels read the cache.
__device__ __forceinline__ float cache_rounded(float v, bool fp8, float scale) {
  if (fp8) {
    const auto code =
        static_cast<__nv_fp8_storage_t>(__nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3));
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))) * scale;
  }
  return __bfloat162float(__float2bfloat16_rn(v));
}

// The attention of this CTA's item (kv_span): RoPE of the group's query heads (and, by the split holding the
// new position, of the new key, which it writes with the value to the cache), the online-softmax partials
// over the streamed keys (ring stages) and the new one, then the last CTA of the group merges the splits
// into p.attn. `sm`: the x buffer as scratch: q [kMaxGroup][hd], the new k and v [hd] each, then the warps'
// partials. Every consumer warp passes every key stage (the ring's protocol), computing or not.
template <int kHd, bool kSplit>
__device__ void attention_phase(const DecodeStackParams& p, const StackLayer& L, float* sm, int* flag,
                                const Ring& ring, uint32_t& it, const uint32_t* key_bits) {
  constexpr int kDims = kHd / kWarp, kHalf = kHd / 2, kPart = kHd + 2;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int group = p.hq / p.hkv, splits = p.splits;
  const KvSpan k = kv_span(p, ring.stage_bytes);
  if (!k.active) return;  // no item, no key stages
  const int g = k.g, s = k.s;
  const bool compute = !(p.skip & 4);
  float* q_s = sm;
  float* knew = sm + kMaxGroup * kHd;
  float* vnew = knew + kHd;
  float* wpart = vnew + kHd;
  // Warps computing: as many as the x buffer holds partials for (at least kAttnWarps).
  const int aw = min(kConsumerWarps, (p.x_bytes / 4 - (kMaxGroup + 2) * kHd) / (group * kPart));
  for (int t = threadIdx.x; compute && t < (group + 1) * kHalf; t += kConsumers) {
    const int r = t / kHalf, i = t % kHalf;
    if (r == group && !k.owner) break;
    float sn, cs;
    sincosf(static_cast<float>(k.pos) * p.inv_freq[i], &sn, &cs);
    const int a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + kHalf;
    const float* head = r < group ? p.qkv + static_cast<int64_t>(g * group + r) * kHd
                                  : p.qkv + static_cast<int64_t>(p.hq + g) * kHd;
    const float x0 = __ldcg(head + a), x1 = __ldcg(head + b);
    const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
    if (r < group) {
      q_s[r * kHd + a] = y0 * p.attn_scale;
      q_s[r * kHd + b] = y1 * p.attn_scale;
    } else {
      const float* v = p.qkv + static_cast<int64_t>(p.hq + p.hkv + g) * kHd;
      const float v0 = __ldcg(v + a), v1 = __ldcg(v + b);
      knew[a] = cache_rounded(y0, p.kv_fp8, p.k_scale);
      knew[b] = cache_rounded(y1, p.kv_fp8, p.k_scale);
      vnew[a] = cache_rounded(v0, p.kv_fp8, p.v_scale);
      vnew[b] = cache_rounded(v1, p.kv_fp8, p.v_scale);
      const int64_t off = kv_offset(p, k.pos, g, kHd);
      if (off >= 0) {
        store_kv(L.k_cache, p.kv_fp8, off + a, y0, 1.0f / p.k_scale);
        store_kv(L.k_cache, p.kv_fp8, off + b, y1, 1.0f / p.k_scale);
        store_kv(L.v_cache, p.kv_fp8, off + a, v0, 1.0f / p.v_scale);
        store_kv(L.v_cache, p.kv_fp8, off + b, v1, 1.0f / p.v_scale);
      }
    }
  }
  consumer_sync();  // q, and the new k / v, in shared memory

  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][kDims];
#pragma unroll
  for (int r = 0; r < kMaxGroup; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[r][d] = 0.0f;
  }
  // One key (kf) and its value (vf) into the warp's online softmax of every query head of the group.
  auto attend = [&](const float* kf, const float* vf) {
#pragma unroll
    for (int r = 0; r < kMaxGroup; ++r) {
      if (r >= group) break;
      float sc = 0.0f;
#pragma unroll
      for (int d = 0; d < kDims; ++d) sc = fmaf(q_s[r * kHd + lane * kDims + d], kf[d], sc);
      sc = warp_sum(sc);
      const float mn = fmaxf(m[r], sc), corr = __expf(m[r] - mn), pr = __expf(sc - mn);
      l[r] = l[r] * corr + pr;
#pragma unroll
      for (int d = 0; d < kDims; ++d) acc[r][d] = fmaf(acc[r][d], corr, pr * vf[d]);
      m[r] = mn;
    }
  };
  for (uint32_t st = 0; st < k.nstages; ++st, ++it) {
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    mbar_wait(&ring.full[slot], (it / ring.stages) & 1);
    const int32_t n = min(k.per_stage, k.ntok - static_cast<int32_t>(st) * k.per_stage);
    const uint8_t* stage = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
    for (int32_t j = warp; compute && warp < aw && j < n; j += aw) {
      if (!((key_bits[slot * kKeyWords + j / kWarp] >> (j % kWarp)) & 1u)) continue;  // invalid block entry
      float kf[kDims], vf[kDims];
      load_kv<kDims>(stage, p.kv_fp8, static_cast<int64_t>(j) * kHd + lane * kDims, p.k_scale, kf);
      load_kv<kDims>(stage, p.kv_fp8, static_cast<int64_t>(k.per_stage + j) * kHd + lane * kDims, p.v_scale,
                     vf);
      attend(kf, vf);
    }
    release_stage<kSplit>(ring, slot);
  }
  if (!compute) return;
  if (k.owner && warp == 0) {
    float kf[kDims], vf[kDims];
#pragma unroll
    for (int d = 0; d < kDims; ++d) kf[d] = knew[lane * kDims + d], vf[d] = vnew[lane * kDims + d];
    attend(kf, vf);
  }
  // The warps' partials, then their merge into this split's partial.
#pragma unroll
  for (int r = 0; r < kMaxGroup; ++r) {
    if (r >= group || warp >= aw) break;
    float* wp = wpart + (warp * group + r) * kPart;
    if (lane == 0) wp[0] = m[r], wp[1] = l[r];
#pragma unroll
    for (int d = 0; d < kDims; ++d) wp[2 + lane * kDims + d] = acc[r][d];
  }
  consumer_sync();
  for (int idx = threadIdx.x; idx < group * kHd; idx += kConsumers) {
    const int r = idx / kHd, d = idx % kHd;
    float mx = -INFINITY;
    for (int w = 0; w < aw; ++w) mx = fmaxf(mx, wpart[(w * group + r) * kPart]);
    float sum_l = 0.0f, sum_a = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < aw; ++w) {
        const float* wp = wpart + (w * group + r) * kPart;
        const float e = __expf(wp[0] - mx);
        sum_l += wp[1] * e;
        sum_a += wp[2 + d] * e;
      }
    }
    float* part = p.partials + (static_cast<int64_t>(g * group + r) * splits + s) * kPart;
    __stcg(part + 2 + d, sum_a);
    if (d == 0) __stcg(part, mx), __stcg(part + 1, sum_l);
  }
  __threadfence();
  consumer_sync();
  if (threadIdx.x == 0) *flag = atomicAdd(&p.control[1 + g], 1u) == static_cast<uint32_t>(splits - 1);
  consumer_sync();
  if (*flag) {  // the group's last split: merge all of them
    __threadfence();
    for (int idx = threadIdx.x; idx < group * kHd; idx += kConsumers) {
      const int r = idx / kHd, d = idx % kHd;
      const float* part = p.partials + static_cast<int64_t>(g * group + r) * splits * kPart;
      float mx = -INFINITY;
      for (int j = 0; j < splits; ++j) mx = fmaxf(mx, __ldcg(part + j * kPart));
      float sum_l = 0.0f, sum_a = 0.0f;
      for (int j = 0; j < splits; ++j) {
        const float mj = __ldcg(part + j * kPart);
        if (mj == -INFINITY) continue;
        const float e = __expf(mj - mx);
        sum_l += __ldcg(part + j * kPart + 1) * e;
        sum_a += __ldcg(part + j * kPart + 2 + d) * e;
      }
      __stcg(p.attn + static_cast<int64_t>(g * group + r) * kHd + d, sum_l > 0.0f ? sum_a / sum_l : 0.0f);
    }
    if (threadIdx.x == 0) p.control[1 + g] = 0;  // ready for the next layer
  }
  consumer_sync();  // flag and scratch reused by the next phase
}

// ---- the kernel -----------------------------------------------------------------------------------------
// 128 registers: 16 warps of one resident CTA per SM, four per sub-partition of 16384 registers.
template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 1)
    decode_stack_kernel(const __grid_constant__ DecodeStackParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  Ring ring;
  ring.data = smem;
  ring.stages = p.stages;
  ring.stage_bytes = p.stage_bytes;
  auto* xs = reinterpret_cast<__nv_bfloat16*>(smem + static_cast<size_t>(p.stages) * p.stage_bytes);
  auto* misc = reinterpret_cast<float*>(smem + static_cast<size_t>(p.stages) * p.stage_bytes + p.x_bytes);
  float* scratch = misc;  // [kConsumerWarps]
  int* flag = reinterpret_cast<int*>(scratch + kConsumerWarps);
  // misc (floats): [0, 32) scratch and flag, then 2 x kMaxStages mbarriers, key bits, split partials.
  ring.full = reinterpret_cast<uint64_t*>(misc + 32);
  auto* key_bits = reinterpret_cast<uint32_t*>(misc + kMiscKeyBits);  // [stages][kKeyWords]
  float* red = misc + kMiscRed;                                       // [2][kMaxUnits][kConsumerWarps]
  ring.empty = ring.full + p.stages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&ring.full[s], 1);
      // Row-owner way: every consumer warp releases every stage; split way: one arrival after a barrier.
      mbar_init(&ring.empty[s], kSplit ? 1 : kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    producer(p, ring, key_bits);
    return;
  }
  uint32_t it = 0, barriers = 0;
  uint32_t* counter = p.control;
  const int64_t events = decode_stack_profile_events(p.num_layers);
  auto stamp = [&](int64_t e) {
    if (p.profile != nullptr && threadIdx.x == 0) p.profile[blockIdx.x * events + e] = gpu_ns();
  };
  auto sync_grid = [&] {
    if (!(p.skip & 2)) grid_barrier(counter, ++barriers * gridDim.x);
  };
  const int32_t qd = p.hq * p.hd, inter = p.layers[0].down.k;
  for (int l = 0; l < p.num_layers; ++l) {
    const StackLayer& L = p.layers[l];
    const int64_t e = static_cast<int64_t>(l) * kStackLayerEvents;
    stamp(e);
    load_input(p.x, p.hidden, L.attn_norm, p.eps, xs, scratch);
    if constexpr (kSplit)
      consume_matrix_split<Emit::Store>(L.qkv, ring, it, xs, p.qkv, p.skip, red);
    else
      consume_matrix<Emit::Store>(L.qkv, ring, it, xs, p.qkv, p.skip);
    stamp(e + 1);
    sync_grid();
    stamp(e + 2);
    if (p.hd == 128)
      attention_phase<128, kSplit>(p, L, reinterpret_cast<float*>(xs), flag, ring, it, key_bits);
    else
      attention_phase<64, kSplit>(p, L, reinterpret_cast<float*>(xs), flag, ring, it, key_bits);
    stamp(e + 3);
    sync_grid();
    stamp(e + 4);
    load_input(p.attn, qd, nullptr, 0.0f, xs, scratch);
    if constexpr (kSplit)
      consume_matrix_split<Emit::AddToResidual>(L.o, ring, it, xs, p.x, p.skip, red);
    else
      consume_matrix<Emit::AddToResidual>(L.o, ring, it, xs, p.x, p.skip);
    stamp(e + 5);
    sync_grid();
    stamp(e + 6);
    load_input(p.x, p.hidden, L.ffn_norm, p.eps, xs, scratch);
    if constexpr (kSplit)
      consume_matrix_split<Emit::SiluMul>(L.gate_up, ring, it, xs, p.act, p.skip, red);
    else
      consume_matrix<Emit::SiluMul>(L.gate_up, ring, it, xs, p.act, p.skip);
    stamp(e + 7);
    sync_grid();
    stamp(e + 8);
    load_input(p.act, inter, nullptr, 0.0f, xs, scratch);
    if constexpr (kSplit)
      consume_matrix_split<Emit::AddToResidual>(L.down, ring, it, xs, p.x, p.skip, red);
    else
      consume_matrix<Emit::AddToResidual>(L.down, ring, it, xs, p.x, p.skip);
    stamp(e + 9);
    sync_grid();
    stamp(e + 10);
  }
  stamp(events - 2);
  load_input(p.x, p.hidden, p.final_norm, p.eps, xs, scratch);
  if constexpr (kSplit)
    consume_matrix_split<Emit::Store>(p.lm_head, ring, it, xs, p.logits, p.skip, red);
  else
    consume_matrix<Emit::Store>(p.lm_head, ring, it, xs, p.logits, p.skip);
  stamp(events - 1);
}

// The x buffer's use by the attention: q [kMaxGroup][hd], the new k and v, kAttnWarps warps' partials of
// `group` query heads.
size_t attention_scratch_bytes(int32_t hd, int32_t group) {
  return (static_cast<size_t>(kMaxGroup + 2) * hd + static_cast<size_t>(kAttnWarps) * group * (hd + 2)) * 4;
}

}  // namespace

bool decode_stack_supported(int32_t hidden, int32_t inter, int32_t hq, int32_t hkv, int32_t hd) {
  return hidden > 0 && hidden <= kNormVecs * 4 * kConsumers && inter > 0 && hidden % 16 == 0 &&
         inter % 16 == 0 && (hd == 64 || hd == 128) && hkv > 0 && hq % hkv == 0 && hq / hkv <= kMaxGroup &&
         (hq * hd) % 16 == 0;
}

bool decode_stack_matrix_fits(const StackMatrix& m, bool paired, int32_t stage_bytes) {
  if (m.data == nullptr || m.rows <= 0 || m.k <= 0 || m.k % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(m.data) % 16 != 0) return false;
  if (m.fp8 && m.scale == nullptr) return false;
  return stage_geometry(m, paired, stage_bytes).rows_per_stage >= 1;
}

size_t decode_stack_prepare(DecodeStackParams& p, int32_t max_k) {
  const size_t x_bytes =
      (std::max(static_cast<size_t>(max_k) * 2, attention_scratch_bytes(p.hd, p.hq / p.hkv)) + 127) / 128 *
      128;
  if (x_bytes + kMiscBytes + 2 * static_cast<size_t>(p.stage_bytes) > kSmemLimit) return 0;
  const size_t stages = std::min<size_t>(kMaxStages, (kSmemLimit - x_bytes - kMiscBytes) / p.stage_bytes);
  p.stages = static_cast<int32_t>(stages);
  p.x_bytes = static_cast<int32_t>(x_bytes);
  return stages * p.stage_bytes + x_bytes + kMiscBytes;
}

size_t decode_stack_scratch_floats(int32_t hq, int32_t hkv, int32_t hd, int32_t inter, int32_t splits) {
  const size_t align = 64;  // floats: each buffer on a 256-byte boundary
  auto up = [&](size_t n) { return (n + align - 1) / align * align; };
  return up(static_cast<size_t>(hq + 2 * hkv) * hd) + up(static_cast<size_t>(hq) * hd) + up(inter) +
         up(static_cast<size_t>(hq) * splits * (hd + 2));
}

int decode_stack_ctas_per_sm(size_t smem) {
  int least = INT32_MAX;
  for (auto* kernel : {decode_stack_kernel<false>, decode_stack_kernel<true>}) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
        cudaSuccess)
      return 0;
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem) != cudaSuccess)
      return 0;
    least = std::min(least, blocks);
  }
  return least;
}

cudaError_t launch_decode_stack(const DecodeStackParams& p, int grid, size_t smem, cudaStream_t stream) {
  if (p.num_layers < 1 || p.num_layers > kMaxStackLayers || p.splits < 1 || p.splits > kMaxSplits)
    return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(p.control, 0, (1 + static_cast<size_t>(p.hkv)) * sizeof(uint32_t), stream);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1] = {};
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return p.split_stages ? cudaLaunchKernelEx(&config, decode_stack_kernel<true>, p)
                        : cudaLaunchKernelEx(&config, decode_stack_kernel<false>, p);
}

}  // namespace inferx::cuda
