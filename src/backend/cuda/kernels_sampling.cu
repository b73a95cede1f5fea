// Token selection on the GPU, so a decode step copies only one int per sequence back to the host.
// One CTA of 1024 threads per row of logits (argmax over few rows: a cluster of eight per row).
//   argmax: the lowest index among equal maxima (as std::max_element).
//   sample: z = logits / temperature; keep z >= theta where theta is raised by, in this order,
//     top-k:  the k-th largest z (ties at the threshold are all kept),
//     top-p:  the largest value v such that the kept tokens with z >= v carry at least top_p of the kept
//             softmax mass (the smallest nucleus, Holtzman et al. 2020, over the top-k set),
//     min-p:  z >= max z + ln(min_p) (probability at least min_p times the most likely token's);
//   then the first index, in vocabulary order, whose running sum of kept exp(z - max z) exceeds
//   uniform * total. Thresholds are found by a 4-pass radix select over the order-preserving integer
//   image of z, with 256-bin histograms of counts (top-k) or softmax mass (top-p) in shared memory:
//   no sort, and the row is read from L2 a few times.
#include <cooperative_groups.h>
#include <math_constants.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace inferx::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;

// float -> uint32 preserving order (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Block-wide max of (value, index), lowest index on ties; every thread gets the result.
__device__ void block_argmax(float& v, int& idx) {
  __shared__ float s_v[kWarp];
  __shared__ int s_i[kWarp];
  const auto better = [](float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); };
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
    if (better(ov, oi, v, idx)) {
      v = ov;
      idx = oi;
    }
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    s_v[warp] = v;
    s_i[warp] = idx;
  }
  __syncthreads();
  v = lane < blockDim.x / kWarp ? s_v[lane] : -CUDART_INF_F;
  idx = lane < blockDim.x / kWarp ? s_i[lane] : INT_MAX;
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
    if (better(ov, oi, v, idx)) {
      v = ov;
      idx = oi;
    }
  }
  __syncthreads();
}

// (value, index) of the maximum of row[begin, end) (the lowest index on ties; NaN never wins), reduced over
// the block: every thread gets it. idx stays INT_MAX for an empty slice.
__device__ void slice_argmax(const float* row, int64_t begin, int64_t end, float& best, int& idx) {
  best = -CUDART_INF_F;
  idx = INT_MAX;
  const auto take = [&](float v, int64_t i) {
    if (v > best || (v == best && i < idx)) {  // NaN never wins
      best = v;
      idx = static_cast<int>(i);
    }
  };
  const float* p = row + begin;
  const int64_t n = end - begin;
  if (n % 4 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0) {
    // float4s, kUnroll of them loaded before any is compared: one scalar load at a time kept a 128k-entry
    // row's CTA on its load latency (H200: 76 us for 256 rows of Llama 3's vocabulary with the copy back,
    // 50.6 us now; docs/benchmarks.md 2026-12-04).
    constexpr int kUnroll = 4;
    const auto* p4 = reinterpret_cast<const float4*>(p);
    const int64_t n4 = n / 4;
    for (int64_t base = threadIdx.x; base < n4; base += static_cast<int64_t>(blockDim.x) * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int64_t i = base + static_cast<int64_t>(j) * blockDim.x;
        if (i < n4) v[j] = p4[i];
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int64_t i = base + static_cast<int64_t>(j) * blockDim.x;
        if (i >= n4) continue;
        take(v[j].x, begin + 4 * i);
        take(v[j].y, begin + 4 * i + 1);
        take(v[j].z, begin + 4 * i + 2);
        take(v[j].w, begin + 4 * i + 3);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) take(p[i], begin + i);
  }
  block_argmax(best, idx);
}

__device__ int row_argmax(const float* row, int64_t vocab) {
  float best;
  int idx;
  slice_argmax(row, 0, vocab, best, idx);
  return idx == INT_MAX ? 0 : idx;
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* logits, int64_t vocab, int32_t* ids) {
  pdl_wait();  // the logits come from the kernel before (cuda_common.cuh)
  pdl_launch_dependents();
  const int id = row_argmax(logits + blockIdx.x * vocab, vocab);
  if (threadIdx.x == 0) ids[blockIdx.x] = id;
}

