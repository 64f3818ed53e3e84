// EbpfRenderer: which addresses of a service port get an element, with which pool, and the
// slots of each pool.

#include <catch2/catch.hpp>

#include <algorithm>

#include "../nftables/service_ports.h"
#include "map_values.h"
#include "kproxy/ebpf/renderer.h"

using namespace kproxy;
using namespace kproxy::ebpf;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;
using kproxy::ebpf::testing::at;
using kproxy::ebpf::testing::key;

namespace {

const ServiceValue* find(const PortMaps& maps, const ServiceKey& k) {
  for (const auto& [sk, v] : maps.services)
    if (sk == k) return &v;
  return nullptr;
}

EbpfRenderer renderer(std::vector<std::string> nodeAddresses = {}) {
  EbpfRenderer r{RenderConfig{}};
  sdk::NodeInfo node;
  node.addresses = std::move(nodeAddresses);
  node.nodePortAddresses.resolved = true;
  node.nodePortAddresses.allLocalIPv4 = true;
  node.nodePortAddresses.allLocalIPv6 = true;
  r.setNode(node);
  return r;
}

}  // namespace

TEST_CASE("a ClusterIP gets one element counting the cluster pool's slots", "[unit][ebpf][renderer]") {
  auto port = clusterIP("ns", "web", "10.96.0.10", 80, {endpoint("10.244.1.5", 8080), endpoint("10.244.2.6", 8080)});
  PortMaps maps = renderer().render(port);
  maps.setId(7);
  REQUIRE(maps.services.size() == 1);
  CHECK(maps.services[0].first == key("10.96.0.10", 80));
  CHECK(maps.services[0].second == ServiceValue{7, 2, 0, 0, 0});
  REQUIRE(maps.slots.size() == 2);
  CHECK(maps.slots[0] == std::pair{SlotKey{7, 0}, at("10.244.1.5", 8080)});
  CHECK(maps.slots[1] == std::pair{SlotKey{7, 1}, at("10.244.2.6", 8080)});
  CHECK(maps.services[0].first.toText() == "tcp 10.96.0.10:80");
}

TEST_CASE("a UDP and an IPv6 service port keep their protocol and family", "[unit][ebpf][renderer]") {
  auto udp = clusterIP("ns", "dns", "10.96.0.53", 53, {endpoint("10.244.1.5", 5353)}, sdk::Protocol::kUDP);
  CHECK(renderer().render(udp).services.at(0).first == key("10.96.0.53", 53, kProtoUDP));
  auto v6 = clusterIP("ns", "web6", "fd00:96::10", 80, {endpoint("fd00:244::5", 8080)});
  PortMaps maps = renderer().render(v6);
  CHECK(maps.services.at(0).first.toText() == "tcp [fd00:96::10]:80");
  CHECK(maps.slots.at(0).second == at("fd00:244::5", 8080));
}

TEST_CASE("internalTrafficPolicy Local picks from the local pool's slots", "[unit][ebpf][renderer]") {
  auto port = clusterIP("ns", "web", "10.96.0.10", 80, {endpoint("10.244.1.5", 8080, true), endpoint("10.244.2.6", 8080)});
  port.internalPolicyLocal = true;
  PortMaps maps = renderer().render(port);
  maps.setId(3);
  REQUIRE(maps.services.size() == 1);
  CHECK(maps.services[0].second == ServiceValue{3, 0, 1, kFlagLocalPool, 0});
  REQUIRE(maps.slots.size() == 1);
  CHECK(maps.slots[0] == std::pair{SlotKey{3, kLocalSlotBase}, at("10.244.1.5", 8080)});
}

TEST_CASE("a service without endpoints counts none, so the connect is refused", "[unit][ebpf][renderer]") {
  auto port = clusterIP("ns", "empty", "10.96.0.11", 80, {});
  PortMaps maps = renderer().render(port);
  REQUIRE(maps.services.size() == 1);
  CHECK(maps.services[0].second.count == 0);
  CHECK(maps.services[0].second.localCount == 0);
  CHECK(maps.slots.empty());
}

TEST_CASE("external addresses use the cluster pool, as the short-circuit does under eTP Local", "[unit][ebpf][renderer]") {
  auto port = clusterIP("ns", "web", "10.96.0.10", 80, {endpoint("10.244.1.5", 8080, true), endpoint("10.244.2.6", 8080)});
  port.type = sdk::ServiceType::kLoadBalancer;
  port.nodePort = 30080;
  port.externalIPs = {"203.0.113.7"};
  port.loadBalancerIPs = {"198.51.100.9"};
  port.externalPolicyLocal = true;
  PortMaps maps = renderer({"192.168.50.10", "fd00::10"}).render(port);
  maps.setId(5);
  for (const auto& k : {key("10.96.0.10", 80), key("203.0.113.7", 80), key("198.51.100.9", 80), key("192.168.50.10", 30080)}) {
    INFO(k.toText());
    const ServiceValue* v = find(maps, k);
    REQUIRE(v != nullptr);
    CHECK((v->flags & kFlagLocalPool) == 0);
    CHECK(v->count == 2);
  }
  CHECK(maps.services.size() == 4);  // the node's IPv6 address is not this port's family
  // No element picks from the local pool, so none of its slots is written.
  CHECK(maps.slots.size() == 2);
  CHECK(std::none_of(maps.slots.begin(), maps.slots.end(), [](const auto& s) { return s.first.slot >= kLocalSlotBase; }));
}

TEST_CASE("LoadBalancer IPs behind source ranges and SCTP are left unsteered", "[unit][ebpf][renderer]") {
  auto port = clusterIP("ns", "web", "10.96.0.10", 80, {endpoint("10.244.1.5", 8080)});
  port.type = sdk::ServiceType::kLoadBalancer;
  port.loadBalancerIPs = {"198.51.100.9"};
  port.loadBalancerSourceRanges = {"203.0.113.0/24"};
  PortMaps maps = renderer().render(port);
  CHECK(find(maps, key("198.51.100.9", 80)) == nullptr);
  CHECK(find(maps, key("10.96.0.10", 80)) != nullptr);

  auto sctp = clusterIP("ns", "sctp", "10.96.0.12", 80, {endpoint("10.244.1.5", 8080)}, sdk::Protocol::kSCTP);
  CHECK(renderer().render(sctp).services.empty());
}

TEST_CASE("ClientIP affinity sets the flag and the timeout on every address", "[unit][ebpf][renderer]") {
  auto port = clusterIP("ns", "web", "10.96.0.10", 80, {endpoint("10.244.1.5", 8080)});
  port.sessionAffinityClientIP = true;
  port.stickyMaxAgeSeconds = 60;
  port.externalIPs = {"203.0.113.7"};
  PortMaps maps = renderer().render(port);
  REQUIRE(maps.services.size() == 2);
  for (const auto& [k, v] : maps.services) {
    CHECK(v.flags == kFlagAffinity);
    CHECK(v.affinityTimeout == 60);
  }
}
