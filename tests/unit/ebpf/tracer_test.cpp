// The ebpf tracer: decideConnect (the program's choose() in C++) over hand-made maps, the
// tracer's answer over what the renderer plans for many kinds of service port (held to the
// plan's pools, so that the tracer and the renderer cannot drift apart), the branch point for
// traffic no socket hook sees, and `kproxy explain`'s answer in ebpf mode.

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "../nftables/service_ports.h"
#include "map_values.h"
#include "kproxy/ebpf/backend.h"
#include "kproxy/ebpf/explain.h"
#include "kproxy/ebpf/tracer.h"
#include "kproxy/nftables/explain.h"
#include "kproxy/plan/options.h"

using namespace kproxy;
using namespace kproxy::ebpf;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;
using kproxy::ebpf::testing::at;
using kproxy::ebpf::testing::key;

namespace {

constexpr const char* kNodeIP = "192.168.0.2";

sdk::NodeInfo testNode() {
  sdk::NodeInfo node;
  node.name = "test-node";
  node.addresses = {kNodeIP};
  node.nodePortAddresses.resolved = true;
  node.nodePortAddresses.addresses = {kNodeIP};
  return node;
}

RenderConfig renderConfig() {
  auto cfg = parseRenderConfig({{"cluster-cidr", "10.0.0.0/8"}, {"detect-local-mode", "ClusterCIDR"},
                                {"node-name", "test-node"}, {"nodeport-addresses", std::string(kNodeIP) + "/32"}});
  REQUIRE(cfg);
  return *cfg;
}

plan::LocalTrafficDetector detectorOf(const RenderConfig& cfg, const sdk::NodeInfo& node) {
  plan::PlanConfig pc = plan::planConfigOf(cfg.common);
  plan::applyNode(pc, cfg.common.detectLocalMode, node, cfg.common.nodeIPs);
  return pc.localDetector;
}

plan::Packet packet(const std::string& source, const std::string& destination, std::uint16_t port,
                    const char* protocol = "tcp", bool fromNode = false) {
  auto p = plan::Packet::make(source, destination, port, protocol, fromNode);
  REQUIRE(p);
  return *p;
}

std::set<std::string> endpointsOf(std::span<const sdk::Endpoint> pool) {
  std::set<std::string> out;
  for (const auto& e : pool) out.insert(plan::endpointText(e.ip, static_cast<std::uint16_t>(e.port)));
  return out;
}

/// Service ports of every kind the renderer treats apart.
std::vector<sdk::ServicePort> variedPorts() {
  std::vector<sdk::ServicePort> ports;
  ports.push_back(clusterIP("ns", "plain", "172.30.0.1", 80, {endpoint("10.180.0.1", 8080), endpoint("10.180.1.1", 8080)}));
  auto itpLocal = clusterIP("ns", "itp", "172.30.0.2", 80,
                            {endpoint("10.180.0.2", 80, true), endpoint("10.180.1.2", 80)});
  itpLocal.internalPolicyLocal = true;
  ports.push_back(itpLocal);
  auto itpLocalNone = clusterIP("ns", "itp-none", "172.30.0.3", 80, {endpoint("10.180.1.3", 80)});
  itpLocalNone.internalPolicyLocal = true;
  ports.push_back(itpLocalNone);
  ports.push_back(clusterIP("ns", "empty", "172.30.0.4", 80, {}));
  auto etpLocal = clusterIP("ns", "etp", "172.30.0.5", 80,
                            {endpoint("10.180.0.5", 80, true), endpoint("10.180.1.5", 80), endpoint("10.180.2.5", 80)});
  etpLocal.type = sdk::ServiceType::kLoadBalancer;
  etpLocal.externalPolicyLocal = true;
  etpLocal.nodePort = 3005;
  etpLocal.externalIPs = {"192.168.99.5"};
  etpLocal.loadBalancerIPs = {"1.2.3.5"};
  ports.push_back(etpLocal);
  auto external = clusterIP("ns", "ext", "172.30.0.6", 80, {endpoint("10.180.1.6", 80)});
  external.type = sdk::ServiceType::kNodePort;
  external.nodePort = 3006;
  external.sessionAffinityClientIP = true;
  external.stickyMaxAgeSeconds = 600;
  ports.push_back(external);
  auto externalEmpty = clusterIP("ns", "ext-empty", "172.30.0.7", 80, {});
  externalEmpty.type = sdk::ServiceType::kNodePort;
  externalEmpty.nodePort = 3007;
  externalEmpty.externalIPs = {"192.168.99.7"};
  ports.push_back(externalEmpty);
  ports.push_back(clusterIP("ns", "dns", "172.30.0.10", 53, {endpoint("10.180.0.10", 5353)}, sdk::Protocol::kUDP));
  ports.push_back(clusterIP("ns", "v6", "fd00:10:96::8", 80, {endpoint("fd00:10:180::8", 80)}));
  return ports;
}

}  // namespace

