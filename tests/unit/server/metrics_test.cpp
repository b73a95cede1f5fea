#include "server/metrics.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "server/server_metrics.h"

namespace inferx::server {
namespace {

TEST(Metrics, CounterGaugeTextFormat) {
  MetricsRegistry r;
  auto& c = r.counter("x_total", "A counter", {"reason"});
  auto& g = r.gauge("y", "A gauge");
  c.inc({"stop"});
  c.inc({"stop"}, 2);
  c.inc({"a\"b\\c\nd"});
  g.set({}, 0.25);
  EXPECT_EQ(r.render(),
            "# HELP x_total A counter\n# TYPE x_total counter\n"
            "x_total{reason=\"a\\\"b\\\\c\\nd\"} 1\nx_total{reason=\"stop\"} 3\n"
            "# HELP y A gauge\n# TYPE y gauge\ny 0.25\n");
  EXPECT_THROW(c.inc({"stop"}, -1), Error);
  EXPECT_THROW(c.inc({}), Error);  // wrong label count
}

TEST(Metrics, MirroredCounterNeverDecreases) {
  MetricsRegistry r;
  auto& c = r.counter("z_total", "mirrored");
  c.set({}, 10);
  c.set({}, 4);
  EXPECT_EQ(c.value(), 10);
}

TEST(Metrics, HistogramBucketsAreCumulativeAndInclusive) {
  MetricsRegistry r;
  auto& h = r.histogram("lat_seconds", "Latency", {0.1, 1.0}, {"m"});
  for (double v : {0.05, 0.1, 0.5, 2.0}) h.observe({"a"}, v);
  EXPECT_EQ(r.render(),
            "# HELP lat_seconds Latency\n# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{m=\"a\",le=\"0.1\"} 2\n"
            "lat_seconds_bucket{m=\"a\",le=\"1\"} 3\n"
            "lat_seconds_bucket{m=\"a\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{m=\"a\"} 2.65\n"
            "lat_seconds_count{m=\"a\"} 4\n");
}

TEST(Metrics, UnlabelledFamiliesExposeZero) {
  MetricsRegistry r;
  r.histogram("h_seconds", "H", {1.0});
  r.counter("c_total", "C");
  EXPECT_EQ(r.render(),
            "# HELP h_seconds H\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1\"} 0\n"
            "h_seconds_bucket{le=\"+Inf\"} 0\nh_seconds_sum 0\nh_seconds_count 0\n"
            "# HELP c_total C\n# TYPE c_total counter\nc_total 0\n");
}

TEST(Metrics, DuplicateNamesRejected) {
  MetricsRegistry r;
  r.counter("a_total", "A");
  EXPECT_THROW(r.gauge("a_total", "again"), Error);
}

TEST(ServerMetrics, InputLengthBins) {
  EXPECT_STREQ(input_length_bin(1), "tiny");
  EXPECT_STREQ(input_length_bin(128), "tiny");
  EXPECT_STREQ(input_length_bin(129), "small");
  EXPECT_STREQ(input_length_bin(512), "small");
  EXPECT_STREQ(input_length_bin(513), "large");
  EXPECT_STREQ(input_length_bin(2048), "large");
  EXPECT_STREQ(input_length_bin(2049), "xlarge");
}

TEST(ServerMetrics, FinishedRequestsLabelled) {
  ServerMetrics m("v1");
  m.request_finished(FinishReason::Stop, 200, 10, 0.5, 0.01);
  m.request_finished(FinishReason::Abort, 5, 1, 0.1, -1);
  const std::string text = m.render();
  EXPECT_NE(text.find("inferx_requests_total{finish_reason=\"stop\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("inferx_requests_total{finish_reason=\"abort\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("inferx_generation_tokens_total 11\n"), std::string::npos);
  EXPECT_NE(
      text.find(
          "inferx_inference_latency_seconds_count{model_version=\"v1\",input_length_bin=\"small\"} 1\n"),
      std::string::npos);
  EXPECT_EQ(text.find("input_length_bin=\"tiny\""), std::string::npos);  // aborted: no latency sample
}

TEST(ServerMetrics, EngineStepCountersMirrorTheEngine) {
  ServerMetrics m("v1");
  EngineStats s;
  s.steps = 40;
  s.decode_graph_steps = 30;
  s.decode_graph_replays = 28;
  s.overlapped_steps = 25;
  m.update_engine(s);
  const std::string text = m.render();
  EXPECT_NE(text.find("inferx_engine_steps_total 40\n"), std::string::npos);
  EXPECT_NE(text.find("inferx_decode_graph_steps_total 30\n"), std::string::npos);
  EXPECT_NE(text.find("inferx_decode_graph_replays_total 28\n"), std::string::npos);
  EXPECT_NE(text.find("inferx_overlapped_decode_steps_total 25\n"), std::string::npos);
}

}  // namespace
}  // namespace inferx::server