// Few rows: a cluster of kClusterSplit CTAs per row, each over one slice, the slices' maxima combined
// through distributed shared memory. One CTA per row leaves a batch-1 step's argmax on a single SM that
// loads Llama 3's 513 KB row in eight rounds of latency (10.4 us, H100 CUPTI timeline 2026-12-06 19:30);
// eight SMs load it in one.
constexpr int kClusterSplit = 8;  // the portable cluster size

__global__ void __launch_bounds__(kThreads)
    argmax_cluster_kernel(const float* logits, int64_t vocab, int32_t* ids) {
  __shared__ float s_best;
  __shared__ int s_idx;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const int64_t row = blockIdx.x / kClusterSplit;
  // Slices of a multiple of 4 entries, so each starts 16-byte aligned where the row does.
  const int64_t slice = ((vocab + kClusterSplit - 1) / kClusterSplit + 3) / 4 * 4;
  const int64_t begin = std::min<int64_t>(vocab, rank * slice), end = std::min<int64_t>(vocab, begin + slice);
  pdl_wait();  // the logits come from the kernel before (cuda_common.cuh)
  pdl_launch_dependents();
  float best;
  int idx;
  slice_argmax(logits + row * vocab, begin, end, best, idx);
  if (threadIdx.x == 0) {
    s_best = best;
    s_idx = idx;
  }
  cluster.sync();  // every slice's maximum is in its CTA's shared memory
  if (rank == 0 && threadIdx.x < kWarp) {
    const bool mine = threadIdx.x < kClusterSplit;
    float v = mine ? *cluster.map_shared_rank(&s_best, threadIdx.x) : -CUDART_INF_F;
    int i = mine ? *cluster.map_shared_rank(&s_idx, threadIdx.x) : INT_MAX;
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, off);
      const int oi = __shfl_xor_sync(0xffffffffu, i, off);
      if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
      }
    }
    if (threadIdx.x == 0) ids[row] = i == INT_MAX ? 0 : i;
  }
  cluster.sync();  // no CTA exits while rank 0 may still read its shared memory
}

constexpr int kUnits = 4;  // 4-entry units per thread in flight

// z = logits * inv_t of unit u (entries 4u .. 4u + 3); entries past the row are NaN (never kept, never a
// max).
__device__ __forceinline__ void load_unit(const float* row, int64_t u, int64_t vocab, bool vec, float inv_t,
                                          float (&z)[4]) {
  if (vec) {
    const float4 v = reinterpret_cast<const float4*>(row)[u];
    z[0] = v.x * inv_t;
    z[1] = v.y * inv_t;
    z[2] = v.z * inv_t;
    z[3] = v.w * inv_t;
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = 4 * u + j;
    z[j] = i < vocab ? row[i] * inv_t : CUDART_NAN_F;
  }
}

// f(z, in_row) for every 4-entry unit of the row, the block's threads striding over units with kUnits loads
// in flight; every lane calls f the same number of times (in_row false past the row), so f may use warp
// collectives.
template <class F>
__device__ __forceinline__ void for_each_unit(const float* row, int64_t vocab, bool vec, float inv_t, F&& f) {
  const int64_t n4 = (vocab + 3) / 4;
  for (int64_t base = threadIdx.x - threadIdx.x % kWarp; base < n4;
       base += static_cast<int64_t>(blockDim.x) * kUnits) {
    float z[kUnits][4];
    const int64_t own = base + threadIdx.x % kWarp;
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int64_t u = own + static_cast<int64_t>(j) * blockDim.x;
      if (u < n4) load_unit(row, u, vocab, vec, inv_t, z[j]);
    }
#pragma unroll
    for (int j = 0; j < kUnits; ++j) f(z[j], own + static_cast<int64_t>(j) * blockDim.x < n4);
  }
}

__device__ __forceinline__ float kept_weight(float z, float theta, float zmax) {
  return z >= theta ? exp2f((z - zmax) * 1.4426950408889634f) : 0.0f;
}

