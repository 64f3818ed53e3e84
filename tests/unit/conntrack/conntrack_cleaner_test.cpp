// ConntrackCleaner against FakeConntrackTable: one case per rule of upstream's
// CleanStaleEntries (pkg/proxy/conntrack/cleanup.go) and of when it runs.

#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>

#include "kproxy/backends/common/conntrack_cleaner.h"
#include "kproxy/kernel/conntrack_table.h"
#include "kproxy/plugin/testing.h"

using namespace kproxy;
using backends::ConntrackCleaner;
using backends::ConntrackCleanupOptions;
using kernel::ConntrackFlow;
using kernel::FakeConntrackTable;

namespace {

sdk::Endpoint endpoint(const std::string& ip, std::int32_t port, bool serving = true) {
  sdk::Endpoint e;
  e.ip = ip;
  e.port = port;
  e.ready = serving;
  e.serving = serving;
  return e;
}

sdk::ServicePort servicePort(const std::string& key, const std::string& clusterIP, std::int32_t port,
                             std::vector<sdk::Endpoint> endpoints,
                             sdk::Protocol protocol = sdk::Protocol::kUDP) {
  sdk::ServicePort p;
  p.family = clusterIP.find(':') == std::string::npos ? net::Family::kIPv4 : net::Family::kIPv6;
  p.protocol = protocol;
  p.key = key;
  p.clusterIP = clusterIP;
  p.port = port;
  for (const auto& e : endpoints)
    if (e.serving) p.clusterEndpoints.push_back(e);
  p.allReachableEndpoints = p.clusterEndpoints;
  p.allEndpoints = std::move(endpoints);
  p.hasAnyEndpoints = !p.allEndpoints.empty();
  return p;
}

/// A flow from client:sport to dst:dport, answered by replySrc:replySport.
ConntrackFlow flow(const std::string& client, std::uint16_t sport, const std::string& dst,
                   std::uint16_t dport, const std::string& replySrc, std::uint16_t replySport,
                   core::Protocol protocol = core::Protocol::kUDP) {
  ConntrackFlow f;
  f.family = client.find(':') == std::string::npos ? net::Family::kIPv4 : net::Family::kIPv6;
  f.protocol = protocol;
  f.original = {client, dst, sport, dport};
  f.reply = {replySrc, client, replySport, sport};
  return f;
}

bool holds(const FakeConntrackTable& table, const ConntrackFlow& f) {
  return std::find(table.flows.begin(), table.flows.end(), f) != table.flows.end();
}

}  // namespace

TEST_CASE("a flow to the ClusterIP answered by a removed endpoint is deleted, one to a kept endpoint stays",
          "[unit]") {
  FakeConntrackTable table;
  auto toRemoved = flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.2", 5353);
  auto toKept = flow("10.0.0.1", 40001, "172.30.0.10", 53, "10.1.0.1", 5353);
  table.flows = {toRemoved, toKept};
  std::vector<sdk::ServicePort> next{servicePort("ns/dns:dns", "172.30.0.10", 53, {endpoint("10.1.0.1", 5353)})};

  ConntrackCleaner cleaner(table);
  auto report = cleaner.reconcile(next);
  REQUIRE(report.has_value());
  CHECK(report->ran);
  CHECK(report->listed == 2);
  CHECK(report->deleted == 1);
  REQUIRE(table.removed.size() == 1);
  CHECK(table.removed[0] == toRemoved);
  CHECK(holds(table, toKept));
}

TEST_CASE("flows to LoadBalancer VIPs and external IPs follow the service's serving endpoints", "[unit]") {
  FakeConntrackTable table;
  auto lbStale = flow("203.0.113.5", 40000, "198.51.100.7", 53, "10.1.0.9", 53);
  auto lbKept = flow("203.0.113.5", 40001, "198.51.100.7", 53, "10.1.0.1", 53);
  auto extStale = flow("203.0.113.5", 40002, "198.51.100.8", 53, "10.1.0.9", 53);
  auto extKept = flow("203.0.113.5", 40003, "198.51.100.8", 53, "10.1.0.1", 53);
  table.flows = {lbStale, lbKept, extStale, extKept};
  auto port = servicePort("ns/lb:dns", "172.30.0.11", 53, {endpoint("10.1.0.1", 53)});
  port.type = sdk::ServiceType::kLoadBalancer;
  port.loadBalancerIPs = {"198.51.100.7"};
  port.externalIPs = {"198.51.100.8"};

  ConntrackCleaner cleaner(table);
  REQUIRE(cleaner.reconcile(std::vector{port}).has_value());
  CHECK(table.removed == std::vector{lbStale, extStale});
  CHECK(holds(table, lbKept));
  CHECK(holds(table, extKept));
}

