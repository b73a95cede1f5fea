// Token selection on the GPU, so a decode step copies only one int per sequence back to the host.
// One CTA of 1024 threads per row of logits (few rows: a cluster of eight per row).
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

// f(z) for every 4-entry unit in [ubegin, uend), the block's threads striding over units with kUnits loads
// in flight (coalesced 16-byte loads where the row allows).
template <class F>
__device__ __forceinline__ void for_each_unit(const float* row, int64_t ubegin, int64_t uend, int64_t vocab,
                                              bool vec, float inv_t, F&& f) {
  for (int64_t base = ubegin + threadIdx.x; base < uend; base += static_cast<int64_t>(blockDim.x) * kUnits) {
    float z[kUnits][4];
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int64_t u = base + static_cast<int64_t>(j) * blockDim.x;
      if (u < uend) load_unit(row, u, vocab, vec, inv_t, z[j]);
    }
#pragma unroll
    for (int j = 0; j < kUnits; ++j)
      if (base + static_cast<int64_t>(j) * blockDim.x < uend) f(z[j]);
  }
}

__device__ __forceinline__ float kept_weight(float z, float theta, float zmax) {
  return z >= theta ? exp2f((z - zmax) * 1.4426950408889634f) : 0.0f;
}

// The sampler runs on kCtas CTAs per row: one, or (few rows) a cluster of kClusterSplit, each over its
// slice of the row, meeting through distributed shared memory wherever the rule needs the whole row (the
// maximum, each radix pass's histogram, the kept mass, the slices' totals). Every CTA of a cluster combines
// the slices' values in rank order with the same float operations, so all take the same decisions.
template <int kCtas>
__device__ __forceinline__ void cluster_sync() {
  if constexpr (kCtas > 1)
    cg::this_cluster().sync();  // also a barrier of each CTA's threads, with release / acquire order
  else
    __syncthreads();
}
// `slot` (shared memory) as CTA r of this cluster holds it.
template <int kCtas, class T>
__device__ __forceinline__ const T& in_cta(T* slot, unsigned r) {
  if constexpr (kCtas > 1)
    return *cg::this_cluster().map_shared_rank(slot, r);
  else
    return *slot;
}

struct RadixScratch {
  // One private histogram per warp: logits of one row share a few exponents, so the first pass puts most
  // of the 128k entries into two or three bins, and one shared histogram serialised every warp of the
  // block on them (1.2 ms per row measured on the H200). Private copies leave only intra-warp conflicts.
  // (Aggregating a warp's lanes per bin with ballots and shuffles before one atomic was twice as slow:
  // 591 against 308 us for one 128k row with top-p, H100 2026-12-06.)
  float warp_hist[kThreads / kWarp][256];
  float cta_hist[2][256];  // this CTA's pass histogram; two, so a pass's fill never meets a slower CTA's read
  float hist[256];         // the cluster's
  uint32_t bin;
  float remaining;
};

// From the top bin down, the first nonempty bin whose weight takes the running sum to `remaining`; s.bin and
// s.remaining (what is left to reach within it). One warp (every lane calls it): lane l owns bins 255 - 8l
// down to 248 - 8l, summed in that order, then a scan over the lanes. (Thread 0 alone walking the 256 bins,
// with the chained final walk below, was slower: one 128k row with temperature 63.6 -> 45.5 us, with
// top-k + top-p + min-p 253.5 -> 229.8 us on one CTA and 86.6 -> 70.6 on a cluster; H100 2026-12-07.)
// Rounding that leaves the target just out of reach takes the lowest nonempty bin with everything above it.
__device__ __forceinline__ void pick_bin(RadixScratch& s, float remaining) {
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x % kWarp;
  float h[8], own = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    h[j] = s.hist[255 - 8 * lane - j];
    own += h[j];
  }
  const float incl = warp_inclusive_sum(own);
  const float total = __shfl_sync(all, incl, kWarp - 1);
  float cum = __shfl_up_sync(all, incl, 1);
  if (lane == 0) cum = 0.0f;
  int found = -1, lowest = -1;
  float found_cum = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int b = 255 - 8 * lane - j;
    if (h[j] > 0.0f) {
      lowest = b;
      if (found < 0 && cum + h[j] >= remaining) {
        found = b;
        found_cum = cum;
      }
    }
    cum += h[j];
  }
  const unsigned with_found = __ballot_sync(all, found >= 0);
  int bin;
  float before;
  if (with_found != 0) {
    const int src = __ffs(with_found) - 1;  // the lowest lane holds the highest bins
    bin = __shfl_sync(all, found, src);
    before = __shfl_sync(all, found_cum, src);
  } else {
    const unsigned nonempty = __ballot_sync(all, lowest >= 0);
    bin = nonempty != 0 ? __shfl_sync(all, lowest, 31 - __clz(nonempty)) : 0;
    before = total - s.hist[bin];
  }
  if (lane == 0) {
    s.bin = static_cast<uint32_t>(bin);
    s.remaining = remaining - before;
  }
}