// hist[bin] += v over the warp's eligible lanes with one atomic per distinct bin (every lane calls it): the
// lanes of a warp mostly fall into the same two or three bins (logits share a few exponents), and 32 lanes
// adding to one shared float serialise (v1 adds lane by lane).
__device__ __forceinline__ void warp_hist_add(float* hist, uint32_t bin, bool eligible, float v) {
  const int lane = threadIdx.x % kWarp;
  unsigned todo = __ballot_sync(0xffffffffu, eligible);
  while (todo != 0) {
    const int src = __ffs(todo) - 1;
    const uint32_t b = __shfl_sync(0xffffffffu, bin, src);
    const bool mine = eligible && bin == b;
    const float sum = warp_sum(mine ? v : 0.0f);
    if (lane == src) atomicAdd(&hist[b], sum);
    todo &= ~__ballot_sync(0xffffffffu, mine);
  }
}

// The largest key K such that the weight of eligible elements with key >= K reaches `target`.
// kMass: weight = exp(z - zmax), else 1. Eligible: z >= floor_z.
// kV2: the sampler v2's fill (coalesced float4 units, warp_hist_add), else v1's (scalar loads, an atomic per
// lane); `vec` (v2): the row is read as float4s.
template <bool kMass, bool kV2>
__device__ float radix_threshold(const float* row, int64_t vocab, bool vec, float inv_t, float zmax,
                                 float floor_z, float target) {
  // One private histogram per warp: logits of one row share a few exponents, so the first pass puts most
  // of the 128k entries into two or three bins, and one shared histogram serialised every warp of the
  // block on them (1.2 ms per row measured on the H200). Private copies leave only intra-warp conflicts.
  constexpr int kWarps = kThreads / kWarp;
  __shared__ float warp_hist[kWarps][256];
  __shared__ float hist[256];
  __shared__ uint32_t s_bin;
  __shared__ float s_remaining;
  float* my_hist = warp_hist[threadIdx.x / kWarp];
  uint32_t prefix = 0, mask = 0;
  float remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kWarps * 256; b += blockDim.x) (&warp_hist[0][0])[b] = 0.0f;
    __syncthreads();
    if constexpr (kV2) {
      for_each_unit(row, vocab, vec, inv_t, [&](const float(&z)[4], bool in_row) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float zz = in_row ? z[e] : CUDART_NAN_F;
          const uint32_t key = order_key(zz);
          const bool eligible = zz >= floor_z && (key & mask) == prefix;
          warp_hist_add(my_hist, (key >> shift) & 255u, eligible,
                        kMass ? exp2f((zz - zmax) * 1.4426950408889634f) : 1.0f);
        }
      });
    } else {
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float z = row[i] * inv_t;
        if (!(z >= floor_z)) continue;
        const uint32_t key = order_key(z);
        if ((key & mask) != prefix) continue;
        atomicAdd(&my_hist[(key >> shift) & 255u], kMass ? exp2f((z - zmax) * 1.4426950408889634f) : 1.0f);
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      float sum = 0.0f;
      for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) sum += warp_hist[w][b];
      hist[b] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float cum = 0.0f;
      int bin = -1, lowest_nonempty = 0;
      for (int b = 255; b >= 0; --b) {
        if (hist[b] > 0.0f) lowest_nonempty = b;
        if (hist[b] > 0.0f && cum + hist[b] >= remaining) {
          bin = b;
          break;
        }
        cum += hist[b];
      }
      if (bin < 0) {  // rounding left the target just out of reach: take everything that is left
        bin = lowest_nonempty;
        cum -= hist[bin];
      }
      s_bin = static_cast<uint32_t>(bin);
      s_remaining = remaining - cum;
    }
    __syncthreads();
    prefix |= s_bin << shift;
    mask |= 255u << shift;
    remaining = s_remaining;
    __syncthreads();
  }
  return key_value(prefix);
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t vocab, const SampleParams* params, int32_t* ids) {
  __shared__ float s_scan[kWarp];
  __shared__ int s_pick, s_last;
  pdl_wait();
  pdl_launch_dependents();
  const float* row = logits + blockIdx.x * vocab;
  const SampleParams p = params[blockIdx.x];
  if (!(p.temperature > 0.0f)) {
    const int id = row_argmax(row, vocab);
    if (threadIdx.x == 0) ids[blockIdx.x] = id;
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  float zmax = -CUDART_INF_F;
  int unused = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) zmax = fmaxf(zmax, row[i] * inv_t);
  block_argmax(zmax, unused);

  float theta = -CUDART_INF_F;
  if (p.top_k > 0 && p.top_k < vocab)
    theta = radix_threshold<false, false>(row, vocab, false, inv_t, zmax, theta, static_cast<float>(p.top_k));
  if (p.top_p < 1.0f) {
    float mass = 0.0f;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float z = row[i] * inv_t;
      if (z >= theta) mass += exp2f((z - zmax) * 1.4426950408889634f);
    }
    mass = block_sum(mass, s_scan);
    theta = fmaxf(theta, radix_threshold<true, false>(row, vocab, false, inv_t, zmax, theta,
                                                      fmaxf(p.top_p, 0.0f) * mass));
  }
  if (p.min_p > 0.0f) theta = fmaxf(theta, zmax + logf(p.min_p));

  // Contiguous ranges per thread, so "first index in vocabulary order" is a block scan of range sums.
  const int64_t per = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t begin = min(vocab, threadIdx.x * per), end = min(vocab, begin + per);
  float local = 0.0f;
  int last_kept = -1;
  for (int64_t i = begin; i < end; ++i) {
    const float z = row[i] * inv_t;
    if (z >= theta) {
      local += exp2f((z - zmax) * 1.4426950408889634f);
      last_kept = static_cast<int>(i);
    }
  }
  // Inclusive scan across the block: warp scan, then the warp totals.
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  float incl = local;
#pragma unroll
  for (int off = 1; off < kWarp; off *= 2) {
    const float o = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += o;
  }
  if (threadIdx.x == 0) {
    s_pick = INT_MAX;
    s_last = -1;
  }
  if (lane == kWarp - 1) s_scan[warp] = incl;
  __syncthreads();
  float warp_offset = 0.0f, total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) {
    if (w < warp) warp_offset += s_scan[w];
    total += s_scan[w];
  }
  // The ranges [lo, hi) tile [0, total) exactly: a thread's hi is computed by the same float operations
  // as the next thread's lo.
  float prev = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) prev = 0.0f;
  const float lo = warp_offset + prev, hi = warp_offset + incl;
  const float target = p.uniform * total;
  if (last_kept >= 0) atomicMax(&s_last, last_kept);
  if (local > 0.0f && lo <= target && target < hi) {
    float cum = lo;
    int pick = last_kept;
    for (int64_t i = begin; i < end; ++i) {
      const float z = row[i] * inv_t;
      if (z >= theta) {
        cum += exp2f((z - zmax) * 1.4426950408889634f);
        if (cum > target) {
          pick = static_cast<int>(i);
          break;
        }
      }
    }
    atomicMin(&s_pick, pick);
  }
  __syncthreads();
  if (threadIdx.x == 0) ids[blockIdx.x] = s_pick != INT_MAX ? s_pick : (s_last >= 0 ? s_last : 0);
}