TEST_CASE("a flow to the NodePort on any address answered by a non-endpoint is deleted", "[unit]") {
  FakeConntrackTable table;
  auto viaNodeIP = flow("203.0.113.5", 40000, "192.168.50.10", 30053, "10.1.0.9", 53);
  auto viaOtherIP = flow("203.0.113.5", 40001, "192.168.60.10", 30053, "10.1.0.9", 53);
  auto kept = flow("203.0.113.5", 40002, "192.168.50.10", 30053, "10.1.0.1", 53);
  auto otherPort = flow("203.0.113.5", 40003, "192.168.50.10", 30054, "10.1.0.9", 53);
  table.flows = {viaNodeIP, viaOtherIP, kept, otherPort};
  auto port = servicePort("ns/np:dns", "172.30.0.12", 53, {endpoint("10.1.0.1", 53)});
  port.type = sdk::ServiceType::kNodePort;
  port.nodePort = 30053;

  ConntrackCleaner cleaner(table);
  REQUIRE(cleaner.reconcile(std::vector{port}).has_value());
  CHECK(table.removed == std::vector{viaNodeIP, viaOtherIP});
  CHECK(holds(table, kept));
  CHECK(holds(table, otherPort));
}

TEST_CASE("a never-DNAT'ed flow (service had no endpoints) is deleted", "[unit]") {
  FakeConntrackTable table;
  // Sent while the service had no endpoints: nothing rewrote it, the reply comes "from" the VIP.
  auto blackholed = flow("10.0.0.1", 40000, "172.30.0.10", 53, "172.30.0.10", 53);
  table.flows = {blackholed};
  ConntrackCleaner cleaner(table);

  SECTION("still no endpoints") {
    REQUIRE(cleaner.reconcile(std::vector{servicePort("ns/dns:dns", "172.30.0.10", 53, {})}).has_value());
    CHECK(table.removed == std::vector{blackholed});
  }
  SECTION("an endpoint appeared") {
    std::vector<sdk::ServicePort> before{servicePort("ns/dns:dns", "172.30.0.10", 53, {})};
    std::vector<sdk::ServicePort> after{servicePort("ns/dns:dns", "172.30.0.10", 53, {endpoint("10.1.0.1", 53)})};
    auto report = cleaner.afterSync(before, after, {{net::Family::kIPv4, "ns/dns:dns"}}, false);
    REQUIRE(report.has_value());
    CHECK(report->ran);
    CHECK(table.removed == std::vector{blackholed});
  }
}

TEST_CASE("a service port with no serving endpoint loses every flow, to its addresses and its NodePort",
          "[unit]") {
  FakeConntrackTable table;
  auto toVip = flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.1", 53);
  auto toNodePort = flow("203.0.113.5", 40001, "192.168.50.10", 30053, "10.1.0.1", 53);
  auto otherService = flow("10.0.0.1", 40002, "172.30.0.11", 53, "10.1.0.5", 53);
  table.flows = {toVip, toNodePort, otherService};
  // Its only endpoint stopped serving (or is gone): every flow goes to a pod that does not serve,
  // and a one-way sender would keep its flow alive and be blackholed (kubernetes#139629).
  auto port = servicePort("ns/dns:dns", "172.30.0.10", 53, {endpoint("10.1.0.1", 53, false)});
  port.type = sdk::ServiceType::kNodePort;
  port.nodePort = 30053;
  auto other = servicePort("ns/other:dns", "172.30.0.11", 53, {endpoint("10.1.0.5", 53)});
  ConntrackCleaner cleaner(table);
  REQUIRE(cleaner.reconcile(std::vector{port, other}).has_value());
  CHECK(table.removed == std::vector{toVip, toNodePort});
  CHECK(holds(table, otherService));
}