// The largest key K such that the weight of eligible elements of the row with key >= K reaches `target`.
// kMass: weight = exp(z - zmax), else 1. Eligible: z >= floor_z. This CTA fills units [ubegin, uend).
template <bool kMass, int kCtas>
__device__ float radix_threshold(RadixScratch& s, const float* row, int64_t ubegin, int64_t uend,
                                 int64_t vocab, bool vec, float inv_t, float zmax, float floor_z,
                                 float target) {
  constexpr int kWarps = kThreads / kWarp;
  float* my_hist = s.warp_hist[threadIdx.x / kWarp];
  uint32_t prefix = 0, mask = 0;
  float remaining = target;
  int parity = 0;
  for (int shift = 24; shift >= 0; shift -= 8, parity ^= 1) {
    for (int b = threadIdx.x; b < kWarps * 256; b += blockDim.x) (&s.warp_hist[0][0])[b] = 0.0f;
    __syncthreads();
    for_each_unit(row, ubegin, uend, vocab, vec, inv_t, [&](const float(&z)[4]) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (!(z[e] >= floor_z)) continue;
        const uint32_t key = order_key(z[e]);
        if ((key & mask) != prefix) continue;
        atomicAdd(&my_hist[(key >> shift) & 255u], kMass ? exp2f((z[e] - zmax) * 1.4426950408889634f) : 1.0f);
      }
    });
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += s.warp_hist[w][b];
      s.cta_hist[parity][b] = sum;
    }
    // Every slice's histogram is complete. A CTA writes cta_hist[parity] again two passes on, after the next
    // pass's cluster barrier, which no CTA reaches before it has read this pass's.
    cluster_sync<kCtas>();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
      float sum = 0.0f;
      for (unsigned r = 0; r < kCtas; ++r) sum += in_cta<kCtas>(&s.cta_hist[parity][b], r);
      s.hist[b] = sum;
    }
    __syncthreads();
    if (threadIdx.x < kWarp) pick_bin(s, remaining);
    __syncthreads();
    prefix |= s.bin << shift;
    mask |= 255u << shift;
    remaining = s.remaining;
    __syncthreads();
  }
  return key_value(prefix);
}

// Sum of v over the block, then over the cluster's CTAs in rank order (every thread of every CTA gets the
// same value). `slot`: a shared float of the caller's, written once.
template <int kCtas>
__device__ float cluster_sum(float v, float* scratch, float* slot) {
  v = block_sum(v, scratch);
  if constexpr (kCtas == 1) return v;
  if (threadIdx.x == 0) *slot = v;
  cluster_sync<kCtas>();
  float sum = 0.0f;
  for (unsigned r = 0; r < kCtas; ++r) sum += in_cta<kCtas>(slot, r);
  return sum;
}

// One warp-sized step of a warp's walk over its segment: the lanes' kept weight of unit base + lane, their
// inclusive scan, and the step's total (the scan's last lane; every lane gets it).
struct WalkStep {
  float z[4];
  float own, incl, total;
};
__device__ __forceinline__ void walk_sums(WalkStep& w, float theta, float zmax, bool valid) {
  w.own = 0.0f;
  if (valid)
#pragma unroll
    for (int e = 0; e < 4; ++e) w.own += kept_weight(w.z[e], theta, zmax);
  w.incl = warp_inclusive_sum(w.own);
  w.total = __shfl_sync(0xffffffffu, w.incl, kWarp - 1);
}

