// INFERX_DECODE_ATTN_STAMPS' setup and report (decode_attention_stamps.h; kernels.h declares both).
#include "backend/cuda/decode_attention_stamps.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cuda/kernels.h"

namespace inferx::cuda {

namespace {
StampSink g_stamp_sink{};  // the device's sink as set up (host copy)

uint64_t median(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}
}  // namespace

void setup_decode_attention_stamps() {
  const char* on = std::getenv("INFERX_DECODE_ATTN_STAMPS");
  if (on == nullptr || std::strcmp(on, "1") != 0 || g_stamp_sink.records != nullptr) return;
  StampSink sink{nullptr, nullptr, 1u << 19};
  if (cudaMalloc(&sink.records, sizeof(StampRecord) * sink.capacity) != cudaSuccess ||
      cudaMalloc(&sink.count, sizeof(unsigned)) != cudaSuccess ||
      cudaMemset(sink.count, 0, sizeof(unsigned)) != cudaSuccess ||
      cudaMemset(sink.records, 0, sizeof(StampRecord) * sink.capacity) != cudaSuccess ||
      set_decode_attention_stamp_sink(sink) != cudaSuccess) {
    std::fprintf(stderr, "inferx cuda: INFERX_DECODE_ATTN_STAMPS: setup failed (%s); no stamps\n",
                 cudaGetErrorString(cudaGetLastError()));
    return;
  }
  g_stamp_sink = sink;
}

// Launches are told apart by their CTAs' start times (a gap of more than 20 us between sorted starts). Per
// launch, relative to the first CTA's release from the PDL wait (w): how early the CTAs started, how far the
// releases spread, when the last CTA finished its tiles / its warps' merge / its partial and ticket or the
// merge (the launch's end); per CTA, from its cycle counter: tiles after the wait, the warps' merge, and the
// finish (the merging CTA's separately). Medians over the launches after the first tenth (warm-up).
void report_decode_attention_stamps() {
  StampSink sink = g_stamp_sink;
  if (sink.records == nullptr) return;
  g_stamp_sink = StampSink{};
  unsigned count = 0;
  std::vector<StampRecord> rec;
  if (cudaMemcpy(&count, sink.count, sizeof(count), cudaMemcpyDeviceToHost) == cudaSuccess) {
    rec.resize(std::min(count, sink.capacity));
    if (cudaMemcpy(rec.data(), sink.records, sizeof(StampRecord) * rec.size(), cudaMemcpyDeviceToHost) !=
        cudaSuccess)
      rec.clear();
  }
  const StampSink off{};
  (void)set_decode_attention_stamp_sink(off);
  (void)cudaFree(sink.records);
  (void)cudaFree(sink.count);
  // A record missing its last stamp (a launch cut short) is left out.
  rec.erase(std::remove_if(rec.begin(), rec.end(), [](const StampRecord& r) { return r.ns[4] == 0; }),
            rec.end());
  std::sort(rec.begin(), rec.end(),
            [](const StampRecord& a, const StampRecord& b) { return a.ns[0] < b.ns[0]; });
  std::vector<std::pair<size_t, size_t>> launches;  // [begin, end) into rec
  for (size_t i = 0; i < rec.size(); ++i) {
    if (i == 0 || rec[i].ns[0] - rec[i - 1].ns[0] > 20000) launches.emplace_back(i, i);
    launches.back().second = i + 1;
  }
  std::vector<uint64_t> lead, spread, tiles, merged, end, c_tiles, c_merge, c_finish, c_last, per_cta;
  std::vector<double> ns_per_cycle;
  for (size_t l = launches.size() / 10; l < launches.size(); ++l) {
    const auto [b, e] = launches[l];
    if (e - b < 2) continue;
    uint64_t w = UINT64_MAX, t0 = UINT64_MAX, t1 = 0, t2 = 0, t3 = 0, t4 = 0;
    size_t last = b;
    for (size_t i = b; i < e; ++i) {
      const StampRecord& r = rec[i];
      w = std::min(w, r.ns[1]), t0 = std::min(t0, r.ns[0]), t1 = std::max(t1, r.ns[1]);
      t2 = std::max(t2, r.ns[2]), t3 = std::max(t3, r.ns[3]);
      if (r.ns[4] > t4) t4 = r.ns[4], last = i;
      c_tiles.push_back(r.cycles[2] - r.cycles[1]);
      c_merge.push_back(r.cycles[3] - r.cycles[2]);
      c_finish.push_back(r.cycles[4] - r.cycles[3]);
      if (r.cycles[4] > r.cycles[0])
        ns_per_cycle.push_back(static_cast<double>(r.ns[4] - r.ns[0]) /
                               static_cast<double>(r.cycles[4] - r.cycles[0]));
    }
    lead.push_back(w - t0), spread.push_back(t1 - w), tiles.push_back(t2 - w), merged.push_back(t3 - w);
    end.push_back(t4 - w), per_cta.push_back(e - b);
    c_last.push_back(rec[last].cycles[4] - rec[last].cycles[3]);
  }
  if (end.empty()) {
    std::fprintf(stderr, "inferx cuda: decode attention stamps: no launches recorded\n");
    return;
  }
  std::sort(ns_per_cycle.begin(), ns_per_cycle.end());
  const double npc = ns_per_cycle[ns_per_cycle.size() / 2];
  const auto us = [](uint64_t ns) { return static_cast<double>(ns) / 1000.0; };
  const auto cyc = [&](const std::vector<uint64_t>& v) {
    return static_cast<double>(median(v)) * npc / 1000.0;
  };
  std::fprintf(
      stderr,
      "inferx cuda: decode attention stamps: %zu launches (%u records%s; %llu host launches took the cluster "
      "form), median CTAs "
      "with keys %llu; "
      "us after the first release from the PDL wait: first start %.2f before it, last release +%.2f, "
      "last tiles done +%.2f, last warp merge +%.2f, end +%.2f; per CTA (cycles at %.3f ns): tiles "
      "%.2f, warp merge %.2f, finish %.2f, the last-ending CTA's finish %.2f\n",
      end.size(), count, count > sink.capacity ? ", sink full" : "",
      static_cast<unsigned long long>(decode_attention_cluster_launches()),
      static_cast<unsigned long long>(median(per_cta)), us(median(lead)), us(median(spread)),
      us(median(tiles)), us(median(merged)), us(median(end)), npc, cyc(c_tiles), cyc(c_merge), cyc(c_finish),
      cyc(c_last));
}

}  // namespace inferx::cuda
