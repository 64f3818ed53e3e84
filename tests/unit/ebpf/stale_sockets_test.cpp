// The stale-socket cleanup over FakeKernelMaps (stale_sockets.h, status.cpp): steered sockets
// as the flows they stand for, the conntrack cleaner's rule over them (an endpoint that no
// longer serves ends its sockets, a terminating one that still serves does not), when it runs,
// what it counts and logs, a kernel that cannot end sockets, a namespace that cannot be
// walked, and --dry-run's printout.

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../nftables/service_ports.h"
#include "kproxy/ebpf/backend.h"
#include "kproxy/ebpf/stale_sockets.h"
#include "kproxy/plugins/plugin_metrics.h"
#include "snapshot_bridge.h"

using namespace kproxy;
using namespace kproxy::ebpf;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;
using kproxy::nftables::testing::setEndpoints;

namespace {

constexpr const char* kPodA = "10.244.1.5";
constexpr const char* kPodB = "10.244.1.6";

SteeredSocket steered(std::uint64_t cookie, std::uint16_t localPort, const char* pod, const char* service = "10.96.0.10",
                      std::uint16_t servicePort = 53) {
  return SteeredSocket{cookie, *SocketAddress::of("10.200.0.1", localPort), *SocketAddress::of(service, servicePort),
                       *SocketAddress::of(pod, 5353)};
}

sdk::ServicePort dns(std::vector<sdk::Endpoint> eps) {
  return clusterIP("ns", "dns", "10.96.0.10", 53, std::move(eps), sdk::Protocol::kUDP, "dns");
}

/// A backend over a fake with two steered sockets, one per pod, and the host's metrics.
struct Cleanup {
  plugins::PluginMetrics metrics;
  kproxy_host_api api = plugins::makeHostApi(&metrics);
  FakeKernelMaps* kernel = nullptr;
  std::unique_ptr<EbpfBackend> backend;
  std::vector<sdk::ServicePort> both{dns({endpoint(kPodA, 5353), endpoint(kPodB, 5353)})};

  Cleanup() {
    auto fake = std::make_unique<FakeKernelMaps>();
    kernel = fake.get();
    kernel->sockets = {steered(1, 40001, kPodA), steered(2, 40002, kPodB)};
    backend = std::make_unique<EbpfBackend>(sdk::Host(&api), BackendSettings{}, std::move(fake),
                                            std::make_unique<nftables::FakeKernelNftables>());
    auto registered = EbpfBackend::registerMetrics(sdk::Host(&api));
    REQUIRE(registered);
    backend->useMetrics(*registered);
  }
  backends::ConntrackCleanupReport after(const std::vector<sdk::ServicePort>& next,
                                         const std::vector<sdk::ChangedKey>& changed = {{net::Family::kIPv4, "ns/dns:dns"}},
                                         bool full = false) {
    auto report = backend->endStaleSockets(both, next, changed, full);
    INFO((report ? "" : report.error().message()));
    REQUIRE(report);
    return *report;
  }
  std::vector<std::uint64_t> cookiesLeft() const {
    std::vector<std::uint64_t> out;
    for (const auto& s : kernel->sockets) out.push_back(s.cookie);
    return out;
  }
  double sample(const std::string& name, const std::vector<std::string>& labels) const {
    for (const auto& family : metrics.collect())
      if (family.name == name)
        if (auto it = family.samples.find(labels); it != family.samples.end()) return it->second;
    return -1;
  }
};

}  // namespace

TEST_CASE("stale sockets: a steered socket stands for the flow a netfilter mode would hold", "[unit][ebpf][stale]") {
  const auto flow = flowOf(steered(7, 40000, kPodA));
  CHECK(flow.str() == "udp 10.200.0.1:40000->10.96.0.10:53 reply 10.244.1.5:5353->10.200.0.1:40000");
  const SteeredSocket v6{8, *SocketAddress::of("fd00::1", 40000), *SocketAddress::of("fd00:96::10", 53),
                         *SocketAddress::of("fd00:244::5", 5353)};
  CHECK(flowOf(v6).family == net::Family::kIPv6);
  CHECK(flowOf(v6).original.dstIP == "fd00:96::10");
  CHECK(flowOf(v6).reply.srcIP == "fd00:244::5");
}

TEST_CASE("stale sockets: an endpoint that no longer serves ends its sockets, and only those",
          "[unit][ebpf][stale]") {
  Cleanup c;
  SECTION("both endpoints still serve: nothing ends") {
    auto report = c.after(c.both);
    CHECK(report.ran);
    CHECK(report.listed == 2);
    CHECK(report.stale.empty());
    CHECK(c.cookiesLeft() == std::vector<std::uint64_t>{1, 2});
  }
  SECTION("pod A removed: its socket ends, pod B's stays") {
    auto report = c.after({dns({endpoint(kPodB, 5353)})});
    CHECK(report.stale.size() == 1);
    CHECK(report.deleted == 1);
    CHECK(c.cookiesLeft() == std::vector<std::uint64_t>{2});
    CHECK(c.sample("kproxy_ebpf_socket_operations_total", {"listed"}) == 2);
    CHECK(c.sample("kproxy_ebpf_socket_operations_total", {"ended"}) == 1);
    CHECK(c.sample("kproxy_ebpf_socket_operation_failures_total", {"kernel"}) == 0);
  }
  SECTION("pod A terminating but serving: as conntrack, its socket stays") {
    auto a = endpoint(kPodA, 5353);
    a.ready = false;
    a.terminating = true;
    auto port = dns({a, endpoint(kPodB, 5353)});
    port.clusterEndpoints = {endpoint(kPodB, 5353)};
    port.allReachableEndpoints = port.clusterEndpoints;
    auto report = c.after({port});
    CHECK(report.stale.empty());
    CHECK(c.cookiesLeft() == std::vector<std::uint64_t>{1, 2});
  }
  SECTION("the service removed: every socket steered from it ends") {
    auto report = c.after({});
    CHECK(report.deleted == 2);
    CHECK(c.cookiesLeft().empty());
  }
  SECTION("a socket steered from another service is judged by that service's endpoints") {
    c.kernel->sockets.push_back(steered(3, 40003, kPodA, "10.96.0.20", 53));
    auto other = clusterIP("ns", "other", "10.96.0.20", 53, {endpoint(kPodA, 5353)}, sdk::Protocol::kUDP, "dns");
    c.both.push_back(other);
    CHECK(c.after({dns({endpoint(kPodB, 5353)}), other}).deleted == 1);
    CHECK(c.cookiesLeft() == std::vector<std::uint64_t>{2, 3});
  }
}