// Which of n consecutive ranges of sizes t[0..n) holds `target` in [0, sum t): the ranges [lo, lo + t)
// tile [0, sum) in order (each lo + t is the next lo, by the same float operations). -1 if none is nonempty;
// the last nonempty one when rounding left target == the sum. lo: where the chosen range starts.
template <class At>
__device__ int pick_range(int n, At t, float target, float& lo_out) {
  int chosen = -1, last_nonempty = -1;
  float lo = 0.0f, last_lo = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ti = t(i);
    if (ti > 0.0f) {
      last_nonempty = i;
      last_lo = lo;
      if (chosen < 0 && lo <= target && target < lo + ti) {
        chosen = i;
        lo_out = lo;
      }
    }
    lo += ti;
  }
  if (chosen < 0 && last_nonempty >= 0) {
    chosen = last_nonempty;
    lo_out = last_lo;
  }
  return chosen;
}

// The lane whose unit crosses rem: its first kept entry that takes cum (the step's sum before the lane)
// past rem; `mine` (its last kept entry) where rounding leaves none.
__device__ __forceinline__ int pick_in_unit(const WalkStep& st, int mine, int64_t first, float cum, float rem,
                                            float theta, float zmax) {
  float c = cum + st.incl - st.own;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float w = kept_weight(st.z[e], theta, zmax);
    c += w;
    if (w > 0.0f && c > rem) return static_cast<int>(first + e);
  }
  return mine;
}

// One warp-sized step of a segment walk: lane's unit u (valid below wend) loaded into st with its kept sums
// (walk_sums); returns the lane's last kept entry, -1 if none.
__device__ __forceinline__ int load_walk_step(WalkStep& st, const float* row, int64_t u, int64_t wend,
                                              int64_t vocab, bool vec, float inv_t, float theta, float zmax) {
  const bool valid = u < wend;
  if (valid) load_unit(row, u, vocab, vec, inv_t, st.z);
  walk_sums(st, theta, zmax, valid);
  int mine = -1;
  if (valid)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (kept_weight(st.z[e], theta, zmax) > 0.0f) mine = static_cast<int>(4 * u + e);
  return mine;
}

// The warp's pick in a step whose running sum starts at cum: pick_in_unit in the first lane with weight whose
// running sum passes rem, else -1. Every lane gets it.
__device__ __forceinline__ int step_crossing(const WalkStep& st, int mine, int64_t u, float cum, float rem,
                                             float theta, float zmax) {
  const unsigned over = __ballot_sync(0xffffffffu, st.own > 0.0f && cum + st.incl > rem);
  if (over == 0) return -1;
  const int l = __ffs(over) - 1;
  int pick = -1;
  if (static_cast<int>(threadIdx.x % kWarp) == l) pick = pick_in_unit(st, mine, 4 * u, cum, rem, theta, zmax);
  return __shfl_sync(0xffffffffu, pick, l);
}

// The step's last kept entry (the highest lane's `mine`), -1 if none. Every lane gets it.
__device__ __forceinline__ int step_last_kept(int mine) {
  const unsigned with_kept = __ballot_sync(0xffffffffu, mine >= 0);
  return with_kept != 0 ? __shfl_sync(0xffffffffu, mine, 31 - __clz(with_kept)) : -1;
}

constexpr int kMaxSteps = 64;  // warp-sized steps per segment whose totals shared memory keeps