// ---- v2 of the sampler (CudaBackendOptions::sample_v2): the same selection rule with every pass over the
// row coalesced and several 16-byte loads in flight per thread. v1 reads the row with one scalar load per
// thread and iteration, and its last pass gives each thread a contiguous range (a warp's 32 loads touch 32
// lines per instruction): 472 us for one row of Llama 3's vocabulary with top-k, top-p and min-p, 850 us for
// 256 rows (H200, 2026-12-02).

// One warp-sized step of a warp's walk over its segment: the lanes' kept weight of unit base + lane, their
// inclusive scan, and the step's total (the scan's last lane; every lane gets it).
struct WalkStep {
  float z[4];
  float own, incl, total;
};
__device__ __forceinline__ void walk_sums(WalkStep& w, float theta, float zmax, bool valid) {
  const int lane = threadIdx.x % kWarp;
  w.own = 0.0f;
  if (valid)
#pragma unroll
    for (int e = 0; e < 4; ++e) w.own += kept_weight(w.z[e], theta, zmax);
  w.incl = w.own;
#pragma unroll
  for (int off = 1; off < kWarp; off *= 2) {
    const float o = __shfl_up_sync(0xffffffffu, w.incl, off);
    if (lane >= off) w.incl += o;
  }
  w.total = __shfl_sync(0xffffffffu, w.incl, kWarp - 1);
}