TEST_CASE("stale sockets: the cleanup runs after the syncs the conntrack cleanup runs after", "[unit][ebpf][stale]") {
  Cleanup c;
  auto web = clusterIP("ns", "web", "10.96.0.30", 80, {endpoint(kPodA, 8080)});
  SECTION("a partial sync that changed no UDP port lists nothing") {
    auto report = c.backend->endStaleSockets({web, dns({})}, {web, dns({})}, {{net::Family::kIPv4, "ns/web:p"}}, false);
    REQUIRE(report);
    CHECK_FALSE(report->ran);
    CHECK(c.sample("kproxy_ebpf_socket_operations_total", {"listed"}) == 0);
    CHECK(c.cookiesLeft() == std::vector<std::uint64_t>{1, 2});
  }
  SECTION("a full sync with a UDP port lists, and ends what is stale") {
    auto report = c.backend->endStaleSockets({}, {web, dns({endpoint(kPodA, 5353)})}, {}, true);
    REQUIRE(report);
    CHECK(report->ran);
    CHECK(c.cookiesLeft() == std::vector<std::uint64_t>{1});
  }
}

TEST_CASE("stale sockets: a kernel that cannot end sockets is warned of once and counted; a refusal fails no sync",
          "[unit][ebpf][stale]") {
  Cleanup c;
  SECTION("no bpf_sock_destroy") {
    c.kernel->socketErrno = EOPNOTSUPP;
    CHECK_FALSE(c.backend->endStaleSockets(c.both, {}, {{net::Family::kIPv4, "ns/dns:dns"}}, false));
    CHECK_FALSE(c.backend->endStaleSockets(c.both, {}, {{net::Family::kIPv4, "ns/dns:dns"}}, false));
    CHECK(c.sample("kproxy_ebpf_socket_operation_failures_total", {"unsupported"}) == 2);
    CHECK(c.sample("kproxy_ebpf_socket_operation_failures_total", {"kernel"}) == 0);
  }
  SECTION("a refused pass is a kernel failure, and the next cleanup tries again") {
    c.kernel->socketErrno = EIO;
    CHECK_FALSE(c.backend->endStaleSockets(c.both, {}, {{net::Family::kIPv4, "ns/dns:dns"}}, false));
    CHECK(c.sample("kproxy_ebpf_socket_operation_failures_total", {"kernel"}) == 1);
    c.kernel->socketErrno = 0;
    auto report = c.after({});
    CHECK(report.deleted == 2);
  }
  SECTION("a network namespace that cannot be walked is counted; the others' sockets are cleaned") {
    c.kernel->skippedNamespaces = {"/proc/4242/ns/net: joining it: Invalid argument"};
    auto report = c.after({dns({endpoint(kPodB, 5353)})});
    CHECK(report.deleted == 1);
    CHECK(c.cookiesLeft() == std::vector<std::uint64_t>{2});
    CHECK(c.sample("kproxy_ebpf_socket_operation_failures_total", {"namespace"}) == 1);
    CHECK(c.sample("kproxy_ebpf_socket_operation_failures_total", {"kernel"}) == 0);
    c.kernel->skippedNamespaces.clear();
    (void)c.after({dns({endpoint(kPodB, 5353)})});
    CHECK(c.sample("kproxy_ebpf_socket_operation_failures_total", {"namespace"}) == 1);
  }
}

TEST_CASE("stale sockets: --dry-run prints each socket it would end", "[unit][ebpf][stale]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  auto fake = std::make_unique<FakeKernelMaps>();
  fake->sockets = {steered(1, 40001, kPodA), steered(2, 40002, kPodB)};
  BackendSettings settings;
  settings.dryRun = true;
  EbpfBackend backend(sdk::Host(nullptr), settings, std::make_unique<PrintingKernelMaps>(std::move(fake), out),
                      std::make_unique<nftables::FakeKernelNftables>());
  auto report = backend.endStaleSockets({dns({endpoint(kPodA, 5353), endpoint(kPodB, 5353)})},
                                        {dns({endpoint(kPodB, 5353)})}, {{net::Family::kIPv4, "ns/dns:dns"}}, false);
  REQUIRE(report);
  std::rewind(out);
  char buf[4096] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, out);
  std::fclose(out);
  CHECK(std::string(buf, n) == "end socket cookie=1 10.200.0.1:40001 -> 10.96.0.10:53 (10.244.1.5:5353)\n");
}