// Grid: rows x kCtas CTAs of kThreads (kCtas > 1: clusters of kCtas, one per row).
template <int kCtas>
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t vocab, const SampleParams* params, int32_t* ids) {
  constexpr int kWarps = kThreads / kWarp;
  __shared__ RadixScratch radix;
  __shared__ float s_scan[kWarp];
  __shared__ float s_warp_total[kWarps];
  __shared__ float s_step_total[kWarps][kMaxSteps];  // each warp's step totals in its segment's first pass
  __shared__ float s_best, s_mass, s_total;
  __shared__ int s_idx, s_pick;
  const unsigned rank = kCtas > 1 ? cg::this_cluster().block_rank() : 0;
  const int64_t r = blockIdx.x / kCtas;
  pdl_wait();
  pdl_launch_dependents();
  const float* row = logits + r * vocab;
  const SampleParams p = params[r];
  // This CTA's slice of 4-entry units (16-byte aligned where the row is).
  const int64_t n4 = (vocab + 3) / 4, per_cta = (n4 + kCtas - 1) / kCtas;
  const int64_t ubegin = std::min<int64_t>(n4, rank * per_cta),
                uend = std::min<int64_t>(n4, ubegin + per_cta);

  // The row's maximum (lowest index on ties): the slices', then the cluster's in rank order.
  float best;
  int best_idx;
  slice_argmax(row, std::min<int64_t>(vocab, 4 * ubegin), std::min<int64_t>(vocab, 4 * uend), best, best_idx);
  if constexpr (kCtas > 1) {
    if (threadIdx.x == 0) {
      s_best = best;
      s_idx = best_idx;
    }
    cluster_sync<kCtas>();
    for (unsigned c = 0; c < kCtas; ++c) {
      const float v = in_cta<kCtas>(&s_best, c);
      const int i = in_cta<kCtas>(&s_idx, c);
      if (v > best || (v == best && i < best_idx)) {
        best = v;
        best_idx = i;
      }
    }
  }
  const float inv_t = 1.0f / p.temperature;
  const float zmax = best * inv_t;  // rounding is monotonic: the largest z is the largest logit's
  // Greedy, or no finite logit to weigh against (every entry -inf or NaN): the argmax.
  if (!(p.temperature > 0.0f) || !(zmax > -CUDART_INF_F)) {
    if (rank == 0 && threadIdx.x == 0) ids[r] = best_idx == INT_MAX ? 0 : best_idx;
    cluster_sync<kCtas>();  // no CTA exits while another may still read its shared memory
    return;
  }
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0;

  float theta = -CUDART_INF_F;
  if (p.top_k > 0 && p.top_k < vocab)
    theta = radix_threshold<false, kCtas>(radix, row, ubegin, uend, vocab, vec, inv_t, zmax, theta,
                                          static_cast<float>(p.top_k));
  if (p.top_p < 1.0f) {
    float mass = 0.0f;
    for_each_unit(row, ubegin, uend, vocab, vec, inv_t, [&](const float(&z)[4]) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mass += kept_weight(z[e], theta, zmax);
    });
    mass = cluster_sum<kCtas>(mass, s_scan, &s_mass);
    theta = fmaxf(theta, radix_threshold<true, kCtas>(radix, row, ubegin, uend, vocab, vec, inv_t, zmax,
                                                      theta, fmaxf(p.top_p, 0.0f) * mass));
  }
  if (p.min_p > 0.0f) theta = fmaxf(theta, zmax + logf(p.min_p));

  // "The first index in vocabulary order whose running sum of kept weights exceeds uniform * total": each
  // warp owns a contiguous segment of the slice's units and sums it in warp-sized steps (coalesced), in
  // order, keeping the step totals; the cluster picks the slice, the slice's CTA the segment, whose warp
  // finds the step from the kept totals and loads that step again.
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t seg = (uend - ubegin + kWarps - 1) / kWarps;
  const int64_t wbegin = std::min<int64_t>(uend, ubegin + warp * seg),
                wend = std::min<int64_t>(uend, wbegin + seg);
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
      const int64_t t = (base - wbegin) / kWarp + j;
      if (lane == 0 && t < kMaxSteps) s_step_total[warp][t] = st[j].total;
    }
  }
  if (lane == 0) s_warp_total[warp] = wtotal;
  if (threadIdx.x == 0) s_pick = -1;
  __syncthreads();
  float slice_total = 0.0f;
  for (int w = 0; w < kWarps; ++w) slice_total += s_warp_total[w];
  float target = 0.0f, slice_lo = 0.0f;
  int chosen_cta = 0;
  if constexpr (kCtas > 1) {
    if (threadIdx.x == 0) s_total = slice_total;
    cluster_sync<kCtas>();
    float total = 0.0f;
    for (unsigned c = 0; c < kCtas; ++c) total += in_cta<kCtas>(&s_total, c);
    target = p.uniform * total;
    chosen_cta = pick_range(
        kCtas, [&](int c) { return in_cta<kCtas>(&s_total, c); }, target, slice_lo);
    cluster_sync<kCtas>();  // every CTA has read the slices' totals: from here on none reads another's memory
  } else {
    target = p.uniform * slice_total;
  }
  if (chosen_cta != static_cast<int>(rank)) {
    // Nothing kept anywhere (min-p above 1): the argmax, from the first CTA.
    if (chosen_cta < 0 && rank == 0 && threadIdx.x == 0) ids[r] = best_idx == INT_MAX ? 0 : best_idx;
    return;
  }
  // Within the slice (target - slice_lo rounds into [0, slice_total] or just past it: pick_range's fallback).
  float seg_lo = 0.0f;
  const float in_slice = target - slice_lo;
  const int chosen = pick_range(
      kWarps, [&](int w) { return s_warp_total[w]; }, in_slice, seg_lo);
  if (warp == chosen) {
    const float rem = in_slice - seg_lo;  // within the segment
    // The step that holds it, from the first pass's step totals (the same sums in the same order); then that
    // step alone is loaded again. (Walking the segment again was a chain of dependent loads, one per step:
    // ~32 L2 round trips for a 128k row on one CTA.) Rounding that leaves rem at the segment's total takes
    // the last kept entry of the last nonempty step.
    const int steps = static_cast<int>((wend - wbegin + kWarp - 1) / kWarp);
    float cum = 0.0f, last_cum = 0.0f;
    int step = -1, last_nonempty = -1;
    for (int t = 0; t < steps; ++t) {
      float tt;
      if (t < kMaxSteps) {
        tt = s_step_total[warp][t];
      } else {  // past what shared memory holds (a vocabulary over 256k on one CTA): the sums again
        WalkStep st;
        load_walk_step(st, row, wbegin + static_cast<int64_t>(t) * kWarp + lane, wend, vocab, vec, inv_t,
                       theta, zmax);
        tt = st.total;
      }
      if (tt > 0.0f) {
        if (cum + tt > rem) {
          step = t;
          break;
        }
        last_nonempty = t;
        last_cum = cum;
      }
      cum += tt;
    }
    const bool crossed = step >= 0;
    if (!crossed) {
      step = last_nonempty;
      cum = last_cum;
    }
    int pick = -1;
    if (step >= 0) {
      WalkStep st;
      const int64_t u = wbegin + static_cast<int64_t>(step) * kWarp + lane;
      const int mine = load_walk_step(st, row, u, wend, vocab, vec, inv_t, theta, zmax);
      // cum + total > rem puts the crossing in a lane with weight (a lane without adds 0 exactly); without a
      // crossing (rounding), the step's last kept entry.
      if (crossed) pick = step_crossing(st, mine, u, cum, rem, theta, zmax);
      if (pick < 0) pick = step_last_kept(mine);
    }
    if (lane == 0) s_pick = pick;
  }
  __syncthreads();
  if (threadIdx.x == 0) ids[r] = s_pick >= 0 ? s_pick : (best_idx == INT_MAX ? 0 : best_idx);
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

