// One-row sampler: greedy, or temperature -> top-k -> softmax -> top-p -> min-p -> renormalise -> draw.
// The filter order is llama.cpp's default chain and vLLM's (top-k/top-p on the scaled logits, min-p on the
// resulting probabilities). Min-p: Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling". Top-p
// (nucleus): Holtzman et al. 2019, keeping the smallest prefix of the sorted distribution whose mass is
// >= p.
//
// Two paths with the same semantics (up to float rounding, see below):
//  - fast path (no top-k, every logit finite or -inf, no NaN): the softmax weights
//    w = exp((x - max) / T) of the whole row in one vectorised pass (engine/sampling_kernels.h), which
//    also sums the mass above a few fixed weights; the top-p nucleus is then found among the few tokens
//    above the highest of those weights that holds enough mass, by bisection on the weight (sum of the
//    weights >= t is monotone in t), ties at the boundary taken in id order exactly like a sort by
//    (probability desc, id asc). No sort, no per-token branch over the vocabulary. The draw walks the
//    kept tokens in id order comparing u * (kept mass) with the running sum of weights (equal to walking
//    renormalised probabilities).
//  - general path (top-k, or NaN / +inf in the row): the candidates are collected, top-k by a k-heap
//    whose scan skips 16 logits at a time that cannot enter it, then softmax with std::exp, top-p, min-p
//    and a walk in `higher` order, unchanged from the first version (same tokens for the same seed).
// The fast path's exp differs from std::exp by an ulp or two, so a seeded draw can differ from the
// general path's only when u falls within float rounding (~1e-7) of a cumulative boundary.
//
// Non-finite logits: NaN and -inf mean "never this token". If any logit is +inf, the distribution is
// uniform over the +inf tokens (greedy takes the lowest such id). If no token is possible (every logit
// NaN or -inf) sample() and probabilities() throw inferx::Error: there is nothing meaningful to return.
#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "engine/sampling_kernels.h"

