#include "metrics.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

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
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}") == "3");
  CHECK(sampleValue(out, "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"}") == "2");
  CHECK(sampleValue(out, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.002\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.001\"}") == "0");
  CHECK(sampleValue(out, "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}") == "0");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}") == "1");
  CHECK(out.find("# TYPE kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter") != std::string::npos);
  CHECK(sampleValue(out, "kubeproxy_proxy_healthz_total{code=\"200\"}") == "2");
  CHECK(sampleValue(out, "kubeproxy_proxy_healthz_total{code=\"503\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_proxy_livez_total{code=\"200\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}") == "2000.25");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv6\"}") == "1999");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_service_changes_pending") == "2");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == "5");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_service_changes_total") == "7");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == "11");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"internal\"}") == "1");
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
  // Upstream's counter keeps its name and only upstream's label.
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}") == "5");
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
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}") == "1000.5");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}") == "0");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}") == "0");
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
  REQUIRE(s.virtualMaxBytes);
  CHECK(*s.virtualMaxBytes > 0);
  REQUIRE(s.networkReceiveBytes);
  CHECK(*s.networkReceiveBytes >= 0);
  REQUIRE(s.networkTransmitBytes);
  CHECK(*s.networkTransmitBytes >= 0);
}

TEST_CASE("the process's network bytes are IpExt's InOctets and OutOctets", "[unit][metrics]") {
  const std::string netstat =
      "TcpExt: SyncookiesSent InOctets\n"
      "TcpExt: 1 2\n"
      "IpExt: InNoRoutes InTruncatedPkts InMcastPkts OutMcastPkts InBcastPkts OutBcastPkts "
      "InOctets OutOctets\n"
      "IpExt: 0 0 0 0 0 0 906841905 477005708\n"
      "MPTcpExt: MPCapableSYNRX\n"
      "MPTcpExt: 0\n";
  const auto octets = kproxy::cli::parseNetstatIpOctets(netstat);
  REQUIRE(octets);
  CHECK(octets->in == 906841905.0);
  CHECK(octets->out == 477005708.0);
  CHECK_FALSE(kproxy::cli::parseNetstatIpOctets("TcpExt: InOctets\nTcpExt: 1\n"));
  CHECK_FALSE(kproxy::cli::parseNetstatIpOctets("IpExt: InOctets OutOctets\nIpExt: 1 x\n"));
  CHECK_FALSE(kproxy::cli::parseNetstatIpOctets("IpExt: InOctets OutOctets\n"));
  CHECK_FALSE(kproxy::cli::parseNetstatIpOctets(""));
}

