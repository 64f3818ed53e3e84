// The host's registry of plugin metrics: Prometheus name rules, the host's own prefixes,
// re-registration, and the update rules of counters and gauges.
#include "kproxy/plugins/plugin_metrics.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

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
