#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace inferx::server {

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);  // shortest round-trip representation
}

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

MetricFamily::MetricFamily(std::string name, std::string help, Kind kind,
                           std::vector<std::string> label_names, std::vector<double> buckets)
    : name_(std::move(name)),
      help_(std::move(help)),
      kind_(kind),
      label_names_(std::move(label_names)),
      bounds_(std::move(buckets)) {
  INFERX_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()), "metric {}: histogram buckets must be sorted",
               name_);
}

MetricFamily::Series& MetricFamily::series(const std::vector<std::string>& label_values) {
  INFERX_CHECK(label_values.size() == label_names_.size(), "metric {}: {} label values for {} labels", name_,
               label_values.size(), label_names_.size());
  auto [it, inserted] = series_.try_emplace(label_values);
  if (inserted && kind_ == Kind::Histogram) it->second.buckets.assign(bounds_.size() + 1, 0);
  return it->second;
}

void MetricFamily::inc(const std::vector<std::string>& label_values, double v) {
  INFERX_CHECK(kind_ != Kind::Histogram, "metric {}: inc() on a histogram", name_);
  INFERX_CHECK(kind_ != Kind::Counter || v >= 0, "metric {}: a counter cannot decrease", name_);
  std::lock_guard lock(mu_);
  series(label_values).value += v;
}

void MetricFamily::set(const std::vector<std::string>& label_values, double v) {
  INFERX_CHECK(kind_ != Kind::Histogram, "metric {}: set() on a histogram", name_);
  std::lock_guard lock(mu_);
  auto& s = series(label_values);
  // A mirrored counter never goes backwards, even if its source was reset (Prometheus would read a
  // decrease as a counter reset and double-count).
  s.value = kind_ == Kind::Counter ? std::max(s.value, v) : v;
}

void MetricFamily::observe(const std::vector<std::string>& label_values, double v) {
  INFERX_CHECK(kind_ == Kind::Histogram, "metric {}: observe() on a {}", name_,
               kind_ == Kind::Counter ? "counter" : "gauge");
  std::lock_guard lock(mu_);
  auto& s = series(label_values);
  const size_t b = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  s.buckets[b] += 1;  // le is inclusive: v == bound falls into that bucket
  s.count += 1;
  s.value += v;
}

double MetricFamily::value(const std::vector<std::string>& label_values) const {
  std::lock_guard lock(mu_);
  auto it = series_.find(label_values);
  if (it == series_.end()) return 0;
  return kind_ == Kind::Histogram ? static_cast<double>(it->second.count) : it->second.value;
}

double MetricFamily::sum(const std::vector<std::string>& label_values) const {
  std::lock_guard lock(mu_);
  auto it = series_.find(label_values);
  return it == series_.end() ? 0 : it->second.value;
}

namespace {
std::string label_text(const std::vector<std::string>& names, const std::vector<std::string>& values,
                       const std::string& extra_name = {}, const std::string& extra_value = {}) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += fmt::format("{}{}=\"{}\"", s.empty() ? "" : ",", names[i], escape_label_value(values[i]));
  if (!extra_name.empty()) s += fmt::format("{}{}=\"{}\"", s.empty() ? "" : ",", extra_name, extra_value);
  return s.empty() ? s : "{" + s + "}";
}
}  // namespace

void MetricFamily::render(std::string& out) const {
  static const char* kind_names[] = {"counter", "gauge", "histogram"};
  out +=
      fmt::format("# HELP {} {}\n# TYPE {} {}\n", name_, help_, name_, kind_names[static_cast<int>(kind_)]);
  std::lock_guard lock(mu_);
  // A family without labels always exposes its one series, so that dashboards see a 0 rather than
  // nothing before the first event.
  if (series_.empty() && label_names_.empty()) {
    if (kind_ == Kind::Histogram) {
      for (double b : bounds_)
        out += fmt::format("{}_bucket{{le=\"{}\"}} 0\n", name_, format_metric_value(b));
      out += fmt::format("{0}_bucket{{le=\"+Inf\"}} 0\n{0}_sum 0\n{0}_count 0\n", name_);
    } else {
      out += fmt::format("{} 0\n", name_);
    }
  }
  for (const auto& [values, s] : series_) {
    if (kind_ != Kind::Histogram) {
      out += fmt::format("{}{} {}\n", name_, label_text(label_names_, values), format_metric_value(s.value));
      continue;
    }
    uint64_t cumulative = 0;
    for (size_t b = 0; b <= bounds_.size(); ++b) {
      cumulative += s.buckets[b];
      const std::string le = b < bounds_.size() ? format_metric_value(bounds_[b]) : "+Inf";
      out += fmt::format("{}_bucket{} {}\n", name_, label_text(label_names_, values, "le", le), cumulative);
    }
    out +=
        fmt::format("{}_sum{} {}\n", name_, label_text(label_names_, values), format_metric_value(s.value));
    out += fmt::format("{}_count{} {}\n", name_, label_text(label_names_, values), s.count);
  }
}

MetricFamily& MetricsRegistry::add(std::unique_ptr<MetricFamily> f) {
  std::lock_guard lock(mu_);
  for (auto& existing : families_)
    INFERX_CHECK(existing->name() != f->name(), "metric {} registered twice", f->name());
  families_.push_back(std::move(f));
  return *families_.back();
}

MetricFamily& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                       std::vector<std::string> label_names) {
  return add(std::make_unique<MetricFamily>(name, help, MetricFamily::Kind::Counter, std::move(label_names),
                                            std::vector<double>{}));
}

MetricFamily& MetricsRegistry::gauge(const std::string& name, const std::string& help,
                                     std::vector<std::string> label_names) {
  return add(std::make_unique<MetricFamily>(name, help, MetricFamily::Kind::Gauge, std::move(label_names),
                                            std::vector<double>{}));
}

MetricFamily& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                         std::vector<double> buckets, std::vector<std::string> label_names) {
  return add(std::make_unique<MetricFamily>(name, help, MetricFamily::Kind::Histogram, std::move(label_names),
                                            std::move(buckets)));
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& f : families_) f->render(out);
  return out;
}

}  // namespace inferx::server