TEST_CASE("decideConnect: the lookup, the pool the flags name, its count and slots, refusal", "[unit][ebpf][tracer]") {
  MapContents maps;
  maps.services[key("10.96.0.10", 80)] = ServiceValue{7, 2, 1, 0, 0};
  maps.services[key("10.96.0.11", 80)] = ServiceValue{8, 2, 1, kFlagLocalPool, 0};
  maps.services[key("10.96.0.12", 80)] = ServiceValue{9, 0, 3, 0, 0};
  maps.services[key("10.96.0.13", 80)] = ServiceValue{10, 2, 0, 0, 0};
  maps.slots[SlotKey{7, 0}] = at("10.244.1.1", 80);
  maps.slots[SlotKey{7, 1}] = at("10.244.1.2", 80);
  maps.slots[SlotKey{7, kLocalSlotBase}] = at("10.244.1.1", 80);
  maps.slots[SlotKey{8, 0}] = at("10.244.2.1", 80);
  maps.slots[SlotKey{8, 1}] = at("10.244.2.2", 80);
  maps.slots[SlotKey{8, kLocalSlotBase}] = at("10.244.2.9", 80);
  maps.slots[SlotKey{10, 0}] = at("10.244.4.1", 80);  // slot 10/1 counted but missing

  SECTION("the cluster pool: slots 0 .. count-1") {
    const ConnectDecision d = decideConnect(maps, key("10.96.0.10", 80));
    CHECK(d.decision == Decision::kSteered);
    CHECK_FALSE(d.localPool);
    CHECK(d.slots == std::vector<SlotChoice>{{SlotKey{7, 0}, at("10.244.1.1", 80)},
                                              {SlotKey{7, 1}, at("10.244.1.2", 80)}});
  }
  SECTION("the local pool flag: the local count, from the local base") {
    const ConnectDecision d = decideConnect(maps, key("10.96.0.11", 80));
    CHECK(d.decision == Decision::kSteered);
    CHECK(d.localPool);
    CHECK(d.base == kLocalSlotBase);
    CHECK(d.slots == std::vector<SlotChoice>{{SlotKey{8, kLocalSlotBase}, at("10.244.2.9", 80)}});
  }
  SECTION("count 0 in the pool the flags name refuses, whatever the other pool holds") {
    CHECK(decideConnect(maps, key("10.96.0.12", 80)).decision == Decision::kRefused);
  }
  SECTION("a counted slot that is missing is a refusing draw") {
    const ConnectDecision d = decideConnect(maps, key("10.96.0.13", 80));
    REQUIRE(d.slots.size() == 2);
    CHECK_FALSE(d.slots[1].endpoint);
    const EbpfTracer tracer(maps, {});
    const plan::Trace t = tracer.trace(packet("192.168.0.2", "10.96.0.13", 80, "tcp", true));
    CHECK(t.outcome.verdict == plan::TraceVerdict::kDnat);
    CHECK(t.outcome.mixed);
  }
  SECTION("another address, port or protocol is no service; SCTP is never looked up") {
    CHECK(decideConnect(maps, key("10.96.0.10", 81)).decision == Decision::kNotAService);
    CHECK(decideConnect(maps, key("10.96.0.10", 80, kProtoUDP)).decision == Decision::kNotAService);
    CHECK(decideConnect(maps, key("10.96.0.10", 80, 132)).decision == Decision::kNotTranslated);
  }
}

