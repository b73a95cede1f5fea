// The batch-1 decode step as one persistent kernel; the design and its reasons are in
// kernels_decode_stack.h, the measurements in docs/benchmarks.md. This file: the producer, the consumers'
// products, the kernel and its host side; the ring and barriers are in decode_stack_ring.cuh, the attention
// phase in decode_stack_attention.cuh. Layout of a CTA (one per SM, all
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
#include "backend/cuda/decode_stack_attention.cuh"
#include "backend/cuda/decode_stack_ring.cuh"
#include "backend/cuda/kernels_decode_stack.h"
#include "backend/cuda/tensor_map.h"

namespace inferx::cuda {
namespace {

using namespace stack;  // the kernel's plumbing (decode_stack_ring.cuh, decode_stack_attention.cuh)

// ---- producer -------------------------------------------------------------------------------------------
// Stage `it` may be issued once the consumers have released its slot and, with ring.inflight set, once
// stage it - inflight has landed. Every lane of the producer warp waits (so none runs a ring round ahead).
// Why the in-flight limit (the reasoning; measured: 2 stages ~2% faster, 1 slower, H200 2026-12-03):
// bytes requested but not yet delivered queue in the memory system, and the consumers' dependent loads
// (grid barriers, the attention's q/k/v and partials) may wait behind them: 132 SMs x a 160 KB ring
// refilled at once is ~21 MB, ~5 us at 4.2 TB/s.
__device__ __forceinline__ void claim_stage(const Ring& ring, uint32_t it) {
  const uint32_t round = it / ring.stages;
  if (round > 0) mbar_wait_backoff(&ring.empty[it % ring.stages], (round - 1) & 1, ring.backoff_ns);
  if (ring.inflight > 0 && it >= ring.inflight) {
    const uint32_t landed = it - ring.inflight;
    mbar_wait_backoff(&ring.full[landed % ring.stages], (landed / ring.stages) & 1, ring.backoff_ns);
  }
}

// The weight matrices in the order the producer streams them (and the consumers use them): per layer qkv,
// o, gate/up (paired), down (transposed with mlp_split), as segments 4 l .. 4 l + 3, then the lm_head
// (4 * num_layers); false past it. The producer streams a layer's cached keys and values right after its qkv
// rows (segment 4 l).
__device__ __forceinline__ bool phase_matrix(const DecodeStackParams& p, int32_t seg, StackMatrix& m,
                                             bool& paired) {
  paired = false;
  if (seg < 4 * p.num_layers) {
    const StackLayer& L = p.layers[seg / 4];
    switch (seg % 4) {
      case 0:
        m = L.qkv;
        break;
      case 1:
        m = L.o;
        break;
      case 2:
        paired = true;
        m = L.gate_up;
        break;
      default:
        m = p.mlp_split ? down_transposed(L) : L.down;
    }
    return true;
  }
  if (seg != 4 * p.num_layers) return false;
  m = p.lm_head;
  return true;
}

__device__ void produce_matrix(const StackMatrix& m, bool paired, const Ring& ring, uint32_t& it) {
  const Geom g = stage_geometry(m, paired, ring.stage_bytes);
  int32_t r0, r1;
  cta_rows(m.rows, r0, r1);
  const auto* base = static_cast<const uint8_t*>(m.data);
  const auto* scales = static_cast<const uint8_t*>(m.scale);
  const int rs = g.rows_per_stage;
  for (int32_t row = r0; row < r1; row += rs, ++it) {
    const int32_t n = min(rs, r1 - row);
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    claim_stage(ring, it);
    if (threadIdx.x % kWarp != 0) continue;  // lane 0 issues
    mbar_expect_tx(&ring.full[slot], static_cast<uint32_t>(n) * g.row_bytes * g.srcs);
    uint8_t* dst = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
    for (int32_t src = 0; src < g.srcs; ++src) {
      const StageRow at = stage_row(g, src, 0);  // the source's n rows of each part, back to back
      const int64_t stored = static_cast<int64_t>(src) * m.rows + row;
      bulk_copy(dst + at.w, base + stored * g.w_bytes, static_cast<uint32_t>(n) * g.w_bytes,
                &ring.full[slot]);
      if (g.s_bytes > 0)
        bulk_copy(dst + at.s, scales + stored * g.s_bytes, static_cast<uint32_t>(n) * g.s_bytes,
                  &ring.full[slot]);
      if (g.z_bytes > 0)
        bulk_copy(dst + at.z, m.zero + stored * g.z_bytes, static_cast<uint32_t>(n) * g.z_bytes,
                  &ring.full[slot]);
    }
  }
}

// The CTA's cached keys and values of one layer, a stage at a time: each lane looks up and copies its keys'
// rows (two bulk copies per key), after lane 0 has set the stage's byte count and written which keys had a
// valid block-table entry (an invalid one, which the engine never produces, copies block 0's row and is
// skipped by the consumers).
// With the layers' tensor maps (kv_span: tiled) each lane copies whole blocks instead, one tensor copy per
// block for the keys and one for the values (a missing entry copies block 0).
__device__ void produce_kv(const DecodeStackParams& p, int layer, const Ring& ring, uint32_t& it,
                           uint32_t* key_bits) {
  const StackLayer& L = p.layers[layer];
  const KvSpan k = kv_span(p, ring.stage_bytes);
  const int lane = threadIdx.x % kWarp;
  const uint8_t* k_map = nullptr;
  const uint8_t* v_map = nullptr;
  if (k.tiled && k.nstages > 0) {
    k_map = static_cast<const uint8_t*>(p.kv_maps) + static_cast<size_t>(2 * layer) * kTensorMapBytes;
    v_map = k_map + kTensorMapBytes;
    if (lane == 0) {  // the maps were written by a host copy before the launch
      asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(k_map) : "memory");
      asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(v_map) : "memory");
    }
    __syncwarp();
  }
  for (uint32_t st = 0; st < k.nstages; ++st, ++it) {
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    claim_stage(ring, it);
    const int32_t i0 = static_cast<int32_t>(st) * k.per_stage, n = min(k.per_stage, k.ntok - i0);
    // Loops kept rolled (the key's cache offset computed twice): this code shares the SM's instruction
    // cache with the consumers' phases.
    const int words = (n + kWarp - 1) / kWarp;
#pragma unroll 1
    for (int q = 0; q < words; ++q) {
      const int32_t j = lane + q * kWarp;
      const bool valid = j < n && kv_streamed_valid(p, k, i0 + j);
      const uint32_t bits = __ballot_sync(0xffffffffu, valid);
      if (lane == 0) key_bits[slot * kKeyWords + q] = bits;
    }
    __syncwarp();
    if (lane == 0)
      mbar_expect_tx(&ring.full[slot], static_cast<uint32_t>(2 * n * k.row));  // releases the bits
    __syncwarp();
    uint8_t* dst = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
    if (k.tiled) {
      const int32_t bs = p.block_size;
#pragma unroll 1
      for (int32_t b = lane; b * bs < n; b += kWarp) {
        const int32_t bi = (k.first + i0) / bs + b;  // first + i0 is a block start
        int32_t block = bi < p.batch.max_blocks_per_seq ? p.batch.block_tables[bi] : -1;
        if (block < 0 || block >= p.num_blocks) block = 0;
        const size_t at = static_cast<size_t>(b) * bs * k.row;
        tensor_copy_2d(dst + at, k_map, k.g * p.hd, block * bs, &ring.full[slot]);
        tensor_copy_2d(dst + static_cast<size_t>(k.per_stage) * k.row + at, v_map, k.g * p.hd, block * bs,
                       &ring.full[slot]);
      }
      continue;
    }
    const int64_t esize = p.kv_fp8 ? 1 : 2;
#pragma unroll 1
    for (int32_t j = lane; j < n; j += kWarp) {
      const int64_t off = kv_offset(p, kv_token(k, i0 + j), k.g, p.hd);
      const int64_t from = (off >= 0 ? off : 0) * esize;
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
  bool paired = false;
  StackMatrix m;
  for (int32_t seg = 0; phase_matrix(p, seg, m, paired); ++seg) {
    produce_matrix(m, paired, ring, it);
    if (seg % 4 == 0 && seg < 4 * p.num_layers) produce_kv(p, seg / 4, ring, it, key_bits);
  }
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
  if (!m.fp8) return 1.0f;  // BF16; INT4 scales its groups inside the dot product
  return static_cast<const float*>(m.scale)[m.per_channel ? stored_row : 0];
}
__device__ __forceinline__ float row_bias(const StackMatrix& m, int64_t stored_row) {
  return m.bias ? m.bias[stored_row] : 0.0f;
}

// What turns output row r's dot products into its output: the row's scale and bias (and the up row's for
// the SiLU product), and the residual it adds to. Loaded before the stage wait and the products, so their
// latency hides there; store() writes the row.
template <Emit kEmit>
struct RowEpilogue {
  float scale0 = 1.0f, bias0 = 0.0f, scale1 = 1.0f, bias1 = 0.0f, resid = 0.0f;

  __device__ __forceinline__ void load(const StackMatrix& m, const float* out, int64_t r) {
    scale0 = row_scale(m, r);
    bias0 = row_bias(m, r);
    if constexpr (kEmit == Emit::SiluMul) {
      scale1 = row_scale(m, m.rows + r);
      bias1 = row_bias(m, m.rows + r);
    }
    if constexpr (kEmit == Emit::AddToResidual) resid = __ldcg(out + r);
  }
  // d0 (and d1, the up row's) are the raw dot products.
  __device__ __forceinline__ float value(float d0, float d1) const {
    const float a = d0 * scale0 + bias0;
    if constexpr (kEmit == Emit::Store) return a;
    if constexpr (kEmit == Emit::AddToResidual) return resid + a;
    return silu(a) * (d1 * scale1 + bias1);
  }
  __device__ __forceinline__ void store(float* out, int64_t r, float d0, float d1) const {
    __stcg(out + r, value(d0, d1));
  }
};

// The dot product of a row's 16-byte weight vectors [0, nv) with x, by one warp (every lane gets it). Four
// vectors per lane are loaded before any is used: shared-memory latency, not issue, bounds a warp. x in
// x_chunks: a BF16 vector's 8 columns are x4[v], an FP8 vector's 16 are x4[v] and x4[nv + v].
template <bool kFp8>
__device__ __forceinline__ float dot_row(const uint8_t* w, const __nv_bfloat16* x, int32_t nv) {
  constexpr int kUnroll = 4;
  const int lane = threadIdx.x % kWarp;
  const auto* w4 = reinterpret_cast<const uint4*>(w);
  const auto* x4 = reinterpret_cast<const uint4*>(x);
  float a0 = 0.0f, a1 = 0.0f;
  auto step = [&](const uint4& wv, int32_t v) {
    if constexpr (kFp8) {
      const uint4 xa = x4[v], xb = x4[nv + v];
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

// INT4: each lane takes whole 16-byte vectors (32 columns of one group; decode_stack_layout.h
// int4_vector_dot), the group's scale multiplying the vector's sum; x in x_chunks (chunk q at x4[q nv + v]).
__device__ __forceinline__ float dot_row_int4(const uint8_t* w, const uint8_t* s, const uint8_t* z,
                                              bool zeros, const __nv_bfloat16* x, int32_t nv,
                                              int group_shift) {
  const int lane = threadIdx.x % kWarp;
  const auto* w4 = reinterpret_cast<const uint4*>(w);
  const auto* x4 = reinterpret_cast<const uint4*>(x);
  const auto* sc = reinterpret_cast<const __half*>(s);
  float acc = 0.0f;
#pragma unroll 2
  for (int32_t v = lane; v < nv; v += kWarp) {
    const uint4 wv = w4[v];
    const int32_t grp = v >> group_shift;
    const float scale = __half2float(sc[grp]);
    const float off = 8388608.0f + (zeros ? static_cast<float>(z[grp]) : 8.0f);
    const uint4 x0 = x4[v], x1 = x4[nv + v], x2 = x4[2 * nv + v], x3 = x4[3 * nv + v];
    const uint32_t xw[16] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w,
                             x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
    const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w};
    acc = fmaf(int4_vector_dot(ww, xw, off), scale, acc);
  }
  return warp_sum(acc);
}

// The product of one row (row i of source src of the stage at `base`) with x in the matrix's format: kW
// (kStackBf16 / kStackFp8 / kStackInt4, or kStackAnyFormat: the matrix decides) fixes it at compile time, so
// a kernel instance for one format carries one product loop.
template <int kW>
__device__ __forceinline__ float row_dot(const StackMatrix& m, const Geom& g, const uint8_t* base, int src,
                                         int i, const __nv_bfloat16* x) {
  const StageRow r = stage_row(g, src, i);
  const uint8_t* w = base + r.w;
  if constexpr (kW == kStackBf16) {
    return dot_row<false>(w, x, m.k / 8);
  } else if constexpr (kW == kStackFp8) {
    return dot_row<true>(w, x, m.k / 16);
  } else if constexpr (kW == kStackInt4) {
    return dot_row_int4(w, base + r.s, base + r.z, g.z_bytes > 0, x, m.k / 32, m.group_shift);
  } else {
    if (m.int4) return dot_row_int4(w, base + r.s, base + r.z, g.z_bytes > 0, x, m.k / 32, m.group_shift);
    return m.fp8 ? dot_row<true>(w, x, m.k / 16) : dot_row<false>(w, x, m.k / 8);
  }
}

// Consumes this CTA's stages of one matrix (the producer's order) and writes its output rows. Row j of the
// CTA's range belongs to warp j % kConsumerWarps, which computes it whole (gate and up together) and
// writes it: no CTA-wide barrier per stage. Every warp waits for every stage and releases it (the empty
// barrier counts the warps), so no warp runs more than a ring ahead of the slowest.
// (Measured against a variant where each slot had its own warp group: 2x slower, since a group then
// alternates between computing its one stage and waiting for that stage's refill.)
// With `local` (mlp_split's activations) row r goes to local[r - r0] in shared memory instead of out.
template <Emit kEmit, int kW>
__device__ void consume_matrix(const StackMatrix& m, const Ring& ring, uint32_t& it, const __nv_bfloat16* xs,
                               float* out, uint32_t skip, float* local = nullptr) {
  constexpr bool kPaired = kEmit == Emit::SiluMul;
  const Geom g = stage_geometry(m, kPaired, ring.stage_bytes);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int rs = g.rows_per_stage;
  int32_t r0, r1;
  cta_rows(m.rows, r0, r1);
  for (int32_t row = r0; row < r1; row += rs, ++it) {
    const int32_t n = min(rs, r1 - row);
    // The owned row of this stage, if any: j = row - r0 + i with j % kConsumerWarps == warp.
    const int i = ((warp - (row - r0)) % kConsumerWarps + kConsumerWarps) % kConsumerWarps;
    const bool mine = i < n;
    const int64_t r = row + i;
    // The emit's operands, loaded before the wait and the products so their latency hides there.
    RowEpilogue<kEmit> epilogue;
    if (mine && lane == 0) epilogue.load(m, out, r);
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    mbar_wait(&ring.full[slot], (it / ring.stages) & 1);
    float d0 = 0.0f, d1 = 0.0f;
    if (mine && !(skip & 1)) {
      const uint8_t* base = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
      d0 = row_dot<kW>(m, g, base, 0, i, xs);
      if constexpr (kPaired) d1 = row_dot<kW>(m, g, base, 1, i, xs);
    }
    release_stage(ring, slot);
    if (mine && lane == 0) {
      if (local != nullptr)
        local[r - r0] = epilogue.value(d0, d1);
      else
        epilogue.store(out, r, d0, d1);
    }
  }
}

// mlp_split's partial sums, added across CTAs with float atomics in whatever order they arrive, yet exactly:
// each CTA's partial p is cut into hi = p rounded to an integer and lo = (p - hi) rounded to a multiple of
// 2^-17 (|lo| <= 1/2), each added into its own sum. Every value then added is a multiple of its sum's unit,
// and every partial sum stays where fp32 holds such multiples exactly (hi below 2^24; lo below
// kMaxSplitCtas x 1/2 = 128 = 2^24 units), so no addition rounds and the order does not matter: the step's
// bits are the same in every run (graph replay = eager). The cost: p rounded at 2^-17 (<= 3.8e-6 per
// partial, below the BF16 rounding of the residual the products read) and a second atomic where |p| >= 1/2
// (hi is zero below that, and a zero vector is not added; rare).
constexpr float kLoUnit = 1.0f / 131072.0f, kLoScale = 131072.0f;  // 2^-17
__device__ __forceinline__ float4 exact_hi(float4 v) {
  return make_float4(rintf(v.x), rintf(v.y), rintf(v.z), rintf(v.w));
}
__device__ __forceinline__ float4 exact_lo(float4 v, float4 hi) {
  return make_float4(rintf((v.x - hi.x) * kLoScale) * kLoUnit, rintf((v.y - hi.y) * kLoScale) * kLoUnit,
                     rintf((v.z - hi.z) * kLoScale) * kLoUnit, rintf((v.w - hi.w) * kLoScale) * kLoUnit);
}
__device__ __forceinline__ bool nonzero(float4 v) {
  return v.x != 0.0f || v.y != 0.0f || v.z != 0.0f || v.w != 0.0f;
}
__device__ __forceinline__ void add_exact(float* hi, float* lo, float4 v) {
  const float4 h = exact_hi(v), l = exact_lo(v, h);
  if (nonzero(h)) atomicAdd(reinterpret_cast<float4*>(hi), h);
  if (nonzero(l)) atomicAdd(reinterpret_cast<float4*>(lo), l);
}

// mlp_split's down product: this CTA's rows [r0, r1) of the transposed down matrix (t, BF16 [inter,
// hidden]) weighted by its activations `act` (shared memory, act[j] for row r0 + j), summed into a partial
// output vector that is added into the exact sums hi / lo (above). Consumer thread c owns the 8 columns of
// each 16-byte vector v = c + u kConsumers of a row (u < kSplitVecs: hidden <= kSplitVecs * 8 * kConsumers)
// and keeps their sums in registers over every stage.
constexpr int kSplitVecs = 4;
__device__ void consume_down_split(const StackMatrix& t, const Ring& ring, uint32_t& it, const float* act,
                                   float* hi, float* lo, uint32_t skip) {
  const Geom g = stage_geometry(t, false, ring.stage_bytes);
  const int rs = g.rows_per_stage;
  const int32_t nv = t.k / 8;
  int32_t r0, r1;
  cta_rows(t.rows, r0, r1);
  float acc[kSplitVecs][8];
#pragma unroll
  for (int u = 0; u < kSplitVecs; ++u)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[u][e] = 0.0f;
  for (int32_t row = r0; row < r1; row += rs, ++it) {
    const int32_t n = min(rs, r1 - row);
    const int32_t slot = static_cast<int32_t>(it % ring.stages);
    mbar_wait(&ring.full[slot], (it / ring.stages) & 1);
    if (!(skip & 1)) {
      const uint8_t* base = ring.data + static_cast<size_t>(slot) * ring.stage_bytes;
      for (int i = 0; i < n; ++i) {
        const float a = act[row - r0 + i];
        const auto* w4 = reinterpret_cast<const uint4*>(base + stage_row(g, 0, i).w);
#pragma unroll
        for (int u = 0; u < kSplitVecs; ++u) {
          const int32_t v = static_cast<int32_t>(threadIdx.x) + u * kConsumers;
          if (v < nv) {
            const uint4 wv = w4[v];
            const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 w2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[e]));
              acc[u][2 * e] = fmaf(a, w2.x, acc[u][2 * e]);
              acc[u][2 * e + 1] = fmaf(a, w2.y, acc[u][2 * e + 1]);
            }
          }
        }
      }
    }
    release_stage(ring, slot);
  }
  if (r1 <= r0) return;  // no rows: nothing to add
#pragma unroll
  for (int u = 0; u < kSplitVecs; ++u) {
    const int32_t v = static_cast<int32_t>(threadIdx.x) + u * kConsumers;
    if (v < nv) {
      const int64_t at = 8 * static_cast<int64_t>(v);
      add_exact(hi + at, lo + at, make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]));
      add_exact(hi + at + 4, lo + at + 4, make_float4(acc[u][4], acc[u][5], acc[u][6], acc[u][7]));
    }
  }
}

