#include "metrics.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <sstream>

#include "ops_fixtures.h"

using kproxy::cli::Histogram;
using kproxy::cli::PrometheusText;
using kproxy::cli::ProxyMetrics;
using namespace std::chrono_literals;

namespace {

// The value of the first sample line starting with `series` (name plus labels), or "".
std::string sampleValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return line.substr(series.size() + 1);
  }
  return "";
}

kproxy::core::SyncObservation sync(kproxy::core::SyncKind kind, bool ok,
                                   std::chrono::steady_clock::duration d) {
  kproxy::core::SyncObservation o;
  o.kind = kind;
  o.ok = ok;
  o.duration = d;
  return o;
}

}  // namespace

TEST_CASE("histogram buckets are cumulative with upstream's bounds", "[unit][metrics]") {
  Histogram h = kproxy::cli::syncDurationHistogram();
  REQUIRE(h.bounds.size() == 15);
  CHECK(h.bounds.front() == 0.001);
  CHECK(h.bounds.back() == Approx(16.384));
  h.observe(0.0015);
  h.observe(0.002);  // on a bound: "less than or equal" takes it
  h.observe(100);    // above every bound: only +Inf

  PrometheusText t;
  t.histogram("x_seconds", "help", h);
  const std::string out = t.str();
  CHECK(out.rfind("# HELP x_seconds help\n# TYPE x_seconds histogram\n", 0) == 0);
  CHECK(sampleValue(out, "x_seconds_bucket{le=\"0.001\"}") == "0");
  CHECK(sampleValue(out, "x_seconds_bucket{le=\"0.002\"}") == "2");
  CHECK(sampleValue(out, "x_seconds_bucket{le=\"16.384\"}") == "2");
  CHECK(sampleValue(out, "x_seconds_bucket{le=\"+Inf\"}") == "3");
  CHECK(sampleValue(out, "x_seconds_count") == "3");
  CHECK(std::stod(sampleValue(out, "x_seconds_sum")) == Approx(100.0035));
}

TEST_CASE("network programming buckets match upstream's merged list", "[unit][metrics]") {
  Histogram h = kproxy::cli::networkProgrammingHistogram();
  REQUIRE(h.bounds.size() == 1 + 2 + 59 + 12 + 7);
  CHECK(h.bounds[0] == 0);
  CHECK(h.bounds[1] == 0.25);
  CHECK(h.bounds[2] == 0.5);
  CHECK(h.bounds[3] == 1);
  CHECK(h.bounds[61] == 59);
  CHECK(h.bounds[62] == 60);
  CHECK(h.bounds[73] == 115);
  CHECK(h.bounds[74] == 120);
  CHECK(h.bounds.back() == 300);
}

