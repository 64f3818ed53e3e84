// The host's registry of plugin metrics: Prometheus name rules, the host's own prefixes,
// re-registration, the update rules of counters, gauges and histograms, and the host table's
// metric functions as plugins of older ABI versions call them.
#include "kproxy/plugins/plugin_metrics.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "snapshot_bridge.h"

using kproxy::plugins::MetricType;
using kproxy::plugins::PluginMetrics;

TEST_CASE("plugin metric names follow Prometheus' rules", "[unit]") {
  CHECK(PluginMetrics::validMetricName("kproxy_nftables_objects"));
  CHECK(PluginMetrics::validMetricName("a:b_c9"));
  CHECK(PluginMetrics::validMetricName("_x"));
  CHECK_FALSE(PluginMetrics::validMetricName(""));
  CHECK_FALSE(PluginMetrics::validMetricName("9lives"));
  CHECK_FALSE(PluginMetrics::validMetricName("with space"));
  CHECK_FALSE(PluginMetrics::validMetricName("dash-ed"));
  CHECK_FALSE(PluginMetrics::validMetricName("__reserved"));
  CHECK(PluginMetrics::validLabelName("family"));
  CHECK_FALSE(PluginMetrics::validLabelName("a:b"));
  CHECK_FALSE(PluginMetrics::validLabelName("__name__"));
}

TEST_CASE("plugin metric registration refuses bad names with the reason", "[unit]") {
  PluginMetrics m;
  m.reservePrefixes({"kubeproxy_", "process_"});
  auto bad = m.registerMetric(MetricType::kCounter, "bad name", "h", {});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().errnum == EINVAL);
  CHECK_THAT(bad.error().message(), Catch::Contains("\"bad name\"") &&
                                        Catch::Contains("not a Prometheus metric name"));
  auto host = m.registerMetric(MetricType::kGauge, "process_open_fds", "h", {});
  REQUIRE_FALSE(host);
  CHECK_THAT(host.error().message(), Catch::Contains("\"process_\" are kproxy's own"));
  auto label = m.registerMetric(MetricType::kGauge, "x_objects", "h", {"ok", "not-ok"});
  REQUIRE_FALSE(label);
  CHECK_THAT(label.error().message(), Catch::Contains("label \"not-ok\""));
  auto twice = m.registerMetric(MetricType::kGauge, "x_objects", "h", {"a", "a"});
  REQUIRE_FALSE(twice);
  CHECK_THAT(twice.error().message(), Catch::Contains("label \"a\" twice"));
  auto lines = m.registerMetric(MetricType::kGauge, "x_objects", "two\nlines", {});
  REQUIRE_FALSE(lines);
  CHECK(m.collect().empty());
}

TEST_CASE("the same metric registered again gets the same handle; a different one is refused",
          "[unit]") {
  PluginMetrics m;
  auto a = m.registerMetric(MetricType::kCounter, "x_total", "help", {"kind"});
  REQUIRE(a);
  CHECK(*a != 0);
  auto again = m.registerMetric(MetricType::kCounter, "x_total", "help", {"kind"});
  REQUIRE(again);
  CHECK(*again == *a);
  auto asGauge = m.registerMetric(MetricType::kGauge, "x_total", "help", {"kind"});
  REQUIRE_FALSE(asGauge);
  CHECK_THAT(asGauge.error().message(), Catch::Contains("already registered as a counter"));
  CHECK_FALSE(m.registerMetric(MetricType::kCounter, "x_total", "help", {"other"}));
  CHECK(m.collect().size() == 1);
}

TEST_CASE("counters only go up, only gauges are set, label values must match", "[unit]") {
  PluginMetrics m;
  auto c = m.registerMetric(MetricType::kCounter, "c_total", "c", {"kind"});
  auto g = m.registerMetric(MetricType::kGauge, "g", "g", {});
  REQUIRE(c);
  REQUIRE(g);
  const std::vector<std::string> full{"full"};
  CHECK(m.add(*c, full, 2));
  CHECK(m.add(*c, full, 0.5));
  CHECK_FALSE(m.add(*c, full, -1));
  CHECK_FALSE(m.set(*c, full, 1));
  CHECK_FALSE(m.add(*c, {}, 1));
  CHECK_FALSE(m.add(99, full, 1));
  CHECK_FALSE(m.add(0, full, 1));
  CHECK(m.set(*g, {}, 5));
  CHECK(m.add(*g, {}, -2));
  const auto families = m.collect();
  REQUIRE(families.size() == 2);
  CHECK(families[0].name == "c_total");
  CHECK(families[0].samples.at(full) == 2.5);
  CHECK(families[1].samples.at({}) == 3);
}