// An input's normed values, this thread's share (element 4 (threadIdx.x + j * kConsumers) onwards of v[j];
// zeros past n): src * rsqrt(mean(src^2) + eps) * norm, read once (L2 round trips are what the phase
// boundaries cost) and held in registers between the sum of squares and the scaling. n <= kNormVecs * 4 *
// kConsumers (decode_stack_supported).
// mlp_split: the previous layer's MLP output, still in its exact sums (hi + lo, plus down's bias), which the
// next reader of the residual adds to it; `keep` (if set) receives this CTA's share (cta_rows) of the sum,
// the residual from then on.
struct PendingMlp {
  const float* hi = nullptr;
  const float* lo = nullptr;
  const float* bias = nullptr;
  float* keep = nullptr;
};
constexpr int kNormVecs = 8;
__device__ __forceinline__ void read_normed(const float* src, int32_t n, const float* norm, float eps,
                                            float4 (&v)[kNormVecs], float* scratch,
                                            const PendingMlp* mlp = nullptr) {
  float ss = 0.0f;
  int32_t h0 = 0, h1 = 0;
  if (mlp != nullptr) cta_rows(n, h0, h1);
#pragma unroll
  for (int j = 0; j < kNormVecs; ++j) {
    const int32_t i = (threadIdx.x + j * kConsumers) * 4;
    v[j] = i < n ? __ldcg(reinterpret_cast<const float4*>(src + i)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (mlp != nullptr && i < n) {
      const float4 h = __ldcg(reinterpret_cast<const float4*>(mlp->hi + i));
      const float4 l = __ldcg(reinterpret_cast<const float4*>(mlp->lo + i));
      float* e = &v[j].x;
      const float hs[4] = {h.x, h.y, h.z, h.w}, ls[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        e[c] += hs[c] + ls[c];
        if (mlp->bias != nullptr) e[c] += mlp->bias[i + c];
        if (mlp->keep != nullptr && i + c >= h0 && i + c < h1) __stcg(mlp->keep + i + c, e[c]);
      }
    }
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  const float rs = rsqrtf(consumer_sum(ss, scratch) / static_cast<float>(n) + eps);
#pragma unroll
  for (int j = 0; j < kNormVecs; ++j) {
    const int32_t i = (threadIdx.x + j * kConsumers) * 4;
    if (i < n) {
      const float4 w = *reinterpret_cast<const float4*>(norm + i);
      v[j] = make_float4(v[j].x * rs * w.x, v[j].y * rs * w.y, v[j].z * rs * w.z, v[j].w * rs * w.w);
    }
  }
}

// xs = BF16(src normed with `norm`, read_normed), or BF16(src) without a norm, laid out in `chunks`
// (decode_stack_layout.h x_chunked_index; 1: column order; n a multiple of 8 x chunks, and the 4 columns a
// thread stores stay together).
__device__ void load_input(const float* src, int32_t n, const float* norm, float eps, __nv_bfloat16* xs,
                           float* scratch, int32_t chunks, const PendingMlp* mlp = nullptr) {
  const int32_t nv = n / (8 * chunks);
  auto at = [&](int32_t i) { return x_chunked_index(i, nv, chunks); };
  if (norm != nullptr) {
    float4 v[kNormVecs];
    read_normed(src, n, norm, eps, v, scratch, mlp);
#pragma unroll
    for (int j = 0; j < kNormVecs; ++j) {
      const int32_t i = (threadIdx.x + j * kConsumers) * 4;
      if (i < n) store_bf16x4(xs + at(i), v[j].x, v[j].y, v[j].z, v[j].w);
    }
  } else {
    for (int32_t i = threadIdx.x * 4; i < n; i += kConsumers * 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(src + i));
      store_bf16x4(xs + at(i), v.x, v.y, v.z, v.w);
    }
  }
  consumer_sync();
}

// One product phase: the input into the x buffer, then this CTA's rows of m.
template <Emit kEmit, int kW>
__device__ __forceinline__ void gemv_phase(const DecodeStackParams& p, const float* src, int32_t n,
                                           const float* norm, const StackMatrix& m, float* out,
                                           const Ring& ring, uint32_t& it, __nv_bfloat16* xs, float* scratch,
                                           float* local = nullptr, const PendingMlp* mlp = nullptr) {
  // x as the product loop reads it: x_chunks for row_dot (of the instance's one format, a compile-time
  // constant: read from m in the INT4 instance it cost 24 bytes of spills).
  StackMatrix format;
  format.fp8 = kW == kStackFp8;
  format.int4 = kW == kStackInt4;
  load_input(src, n, norm, p.eps, xs, scratch, x_chunks(kW == kStackAnyFormat ? m : format), mlp);
  consume_matrix<kEmit, kW>(m, ring, it, xs, out, p.skip, local);
}

// mlp_split: this CTA's share of `hidden` (cta_rows), which it zeroes in the sums the layer's MLP will add
// into.
__device__ __forceinline__ void zero_share(float* v, int32_t hidden) {
  int32_t h0, h1;
  cta_rows(hidden, h0, h1);
  for (int32_t i = h0 + static_cast<int32_t>(threadIdx.x); i < h1; i += kConsumers) __stcg(v + i, 0.0f);
}

// ---- the kernel -----------------------------------------------------------------------------------------
// 128 registers: 16 warps of one resident CTA per SM, four per sub-partition of 16384 registers.
// kW (kStackBf16 / kStackFp8 / kStackAnyFormat) and kHd (64, 128, or 0: p.hd decides) fix the weight
// format and head size at compile time: an instance for one model carries one product loop and one
// attention (171-179 KB of code against the generic instance's 259 KB, which mixed-format stacks and the
// A/B use).
template <int kW, int kHd>
__global__ void __launch_bounds__(kThreads, 1)
    decode_stack_kernel(const __grid_constant__ DecodeStackParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  Ring ring;
  ring.data = smem;
  ring.stages = p.stages;
  ring.stage_bytes = p.stage_bytes;
  ring.inflight = static_cast<uint32_t>(p.inflight < p.stages ? p.inflight : 0);
  ring.backoff_ns = p.backoff_ns;
  auto* xs = reinterpret_cast<__nv_bfloat16*>(smem + static_cast<size_t>(p.stages) * p.stage_bytes);
  auto* misc = reinterpret_cast<float*>(smem + static_cast<size_t>(p.stages) * p.stage_bytes + p.x_bytes);
  float* scratch = misc;  // [kConsumerWarps]
  int* flag = reinterpret_cast<int*>(scratch + kConsumerWarps);
  // misc (floats): [0, 32) scratch and flag, then 2 x kMaxStages
  // mbarriers, key bits.
  ring.full = reinterpret_cast<uint64_t*>(misc + 32);
  auto* key_bits = reinterpret_cast<uint32_t*>(misc + kMiscKeyBits);  // [stages][kKeyWords]
  ring.empty = ring.full + p.stages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&ring.full[s], 1);
      mbar_init(&ring.empty[s], kConsumerWarps);  // every consumer warp releases every stage
    }
    mbar_init_fence();
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
  // mlp_split takes BF16 down matrices only (the host checks): the FP8 / INT4 instances leave it out (its
  // registers cost the FP8 instance 12 bytes of spills).
  constexpr bool kSplits = kW == kStackBf16 || kW == kStackAnyFormat;
  // The residual stream: x, or with mlp_split x and x_alt in turn: each layer's MLP adds into exact sums
  // (the pair of its layer's parity in mlp_sums), which the next layer's qkv phase adds to the residual as it
  // reads it, each CTA keeping its share of the result in the other buffer.
  float* xr = p.x;
  float* xt = p.x_alt;
  const int32_t sums = mlp_sums_stride(p.hidden);
  PendingMlp pending;
  // mlp_split's activations: after the gate/up input in the x buffer (decode_stack_mlp_split_fits).
  auto* act_local = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(xs) + (p.hidden * 2 + 15) / 16 * 16);
  for (int l = 0; l < p.num_layers; ++l) {
    const StackLayer& L = p.layers[l];
    const int64_t e = static_cast<int64_t>(l) * kStackLayerEvents;
    stamp(e);
    // This layer's sums were last read by the previous layer's qkv phase, three grid barriers back; this
    // layer's MLP adds into them behind three more. xt was last read there too.
    float* const hi = p.mlp_sums + (l & 1) * 2 * sums;
    if (kSplits && p.mlp_split) {
      zero_share(hi, p.hidden);
      zero_share(hi + sums, p.hidden);
    }
    if (kSplits && p.mlp_split && l > 0) {
      pending.keep = xt;
      gemv_phase<Emit::Store, kW>(p, xr, p.hidden, L.attn_norm, L.qkv, p.qkv, ring, it, xs, scratch, nullptr,
                                  &pending);
      float* const swap = xr;
      xr = xt;
      xt = swap;
    } else {
      gemv_phase<Emit::Store, kW>(p, xr, p.hidden, L.attn_norm, L.qkv, p.qkv, ring, it, xs, scratch);
    }
    stamp(e + 1);
    sync_grid();
    stamp(e + 2);
    auto stamp_attention = [&](int i) { stamp(e + 2 + i); };  // 1 rope, 2 landed, 3 keys, 4 published
    if ((kHd != 0 ? kHd : p.hd) == 128)
      attention_phase<128>(p, L, reinterpret_cast<float*>(xs), flag, ring, it, key_bits, stamp_attention);
    else
      attention_phase<64>(p, L, reinterpret_cast<float*>(xs), flag, ring, it, key_bits, stamp_attention);
    stamp(e + 7);
    sync_grid();
    stamp(e + 8);
    gemv_phase<Emit::AddToResidual, kW>(p, p.attn, qd, nullptr, L.o, xr, ring, it, xs, scratch);
    stamp(e + 9);
    sync_grid();
    stamp(e + 10);
    if (kSplits && p.mlp_split) {
      // gate/up into shared memory, then the down product of those activations added into this layer's
      // exact sums: no barrier between them (kernels_decode_stack.h, mlp_split). The profile's gate/up ->
      // down barrier reads as zero.
      gemv_phase<Emit::SiluMul, kW>(p, xr, p.hidden, L.ffn_norm, L.gate_up, p.act, ring, it, xs, scratch,
                                    act_local);
      stamp(e + 11);
      consumer_sync();  // every warp's activations written
      stamp(e + 12);
      consume_down_split(down_transposed(L), ring, it, act_local, hi, hi + sums, p.skip);
      pending.hi = hi;
      pending.lo = hi + sums;
      pending.bias = L.down.bias;
      stamp(e + 13);
      sync_grid();
    } else {
      gemv_phase<Emit::SiluMul, kW>(p, xr, p.hidden, L.ffn_norm, L.gate_up, p.act, ring, it, xs, scratch);
      stamp(e + 11);
      sync_grid();
      stamp(e + 12);
      gemv_phase<Emit::AddToResidual, kW>(p, p.act, inter, nullptr, L.down, xr, ring, it, xs, scratch);
      stamp(e + 13);
      sync_grid();
    }
    stamp(e + 14);
  }
  stamp(events - 2);
  if (kSplits && p.mlp_split) {
    pending.keep = nullptr;  // the last layer's MLP: added here, kept nowhere
    gemv_phase<Emit::Store, kW>(p, xr, p.hidden, p.final_norm, p.lm_head, p.logits, ring, it, xs, scratch,
                                nullptr, &pending);
  } else {
    gemv_phase<Emit::Store, kW>(p, xr, p.hidden, p.final_norm, p.lm_head, p.logits, ring, it, xs, scratch);
  }
  stamp(events - 1);
}