TEST_CASE("process metrics: client_golang's process collector's families, names and types",
          "[unit][metrics]") {
  ProxyMetrics metrics("nftables", 1000.0);
  kproxy::cli::ProcessStats process;
  process.cpuSeconds = 0.5;
  process.maxFds = 1024;
  process.networkReceiveBytes = 100;
  process.networkTransmitBytes = 200;
  process.openFds = 9;
  process.residentBytes = 1234;
  process.startTimeSeconds = 1.7e9;
  process.virtualBytes = 5678;
  process.virtualMaxBytes = 18446744073709551615.0;  // unlimited, as RLIM_INFINITY reads
  const std::string out = metrics.render(kproxy::core::ProxierStatus{}, process);
  // Upstream's (client_golang's on Linux) family, type and help text.
  const std::vector<std::tuple<std::string, std::string, std::string>> families{
      {"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."},
      {"process_max_fds", "gauge", "Maximum number of open file descriptors."},
      {"process_network_receive_bytes_total", "counter",
       "Number of bytes received by the process over the network."},
      {"process_network_transmit_bytes_total", "counter",
       "Number of bytes sent by the process over the network."},
      {"process_open_fds", "gauge", "Number of open file descriptors."},
      {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes."},
      {"process_start_time_seconds", "gauge",
       "Start time of the process since unix epoch in seconds."},
      {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes."},
      {"process_virtual_memory_max_bytes", "gauge",
       "Maximum amount of virtual memory available in bytes."},
  };
  for (const auto& [name, type, help] : families) {
    INFO(name);
    const std::string header =
        "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    CHECK(out.find(header) != std::string::npos);
    CHECK_FALSE(sampleValue(out, name).empty());
  }
  CHECK(sampleValue(out, "process_virtual_memory_max_bytes") == "1.8446744073709552e+19");
  CHECK(sampleValue(out, "process_network_transmit_bytes_total") == "200");
}

TEST_CASE("network programming latency: trigger time to the end of the sync that applied it",
          "[unit][metrics]") {
  ops_test::QuietLog quiet;
  ProxyMetrics metrics("nftables", 1000.0);
  auto o = sync(kproxy::core::SyncKind::kPartial, true, 2ms);
  o.wallTimestamp = 2000.0;
  using kproxy::net::Family;
  o.triggerTimes = {{1999.9, Family::kIPv4},
                    {1999.0, Family::kIPv4},
                    {2000.5, Family::kIPv4},  // in the future: clock skew, dropped
                    {999.0, Family::kIPv4},   // before kproxy started: upstream's tracker drops it
                    {1998.0, Family::kIPv6}};
  metrics.observeSync(o);
  const std::string out = metrics.render(kproxy::core::ProxierStatus{}, kproxy::cli::ProcessStats{});
  CHECK(sampleValue(out, "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}") == "2");
  CHECK(std::stod(sampleValue(out, "kubeproxy_network_programming_duration_seconds_sum{ip_family=\"IPv4\"}")) ==
        Approx(1.1));
  // The IPv6 slice's change is the IPv6 series'.
  CHECK(sampleValue(out, "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv6\"}") == "1");
  CHECK(sampleValue(out, "kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv6\",le=\"2\"}") == "1");
}

namespace {

// What /metrics says about one family: its TYPE, HELP and the label names of its samples
// (without "le"), as a dashboard or alert sees them.
struct Family {
  std::string type;
  std::string help;
  std::set<std::set<std::string>> labelNames;
};

std::map<std::string, Family> parseFamilies(const std::string& text) {
  std::map<std::string, Family> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream l(line.substr(7));
      std::string name, type;
      l >> name >> type;
      out[name].type = type;
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) {
      const auto space = line.find(' ', 7);
      out[line.substr(7, space - 7)].help = line.substr(space + 1);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const auto brace = line.find('{');
    std::string name = line.substr(0, std::min(brace, line.find(' ')));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string base = name.substr(0, name.size() - std::min(name.size(), std::strlen(suffix)));
      if (name.ends_with(suffix) && out.contains(base) && out[base].type == "histogram") name = base;
    }
    std::set<std::string> labels;
    if (brace != std::string::npos) {
      const std::string body = line.substr(brace + 1, line.find('}') - brace - 1);
      std::size_t at = 0;
      while (at < body.size()) {
        const auto eq = body.find('=', at);
        const std::string label = body.substr(at, eq - at);
        if (label != "le") labels.insert(label);
        // Skip the quoted value (values here hold no escaped quotes).
        const auto close = body.find('"', eq + 2);
        at = close + 2;
      }
    }
    out[name].labelNames.insert(labels);
  }
  return out;
}

struct Expected {
  const char* name;
  const char* type;
  std::set<std::string> labels;
};

// pkg/proxy/metrics/metrics.go (v1.34): the families every mode registers.
const std::vector<Expected> kCommonFamilies = {
    {"kubeproxy_sync_proxy_rules_duration_seconds", "histogram", {"ip_family"}},
    {"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "gauge", {"ip_family"}},
    {"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge", {"ip_family"}},
    {"kubeproxy_sync_proxy_rules_endpoint_changes_pending", "gauge", {}},
    {"kubeproxy_sync_proxy_rules_endpoint_changes_total", "counter", {}},
    {"kubeproxy_sync_proxy_rules_service_changes_pending", "gauge", {}},
    {"kubeproxy_sync_proxy_rules_service_changes_total", "counter", {}},
    {"kubeproxy_proxy_healthz_total", "counter", {"code"}},
    {"kubeproxy_proxy_livez_total", "counter", {"code"}},
    {"kubeproxy_network_programming_duration_seconds", "histogram", {"ip_family"}},
    {"kubeproxy_sync_proxy_rules_no_local_endpoints_total", "gauge", {"traffic_policy", "ip_family"}},
    {"kubernetes_build_info",
     "gauge",
     {"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler",
      "platform"}},
};

// Each mode's own, as RegisterMetrics adds them.
std::vector<Expected> modeFamilies(const std::string& mode) {
  const Expected reconcileDuration{"kubeproxy_conntrack_reconciler_sync_duration_seconds", "histogram", {"ip_family"}};
  const Expected reconcileDeleted{"kubeproxy_conntrack_reconciler_deleted_entries_total", "counter", {"ip_family"}};
  if (mode == "iptables")
    return {{"kubeproxy_sync_full_proxy_rules_duration_seconds", "histogram", {"ip_family"}},
            {"kubeproxy_sync_partial_proxy_rules_duration_seconds", "histogram", {"ip_family"}},
            {"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "counter", {"ip_family"}},
            {"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", "counter", {"ip_family"}},
            {"kubeproxy_sync_proxy_rules_iptables_total", "gauge", {"table", "ip_family"}},
            {"kubeproxy_sync_proxy_rules_iptables_last", "gauge", {"table", "ip_family"}},
            reconcileDuration,
            reconcileDeleted,
            {"kubeproxy_iptables_ct_state_invalid_dropped_packets_total", "counter", {}},
            {"kubeproxy_iptables_localhost_nodeports_accepted_packets_total", "counter", {}}};
  if (mode == "ipvs")
    return {{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "counter", {"ip_family"}}, reconcileDuration,
            reconcileDeleted};
  return {{"kubeproxy_sync_full_proxy_rules_duration_seconds", "histogram", {"ip_family"}},
          {"kubeproxy_sync_partial_proxy_rules_duration_seconds", "histogram", {"ip_family"}},
          {"kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "counter", {"ip_family"}},
          {"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", "counter", {"ip_family"}},
          reconcileDuration,
          reconcileDeleted};
}

/// The plugin metrics upstream's families come from, registered and updated as the plugins do
/// (the iptables backend's rule counts; the reconcile skeleton's conntrack reconciler, in the
/// iptables, IPVS and nftables backends), and the nfacct objects iptables mode's rules count
/// into.
struct BackendSide {
  kproxy::plugins::PluginMetrics registry;
  std::unique_ptr<kproxy::cli::NfacctMetrics> nfacct;

  explicit BackendSide(const std::string& mode) {
    using kproxy::plugins::MetricType;
    registry.reservePrefixes(kproxy::cli::hostMetricPrefixes());
    if (mode == "iptables") {
      for (const char* name : {"kproxy_iptables_rules", "kproxy_iptables_rules_last_sync"}) {
        auto g = registry.registerMetric(MetricType::kGauge, name, "help", {"family", "table"});
        REQUIRE(g);
        for (const char* table : {"filter", "nat", "mangle"})
          REQUIRE(registry.set(*g, std::vector<std::string>{"ipv4", table}, 7));
      }
      auto objects = std::make_unique<kproxy::kernel::FakeNfacct>();
      objects->objects["ct_state_invalid_dropped_pkts"] = {"ct_state_invalid_dropped_pkts", 3, 300};
      objects->objects["localhost_nps_accepted_pkts"] = {"localhost_nps_accepted_pkts", 5, 500};
      nfacct = std::make_unique<kproxy::cli::NfacctMetrics>(std::move(objects));
    }
    if (mode == "iptables" || mode == "ipvs" || mode == "nftables") {
      auto duration = registry.registerMetric(MetricType::kHistogram,
                                              "kproxy_conntrack_reconciler_sync_duration_seconds", "help",
                                              {"ip_family"}, {0.001, 0.002});
      auto deleted = registry.registerMetric(MetricType::kCounter, "kproxy_conntrack_reconciler_deleted_entries_total",
                                             "help", {"ip_family"});
      REQUIRE(duration);
      REQUIRE(deleted);
      REQUIRE(registry.observe(*duration, std::vector<std::string>{"IPv4"}, 0.0015));
      REQUIRE(registry.add(*deleted, std::vector<std::string>{"IPv4"}, 2));
    }
  }
  std::string render(const std::string& mode) const {
    const auto plugins = registry.collect();
    return kproxy::cli::renderUpstreamAliases(mode, plugins) + (nfacct ? nfacct->render() : std::string()) +
           kproxy::cli::renderPluginMetrics(plugins);
  }
};

}  // namespace

TEST_CASE("every upstream family has upstream's name, type, labels and stability in each mode",
          "[unit][metrics]") {
  ops_test::QuietLog quiet;
  for (const std::string mode : {"iptables", "nftables", "ipvs"}) {
    INFO("mode " << mode);
    ProxyMetrics metrics(mode, 1000.0, {"IPv4", "IPv6"}, {"v1.34.4", "0123456789ab"});
    auto o = sync(kproxy::core::SyncKind::kPartial, false, 2ms);
    o.wallTimestamp = 2000.0;
    metrics.observeSync(o);
    o.ok = true;
    o.triggerTimes = {{1999.0, kproxy::net::Family::kIPv4}};
    metrics.observeSync(o);
    metrics.countHealthz(200);
    metrics.countLivez(200);
    kproxy::core::ProxierStatus status;
    status.applied = ops_test::snapshotOf({ops_test::internalLocalService("in1", "10.96.0.11")}, {});
    // What /metrics serves: the host's families, then what the backend side measured.
    const auto families = parseFamilies(metrics.render(status, {}) + BackendSide(mode).render(mode));
    std::vector<Expected> expected = kCommonFamilies;
    for (auto& e : modeFamilies(mode)) expected.push_back(e);
    for (const auto& e : expected) {
      INFO("family " << e.name);
      REQUIRE(families.contains(e.name));
      const Family& f = families.at(e.name);
      CHECK(f.type == e.type);
      CHECK(f.help.rfind("[ALPHA] ", 0) == 0);  // component-base's stability prefix
      CHECK(f.labelNames == std::set<std::set<std::string>>{e.labels});
    }
    // And no other upstream family: each mode registers only its own (kproxy serves the full
    // and partial sync histograms in every mode: docs/upstream-differences.md).
    for (const auto& [name, f] : families) {
      if (!name.starts_with("kubeproxy_") || name == "kubeproxy_sync_full_proxy_rules_duration_seconds" ||
          name == "kubeproxy_sync_partial_proxy_rules_duration_seconds")
        continue;
      INFO("family " << name);
      CHECK(std::any_of(expected.begin(), expected.end(), [&](const Expected& e) { return name == e.name; }));
    }
  }
}

TEST_CASE("upstream's names for plugin metrics: labels and values as upstream's, only in upstream's modes",
          "[unit][metrics]") {
  const BackendSide iptables("iptables");
  const std::string out = iptables.render("iptables");
  // family "ipv4" is ip_family "IPv4"; labels sorted as client_golang writes them; no mangle.
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"}") == "7");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv4\",table=\"filter\"}") == "7");
  CHECK(out.find("kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"mangle\"}") ==
        std::string::npos);
  CHECK(out.find("# HELP kubeproxy_sync_proxy_rules_iptables_last [ALPHA] Number of iptables rules written by "
                 "kube-proxy in last sync\n") != std::string::npos);
  // kproxy's own series stay, under kproxy_ and their own labels.
  CHECK(sampleValue(out, "kproxy_iptables_rules{family=\"ipv4\",table=\"mangle\"}") == "7");
  // The histogram keeps its buckets.
  CHECK(sampleValue(out, "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.002\"}") ==
        "1");
  CHECK(sampleValue(out, "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}") == "2");
  // The nfacct counters are the objects' packet counts.
  CHECK(sampleValue(out, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total") == "3");
  CHECK(sampleValue(out, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total") == "5");

  // The same plugin metrics in userspace mode: kproxy_ names only.
  const std::string userspace = kproxy::cli::renderUpstreamAliases("userspace", iptables.registry.collect());
  CHECK(userspace.empty());
  // A family without samples is not served, as upstream's vectors before a first observation.
  kproxy::plugins::PluginMetrics fresh;
  REQUIRE(fresh.registerMetric(kproxy::plugins::MetricType::kCounter, "kproxy_conntrack_reconciler_deleted_entries_total",
                               "help", {"ip_family"}));
  CHECK(kproxy::cli::renderUpstreamAliases("nftables", fresh.collect()).empty());
}

TEST_CASE("nfacct counters: an object the kernel does not answer for is left out; no client, nothing",
          "[unit][metrics]") {
  ops_test::QuietLog quiet;
  auto objects = std::make_unique<kproxy::kernel::FakeNfacct>();
  objects->objects["localhost_nps_accepted_pkts"] = {"localhost_nps_accepted_pkts", 9, 900};
  const kproxy::cli::NfacctMetrics one(std::move(objects));
  const std::string out = one.render();
  CHECK(sampleValue(out, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total") == "9");
  CHECK(out.find("kubeproxy_iptables_ct_state_invalid_dropped_packets_total") == std::string::npos);
  CHECK(kproxy::cli::NfacctMetrics(nullptr).render().empty());
}

TEST_CASE("the sync metrics carry one series per family the node runs", "[unit][metrics]") {
  ProxyMetrics singleStack("nftables", 1000.0, {"IPv4"});
  singleStack.observeSync(sync(kproxy::core::SyncKind::kFull, true, 3ms));
  const std::string v4 = singleStack.render(kproxy::core::ProxierStatus{}, {});
  CHECK(sampleValue(v4, "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}") == "1");
  CHECK(v4.find("ip_family=\"IPv6\"") == std::string::npos);

  ProxyMetrics dual("nftables", 1000.0, {"IPv4", "IPv6"});
  dual.observeSync(sync(kproxy::core::SyncKind::kFull, true, 3ms));
  const std::string both = dual.render(kproxy::core::ProxierStatus{}, {});
  // One sync programs both families: each family's series counts it.
  CHECK(sampleValue(both, "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}") == "1");
  CHECK(sampleValue(both, "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"}") == "1");
}

TEST_CASE("iptables mode counts failed partial restores, as upstream's fall back to a full one",
          "[unit][metrics]") {
  ProxyMetrics metrics("iptables", 1000.0, {"IPv4"});
  metrics.observeSync(sync(kproxy::core::SyncKind::kPartial, false, 1ms));
  metrics.observeSync(sync(kproxy::core::SyncKind::kFull, false, 1ms));
  metrics.observeSync(sync(kproxy::core::SyncKind::kPartial, true, 1ms));
  const std::string out = metrics.render(kproxy::core::ProxierStatus{}, {});
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}") == "2");
  CHECK(sampleValue(out, "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family=\"IPv4\"}") ==
        "1");
  // Not a family of nftables mode.
  ProxyMetrics nft("nftables", 1000.0, {"IPv4"});
  CHECK(nft.render(kproxy::core::ProxierStatus{}, {}).find("partial_restore_failures") == std::string::npos);
}

TEST_CASE("kubernetes_build_info names the Kubernetes release kproxy follows and its commit", "[unit][metrics]") {
  ProxyMetrics clean("nftables", 1000.0, {"IPv4"}, {"v1.34.4", "0123456789ab"});
  const std::string out = clean.render(kproxy::core::ProxierStatus{}, {});
  const std::string line = out.substr(out.find("\nkubernetes_build_info{") + 1);
  INFO(line.substr(0, line.find('\n')));
  CHECK(line.rfind("kubernetes_build_info{build_date=\"1970-01-01T00:00:00Z\",compiler=\"gcc\","
                   "git_commit=\"0123456789ab\",git_tree_state=\"clean\",git_version=\"v1.34.4\",go_version=\"\","
                   "major=\"1\",minor=\"34\",platform=\"linux/",
                   0) == 0);
  CHECK(line.substr(0, line.find('\n')).ends_with("} 1"));
  ProxyMetrics dirty("nftables", 1000.0, {"IPv4"}, {"v1.34.4", "0123456789ab-dirty"});
  const std::string d = dirty.render(kproxy::core::ProxierStatus{}, {});
  CHECK(d.find("git_commit=\"0123456789ab\",git_tree_state=\"dirty\"") != std::string::npos);
}

TEST_CASE("rest_client metrics: requests by code, method and host; request and rate-limiter latency",
          "[unit][metrics]") {
  kproxy::cli::RestClientMetrics rest;
  const std::string empty = rest.render();
  // Before any request: HELP and TYPE only, so a dashboard's query is valid from the start.
  CHECK(empty.find("# TYPE rest_client_requests_total counter\n") != std::string::npos);
  CHECK(empty.find("# TYPE rest_client_request_duration_seconds histogram\n") != std::string::npos);
  CHECK(empty.find("# TYPE rest_client_rate_limiter_duration_seconds histogram\n") != std::string::npos);

  rest.requestDone("GET", "10.96.0.1:443", "200");
  rest.requestDone("GET", "10.96.0.1:443", "200");
  rest.requestDone("GET", "10.96.0.1:443", kproxy::apiwatch::kRequestErrorCode);
  rest.requestDone("POST", "10.96.0.1:443", "201");
  rest.requestLatency("GET", "10.96.0.1:443", 0.02);
  rest.requestLatency("GET", "10.96.0.1:443", 0.3);
  rest.rateLimiterWait("GET", "10.96.0.1:443", 0);
  const std::string out = rest.render();
  CHECK(sampleValue(out, "rest_client_requests_total{code=\"200\",host=\"10.96.0.1:443\",method=\"GET\"}") == "2");
  CHECK(sampleValue(out, "rest_client_requests_total{code=\"<error>\",host=\"10.96.0.1:443\",method=\"GET\"}") ==
        "1");
  CHECK(sampleValue(out, "rest_client_requests_total{code=\"201\",host=\"10.96.0.1:443\",method=\"POST\"}") == "1");
  CHECK(sampleValue(out, "rest_client_request_duration_seconds_bucket{host=\"10.96.0.1:443\",verb=\"GET\",le=\"0.025\"}") ==
        "1");
  CHECK(sampleValue(out, "rest_client_request_duration_seconds_bucket{host=\"10.96.0.1:443\",verb=\"GET\",le=\"60\"}") ==
        "2");
  CHECK(sampleValue(out, "rest_client_request_duration_seconds_count{host=\"10.96.0.1:443\",verb=\"GET\"}") == "2");
  CHECK(sampleValue(out, "rest_client_rate_limiter_duration_seconds_bucket{host=\"10.96.0.1:443\",verb=\"GET\",le=\"0.005\"}") ==
        "1");
  const auto families = parseFamilies(out);
  CHECK(families.at("rest_client_requests_total").labelNames ==
        std::set<std::set<std::string>>{{"code", "method", "host"}});
  CHECK(families.at("rest_client_request_duration_seconds").labelNames ==
        std::set<std::set<std::string>>{{"verb", "host"}});
  CHECK(families.at("rest_client_rate_limiter_duration_seconds").labelNames ==
        std::set<std::set<std::string>>{{"verb", "host"}});
  CHECK(kproxy::cli::restClientLatencyHistogram().bounds ==
        std::vector<double>{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0});
}