TEST_CASE("histograms: finite ascending bounds, no \"le\" label, observed only", "[unit]") {
  PluginMetrics m;
  auto unsorted = m.registerMetric(MetricType::kHistogram, "h_seconds", "h", {}, {0.1, 0.1});
  REQUIRE_FALSE(unsorted);
  CHECK_THAT(unsorted.error().message(), Catch::Contains("finite and strictly ascending"));
  CHECK_FALSE(m.registerMetric(MetricType::kHistogram, "h_seconds", "h", {}, {1, INFINITY}));
  auto le = m.registerMetric(MetricType::kHistogram, "h_seconds", "h", {"le"}, {1});
  REQUIRE_FALSE(le);
  CHECK_THAT(le.error().message(), Catch::Contains("label \"le\""));

  auto h = m.registerMetric(MetricType::kHistogram, "h_seconds", "h", {"ip_family"}, {0.001, 0.002, 0.004});
  REQUIRE(h);
  CHECK(*m.registerMetric(MetricType::kHistogram, "h_seconds", "h", {"ip_family"}, {0.001, 0.002, 0.004}) == *h);
  auto otherBuckets = m.registerMetric(MetricType::kHistogram, "h_seconds", "h", {"ip_family"}, {1});
  REQUIRE_FALSE(otherBuckets);
  CHECK_THAT(otherBuckets.error().message(), Catch::Contains("already registered as a histogram"));

  const std::vector<std::string> v4{"IPv4"};
  CHECK(m.observe(*h, v4, 0.0015));
  CHECK(m.observe(*h, v4, 0.002));
  CHECK(m.observe(*h, v4, 7));
  CHECK_FALSE(m.observe(*h, {}, 1));
  CHECK_FALSE(m.add(*h, v4, 1));
  CHECK_FALSE(m.set(*h, v4, 1));
  auto g = m.registerMetric(MetricType::kGauge, "g", "g", {});
  REQUIRE(g);
  CHECK_FALSE(m.observe(*g, {}, 1));

  const auto families = m.collect();
  REQUIRE(families.size() == 2);
  const auto& hist = families[1];
  CHECK(hist.name == "h_seconds");
  CHECK(hist.buckets == std::vector<double>{0.001, 0.002, 0.004});
  const kproxy::core::Histogram& observed = hist.histograms.at(v4);
  CHECK(observed.counts == std::vector<std::uint64_t>{0, 2, 0});  // 7 is only in +Inf
  CHECK(observed.count == 3);
  CHECK(observed.sum == Approx(7.0035));
}

namespace {

/// A spec as a plugin allocates it: `structSize` is the size its header knew.
kproxy_metric_spec specOf(std::uint32_t type, const char* name, std::uint32_t structSize) {
  static const char* const labels[] = {"ip_family"};
  kproxy_metric_spec spec{};
  spec.struct_size = structSize;
  spec.type = type;
  spec.name = name;
  spec.help = "help";
  spec.label_names = labels;
  spec.label_names_count = 1;
  return spec;
}

}  // namespace

TEST_CASE("the 1.4 host table: older plugins' specs still register; histograms need 1.4's",
          "[unit]") {
  PluginMetrics metrics;
  const kproxy_host_api api = kproxy::plugins::makeHostApi(&metrics);
  REQUIRE(api.struct_size == sizeof(kproxy_host_api));
  REQUIRE(api.metric_observe != nullptr);
  // The fields an ABI 1.2/1.3 plugin reads did not move.
  static_assert(offsetof(kproxy_host_api, metric_observe) > offsetof(kproxy_host_api, log_at));
  static_assert(KPROXY_METRIC_SPEC_V1_2_SIZE == offsetof(kproxy_metric_spec, buckets));
  const char* const v4[] = {"IPv4"};
  kproxy_error err{};

  // A counter from a plugin built against ABI 1.3: its spec ends at label_names_count, and
  // whatever follows it in memory is not the host's to read.
  kproxy_metric_spec old = specOf(KPROXY_METRIC_COUNTER, "old_total", KPROXY_METRIC_SPEC_V1_2_SIZE);
  old.buckets = reinterpret_cast<const double*>(0x1);  // garbage past the old spec
  old.buckets_count = 99;
  const std::uint64_t counter = api.metric_register(api.host_ctx, &old, &err);
  REQUIRE(counter != 0);
  CHECK(api.metric_add(api.host_ctx, counter, v4, 1, 2) == KPROXY_OK);
  CHECK(api.metric_observe(api.host_ctx, counter, v4, 1, 2) == KPROXY_ERR);

  // A histogram in a spec that does not cover the buckets is refused, with the reason.
  kproxy_metric_spec shortHistogram = specOf(KPROXY_METRIC_HISTOGRAM, "short_seconds", KPROXY_METRIC_SPEC_V1_2_SIZE);
  CHECK(api.metric_register(api.host_ctx, &shortHistogram, &err) == 0);
  CHECK_THAT(err.message, Catch::Contains("has no buckets"));

  const double bounds[] = {0.5, 1};
  kproxy_metric_spec histogram = specOf(KPROXY_METRIC_HISTOGRAM, "new_seconds", sizeof(kproxy_metric_spec));
  histogram.buckets = bounds;
  histogram.buckets_count = 2;
  const std::uint64_t h = api.metric_register(api.host_ctx, &histogram, &err);
  REQUIRE(h != 0);
  CHECK(api.metric_observe(api.host_ctx, h, v4, 1, 0.7) == KPROXY_OK);
  CHECK(api.metric_add(api.host_ctx, h, v4, 1, 1) == KPROXY_ERR);

  const auto families = metrics.collect();
  REQUIRE(families.size() == 2);
  CHECK(families[0].name == "new_seconds");
  CHECK(families[0].histograms.at({"IPv4"}).counts == std::vector<std::uint64_t>{0, 1});
  CHECK(families[1].name == "old_total");
  CHECK(families[1].samples.at({"IPv4"}) == 2);
  CHECK(families[1].buckets.empty());
}
