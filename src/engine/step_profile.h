// StepProfile: where the engine thread's time goes per step (INFERX_STEP_PROFILE=1), so that a served or
// offline run shows whether steps are bound by the device (time spent waiting in sampling) or by host work
// (scheduling, batch building, token handling, output emission). Printed to stderr when the engine stops.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace inferx {

class StepProfile {
 public:
  // Phases of Engine::Impl::step in order. kSample includes the wait for the device to finish the step.
  enum Phase {
    kIntake,
    kSchedule,
    kLaunch,
    kEmitOverlapped,
    kSample,
    kHandle,
    kEmitTail,
    kPublish,
    kNumPhases
  };
  // Step kinds: decode steps replayed from a graph, every other step (prefill chunks, mixed, eager).
  enum Kind { kGraphDecode, kOther, kNumKinds };

  explicit StepProfile(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  void begin_step() {
    if (!enabled_) return;
    last_ = Clock::now();
    step_start_ = last_;
  }
  // Charges the time since the previous mark to `p` of the current step.
  void mark(Phase p) {
    if (!enabled_) return;
    const auto t = Clock::now();
    current_[p] += std::chrono::duration<double>(t - last_).count();
    last_ = t;
  }
  void end_step(Kind k, int64_t rows) {
    if (!enabled_) return;
    Totals& tot = totals_[k];
    for (int i = 0; i < kNumPhases; ++i) tot.phase_s[i] += current_[i];
    tot.wall_s += std::chrono::duration<double>(Clock::now() - step_start_).count();
    tot.steps += 1;
    tot.rows += rows;
    current_.fill(0.0);
  }
  // Drops a step that did not run (nothing scheduled).
  void cancel_step() { current_.fill(0.0); }

  std::string report() const {
    static const char* names[kNumPhases] = {"intake",      "schedule", "launch",     "emit(overlap)",
                                            "sample+wait", "handle",   "emit(tail)", "publish"};
    static const char* kinds[kNumKinds] = {"graph decode", "other"};
    std::string s = "inferx step profile (host ms per step; sample+wait includes the device):\n";
    char line[256];
    for (int k = 0; k < kNumKinds; ++k) {
      const Totals& t = totals_[k];
      if (t.steps == 0) continue;
      const double n = static_cast<double>(t.steps);
      std::snprintf(line, sizeof line, "  %-12s steps %lld, rows/step %.1f, wall %.3f ms:", kinds[k],
                    static_cast<long long>(t.steps), static_cast<double>(t.rows) / n, 1e3 * t.wall_s / n);
      s += line;
      for (int i = 0; i < kNumPhases; ++i) {
        std::snprintf(line, sizeof line, " %s %.3f", names[i], 1e3 * t.phase_s[i] / n);
        s += line;
      }
      s += "\n";
    }
    return s;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Totals {
    std::array<double, kNumPhases> phase_s{};
    double wall_s = 0;
    int64_t steps = 0, rows = 0;
  };
  bool enabled_;
  Clock::time_point last_{}, step_start_{};
  std::array<double, kNumPhases> current_{};
  std::array<Totals, kNumKinds> totals_{};
};

}  // namespace inferx