__global__ void __launch_bounds__(kThreads)
    sample_v2_kernel(const float* logits, int64_t vocab, const SampleParams* params, int32_t* ids) {
  constexpr int kWarps = kThreads / kWarp;
  __shared__ float s_scan[kWarp];
  __shared__ float s_warp_total[kWarps];
  __shared__ int s_pick;
  pdl_wait();
  pdl_launch_dependents();
  const float* row = logits + blockIdx.x * vocab;
  const SampleParams p = params[blockIdx.x];
  float best;
  int best_idx;
  slice_argmax(row, 0, vocab, best, best_idx);  // float4 loads, several in flight
  const float inv_t = 1.0f / p.temperature;
  const float zmax = best * inv_t;  // rounding is monotonic: the largest z is the largest logit's
  // Greedy, or no finite logit to weigh against (every entry -inf or NaN): the argmax.
  if (!(p.temperature > 0.0f) || !(zmax > -CUDART_INF_F)) {
    if (threadIdx.x == 0) ids[blockIdx.x] = best_idx == INT_MAX ? 0 : best_idx;
    return;
  }
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0;
  const int64_t n4 = (vocab + 3) / 4;

  float theta = -CUDART_INF_F;
  if (p.top_k > 0 && p.top_k < vocab)
    theta = radix_threshold<false, true>(row, vocab, vec, inv_t, zmax, theta, static_cast<float>(p.top_k));
  if (p.top_p < 1.0f) {
    float mass = 0.0f;
    for_each_unit(row, vocab, vec, inv_t, [&](const float(&z)[4], bool in_row) {
      if (in_row)
#pragma unroll
        for (int e = 0; e < 4; ++e) mass += kept_weight(z[e], theta, zmax);
    });
    mass = block_sum(mass, s_scan);
    theta = fmaxf(
        theta, radix_threshold<true, true>(row, vocab, vec, inv_t, zmax, theta, fmaxf(p.top_p, 0.0f) * mass));
  }
  if (p.min_p > 0.0f) theta = fmaxf(theta, zmax + logf(p.min_p));

  // "The first index in vocabulary order whose running sum of kept weights exceeds uniform * total": each
  // warp owns a contiguous segment of units and sums it in warp-sized steps (coalesced), in order; the
  // segment holding the target is then walked again by its warp with the same sums.
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t seg = (n4 + kWarps - 1) / kWarps;
  const int64_t wbegin = std::min<int64_t>(n4, warp * seg), wend = std::min<int64_t>(n4, wbegin + seg);
  float wtotal = 0.0f;
  for (int64_t base = wbegin; base < wend; base += static_cast<int64_t>(kWarp) * kUnits) {
    WalkStep st[kUnits];
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int64_t u = base + j * kWarp + lane;
      if (u < wend) load_unit(row, u, vocab, vec, inv_t, st[j].z);
    }
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      walk_sums(st[j], theta, zmax, base + j * kWarp + lane < wend);
      wtotal += st[j].total;
    }
  }
  if (lane == 0) s_warp_total[warp] = wtotal;
  if (threadIdx.x == 0) s_pick = -1;
  __syncthreads();
  // Every thread finds the same segment: the ranges [lo, lo + total) tile [0, sum) in warp order.
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += s_warp_total[w];
  const float target = p.uniform * total;
  int chosen = -1, last_nonempty = -1;
  float lo = 0.0f, chosen_lo = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    const float t = s_warp_total[w];
    if (t > 0.0f) {
      last_nonempty = w;
      if (chosen < 0 && lo <= target && target < lo + t) {
        chosen = w;
        chosen_lo = lo;
      }
    }
    lo += t;
  }
  if (chosen < 0 && last_nonempty >= 0) {  // target == total by rounding: the last kept weight
    chosen = last_nonempty;
    chosen_lo = total - s_warp_total[last_nonempty];
  }
  if (warp == chosen) {
    const float rem = target - chosen_lo;  // within the segment; the walk repeats the first pass's sums
    float cum = 0.0f;
    int last_kept = -1;  // the segment's last entry with a positive weight so far (the rounding fallback)
    int pick = -1;
    for (int64_t base = wbegin; base < wend && pick < 0; base += kWarp) {
      WalkStep st;
      const int64_t u = base + lane;
      const bool valid = u < wend;
      if (valid) load_unit(row, u, vocab, vec, inv_t, st.z);
      walk_sums(st, theta, zmax, valid);
      int mine = -1;  // this lane's last kept entry
      if (valid)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kept_weight(st.z[e], theta, zmax) > 0.0f) mine = static_cast<int>(4 * u + e);
      const unsigned with_kept = __ballot_sync(0xffffffffu, mine >= 0);
      const unsigned over = __ballot_sync(0xffffffffu, st.own > 0.0f && cum + st.incl > rem);
      if (over != 0) {
        const int l = __ffs(over) - 1;
        if (lane == l) {
          float c = cum + st.incl - st.own;
          pick = mine;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float w = kept_weight(st.z[e], theta, zmax);
            c += w;
            if (w > 0.0f && c > rem) {
              pick = static_cast<int>(4 * u + e);
              break;
            }
          }
        }
        pick = __shfl_sync(0xffffffffu, pick, l);
      } else if (with_kept != 0) {
        last_kept = __shfl_sync(0xffffffffu, mine, 31 - __clz(with_kept));
      }
      cum += st.total;
    }
    if (lane == 0) s_pick = pick >= 0 ? pick : last_kept;
  }
  __syncthreads();
  if (threadIdx.x == 0) ids[blockIdx.x] = s_pick >= 0 ? s_pick : (best_idx == INT_MAX ? 0 : best_idx);
}