TEST_CASE("a removed UDP service port's flows go, unless a remaining port serves the same frontend",
          "[unit]") {
  FakeConntrackTable table;
  auto toGone = flow("10.0.0.1", 40000, "172.30.0.50", 53, "10.1.0.7", 53);
  auto toGoneNodePort = flow("203.0.113.5", 40001, "192.168.50.10", 30050, "10.1.0.7", 53);
  // The other removed port's ClusterIP was handed to a new service in the same sync.
  auto toReused = flow("10.0.0.1", 40002, "172.30.0.60", 53, "10.1.0.8", 53);
  table.flows = {toGone, toGoneNodePort, toReused};
  auto gone = servicePort("ns/old:dns", "172.30.0.50", 53, {endpoint("10.1.0.7", 53)});
  gone.type = sdk::ServiceType::kNodePort;
  gone.nodePort = 30050;
  auto goneToo = servicePort("ns/older:dns", "172.30.0.60", 53, {endpoint("10.1.0.1", 53)});
  auto reused = servicePort("ns/new:dns", "172.30.0.60", 53, {endpoint("10.1.0.8", 53)});
  ConntrackCleaner cleaner(table);

  SECTION("the partial sync that removed them") {
    auto report = cleaner.afterSync({gone, goneToo}, {reused},
                                    {{net::Family::kIPv4, "ns/old:dns"}, {net::Family::kIPv4, "ns/older:dns"},
                                     {net::Family::kIPv4, "ns/new:dns"}},
                                    false);
    REQUIRE(report.has_value());
    CHECK(report->ran);
    CHECK(table.removed == std::vector{toGone, toGoneNodePort});
    CHECK(holds(table, toReused));
  }
  SECTION("a later sync that did not change them knows nothing of them") {
    auto report = cleaner.afterSync({reused}, {reused}, {{net::Family::kIPv4, "ns/new:dns"}}, false);
    REQUIRE(report.has_value());
    CHECK(report->ran);
    CHECK(table.removed.empty());
  }
}

TEST_CASE("serving means serving: a non-serving endpoint's flows go, a terminating serving one's stay",
          "[unit]") {
  FakeConntrackTable table;
  auto toNotServing = flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.2", 53);
  auto toTerminating = flow("10.0.0.1", 40001, "172.30.0.10", 53, "10.1.0.3", 53);
  table.flows = {toNotServing, toTerminating};
  auto terminating = endpoint("10.1.0.3", 53);
  terminating.ready = false;
  terminating.terminating = true;
  auto port = servicePort("ns/dns:dns", "172.30.0.10", 53,
                          {endpoint("10.1.0.1", 53), endpoint("10.1.0.2", 53, false), terminating});
  // Traffic policy and local endpoints do not narrow the set.
  port.externalPolicyLocal = true;
  port.localEndpoints.clear();
  ConntrackCleaner cleaner(table);
  REQUIRE(cleaner.reconcile(std::vector{port}).has_value());
  CHECK(table.removed == std::vector{toNotServing});
  CHECK(holds(table, toTerminating));
}

TEST_CASE("flows of other addresses, ports and protocols are never touched", "[unit]") {
  FakeConntrackTable table;
  auto otherPort = flow("10.0.0.1", 40000, "172.30.0.10", 54, "10.1.0.9", 54);
  auto otherIP = flow("10.0.0.1", 40001, "172.30.0.99", 53, "10.1.0.9", 53);
  auto tcp = flow("10.0.0.1", 40002, "172.30.0.10", 53, "10.1.0.9", 53, core::Protocol::kTCP);
  table.flows = {otherPort, otherIP, tcp};
  std::vector<sdk::ServicePort> next{
      servicePort("ns/dns:dns", "172.30.0.10", 53, {endpoint("10.1.0.1", 53)}),
      servicePort("ns/dns:dns-tcp", "172.30.0.10", 53, {endpoint("10.1.0.1", 53)}, sdk::Protocol::kTCP)};
  ConntrackCleaner cleaner(table);
  auto report = cleaner.reconcile(next);
  REQUIRE(report.has_value());
  CHECK(report->stale.empty());
  CHECK(table.removed.empty());
  CHECK(table.flows.size() == 3);
}

TEST_CASE("SCTP is cleaned only when asked for (upstream cleans UDP only)", "[unit]") {
  auto stale = flow("10.0.0.1", 40000, "172.30.0.20", 3868, "10.1.0.9", 3868, core::Protocol::kSCTP);
  std::vector<sdk::ServicePort> next{
      servicePort("ns/diameter:d", "172.30.0.20", 3868, {endpoint("10.1.0.1", 3868)}, sdk::Protocol::kSCTP)};

  FakeConntrackTable byDefault;
  byDefault.flows = {stale};
  ConntrackCleaner udpOnly(byDefault);
  REQUIRE(udpOnly.reconcile(next).has_value());
  CHECK(byDefault.removed.empty());

  FakeConntrackTable withSctp;
  withSctp.flows = {stale};
  ConntrackCleaner both(withSctp, ConntrackCleanupOptions{{sdk::Protocol::kUDP, sdk::Protocol::kSCTP}});
  REQUIRE(both.reconcile(next).has_value());
  CHECK(withSctp.removed == std::vector{stale});
}

