#pragma once
// A small Prometheus registry: counters, gauges and histograms with labels, rendered in the text
// exposition format (https://prometheus.io/docs/instrumenting/exposition_formats/, version 0.0.4).
// Updates are thread-safe and cheap (one short mutex per family), so the engine thread may record
// from its output callbacks.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace inferx::server {

using Labels = std::vector<std::pair<std::string, std::string>>;  // (name, value), in order

class MetricFamily {
 public:
  enum class Kind : uint8_t { Counter, Gauge, Histogram };
  MetricFamily(std::string name, std::string help, Kind kind, std::vector<std::string> label_names,
               std::vector<double> buckets);

  // Counter: adds v (>= 0). Gauge: adds v (any sign).
  void inc(const std::vector<std::string>& label_values, double v = 1.0);
  // Gauge: sets the value. Counter: sets a total mirrored from elsewhere (must not decrease).
  void set(const std::vector<std::string>& label_values, double v);
  // Histogram: records one observation.
  void observe(const std::vector<std::string>& label_values, double v);

  // Value of a counter/gauge series, or the count of a histogram series (0 when absent); for tests.
  double value(const std::vector<std::string>& label_values = {}) const;
  double sum(const std::vector<std::string>& label_values = {}) const;  // histogram sum

  const std::string& name() const { return name_; }
  void render(std::string& out) const;

 private:
  struct Series {
    double value = 0;               // counter / gauge; histogram sum
    uint64_t count = 0;             // histogram
    std::vector<uint64_t> buckets;  // histogram: non-cumulative counts per upper bound (+Inf last)
  };
  Series& series(const std::vector<std::string>& label_values);  // mutex held

  std::string name_, help_;
  Kind kind_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, Series> series_;
};

class MetricsRegistry {
 public:
  MetricFamily& counter(const std::string& name, const std::string& help,
                        std::vector<std::string> label_names = {});
  MetricFamily& gauge(const std::string& name, const std::string& help,
                      std::vector<std::string> label_names = {});
  MetricFamily& histogram(const std::string& name, const std::string& help, std::vector<double> buckets,
                          std::vector<std::string> label_names = {});
  // The whole registry in the text format, families in registration order.
  std::string render() const;

 private:
  MetricFamily& add(std::unique_ptr<MetricFamily> f);
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MetricFamily>> families_;
};

// Formats a sample value the way Prometheus parses it: integers without exponent, +Inf/-Inf/NaN.
std::string format_metric_value(double v);
// Escapes a label value: backslash, double quote and newline (exposition format spec).
std::string escape_label_value(const std::string& v);

}  // namespace inferx::server