// One thread per edit; the rounding pinned (no contraction): the host applies the same operations in this
// order (apply_logit_bias, PenaltyState::apply), so an edited row is the host's row bit for bit.
__global__ void logit_edits_kernel(float* logits, int64_t vocab, const LogitEdit* edits, int64_t n) {
  pdl_wait();  // the logits come from the kernel before
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const LogitEdit e = edits[i];
    float* p = logits + static_cast<int64_t>(e.row) * vocab + e.token;
    float x = __fadd_rn(*p, e.bias);
    if (e.repetition != 1.0f) x = x > 0.0f ? __fdiv_rn(x, e.repetition) : __fmul_rn(x, e.repetition);
    *p = __fsub_rn(x, e.subtract);
  }
}

}  // namespace

cudaError_t launch_logit_edits(float* logits, int64_t vocab, const LogitEdit* edits, int64_t n,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 1024));
  return launch_pdl(logit_edits_kernel, dim3(blocks), dim3(kThreads), 0, stream, logits, vocab, edits, n);
}

cudaError_t launch_argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, cudaStream_t stream,
                          int64_t cluster_rows_max) {
  if (rows == 0) return cudaSuccess;
  if (rows > cluster_rows_max)
    return launch_pdl(argmax_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, logits,
                      vocab, ids);
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kClusterSplit;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows * kClusterSplit));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = pdl_enabled() ? 2 : 1;
  return cudaLaunchKernelEx(&config, argmax_cluster_kernel, logits, vocab, ids);
}

cudaError_t launch_sample(const float* logits, int64_t rows, int64_t vocab, const SampleParams* params,
                          int32_t* ids, cudaStream_t stream, int version) {
  if (rows == 0) return cudaSuccess;
  return launch_pdl(version >= 2 ? sample_v2_kernel : sample_kernel, dim3(static_cast<unsigned>(rows)),
                    dim3(kThreads), 0, stream, logits, vocab, params, ids);
}

}  // namespace inferx::cuda