namespace {
// rows x kClusterSplit CTAs in clusters of kClusterSplit, with PDL as launch_pdl gives it.
template <class... Params, class... Args>
cudaError_t launch_clusters(void (*kernel)(Params...), int64_t rows, cudaStream_t stream, Args... args) {
  return launch_pdl_clusters(kernel, dim3(static_cast<unsigned>(rows * kClusterSplit)), dim3(kClusterSplit),
                             dim3(kThreads), 0, stream, args...);
}
}  // namespace

cudaError_t launch_argmax(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, cudaStream_t stream,
                          int64_t cluster_rows_max) {
  if (rows == 0) return cudaSuccess;
  if (rows > cluster_rows_max)
    return launch_pdl(argmax_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, logits,
                      vocab, ids);
  return launch_clusters(argmax_cluster_kernel, rows, stream, logits, vocab, ids);
}

cudaError_t launch_sample(const float* logits, int64_t rows, int64_t vocab, const SampleParams* params,
                          int32_t* ids, cudaStream_t stream, int64_t cluster_rows_max) {
  if (rows == 0) return cudaSuccess;
  if (rows > cluster_rows_max)
    return launch_pdl(sample_kernel<1>, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, logits,
                      vocab, params, ids);
  return launch_clusters(sample_kernel<kClusterSplit>, rows, stream, logits, vocab, params, ids);
}

}  // namespace inferx::cuda