TEST_CASE("values and label values are formatted as Prometheus expects", "[unit][metrics]") {
  CHECK(PrometheusText::formatValue(1) == "1");
  CHECK(PrometheusText::formatValue(0.25) == "0.25");
  CHECK(PrometheusText::formatValue(1.0 / 0.0) == "+Inf");
  CHECK(PrometheusText::escapeLabel("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
  PrometheusText t;
  t.family("m", "line one\nline \\two", "gauge");
  t.sample("m", {{"a", "x"}, {"b", "y\"z"}}, 3);
  CHECK(t.str() == "# HELP m line one\\nline \\\\two\n# TYPE m gauge\nm{a=\"x\",b=\"y\\\"z\"} 3\n");
}

TEST_CASE("the failure counter carries the mode's upstream name", "[unit][metrics]") {
  CHECK(ProxyMetrics::failureCounterName("nftables") ==
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total");
  CHECK(ProxyMetrics::failureCounterName("iptables") ==
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total");
  CHECK(ProxyMetrics::failureCounterName("ipvs") ==
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total");
  CHECK(ProxyMetrics::failureCounterName("my-plugin") ==
        "kubeproxy_sync_proxy_rules_my_plugin_sync_failures_total");
}

TEST_CASE("render: every upstream family with values from syncs, probes and status", "[unit][metrics]") {
  ops_test::QuietLog quiet;
  ProxyMetrics metrics("nftables", 1000.5);
  metrics.observeSync(sync(kproxy::core::SyncKind::kFull, true, 3ms));
  metrics.observeSync(sync(kproxy::core::SyncKind::kPartial, true, 1500us));
  metrics.observeSync(sync(kproxy::core::SyncKind::kFull, false, 40ms));
  metrics.countHealthz(200);
  metrics.countHealthz(200);
  metrics.countHealthz(503);
  metrics.countLivez(200);

  kproxy::core::ProxierStatus status;
  status.lastSuccessWall = 2000.25;
  status.lastQueuedWall = 1999.0;
  status.pendingServiceChanges = 2;
  status.pendingEndpointChanges = 5;
  status.serviceChangesTotal = 7;
  status.endpointChangesTotal = 11;
  // One eTP=Local LB without local endpoints, one iTP=Local service with one, one without.
  status.applied = ops_test::snapshotOf(
      {ops_test::localLoadBalancer("lb", 32000, "10.96.0.10"),
       ops_test::internalLocalService("in1", "10.96.0.11"),
       ops_test::internalLocalService("in2", "10.96.0.12")},
      {ops_test::sliceFor("lb", {{"10.244.2.1", false}}),
       ops_test::sliceFor("in1", {{"10.244.1.1", true}})});

  kproxy::cli::ProcessStats process;
  process.residentBytes = 1234;
  process.cpuSeconds = 0.5;
  process.openFds = 9;
  const std::string out = metrics.render(status, process);

  for (const char* family :
       {"kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "kubeproxy_network_programming_duration_seconds"}) {
    CHECK(out.find(std::string("# TYPE ") + family + " histogram\n") != std::string::npos);
  }
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_duration_seconds_count") == "3");
  CHECK(sampleValue(out, "kubeproxy_sync_full_proxy_rules_duration_seconds_count") == "2");
  CHECK(sampleValue(out, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count") == "1");
  CHECK(sampleValue(out, "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{le=\"0.002\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{le=\"0.001\"}") == "0");
  CHECK(sampleValue(out, "kubeproxy_network_programming_duration_seconds_count") == "0");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total") == "1");
  CHECK(out.find("# TYPE kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter") != std::string::npos);
  CHECK(sampleValue(out, "kubeproxy_proxy_healthz_total{code=\"200\"}") == "2");
  CHECK(sampleValue(out, "kubeproxy_proxy_healthz_total{code=\"503\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_proxy_livez_total{code=\"200\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") == "2000.25");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds") == "1999");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_service_changes_pending") == "2");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == "5");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_service_changes_total") == "7");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == "11");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"}") == "1");
  CHECK(out.find("# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge") != std::string::npos);
  CHECK(sampleValue(out, "process_resident_memory_bytes") == "1234");
  CHECK(sampleValue(out, "process_cpu_seconds_total") == "0.5");
  CHECK(sampleValue(out, "process_open_fds") == "9");
  // Absent process fields are left out rather than reported as 0.
  CHECK(out.find("process_start_time_seconds") == std::string::npos);
  // Every line is a comment or "name[{labels}] value".
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    INFO(line);
    CHECK(line.find(' ') != std::string::npos);
    // Every family the host serves is under a prefix plugins may not register (ABI 1.2).
    const auto prefixes = kproxy::cli::hostMetricPrefixes();
    CHECK(std::any_of(prefixes.begin(), prefixes.end(),
                      [&](const std::string& p) { return line.rfind(p, 0) == 0; }));
  }
}

TEST_CASE("failed syncs are also counted by the category the backend gave", "[unit][metrics]") {
  ProxyMetrics metrics("nftables", 1000.0);
  auto failed = [](kproxy::core::ErrorCategory category) {
    auto o = sync(kproxy::core::SyncKind::kFull, false, 1ms);
    o.error = kproxy::core::Error{category, 0, "nftables: kernel refused"};
    return o;
  };
  metrics.observeSync(failed(kproxy::core::ErrorCategory::kKernel));
  metrics.observeSync(failed(kproxy::core::ErrorCategory::kTransient));
  metrics.observeSync(failed(kproxy::core::ErrorCategory::kTransient));
  metrics.observeSync(failed(kproxy::core::ErrorCategory::kInvalidArgument));
  metrics.observeSync(failed(kproxy::core::ErrorCategory::kPlugin));  // a 1.0/1.1 plugin
  metrics.observeSync(sync(kproxy::core::SyncKind::kPartial, true, 1ms));
  const std::string out = metrics.render(kproxy::core::ProxierStatus{}, {});
  // Upstream's counter keeps its name and no label.
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total") == "5");
  const std::string name = "kproxy_sync_proxy_rules_failures_total";
  CHECK(out.find("# TYPE " + name + " counter\n") != std::string::npos);
  CHECK(sampleValue(out, name + "{category=\"kernel_refused\"}") == "1");
  CHECK(sampleValue(out, name + "{category=\"transient\"}") == "2");
  CHECK(sampleValue(out, name + "{category=\"invalid_input\"}") == "1");
  CHECK(sampleValue(out, name + "{category=\"unknown\"}") == "1");
}

TEST_CASE("plugin metrics render with HELP, TYPE and their labels", "[unit][metrics]") {
  kproxy::plugins::PluginMetrics registry;
  registry.reservePrefixes(kproxy::cli::hostMetricPrefixes());
  auto objects = registry.registerMetric(kproxy::plugins::MetricType::kGauge, "kproxy_nftables_objects",
                                         "Objects \\ in tables", {"family", "kind"});
  REQUIRE(objects);
  auto ops = registry.registerMetric(kproxy::plugins::MetricType::kCounter,
                                     "kproxy_nftables_kernel_operations_total", "Operations", {});
  REQUIRE(ops);
  auto unused = registry.registerMetric(kproxy::plugins::MetricType::kCounter, "my_unused_total",
                                        "Never updated", {"x"});
  REQUIRE(unused);
  const std::vector<std::string> chain{"ipv4", "chain"}, set{"ipv6", "set\"x"};
  REQUIRE(registry.set(*objects, chain, 12));
  REQUIRE(registry.set(*objects, set, 3));
  REQUIRE(registry.add(*ops, {}, 40));
  REQUIRE(registry.add(*ops, {}, 2));
  // A host name prefix is refused: the host's own families stay unambiguous.
  auto clash = registry.registerMetric(kproxy::plugins::MetricType::kCounter,
                                       "kubeproxy_sync_proxy_rules_duration_seconds", "x", {});
  REQUIRE_FALSE(clash);
  CHECK_THAT(clash.error().message(), Catch::Contains("\"kubeproxy_\"") && Catch::Contains("kproxy's own"));

  const std::string out = kproxy::cli::renderPluginMetrics(registry.collect());
  CHECK(out ==
        "# HELP kproxy_nftables_kernel_operations_total Operations\n"
        "# TYPE kproxy_nftables_kernel_operations_total counter\n"
        "kproxy_nftables_kernel_operations_total 42\n"
        "# HELP kproxy_nftables_objects Objects \\\\ in tables\n"
        "# TYPE kproxy_nftables_objects gauge\n"
        "kproxy_nftables_objects{family=\"ipv4\",kind=\"chain\"} 12\n"
        "kproxy_nftables_objects{family=\"ipv6\",kind=\"set\\\"x\"} 3\n"
        "# HELP my_unused_total Never updated\n"
        "# TYPE my_unused_total counter\n");
}

TEST_CASE("render before any sync: the loop start seeds last_queued, no snapshot gauges", "[unit][metrics]") {
  ProxyMetrics metrics("iptables", 1000.5);
  const std::string out = metrics.render(kproxy::core::ProxierStatus{}, {});
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds") == "1000.5");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") == "0");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total") == "0");
  CHECK(out.find("kubeproxy_sync_proxy_rules_no_local_endpoints_total{") == std::string::npos);
  CHECK(out.find("kubeproxy_proxy_healthz_total{") == std::string::npos);
}

TEST_CASE("process stats come from /proc", "[unit][metrics]") {
  const auto s = kproxy::cli::readProcessStats();
  REQUIRE(s.residentBytes);
  CHECK(*s.residentBytes > 0);
  REQUIRE(s.openFds);
  CHECK(*s.openFds >= 3);
  REQUIRE(s.startTimeSeconds);
  CHECK(*s.startTimeSeconds > 1.0e9);
  REQUIRE(s.cpuSeconds);
  CHECK(*s.cpuSeconds >= 0);
}

TEST_CASE("network programming latency: trigger time to the end of the sync that applied it",
          "[unit][metrics]") {
  ops_test::QuietLog quiet;
  ProxyMetrics metrics("nftables", 1000.0);
  auto o = sync(kproxy::core::SyncKind::kPartial, true, 2ms);
  o.wallTimestamp = 2000.0;
  o.triggerTimes = {1999.9, 1999.0, 2000.5};  // the last one is in the future: clock skew, dropped
  metrics.observeSync(o);
  const std::string out = metrics.render(kproxy::core::ProxierStatus{}, kproxy::cli::ProcessStats{});
  CHECK(sampleValue(out, "kubeproxy_network_programming_duration_seconds_count") == "2");
  CHECK(std::stod(sampleValue(out, "kubeproxy_network_programming_duration_seconds_sum")) ==
        Approx(1.1));
}