// The drift check: whatever the renderer writes, a connect from the node to each address it
// wrote meets exactly the plan's pool for that traffic, through the tracer's decision; and
// every slot written is one some connect can draw.
TEST_CASE("the tracer over the renderer's maps meets the plan's pool at every address", "[unit][ebpf][tracer]") {
  const RenderConfig cfg = renderConfig();
  const sdk::NodeInfo node = testNode();
  EbpfRenderer renderer(cfg);
  renderer.setNode(node);
  plan::PlanConfig planConfig = plan::planConfigOf(cfg.common);
  plan::applyNode(planConfig, cfg.common.detectLocalMode, node, cfg.common.nodeIPs);
  const std::vector<sdk::ServicePort> ports = variedPorts();

  for (net::Family family : {net::Family::kIPv4, net::Family::kIPv6}) {
    const MapContents maps = plannedMaps(renderer, family, ports);
    const EbpfTracer tracer(maps, planConfig.localDetector);
    std::set<SlotKey> drawn;
    std::size_t checked = 0;
    for (const auto& port : ports) {
      if (port.family != family) continue;
      const plan::ServicePortPlan p = plan::planServicePort(port, planConfig);
      const char* protocol = port.protocol == sdk::Protocol::kUDP ? "udp" : "tcp";
      const std::string source = family == net::Family::kIPv4 ? kNodeIP : "2001:db8::1";
      // Each address with the pool the node's own traffic meets there (renderer.h).
      std::vector<std::tuple<std::string, std::uint16_t, std::set<std::string>, plan::DropReason>> addresses;
      addresses.emplace_back(p.clusterIP, port.port, endpointsOf(p.endpointsOf(p.internalPool)),
                             p.internalPool == plan::Pool::kLocal ? plan::DropReason::kNoLocalEndpoints
                                                                  : plan::DropReason::kNoEndpoints);
      const std::set<std::string> external =
          p.capturesExternal ? endpointsOf(p.clusterEndpoints) : std::set<std::string>{};
      for (const auto& ip : p.externalIPs) addresses.emplace_back(ip, port.port, external, plan::DropReason::kNoEndpoints);
      for (const auto& ip : p.loadBalancerIPs)
        addresses.emplace_back(ip, port.port, external, plan::DropReason::kNoEndpoints);
      if (p.nodePort != 0)
        addresses.emplace_back(kNodeIP, static_cast<std::uint16_t>(p.nodePort), external, plan::DropReason::kNoEndpoints);
      for (const auto& [ip, number, want, reason] : addresses) {
        INFO(port.key << " at " << ip << ":" << number);
        const plan::Trace t = tracer.trace(packet(source, ip, number, protocol, true));
        ++checked;
        CHECK_FALSE(t.outcome.mixed);
        CHECK_FALSE(t.outcome.masqueraded);
        if (want.empty()) {
          CHECK(t.outcome.verdict == plan::TraceVerdict::kRejected);
          CHECK(t.outcome.reason == reason);
        } else {
          CHECK(t.outcome.verdict == plan::TraceVerdict::kDnat);
          CHECK(std::set<std::string>(t.outcome.endpoints.begin(), t.outcome.endpoints.end()) == want);
        }
        auto k = SocketAddress::of(ip, number);
        REQUIRE(k);
        for (const auto& choice : decideConnect(maps, ServiceKey{*k, port.protocol == sdk::Protocol::kUDP ? kProtoUDP : kProtoTCP}).slots)
          drawn.insert(choice.slot);
      }
    }
    CHECK(checked == maps.services.size());
    for (const auto& [slot, ep] : maps.slots) {
      INFO("slot " << slot.toText() << " " << ep.toText());
      CHECK(drawn.contains(slot));
    }
  }
}

TEST_CASE("traffic no socket hook sees goes to the one branch point, by default not steered", "[unit][ebpf][tracer]") {
  const RenderConfig cfg = renderConfig();
  const sdk::NodeInfo node = testNode();
  EbpfRenderer renderer(cfg);
  renderer.setNode(node);
  const std::vector<sdk::ServicePort> ports = variedPorts();
  const MapContents maps = plannedMaps(renderer, net::Family::kIPv4, ports);
  const plan::Packet fromOutside = packet("203.0.113.2", kNodeIP, 3006);
  const plan::Packet fromPod = packet("10.0.0.2", kNodeIP, 3006);

  const EbpfTracer plain(maps, detectorOf(cfg, node));
  CHECK(plain.hooked(fromPod));
  CHECK_FALSE(plain.hooked(fromOutside));
  CHECK(plain.trace(fromPod).outcome.endpoints == std::vector<std::string>{"10.180.1.6:80"});
  const plan::Trace untouched = plain.trace(fromOutside);
  CHECK(untouched.outcome.verdict == plan::TraceVerdict::kAccepted);
  REQUIRE(untouched.paths.size() == 1);
  CHECK(untouched.paths[0].steps.at(0).detail.starts_with("not steered by the socket hooks"));

  // The part that programs such traffic answers in its place, and only for it.
  std::size_t asked = 0;
  const EbpfTracer composed(maps, detectorOf(cfg, node), [&](const plan::Packet& p) {
    ++asked;
    plan::Trace t;
    t.packet = p;
    plan::TracePath path;
    path.outcome.verdict = plan::TraceVerdict::kDnat;
    path.outcome.endpoints = {"10.180.1.6:80"};
    path.outcome.masqueraded = true;
    t.paths = {path};
    t.outcome = plan::mergePaths(t.paths);
    return t;
  });
  CHECK(composed.trace(fromOutside).outcome.masqueraded);
  CHECK(asked == 1);
  CHECK_FALSE(composed.trace(fromPod).outcome.masqueraded);
  CHECK(asked == 1);
}