namespace inferx {
namespace {

// Order of candidates: higher logit first, lower id on ties (so results never depend on sort stability).
bool higher(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  if (a.first != b.first) return a.first > b.first;
  return a.second < b.second;
}

void check_row(const float* logits, int64_t vocab_size) {
  INFERX_CHECK(logits != nullptr && vocab_size > 0, "Sampler: empty logits row (vocab_size {})", vocab_size);
  INFERX_CHECK(vocab_size <= std::numeric_limits<int32_t>::max(), "Sampler: vocab_size {} is too large",
               vocab_size);
}

int32_t argmax(const float* logits, int64_t vocab_size) {
  const int64_t best = sampling_kernels::argmax(logits, vocab_size);
  INFERX_CHECK(best >= 0, "Sampler: no token can be chosen: all {} logits are NaN or -inf", vocab_size);
  return static_cast<int32_t>(best);
}

// The last token (in `higher` order) of the top-p nucleus: the smallest prefix of the probabilities
// sorted by `higher` whose mass reaches p (at least one token). Quickselect on mass: expected O(n), and
// exact because `higher` is a strict total order (ties broken by id), so the set equals the one a full
// sort gives.
std::pair<float, int32_t> nucleus_boundary(const std::vector<std::pair<float, int32_t>>& c, double p) {
  thread_local std::vector<std::pair<float, int32_t>> work;
  work.assign(c.begin(), c.end());
  size_t lo = 0, hi = work.size();  // the boundary lies in [lo, hi); everything before lo is kept
  double need = p;                  // mass still needed from work[lo..)
  while (hi - lo > 32) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(work.begin() + static_cast<std::ptrdiff_t>(lo),
                     work.begin() + static_cast<std::ptrdiff_t>(mid),
                     work.begin() + static_cast<std::ptrdiff_t>(hi), higher);
    double mass = 0.0;
    for (size_t i = lo; i < mid; ++i) mass += work[i].first;
    if (mass >= need) {
      hi = mid;  // the top (mid - lo) of the range already reach p
    } else {
      need -= mass;
      lo = mid;
    }
  }
  std::sort(work.begin() + static_cast<std::ptrdiff_t>(lo), work.begin() + static_cast<std::ptrdiff_t>(hi),
            higher);
  double cumulative = 0.0;
  for (size_t i = lo; i < hi; ++i) {
    cumulative += work[i].first;
    if (cumulative >= need) return work[i];
  }
  return work[hi - 1];  // rounding: the whole range is needed
}

// Fills `c` with the surviving candidates as (probability, id), probabilities summing to 1. The order of
// `c` is the order in which the draw walks the cumulative sum; it depends on no library's sort or
// partition algorithm: `higher` order when top-k applied (a full sort of the k by a strict total order),
// else id order.
void build_distribution(const SamplingParams& params, const float* logits, int64_t vocab_size,
                        bool any_pos_inf, std::vector<std::pair<float, int32_t>>& c) {
  c.clear();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const auto top_k = static_cast<size_t>(std::max<int32_t>(params.top_k, 0));
  bool sorted = false;
  if (top_k > 0 && !any_pos_inf) {
    // Top-k in one pass with a k-sized heap whose front is the weakest kept candidate: O(V log k). Once
    // the heap is full, only a logit strictly above the front can enter (a later equal one has a higher
    // id), so the scan jumps to the next such logit, 16 comparisons at a time.
    for (int64_t i = 0; i < vocab_size; ++i) {
      if (c.size() == top_k) {
        i += sampling_kernels::first_greater(logits + i, vocab_size - i, c.front().first);
        if (i >= vocab_size) break;
      }
      if (!std::isfinite(logits[i])) continue;
      const std::pair<float, int32_t> e(logits[i], static_cast<int32_t>(i));
      if (c.size() < top_k) {
        c.push_back(e);
        std::push_heap(c.begin(), c.end(), higher);
      } else if (higher(e, c.front())) {
        std::pop_heap(c.begin(), c.end(), higher);
        c.back() = e;
        std::push_heap(c.begin(), c.end(), higher);
      }
    }
    std::sort(c.begin(), c.end(), higher);
    sorted = true;
  } else {
    for (int64_t i = 0; i < vocab_size; ++i) {
      if (any_pos_inf ? logits[i] == kInf : std::isfinite(logits[i])) {
        // +inf tokens all get the same value: the distribution is uniform over them.
        c.emplace_back(any_pos_inf ? 0.0f : logits[i], static_cast<int32_t>(i));
      }
    }
    if (top_k > 0 && top_k < c.size()) {
      c.resize(top_k);  // equal values and ascending ids: the first k are the top k
    }
  }
  INFERX_CHECK(!c.empty(), "Sampler: no token can be chosen: all {} logits are NaN or -inf", vocab_size);

  // Softmax of logits / temperature as exp((x - max) / T), summed in double: dividing the difference
  // (never the logit) keeps a tiny temperature from overflowing to inf - inf.
  float max_value = c.front().first;
  for (const auto& e : c) max_value = std::max(max_value, e.first);
  const float inv_temperature = 1.0f / params.temperature;
  double sum = 0.0;
  for (auto& e : c) {
    const float w = std::exp((e.first - max_value) * inv_temperature);
    e.first = w;
    sum += w;
  }
  for (auto& e : c) e.first = static_cast<float>(e.first / sum);

  if (params.top_p < 1.0f && c.size() > 1) {
    if (sorted) {
      double cumulative = 0.0;
      size_t keep = 0;
      while (keep < c.size()) {
        cumulative += c[keep].first;
        ++keep;
        if (cumulative >= params.top_p) break;
      }
      c.resize(keep);
    } else {
      // Expected O(V) without sorting the vocabulary: find the last token of the nucleus, then keep
      // everything ranked at or above it, leaving `c` in id order.
      const std::pair<float, int32_t> last = nucleus_boundary(c, params.top_p);
      std::erase_if(c, [&](const std::pair<float, int32_t>& e) { return higher(last, e); });
    }
  }

  if (params.min_p > 0.0f && c.size() > 1) {
    float p_max = 0.0f;
    for (const auto& e : c) p_max = std::max(p_max, e.first);
    const float threshold = params.min_p * p_max;
    std::erase_if(c, [&](const std::pair<float, int32_t>& e) { return e.first < threshold; });
  }

  double total = 0.0;
  for (const auto& e : c) total += e.first;
  for (auto& e : c) e.first = static_cast<float>(e.first / total);
}

// Fast path ------------------------------------------------------------------------------------------

// Per-thread buffers (rows of one step may be sampled on several threads; a Sampler per sequence would
// hold a vocabulary-sized buffer per running sequence).
struct FastScratch {
  std::vector<float> w;        // softmax weights of the row
  std::vector<double> blocks;  // their sums per kBlock
  std::vector<int32_t> ids;    // kept candidates, id order
  std::vector<float> ws;       // and their weights
  std::vector<float> work;     // the nucleus search's working set
};
FastScratch& fast_scratch() {
  thread_local FastScratch s;
  return s;
}

// The kept tokens: every token of positive weight (`dense`: weights in s.w, block sums in s.blocks), or
// s.ids/s.ws[0, count). `total` is their weight sum, the draw's normaliser.
struct Kept {
  bool dense = false;
  int64_t count = 0;
  double total = 0.0;
};

bool fast_path_applies(const SamplingParams& params, const sampling_kernels::RowScan& scan) {
  const float inv_t = 1.0f / params.temperature;
  return params.top_k <= 0 && !scan.has_nan && std::isfinite(scan.max) && std::isfinite(inv_t);
}

// The nucleus is searched among the tokens of weight >= kCandidateWeight (w = 1 is the maximum), gathered
// during the weights pass, when they hold top_p of the mass; otherwise (very flat distributions) among
// every token of positive weight.
constexpr float kCandidateWeight = 0x1p-15f;

// Top-p among s.ids/s.ws[0, n) (all tokens of weight >= some bound, holding at least `need`): keeps, in
// id order, the smallest set ranked by (weight desc, id asc) whose mass reaches `need`. Returns its size.
int64_t nucleus(FastScratch& s, int64_t n, double need) {
  // The boundary weight b is the largest weight with mass(w >= b) >= need. Quickselect on mass over a
  // working copy of the weights: a pivot v splits it; if the weights above v already hold enough, the
  // boundary is above v; else if those >= v do, it is v; else it is below v, and the mass at or above
  // v is carried in `above` (so the working set only ever holds weights that are still undecided, and
  // each step removes v's copies at least: expected O(n) with a median-of-3 pivot).
  s.work.assign(s.ws.begin(), s.ws.begin() + n);
  s.work.resize(static_cast<size_t>(n) + 16);
  float* work = s.work.data();
  int64_t m = n;
  double above = 0.0;     // mass of the weights above the working set = mass(w > b) at the end
  float boundary = 0.0f;  // 0 keeps every candidate (rounding left them all short of need)
  int64_t ties = 0;       // how many candidates weigh exactly `boundary`
  while (m > 32) {
    float a = work[0], b = work[m / 2], c = work[m - 1];
    if (a > b) std::swap(a, b);
    const float v = std::max(a, std::min(b, c));  // median of three
    int64_t equal = 0;
    const double mass_above = above + sampling_kernels::sum_above(work, m, v, &equal);
    if (mass_above >= need) {
      m = sampling_kernels::keep_at_least(work, m, std::nextafter(v, std::numeric_limits<float>::infinity()));
      continue;
    }
    const double mass_at = mass_above + static_cast<double>(equal) * v;
    if (mass_at >= need) {
      boundary = v;
      above = mass_above;
      ties = equal;
      m = 0;
      break;
    }
    above = mass_at;
    m = sampling_kernels::keep_below(work, m, v);
  }
  if (m > 0) {
    // Few left: descending order, equal weights taken together.
    std::sort(work, work + m, std::greater<float>());
    for (int64_t i = 0; i < m;) {
      double group = 0.0;
      int64_t j = i;
      for (; j < m && work[j] == work[i]; ++j) group += work[j];
      if (above + group >= need) {
        boundary = work[i];
        ties = j - i;
        break;
      }
      above += group;
      i = j;
    }
  }
  // Everything above the boundary weight, then boundary-weight tokens in id order (the `higher` order
  // among equals) until the mass reaches need, at least one. Ties at the boundary are rare: the walk
  // over the kept tokens only runs when there are several.
  int64_t kept = sampling_kernels::keep_pairs_at_least(s.ids.data(), s.ws.data(), n, boundary);
  if (ties > 1) {
    int64_t out = 0;
    ties = 0;
    double tie_mass = 0.0;
    for (int64_t i = 0; i < kept; ++i) {
      const float w = s.ws[static_cast<size_t>(i)];
      if (w == boundary) {
        if (ties > 0 && above + tie_mass >= need) continue;
        ++ties;
        tie_mass += w;
      }
      s.ids[static_cast<size_t>(out)] = s.ids[static_cast<size_t>(i)];
      s.ws[static_cast<size_t>(out++)] = w;
    }
    kept = out;
  }
  return kept;
}

Kept fast_distribution(const SamplingParams& params, const float* logits, int64_t vocab_size, float max,
                       FastScratch& s) {
  const auto n = static_cast<size_t>(vocab_size);
  s.w.resize(n);
  s.blocks.resize((n + sampling_kernels::kBlock - 1) / sampling_kernels::kBlock);
  // Min-p keeps w >= min_p * w_max, and w_max = exp(0) = 1 (the maximum is always kept by top-p, so
  // applying min-p after top-p is the same as intersecting with this set).
  const float min_w = std::min(params.min_p, 1.0f);
  const bool top_p = params.top_p < 1.0f;
  Kept k;
  if (!top_p && !(min_w > 0.0f)) {
    k.dense = true;
    k.total = sampling_kernels::softmax_weights(logits, vocab_size, max, 1.0f / params.temperature,
                                                s.w.data(), s.blocks.data());
    return k;
  }
  s.ids.resize(n + 16);
  s.ws.resize(n + 16);
  int64_t count = 0;
  // Without top-p, min-p alone: the kept set is gathered directly.
  const float gather_w = top_p ? kCandidateWeight : min_w;
  const double total =
      sampling_kernels::softmax_weights(logits, vocab_size, max, 1.0f / params.temperature, s.w.data(),
                                        s.blocks.data(), gather_w, s.ids.data(), s.ws.data(), &count);
  if (top_p) {
    const double need = static_cast<double>(params.top_p) * total;
    float lo_w = kCandidateWeight;
    double mass = sampling_kernels::sum_at_least(s.ws.data(), count, lo_w);
    if (mass < need) {
      lo_w = 0.0f;
      count = sampling_kernels::gather_at_least(s.w.data(), vocab_size, lo_w, s.ids.data(), s.ws.data());
      mass = sampling_kernels::sum_at_least(s.ws.data(), count, lo_w);
    }
    // (Rounding can leave every positive weight short of need: then they are all kept.)
    if (mass >= need) count = nucleus(s, count, need);
    if (min_w > 0.0f) count = sampling_kernels::keep_pairs_at_least(s.ids.data(), s.ws.data(), count, min_w);
  }
  k.count = count;
  k.total = sampling_kernels::sum_at_least(s.ws.data(), count, 0.0f);
  return k;
}

int32_t fast_draw(const Kept& k, const FastScratch& s, int64_t vocab_size, double u) {
  const double target = u * k.total;
  double cumulative = 0.0;
  if (!k.dense) {
    for (int64_t i = 0; i < k.count; ++i) {
      cumulative += s.ws[static_cast<size_t>(i)];
      if (target < cumulative) return s.ids[static_cast<size_t>(i)];
    }
    return s.ids[static_cast<size_t>(k.count - 1)];  // rounding left the target at the very end
  }
  // Skip whole blocks by their sums, then walk the block holding the target.
  int64_t last = -1;
  for (size_t b = 0; b < s.blocks.size(); ++b) {
    const int64_t begin = static_cast<int64_t>(b) * sampling_kernels::kBlock;
    if (!(target < cumulative + s.blocks[b]) && b + 1 < s.blocks.size()) {
      cumulative += s.blocks[b];
      continue;
    }
    const int64_t end = std::min(vocab_size, begin + sampling_kernels::kBlock);
    for (int64_t i = begin; i < end; ++i) {
      const float w = s.w[static_cast<size_t>(i)];
      if (w <= 0.0f) continue;
      cumulative += w;
      last = i;
      if (target < cumulative) return static_cast<int32_t>(i);
    }
  }
  if (last < 0) {  // the target's block had no positive weight left after it: the last positive token
    for (int64_t i = vocab_size - 1; i >= 0 && last < 0; --i) {
      if (s.w[static_cast<size_t>(i)] > 0.0f) last = i;
    }
  }
  return static_cast<int32_t>(last);
}

// Uniform double in [0, 1) from the top 53 bits of one 64-bit output: identical on every standard library
// (std::uniform_real_distribution's algorithm is implementation-defined).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::sample(const float* logits, int64_t vocab_size) {
  check_row(logits, vocab_size);
  if (!(params_.temperature > 0.0f)) return argmax(logits, vocab_size);
  const sampling_kernels::RowScan scan = sampling_kernels::scan_row(logits, vocab_size);
  if (fast_path_applies(params_, scan)) {
    FastScratch& s = fast_scratch();
    const Kept k = fast_distribution(params_, logits, vocab_size, scan.max, s);
    return fast_draw(k, s, vocab_size, uniform01(rng_));
  }
  build_distribution(params_, logits, vocab_size, scan.max == std::numeric_limits<float>::infinity(),
                     scratch_);
  const double u = uniform01(rng_);
  double cumulative = 0.0;
  for (const auto& e : scratch_) {
    cumulative += e.first;
    if (u < cumulative) return e.second;
  }
  return scratch_.back().second;  // rounding left u just above the last cumulative sum
}

std::vector<float> Sampler::probabilities(const float* logits, int64_t vocab_size) const {
  check_row(logits, vocab_size);
  std::vector<float> p(static_cast<size_t>(vocab_size), 0.0f);
  if (!(params_.temperature > 0.0f)) {
    p[argmax(logits, vocab_size)] = 1.0f;
    return p;
  }
  const sampling_kernels::RowScan scan = sampling_kernels::scan_row(logits, vocab_size);
  if (fast_path_applies(params_, scan)) {
    FastScratch& s = fast_scratch();
    const Kept k = fast_distribution(params_, logits, vocab_size, scan.max, s);
    if (k.dense) {
      for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(s.w[i] / k.total);
    } else {
      for (int64_t i = 0; i < k.count; ++i) {
        p[static_cast<size_t>(s.ids[static_cast<size_t>(i)])] =
            static_cast<float>(s.ws[static_cast<size_t>(i)] / k.total);
      }
    }
    return p;
  }
  std::vector<std::pair<float, int32_t>> c;
  build_distribution(params_, logits, vocab_size, scan.max == std::numeric_limits<float>::infinity(), c);
  for (const auto& e : c) p[e.second] = e.first;
  return p;
}

}  // namespace inferx