// The x buffer's use by the attention: q [kMaxGroup][hd], the new k and v, the partials of kAttnWarps key
// walkers for each of the `group` query heads.
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
  if ((m.fp8 || m.int4) && m.scale == nullptr) return false;
  if (m.int4) {
    // Whole 16-byte vectors of codes, and scale / zero-point rows whose bulk copies are whole 16 bytes.
    const Geom g = stage_geometry(m, paired, stage_bytes);
    if (m.k % 32 != 0 || m.group_shift > 2 || (m.k >> 5) % (1 << m.group_shift) != 0 || g.s_bytes % 16 != 0 ||
        g.z_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(m.scale) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(m.zero) % 16 != 0)
      return false;
  }
  return stage_geometry(m, paired, stage_bytes).rows_per_stage >= 1;
}

size_t decode_stack_prepare(DecodeStackParams& p, int32_t max_k) {
  // The x buffer: the BF16 input; the attention's scratch between phases.
  const size_t input = (static_cast<size_t>(max_k) * 2 + 15) / 16 * 16;
  const size_t x_bytes = (std::max(input, attention_scratch_bytes(p.hd, p.hq / p.hkv)) + 127) / 128 * 128;
  if (x_bytes + kMiscBytes + 2 * static_cast<size_t>(p.stage_bytes) > kSmemLimit) return 0;
  const size_t stages = std::min<size_t>(kMaxStages, (kSmemLimit - x_bytes - kMiscBytes) / p.stage_bytes);
  p.stages = static_cast<int32_t>(stages);
  p.x_bytes = static_cast<int32_t>(x_bytes);
  return stages * p.stage_bytes + x_bytes + kMiscBytes;
}