TEST_CASE("kproxy explain in ebpf mode answers in the plan's explanation", "[unit][ebpf][tracer]") {
  const RenderConfig cfg = renderConfig();
  const std::vector<sdk::ServicePort> ports = variedPorts();
  auto ask = [&](const char* source, const char* destination, std::uint16_t port, bool fromNode = false) {
    sdk::ExplainRequest r;
    r.sourceIP = source;
    r.destinationIP = destination;
    r.destinationPort = port;
    r.fromNode = fromNode;
    r.json = true;
    auto text = explainPacket(cfg, ports, testNode(), r, {});
    REQUIRE(text);
    return nlohmann::json::parse(*text);
  };
  SECTION("a steered connect: dnat to the candidates, unmasqueraded, the hook in the trace") {
    auto a = ask("10.0.0.2", "172.30.0.1", 80);
    CHECK(a["verdict"] == "dnat");
    CHECK(a["outcome"]["endpoints"] == nlohmann::json::array({"10.180.0.1:8080", "10.180.1.1:8080"}));
    CHECK(a["masqueraded"] == false);
    CHECK(a["service"]["key"] == "ns/plain:p");
    CHECK(a["paths"][0]["steps"][0]["chain"] == "cgroup/connect4");
    CHECK(a["paths"].size() == 2);
  }
  SECTION("no endpoints: rejected, with the reason") {
    auto a = ask("10.0.0.2", "172.30.0.4", 80);
    CHECK(a["verdict"] == "reject");
    CHECK(a["reason"] == "rejected: the service port has no endpoints");
    auto local = ask("10.0.0.2", "172.30.0.3", 80);
    CHECK(local["verdict"] == "reject");
    CHECK(local["reason"].get<std::string>().starts_with("rejected: the traffic policy is Local"));
  }
  SECTION("from another host: the nftables part's answer, as nftables mode traces it") {
    auto a = ask("203.0.113.2", kNodeIP, 3006);
    CHECK(a["verdict"] == "dnat");
    CHECK(a["service"]["key"] == "ns/ext:p");
    CHECK(a["outcome"]["endpoints"] == nlohmann::json::array({"10.180.1.6:80"}));
    CHECK(a["masqueraded"] == true);
    const std::string hook = a["paths"][0]["steps"][0]["chain"].get<std::string>();
    CHECK_FALSE(hook.starts_with("cgroup/"));
    // The same trace nftables mode's explain gives over the part's table.
    sdk::ExplainRequest r;
    r.sourceIP = "203.0.113.2";
    r.destinationIP = kNodeIP;
    r.destinationPort = 3006;
    r.json = true;
    auto nft = nftables::explainPacket(nftablesPartConfig(cfg), ports, testNode(), r, {});
    REQUIRE(nft);
    CHECK(a["paths"] == nlohmann::json::parse(*nft)["paths"]);
    // A NodePort without endpoints: dropped or rejected, with the plan's reason.
    auto empty = ask("203.0.113.2", kNodeIP, 3007);
    CHECK(empty["verdict"] == "reject");
    CHECK(empty["reason"].get<std::string>().starts_with("rejected: "));
    // A ClusterIP is not served to other hosts: the part has no ClusterIP dispatch.
    auto cluster = ask("203.0.113.2", "172.30.0.1", 80);
    CHECK(cluster["verdict"] == "reject");
    CHECK(cluster["outcome"]["endpoints"].empty());
  }
  SECTION("a connect the hook leaves unchanged meets the nftables part after the hook") {
    // No element for port 81 of the ClusterIP: the part's cluster-ips rejects it.
    auto a = ask("10.0.0.2", "172.30.0.1", 81);
    CHECK(a["verdict"] == "reject");
    CHECK(a["reason"].get<std::string>().starts_with("rejected: "));
    CHECK(a["paths"][0]["steps"][0]["chain"] == "cgroup/connect4");
    CHECK(a["paths"][0]["steps"].size() > 2);
    // Nor an address of any service: the part leaves it untouched too.
    auto none = ask("10.0.0.2", "10.0.0.3", 80);
    CHECK(none["verdict"] == "accept");
  }
  SECTION("the node to a NodePort: the cluster pool") {
    auto a = ask(kNodeIP, kNodeIP, 3005, true);
    CHECK(a["outcome"]["endpoints"] == nlohmann::json::array({"10.180.0.5:80", "10.180.1.5:80", "10.180.2.5:80"}));
  }
}
