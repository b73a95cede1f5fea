// Bandwidth probe and roofline figures for `inferx bench offline --roofline` (bench_roofline.h).
#include "cli/bench_roofline.h"

#include <algorithm>
#include <chrono>

#include "backend/backend.h"
#include "core/bandwidth.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace inferx::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Roofline measure_roofline(Backend& backend, const Model& model, int threads) {
  Roofline r;
  r.weight_bytes = model.weight_bytes_per_token();
  if (const TensorParallel* tp = model.tensor_parallel(); tp && backend.device() != Device::CPU) {
    r.devices = tp->size();
    r.weight_bytes = 0;
    for (int rank = 0; rank < tp->size(); ++rank)
      r.weight_bytes = std::max(r.weight_bytes, tp->rank_model(rank).weight_bytes_per_token());
  }
  if (backend.device() == Device::CPU) {
    ThreadPool pool(threads);
    r.bandwidth_gbs = measure_read_bandwidth_gbs(pool);
    r.probe = fmt::format("host streaming read, 512 MB, {} threads", pool.size());
    return r;
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (!backend.memory_info(free_bytes, total_bytes)) {
    r.probe = "not measured: the backend reports no free memory";
    return r;
  }
  // Two buffers of up to 2 GiB each (a quarter of what is free at most: the KV cache already took its
  // share), whole 64 MiB units.
  const size_t unit = size_t{64} << 20;
  const size_t bytes = std::min(size_t{2} << 30, free_bytes / 4) / unit * unit;
  if (bytes == 0) {
    r.probe = fmt::format("not measured: {} MiB free", free_bytes >> 20);
    return r;
  }
  auto a = backend.allocate(bytes), b = backend.allocate(bytes);
  backend.copy_on_device(b->data(), a->data(), bytes);  // warm-up
  backend.synchronize();
  double best = 0;
  for (int pass = 0; pass < 10; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    backend.copy_on_device(pass % 2 ? a->data() : b->data(), pass % 2 ? b->data() : a->data(), bytes);
    backend.synchronize();
    const double s = seconds_since(t0);
    if (s > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
  }
  r.bandwidth_gbs = best;
  r.probe = fmt::format("device copy of {} MiB buffers, read + write, best of 10", bytes >> 20);
  return r;
}

void add_roofline(BenchSummary& summary, const Roofline& r) {
  nlohmann::json j = {{"probe", r.probe}, {"weight_bytes_per_token", r.weight_bytes}, {"devices", r.devices}};
  if (r.bandwidth_gbs > 0 && r.weight_bytes > 0) {
    const double stream_ms = static_cast<double>(r.weight_bytes) / (r.bandwidth_gbs * 1e9) * 1e3;
    j["bandwidth_gbs"] = r.bandwidth_gbs;
    j["batch1_roofline_tok_s"] = 1e3 / stream_ms;
    j["weight_stream_ms"] = stream_ms;
    std::string ratio;
    const nlohmann::json& tpot = summary.json.value("tpot_ms", nlohmann::json::object());
    if (tpot.contains("p50") && tpot["p50"].get<double>() > 0) {
      const double f = stream_ms / tpot["p50"].get<double>();
      j["tpot_p50_roofline_ratio"] = f;
      ratio = fmt::format("; TPOT p50 at {:.1f}% of it", 100 * f);
    }
    const std::string per = r.devices > 1 ? fmt::format(" on each of {} GPUs", r.devices) : "";
    summary.text += fmt::format(
        "roofline: {:.3f} GB per token{} / {:.0f} GB/s ({}) = {:.1f} tok/s at batch 1{}\n",
        static_cast<double>(r.weight_bytes) / 1e9, per, r.bandwidth_gbs, r.probe, 1e3 / stream_ms, ratio);
  } else {
    summary.text += fmt::format("roofline: {}\n", r.probe);
  }
  summary.json["roofline"] = j;
}

}  // namespace inferx::cli