bool decode_stack_mlp_split_fits(const DecodeStackParams& p, int32_t inter, int grid) {
  if (grid < 1 || grid > kMaxSplitCtas || p.hidden > kSplitVecs * 8 * kConsumers || p.hidden % 8 != 0)
    return false;
  const int64_t rows = (static_cast<int64_t>(inter) + grid - 1) / grid;
  return (static_cast<int64_t>(p.hidden) * 2 + 15) / 16 * 16 + rows * 4 <= p.x_bytes;
}

namespace {
// 32 x 32 tiles through shared memory (a one-time copy per layer at the first batch-1 step).
__global__ void transpose_bf16_kernel(const __nv_bfloat16* src, __nv_bfloat16* dst, int64_t rows,
                                      int64_t cols) {
  __shared__ __nv_bfloat16 tile[32][33];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 32, r0 = static_cast<int64_t>(blockIdx.y) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c < cols && r < rows) dst[c * rows + r] = tile[threadIdx.x][i];
  }
}
}  // namespace

cudaError_t transpose_bf16(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || (cols + 31) / 32 > INT32_MAX || (rows + 31) / 32 > 65535)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  transpose_bf16_kernel<<<grid, dim3(32, 8), 0, stream>>>(static_cast<const __nv_bfloat16*>(src),
                                                          static_cast<__nv_bfloat16*>(dst), rows, cols);
  return cudaGetLastError();
}