TEST_CASE("IPv6: addresses are compared in canonical form, per family", "[unit]") {
  FakeConntrackTable table;
  auto stale = flow("2001:db8::1", 40000, "fd00:30::10", 53, "fd00:1::2", 53);
  auto kept = flow("2001:db8::1", 40001, "fd00:30::10", 53, "fd00:1::1", 53);
  // Same numbers in IPv4: a different family, not this service.
  auto v4 = flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.2", 53);
  table.flows = {stale, kept, v4};
  std::vector<sdk::ServicePort> next{
      servicePort("ns/dns:dns", "fd00:30:0:0::10", 53, {endpoint("fd00:1:0::1", 53)})};
  ConntrackCleaner cleaner(table);
  REQUIRE(cleaner.reconcile(next).has_value());
  CHECK(table.removed == std::vector{stale});
  CHECK(holds(table, kept));
  CHECK(holds(table, v4));
}

TEST_CASE("cleanup runs only when a changed service port uses a cleaned protocol, or on full syncs",
          "[unit]") {
  FakeConntrackTable table;
  auto stale = flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.2", 53);
  table.flows = {stale};
  auto udp = servicePort("ns/dns:dns", "172.30.0.10", 53, {endpoint("10.1.0.1", 53)});
  auto tcp = servicePort("ns/web:http", "172.30.0.11", 80, {endpoint("10.1.0.5", 80)}, sdk::Protocol::kTCP);
  ConntrackCleaner cleaner(table);

  SECTION("only a TCP service changed: the table is not read") {
    auto report = cleaner.afterSync({udp, tcp}, {udp, tcp}, {{net::Family::kIPv4, "ns/web:http"}}, false);
    REQUIRE(report.has_value());
    CHECK_FALSE(report->ran);
    CHECK(table.listCalls == 0);
  }
  SECTION("nothing changed: the table is not read") {
    auto report = cleaner.afterSync({udp}, {udp}, {}, false);
    REQUIRE(report.has_value());
    CHECK_FALSE(report->ran);
    CHECK(table.listCalls == 0);
  }
  SECTION("a UDP service port that was removed still triggers the reconcile of the others") {
    auto gone = servicePort("ns/old:dns", "172.30.0.50", 53, {endpoint("10.1.0.7", 53)});
    auto report = cleaner.afterSync({udp, gone}, {udp}, {{net::Family::kIPv4, "ns/old:dns"}}, false);
    REQUIRE(report.has_value());
    CHECK(report->ran);
    CHECK(table.removed == std::vector{stale});
  }
  SECTION("a full sync with a UDP service reconciles") {
    auto report = cleaner.afterSync({}, {udp, tcp}, {}, true);
    REQUIRE(report.has_value());
    CHECK(report->ran);
    CHECK(table.removed == std::vector{stale});
  }
  SECTION("a full sync without UDP services does not read the table") {
    auto report = cleaner.afterSync({}, {tcp}, {}, true);
    REQUIRE(report.has_value());
    CHECK_FALSE(report->ran);
    CHECK(table.listCalls == 0);
  }
}