size_t decode_stack_scratch(DecodeStackParams& p, int32_t inter, void* base) {
  // Each buffer on a 256-byte boundary: q/k/v, the attention output, the MLP activation, the split
  // partials, mlp_split's second residual buffer, then the control words.
  auto up = [](size_t floats) { return (floats + 63) / 64 * 64; };
  const size_t sizes[] = {up(static_cast<size_t>(p.hq + 2 * p.hkv) * p.hd),
                          up(static_cast<size_t>(p.hq) * p.hd),
                          up(static_cast<size_t>(inter)),
                          up(static_cast<size_t>(p.hq) * p.splits * (p.hd + 2)),
                          up(static_cast<size_t>(p.hidden)),
                          4 * static_cast<size_t>(mlp_sums_stride(p.hidden))};
  float* f = static_cast<float*>(base);
  float** const buffers[] = {&p.qkv, &p.attn, &p.act, &p.partials, &p.x_alt, &p.mlp_sums};
  size_t at = 0;
  for (int i = 0; i < 6; ++i) {
    if (f != nullptr) *buffers[i] = f + at;
    at += sizes[i];
  }
  if (f != nullptr) p.control = reinterpret_cast<uint32_t*>(f + at);
  return at * sizeof(float) + (1 + static_cast<size_t>(p.hkv)) * sizeof(uint32_t);
}

bool decode_stack_encode_kv_maps(const DecodeStackParams& p, void* out) {
  static_assert(sizeof(CUtensorMap) == kTensorMapBytes, "the kernel steps through the maps by this size");
  const int32_t row = p.hd * (p.kv_fp8 ? 1 : 2);
  const int64_t slots = p.num_blocks * p.block_size;
  if (p.block_size < 1 || p.block_size > 256 || slots >= (int64_t{1} << 31) ||
      std::min(p.stage_bytes / (2 * row), stack::kMaxKeysPerStage) < p.block_size ||
      reinterpret_cast<uintptr_t>(out) % 64 != 0)
    return false;
  auto* maps = static_cast<CUtensorMap*>(out);
  for (int32_t l = 0; l < p.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const void* base = kv == 0 ? p.layers[l].k_cache : p.layers[l].v_cache;
      if (reinterpret_cast<uintptr_t>(base) % 16 != 0 ||
          !encode_rows_map(maps[2 * l + kv], base,
                           p.kv_fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                           static_cast<uint64_t>(p.hkv) * p.hd, static_cast<uint64_t>(slots),
                           static_cast<uint64_t>(p.hkv) * row, static_cast<uint32_t>(p.hd),
                           static_cast<uint32_t>(p.block_size), CU_TENSOR_MAP_SWIZZLE_NONE,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B))
        return false;
    }
  }
  return true;
}