TEST_CASE("table errors come back as errors", "[unit]") {
  FakeConntrackTable table;
  table.flows = {flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.2", 53)};
  std::vector<sdk::ServicePort> next{servicePort("ns/dns:dns", "172.30.0.10", 53, {endpoint("10.1.0.1", 53)})};
  ConntrackCleaner cleaner(table);
  SECTION("listing") {
    table.failList = true;
    auto report = cleaner.reconcile(next);
    REQUIRE_FALSE(report.has_value());
    CHECK(report.error().category == core::ErrorCategory::kKernel);
  }
  SECTION("deleting") {
    table.failRemove = true;
    REQUIRE_FALSE(cleaner.reconcile(next).has_value());
    CHECK(table.flows.size() == 1);
  }
}

TEST_CASE("a flow prints with both directions", "[unit]") {
  auto f = flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.2", 5353);
  CHECK(f.str() == "udp 10.0.0.1:40000->172.30.0.10:53 reply 10.1.0.2:5353->10.0.0.1:40000");
}

TEST_CASE("--dry-run's conntrack table lists the real flows, prints each deletion and makes none", "[unit]") {
  auto inner = std::make_unique<FakeConntrackTable>();
  FakeConntrackTable& real = *inner;
  auto stale = flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.2", 5353);
  auto v6 = flow("fd00::1", 40001, "fd00:30::10", 53, "fd00:1::2", 5353);
  v6.zone = 7;
  real.flows = {stale, v6};
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  kproxy::kernel::PrintingConntrackTable printing(std::move(inner), out);

  auto listed = printing.list(net::Family::kIPv4, core::Protocol::kUDP);
  REQUIRE(listed);
  CHECK(listed->size() == 1);
  CHECK(real.listCalls == 1);
  auto removed = printing.remove({stale, v6});
  REQUIRE(removed);
  CHECK(*removed == 2);
  CHECK(real.flows.size() == 2);  // nothing deleted
  CHECK(real.removed.empty());

  std::rewind(out);
  std::string printed;
  for (int c; (c = std::fgetc(out)) != EOF;) printed.push_back(static_cast<char>(c));
  std::fclose(out);
  CHECK(printed ==
        "conntrack -D -f ipv4 -p udp -s 10.0.0.1 --sport 40000 -d 172.30.0.10 --dport 53\n"
        "conntrack -D -f ipv6 -p udp -s fd00::1 --sport 40001 -d fd00:30::10 --dport 53 -w 7\n");
}

TEST_CASE("each family that required a cleanup is reconciled and reported on its own, as upstream's "
          "per-family proxiers",
          "[unit]") {
  FakeConntrackTable table;
  auto stale4 = flow("10.0.0.1", 40000, "172.30.0.10", 53, "10.1.0.2", 53);
  auto stale6 = flow("fd00::1", 40000, "fd00:30::10", 53, "fd00:1::2", 53);
  table.flows = {stale4, stale6};
  auto dns4 = servicePort("ns/dns:dns", "172.30.0.10", 53, {endpoint("10.1.0.1", 53)});
  auto dns6 = servicePort("ns/dns:dns", "fd00:30::10", 53, {endpoint("fd00:1::1", 53)});
  ConntrackCleaner cleaner(table);

  SECTION("a partial sync that changed an IPv4 port reconciles IPv4 only") {
    auto report = cleaner.afterSync({dns4, dns6}, {dns4, dns6}, {{net::Family::kIPv4, "ns/dns:dns"}}, false);
    REQUIRE(report.has_value());
    REQUIRE(report->families.size() == 1);
    CHECK(report->families[0].family == net::Family::kIPv4);
    CHECK(report->families[0].deleted == 1);
    CHECK(report->families[0].seconds >= 0);
    CHECK(table.removed == std::vector{stale4});
  }
  SECTION("a full sync reconciles every family with a cleaned port") {
    auto report = cleaner.afterSync({}, {dns4, dns6}, {}, true);
    REQUIRE(report.has_value());
    REQUIRE(report->families.size() == 2);
    CHECK(report->families[0].family == net::Family::kIPv4);
    CHECK(report->families[1].family == net::Family::kIPv6);
    CHECK(report->families[1].deleted == 1);
    CHECK(report->deleted == 2);
  }
}

TEST_CASE("the reconciler metrics observe each family reconciled, under upstream's labels", "[unit]") {
  sdk::testing::FakeHost host;
  auto metrics = backends::ConntrackReconcilerMetrics::registerWith(sdk::Host(host.api()));
  REQUIRE(metrics.has_value());
  backends::ConntrackCleanupReport report;
  report.ran = true;
  report.families = {{net::Family::kIPv4, 0.25, 3}, {net::Family::kIPv6, 0.5, 0}};
  metrics->observe(report);
  metrics->observe(report);
  using Metrics = backends::ConntrackReconcilerMetrics;
  CHECK(host.metric(Metrics::kDeletedName, {"IPv4"}) == 6);
  CHECK(host.metric(Metrics::kDeletedName, {"IPv6"}) == 0);
  auto v6 = host.observed(Metrics::kDurationName, {"IPv6"});
  REQUIRE(v6.has_value());
  CHECK(v6->count == 2);
  CHECK(v6->sum == 1.0);
  // A cleanup that did not run observes nothing.
  metrics->observe(backends::ConntrackCleanupReport{});
  CHECK(host.observed(Metrics::kDurationName, {"IPv4"})->count == 2);
}