namespace {
using StackKernel = void (*)(DecodeStackParams);
struct StackInstance {
  StackKernel kernel;
  const char* name;
};
// Generic first; then BF16 / FP8 / INT4 for hd 128 and hd 64 (decode_stack_supported takes no other head
// size).
constexpr StackInstance kStackInstances[] = {{decode_stack_kernel<kStackAnyFormat, 0>, "generic"},
                                             {decode_stack_kernel<kStackBf16, 128>, "bf16_hd128"},
                                             {decode_stack_kernel<kStackFp8, 128>, "fp8_hd128"},
                                             {decode_stack_kernel<kStackInt4, 128>, "int4_hd128"},
                                             {decode_stack_kernel<kStackBf16, 64>, "bf16_hd64"},
                                             {decode_stack_kernel<kStackFp8, 64>, "fp8_hd64"},
                                             {decode_stack_kernel<kStackInt4, 64>, "int4_hd64"}};

const StackInstance& stack_instance(const DecodeStackParams& p) {
  if (p.format == kStackAnyFormat) return kStackInstances[0];
  return kStackInstances[(p.hd == 128 ? 1 : 4) + (p.format - kStackBf16)];
}
}  // namespace

const char* decode_stack_instance_name(const DecodeStackParams& p) { return stack_instance(p).name; }

int decode_stack_ctas_per_sm(size_t smem) {
  int least = INT32_MAX;
  for (const StackInstance& instance : kStackInstances) {
    const StackKernel kernel = instance.kernel;
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
  if (p.num_layers < 1 || p.num_layers > kMaxStackLayers || p.splits < 1 || p.splits > kMaxStackSplits)
    return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(p.control, 0, (1 + static_cast<size_t>(p.hkv)) * sizeof(uint32_t), stream);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute cooperative = {};  // all CTAs resident at once (the grid barriers need it)
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  return launch_with(cooperative, true, stack_instance(p).kernel, dim3(grid), dim3(kThreads), smem, stream,
                     p);
}

}  // namespace inferx::cuda
